"""Numerical kernels behind one interface. `reference` is plain torch (CPU, tests, fp32); a CUDA backend with
fused kernels plugs in here with the same signatures."""

from engine.ops.reference import (  # noqa: F401
    causal_conv,
    kda_chunked,
    kda_step,
    l2norm,
    linear,
    linear_pairs,
    layer_norm,
    rms_norm,
    swiglu_clamped,
)
