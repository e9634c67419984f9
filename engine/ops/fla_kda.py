"""A KDA prompt chunk on a GPU through fla-core's `chunk_kda` (Triton), with `reference.kda_chunked`'s contract.

At 2k tokens of one full-width layer on an H200, `chunk_kda` takes 0.81 ms where the torch chunked form takes
50.4 ms (docs/BENCHMARKS.md); for a decode token our own kernel (`triton_kda.py`) is the faster one, so only
prompts come here.

Precision: Triton's `tl.dot` on fp32 inputs defaults to TF32 (10-bit mantissa), which leaves ~1e-3 relative error
against the fp32 reference. Before fla-core's kernels are first compiled in this process, `TRITON_F32_DEFAULT` is
set to `PRECISION` unless the operator set it: "tf32x3" splits each fp32 operand into three TF32 products on the
tensor cores (near-fp32 results). Our own Triton kernels use no `tl.dot`, so the setting touches only fla-core's.
The variable is part of Triton's compile-cache key, so a cache built under another precision is not reused.

First use of a shape autotunes fla-core's kernels (199 s on an H200 at GLM-5.3-Flash's TP=2 shape, every candidate
compiled and timed); `warm` runs that at load. The engine ships fla-core's choices for GLM-5.3-Flash's KDA heads
(128 wide, the head counts of TP=1..4) in fla-core's own config format, `fla_configs/<GPU>/`: recorded on an H200
(bench/fla_configs.py record), and for a GB10 the same choices within what fla-core itself offers a GPU of 101,376
bytes of shared memory a block (bench/fla_configs.py derive: the state kernel's 3 pipeline stages become 2), and the
KDA recompute kernel capped at 2 stages (its 4 compiled to 163,840 bytes a block on the H200); the gate kernel that
makes the log-decay (`kda_gated`, the served form since session 37) takes the choices recorded for the cumsum kernel
it replaces (bench/fla_configs.py gate: the same tile and candidates; chosen by that likeness, not tuned). Unless
the operator set FLA_CACHE_MODE or FLA_CONFIG_DIR, fla-core reads them (`use_shipped_configs`, mode "strict": a
kernel whose tuning key matches none autotunes as before), so a first start compiles once per kernel: 15.6 s on an
H200. With a persistent TRITON_CACHE_DIR later starts read the compiled kernels (and any autotuned choice, fla-core's
FLA_CACHE_RESULTS) from disk. FLA_CACHE_MODE=disabled tunes on the machine instead.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from pathlib import Path

import torch

from engine.ops.reference import l2norm

PRECISION = "tf32x3"


CONFIGS = Path(__file__).with_name("fla_configs")  # fla-core's choices shipped per GPU (the docstring above)


def shipped_configs(device_name: str) -> Path | None:
    """The folder of fla-core choices shipped for the GPU named `device_name` (as torch names it; the folder as
    fla-core spells GPU names), or None."""
    folder = CONFIGS / (re.sub(r"[^0-9A-Za-z]+", "_", device_name).strip("_") or "unknown_gpu")
    return folder if folder.is_dir() else None


def use_shipped_configs(device_name: str) -> Path | None:
    """Point fla-core at the choices shipped for this GPU (FLA_CACHE_MODE=strict, FLA_CONFIG_DIR), unless the operator
    set either variable or none is shipped for it; the folder used, or None."""
    if "FLA_CACHE_MODE" in os.environ or "FLA_CONFIG_DIR" in os.environ:
        return None
    folder = shipped_configs(device_name)
    if folder is not None:
        os.environ["FLA_CACHE_MODE"], os.environ["FLA_CONFIG_DIR"] = "strict", str(folder)
    return folder


@functools.cache
def _chunk_kda() -> Callable | None:
    os.environ.setdefault("TRITON_F32_DEFAULT", PRECISION)
    shipped = use_shipped_configs(torch.cuda.get_device_name()) if torch.cuda.is_available() else None
    try:
        from fla.ops.kda.chunk import chunk_kda
        from fla.ops.utils import cache
    except ImportError:
        return None
    if shipped is not None:  # fla-core reads the mode as it is imported: in case something imported it before
        cache.FLA_CACHE_MODE = cache.FlaCacheMode("strict")
    return chunk_kda


def _required() -> Callable:
    chunk_kda = _chunk_kda()
    if chunk_kda is None:
        raise RuntimeError("fla-core is not importable: the 'fla' prompt form cannot run (kda.prompt_form checks)")
    return chunk_kda


def usable(device: torch.device, head_dim: int) -> bool:
    """Whether prompts of heads this wide on `device` can go through fla-core (a CUDA device, fla-core importable,
    a head width its tiles take: a multiple of 16 up to 256)."""
    return device.type == "cuda" and head_dim % 16 == 0 and head_dim <= 256 and _chunk_kda() is not None


def kda_chunked(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta rule over T tokens of one stream. state: [H, dk, dv] fp32; q (pre-scaled), k: [T, H, dk];
    v: [T, H, dv]; g: [T, H, dk] log-decay; beta: [T, H]. Returns the output [T, H, dv] and the new state."""
    chunk_kda = _required()
    out, final = chunk_kda(
        q[None], k[None], v[None], g[None], beta[None], scale=1.0, initial_state=state[None], output_final_state=True
    )
    return out[0], final[0]


# KDA prompt chunks hand fla-core f_b's output, and it makes the log-decay in the kernel that sums it (in place of
# four torch launches a layer: 4-layer bf16 prefill +1.8 % at 2k, +2.0 % at 8k on an H100, the same error against
# fp64: docs/BENCHMARKS.md, session 37)
GATE_IN_KERNEL = True
# ... and take its tensor-core form of the diagonal blocks, which it allows for gates bounded in [lower_bound, 0):
# measured no faster in the engine (session 37), so left off
SAFE_GATE = False


def kda_gated(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    raw: torch.Tensor,
    beta: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    lower_bound: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`kda_chunked` with the log-decay made inside fla-core's first kernel, in the pass that sums it: from f_b's
    output raw [T, H, dk], dt_bias [H·dk] and A_log [H], lower_bound · sigmoid(e^A_log · (raw + dt_bias))
    (`KimiDeltaAttention._decay`'s values, to fp32 rounding), or -e^A_log · softplus(raw + dt_bias) without a bound
    (fla-core's softplus takes approximate exp2 / log2: near 0 where torch gives e^x for arguments below ~-17)."""
    chunk_kda = _required()
    safe = SAFE_GATE and lower_bound is not None and -5 <= lower_bound < 0
    out, final = chunk_kda(
        q[None], k[None], v[None], raw[None], beta[None], scale=1.0, initial_state=state[None],
        output_final_state=True, use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias, lower_bound=lower_bound,
        safe_gate=safe,
    )  # fmt: skip
    return out[0], final[0]


def random_inputs(
    tokens: int, heads: int, head_dim: int, device: torch.device, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """`kda_chunked`'s arguments for one stream of `tokens` tokens, drawn at the model's scales: a zero state, q
    (pre-scaled) and k unit rows, v, a negative log-decay g, beta in (0, 1)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (tokens, heads, head_dim)
    q = l2norm(torch.randn(shape, device=device, generator=gen)) * head_dim**-0.5
    k = l2norm(torch.randn(shape, device=device, generator=gen))
    v = torch.randn(shape, device=device, generator=gen)
    g = -torch.rand(shape, device=device, generator=gen)
    beta = torch.rand(shape[:2], device=device, generator=gen)
    return torch.zeros(heads, head_dim, head_dim, device=device), q, k, v, g, beta


def warm(heads: int, head_dim: int, device: torch.device, lower_bound: float | None = None) -> None:
    """Compile and autotune fla-core's kernels for this head shape (and gate bound) now (every KDA layer shares
    them), so the first prompt does not wait for it."""
    state, q, k, v, g, beta = random_inputs(128, heads, head_dim, device)
    with torch.no_grad():
        if GATE_IN_KERNEL:
            a_log, dt_bias = torch.zeros(heads, device=device), torch.zeros(heads * head_dim, device=device)
            kda_gated(state, q, k, v, g, beta, a_log, dt_bias, lower_bound)
        else:
            kda_chunked(state, q, k, v, g, beta)
    torch.cuda.synchronize(device)
