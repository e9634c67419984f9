"""Numerical kernels behind one interface. `reference` is plain torch (CPU, tests, fp32); `fused` chooses, per op,
the Triton kernels on CUDA where their form applies and the reference otherwise (model files never import Triton)."""

from engine.ops.fused import (  # noqa: F401
    Exl3Experts,
    hc_around,
    hc_weights,
    kda_decode,
    kda_decode_applies,
    linear,
    linear_pairs,
    moe_decode_applies,
    moe_experts,
    moe_route,
    sinkhorn,
)
from engine.ops.reference import (  # noqa: F401
    ROW_INVARIANT_ROWS,
    Split,
    causal_conv,
    kda_chunked,
    kda_step,
    l2norm,
    layer_norm,
    require_row_invariance,
    rms_norm,
    row_blocks,
    sigmoid,
    silu,
    softplus,
    split_bf16,
    split_product,
    swiglu_clamped,
)
