"""KDA kernels on the GPU: ours against fla-core's (issue 7: "KDA through fla-core's Triton kernels unless our own
are faster"), at GLM-5.3-Flash's shapes (64 heads of 128, conv 4).

    python bench/kda_bench.py [--out kda_bench.json] [--budget 120]

Decode, one token per stream on lanes of a state pool, B = 1..4, each timed from a CUDA graph
(`triton.testing.do_bench_cudagraph`) so launch costs count as they do in the served step:
- `ours_fused`: engine/ops/triton_kda.py — conv + SiLU, L2 norms, gates, delta rule, gated RMS norm, lane state in
  place: the whole stretch between the projections and o_proj, one launch;
- `torch_step`: the torch ops it replaced (the gathered lanes through `KimiDeltaAttention._step`'s math and back);
- `fla_recurrent`: fla-core's `fused_recurrent_kda` (L2 norms, gate and beta sigmoid in the kernel, lane state in
  place through `ssm_state_indices`) plus the conv + SiLU and gated RMS norm around it in torch, which it does not do.
Prefill, one stream, T = 2k / 8k tokens (`triton.testing.do_bench`): `ours_chunked` (ops.kda_chunked, torch) against
fla-core's `chunk_kda`. Each fla figure also records its largest difference from ours (relative to the largest
magnitude) on the same inputs. fla-core is optional: without it only our figures are written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine import ops  # noqa: E402
from engine.ops.triton_kda import kda_decode  # noqa: E402

H, D, K, LANES = 64, 128, 4, 5
LOWER = -5.0


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30))


def decode_inputs(batch: int, gen: torch.Generator) -> dict:
    dev = "cuda"
    c = H * D
    return dict(
        proj=torch.randn(batch, 3 * c, device=dev, generator=gen),
        f=torch.randn(batch, c, device=dev, generator=gen),
        b=torch.randn(batch, H, device=dev, generator=gen),
        gate=torch.randn(batch, c, device=dev, generator=gen),
        conv_w=torch.randn(3 * c, K, device=dev, generator=gen) * 0.5,
        dt_bias=torch.zeros(c, device=dev),
        a_decay=torch.ones(H, device=dev),
        o_norm=torch.ones(D, device=dev),
        lane_ids=torch.arange(batch, device=dev),
        windows=torch.randn(LANES, 3 * c, K - 1, device=dev, generator=gen),
        states=torch.randn(LANES, H, D, D, device=dev, generator=gen) * 0.1,
    )


def ours(i: dict) -> torch.Tensor:
    return kda_decode(
        i["proj"],
        i["f"],
        i["b"],
        i["gate"],
        i["conv_w"],
        i["dt_bias"],
        i["a_decay"],
        i["o_norm"],
        i["lane_ids"],
        i["windows"],
        i["states"],
        LOWER,
        1e-5,
    )


def conv_and_split(i: dict):
    lanes = i["lane_ids"]
    seqs = torch.cat([i["windows"][lanes], i["proj"].unsqueeze(-1)], dim=-1)
    mixed = torch.nn.functional.silu((seqs * i["conv_w"]).sum(-1))
    i["windows"][lanes] = seqs[:, :, 1:]
    q, k, v = (t.reshape(-1, H, D).contiguous() for t in mixed.split(H * D, dim=-1))  # fla reads them dense
    return q, k, v


def gated_norm(core: torch.Tensor, i: dict) -> torch.Tensor:
    return (ops.rms_norm(core, i["o_norm"], 1e-5) * torch.sigmoid(i["gate"].view(-1, H, D))).flatten(1)


def torch_step(i: dict) -> torch.Tensor:
    q, k, v = conv_and_split(i)
    q, k = ops.l2norm(q) * D**-0.5, ops.l2norm(k)
    g = LOWER * torch.sigmoid(i["a_decay"][:, None] * (i["f"] + i["dt_bias"]).view(-1, H, D))
    core, state = ops.kda_step(i["states"][i["lane_ids"]], q, k, v, g, torch.sigmoid(i["b"]))
    i["states"][i["lane_ids"]] = state
    return gated_norm(core, i)


def fla_step(i: dict, fused_recurrent_kda_fwd) -> torch.Tensor:
    q, k, v = conv_and_split(i)
    raw = (i["f"]).view(-1, 1, H, D)
    core, _ = fused_recurrent_kda_fwd(
        q=q.unsqueeze(1),
        k=k.unsqueeze(1),
        v=v.unsqueeze(1),
        g=raw,
        beta=i["b"].view(-1, 1, H),
        A_log=torch.zeros(H, device="cuda"),
        dt_bias=i["dt_bias"],
        initial_state=i["states"],
        scale=D**-0.5,
        inplace_final_state=True,
        ssm_state_indices=i["lane_ids"],
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        use_beta_sigmoid_in_kernel=True,
        lower_bound=LOWER,
    )
    return gated_norm(core[:, 0], i)


def prompt_inputs(length: int) -> tuple[torch.Tensor, ...]:
    """One stream's prompt of `length` tokens at full width, seeded by its length: the state it starts from, then
    q (normalised, pre-scaled), k, v, the bounded log-decay and beta."""
    g = torch.Generator(device="cuda").manual_seed(length)
    q = ops.l2norm(torch.randn(length, H, D, device="cuda", generator=g)) * D**-0.5
    k = ops.l2norm(torch.randn(length, H, D, device="cuda", generator=g))
    v = torch.randn(length, H, D, device="cuda", generator=g)
    gate = LOWER * torch.sigmoid(torch.randn(length, H, D, device="cuda", generator=g))
    beta = torch.sigmoid(torch.randn(length, H, device="cuda", generator=g))
    return torch.randn(H, D, D, device="cuda", generator=g) * 0.1, q, k, v, gate, beta


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget", type=float, default=120.0, help="seconds; what is left after it is skipped")
    args = ap.parse_args()
    import triton
    import triton.testing

    start = time.monotonic()
    result: dict = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "decode": {},
        "prefill": {},
    }
    try:
        import fla
        from fla.ops.kda.chunk import chunk_kda
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

        result["fla_core"] = getattr(fla, "__version__", "?")
    except Exception as exc:  # optional: record why
        chunk_kda = fused_recurrent_kda_fwd = None
        result["fla_core"] = f"not importable: {type(exc).__name__}: {exc}"

    def save() -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
        print(json.dumps(result), flush=True)

    gen = torch.Generator(device="cuda").manual_seed(0)
    for batch in (1, 2, 3, 4):
        if time.monotonic() - start > args.budget:
            result["skipped"] = f"decode from batch {batch}: budget"
            break
        row = result["decode"][f"b{batch}"] = {}
        base = decode_inputs(batch, gen)
        copy = lambda: {k: v.clone() for k, v in base.items()}  # noqa: E731
        a, b = copy(), copy()
        out_ours, out_torch = ours(a), torch_step(b)
        row["ours_vs_torch"] = {"out": rel(out_ours, out_torch), "state": rel(a["states"], b["states"])}
        paths = {"ours_fused": ours, "torch_step": torch_step}
        if fused_recurrent_kda_fwd is not None:
            try:
                c = copy()
                out_fla = fla_step(c, fused_recurrent_kda_fwd)
                row["fla_vs_ours"] = {"out": rel(out_fla, out_ours), "state": rel(c["states"], a["states"])}
                paths["fla_recurrent"] = lambda i: fla_step(i, fused_recurrent_kda_fwd)
            except Exception as exc:
                row["fla_recurrent"] = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
        for name, fn in paths.items():
            state = copy()
            try:
                row[f"{name}_us"] = round(triton.testing.do_bench_cudagraph(lambda: fn(state), rep=40) * 1e3, 1)
            except Exception as exc:
                row[f"{name}_us"] = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
        save()
    for length in (2048, 8192):
        if time.monotonic() - start > args.budget:
            result.setdefault("skipped", f"prefill from {length}: budget")
            break
        s0, q, k, v, gate, beta = prompt_inputs(length)
        row = result["prefill"][f"t{length}"] = {}
        ref_out, ref_state = ops.kda_chunked(s0, q, k, v, gate, beta)
        row["ours_chunked_ms"] = round(
            triton.testing.do_bench(lambda: ops.kda_chunked(s0, q, k, v, gate, beta), rep=200), 2
        )
        save()
        if chunk_kda is not None:  # its first call autotunes (compiles many configurations): allow minutes
            try:

                def fla_chunk():
                    return chunk_kda(
                        q[None],
                        k[None],
                        v[None],
                        gate[None],
                        beta[None],
                        scale=1.0,
                        initial_state=s0[None].clone(),
                        output_final_state=True,
                    )

                with torch.inference_mode():
                    out, state = fla_chunk()
                    row["fla_vs_ours"] = {
                        "out": rel(out[0], ref_out),
                        "state": rel(state[0], ref_state),
                        "dtype": str(out.dtype),
                    }
                    row["fla_chunk_ms"] = round(triton.testing.do_bench(fla_chunk, rep=200), 2)
            except Exception as exc:
                row["fla_chunk_ms"] = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
        row["tok_s"] = {
            name: round(length / (ms / 1e3))
            for name, ms in (("ours", row["ours_chunked_ms"]), ("fla", row.get("fla_chunk_ms")))
            if isinstance(ms, (int, float))
        }
        save()


if __name__ == "__main__":
    main()
