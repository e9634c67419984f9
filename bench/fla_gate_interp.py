"""fla-core's KDA gate kernel (`kda_gate_chunk_cumsum`, the served prompt form since session 37: the log-decay made
inside fla-core) against the torch form, in Triton's CPU interpreter — a check of the wiring (A_log [H], dt_bias
[H·d], the bound) without a GPU. fla-core's other KDA kernels do not run in the interpreter.

    pip install --no-deps --target /tmp/pylib-fla .wheels/fla_core-*.whl .wheels/einops-*.whl
    PYTHONPATH=/tmp/pylib-fla python bench/fla_gate_interp.py

Prints, per (T, H, d, bound), the largest difference of the chunk-wise cumulative log-decay (in log2 units, as
fla-core keeps it) between the two forms, and the largest value.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton.runtime.autotuner as autotuner  # noqa: E402

# no GPU to time candidates on: every candidate "takes" the same time, so the first is used
autotuner.Autotuner._bench = lambda self, *args, **kwargs: [1.0, 1.0, 1.0]  # type: ignore[method-assign]

from fla.ops.kda.gate import kda_gate_chunk_cumsum  # noqa: E402
from fla.ops.utils.cumsum import chunk_local_cumsum  # noqa: E402

from engine.models.glm5_next.kda import log_decay  # noqa: E402

RCP_LN2 = 1.4426950408889634


def main() -> None:
    for tokens, heads, width in ((64, 2, 32), (100, 3, 64)):
        gen = torch.Generator().manual_seed(tokens)
        raw = torch.randn(tokens, heads, width, generator=gen) * 2  # f_b's output
        a_log = torch.randn(heads, generator=gen) * 0.5
        dt_bias = torch.randn(heads * width, generator=gen) * 0.3
        for bound in (-5.0, None):
            g = log_decay(raw.flatten(1), dt_bias, a_log.exp(), bound)  # the engine's torch form, both bounds
            torch_form = chunk_local_cumsum(g=g[None], scale=RCP_LN2, chunk_size=64)
            in_kernel = kda_gate_chunk_cumsum(
                g=raw[None], A_log=a_log, dt_bias=dt_bias, scale=RCP_LN2, chunk_size=64, lower_bound=bound
            )
            diff = (in_kernel - torch_form).abs().max().item()
            print(
                f"T {tokens} H {heads} d {width} bound {bound}: max |diff| {diff:.3g} of max |g| "
                f"{torch_form.abs().max().item():.4g}"
            )


if __name__ == "__main__":
    main()
