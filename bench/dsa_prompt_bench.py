"""A prompt chunk's DSA attention over selected tokens on one GPU (engine/models/glm5_next/dsa.py `_attend_selected`,
the sparse regime): the one-launch kernel (engine/ops/triton_dsa.py `selected_attention`) against the gathered form
it replaced (per block of queries: every query's selected latents gathered, then batched split products), each with
the head products around it, and the kernel alone under launch variants (triton_dsa.PROMPT_LAUNCHES: this GPU's
beside the others), for latents from a bf16 cache and (`--latents lo`) with a lo part (an fp8 or fp32 cache).

Shapes from engine/checkpoint/glm53_flash_config.json at TP=2's share (32 of 64 heads, nope 256, v 256, latent 512,
2,048 selected tokens in pools of 4 plus the query's unfinished pool); a chunk of T queries ending at each context;
each query's pools drawn uniformly among those it can see (random weights select that way too; a trained model's
neighbours share more pools, which this kernel does not rely on). Figures: ms a call (median of triton.testing.do_bench), TFLOP/s of the useful products
(scores and context: 2 · 2 · queries · heads · counted tokens · rank, each split product counted once), and the
largest difference from the fp32 form (relative to its largest value, over the first 128 queries).

    PYTHONPATH=. python bench/dsa_prompt_bench.py --out dsa_prompt.json [--contexts 8192,32768] [--tokens 2048]
        [--latents bf16,lo]
    PYTHONPATH=. python bench/dsa_prompt_bench.py --index --out dsa_index.json [--keys fp32,bf16,fp8]   # the
        indexer's scores instead: the torch form against engine/ops/triton_dsa.py `index_scores` under
        INDEX_VARIANTS, for fp32 keys and for a bf16 and an fp8 cache pool's keys
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from pathlib import Path

import torch
from triton.testing import do_bench

from engine import ops
from engine.cache import KVPool
from engine.models.glm5_next.dsa import SparseMLA
from engine.ops import triton_dsa

FLASH = json.loads((Path(__file__).resolve().parents[1] / "engine/checkpoint/glm53_flash_config.json").read_text())
TEXT = FLASH["text_config"]
# the GB10's launch before session 42 (the tokens the products' tall side), to time against PROMPT_LAUNCHES' "other"
# on mma.sync here (a GB10 not lent); every variant takes the tokens as the tall side unless it says otherwise
GB10_BEFORE = {"heads": 32, "block": 16, "num_warps": 8, "num_stages": 2}
VARIANTS = {  # the kernel's launch, beside this GPU's (triton_dsa.prompt_launch) and the other entry of PROMPT_LAUNCHES
    "heads32_block64_s3": {"heads": 32, "block": 64, "num_warps": 8, "num_stages": 3},
    "heads32_block64_w8": {"heads": 32, "block": 64, "num_warps": 8, "num_stages": 2},
    "heads32_block32_w4": {"heads": 32, "block": 32, "num_warps": 4, "num_stages": 2},
    "heads16_block64": {"heads": 16, "block": 64, "num_warps": 8, "num_stages": 2},
    "heads16_block32_w4": {"heads": 16, "block": 32, "num_warps": 4, "num_stages": 2},
    "gb10_before": GB10_BEFORE,
}
VARIANTS_LO = {  # the same for latents with a lo part (an fp8 or fp32 cache: two latent tiles a step)
    "heads32_block32": {"heads": 32, "block": 32, "num_warps": 8, "num_stages": 2},
    "heads32_block64_s1_w4": {"heads": 32, "block": 64, "num_warps": 4, "num_stages": 1},
    "heads16_block64_s1": {"heads": 16, "block": 64, "num_warps": 8, "num_stages": 1},
    "heads16_block32": {"heads": 16, "block": 32, "num_warps": 8, "num_stages": 2},
    "heads32_block32_w4": {"heads": 32, "block": 32, "num_warps": 4, "num_stages": 2},
    "gb10_before": GB10_BEFORE,
}


def layer(heads: int, gen: torch.Generator) -> SparseMLA:
    """A SparseMLA holding what its prompt attention reads: random absorbed kv_b at the served widths."""
    mla = object.__new__(SparseMLA)
    nope, v, rank = TEXT["qk_nope_head_dim"], TEXT["v_head_dim"], TEXT["kv_lora_rank"]
    mla.local_heads, mla.nope, mla.v_dim, mla.rank_dim = heads, nope, v, rank
    mla.scaling = (nope + TEXT.get("qk_rope_head_dim", 0)) ** -0.5
    kv_b = torch.randn(heads, nope + v, rank, device="cuda", generator=gen) * rank**-0.5
    mla.w_k, mla.w_v = kv_b[:, :nope], kv_b[:, nope:]
    return mla


def selection(context: int, t: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens, counts [T, N] for the chunk's queries at context - T .. context - 1, laid out as `_select_tokens`
    gives them: the chosen pools' tokens (uniform among the visible pools), then the unfinished pool's."""
    kpool, pick = TEXT["index_kpool"], TEXT["index_topk"] // TEXT["index_kpool"]
    positions = torch.arange(context - t, context, device="cuda")
    pools = context // kpool
    visible = torch.arange(pools, device="cuda")[None, :] * kpool + kpool - 1 <= positions[:, None]
    draw = torch.rand(t, pools, device="cuda", generator=gen).masked_fill_(~visible, -1.0)
    chosen = draw.topk(pick, dim=-1).indices.sort(dim=-1).values
    within = torch.arange(kpool, device="cuda")
    tokens = (chosen[:, :, None] * kpool + within).flatten(1)
    counts = visible.gather(-1, chosen)[:, :, None].expand(-1, -1, kpool).flatten(1)
    tail = ((positions + 1) - (positions + 1) % kpool)[:, None] + within
    return torch.cat([tokens, tail], 1), torch.cat([counts, tail <= positions[:, None]], 1)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def case(mla: SparseMLA, context: int, t: int, lo: bool, gen: torch.Generator) -> dict:
    """One chunk of t queries ending at `context`, latents from a bf16 cache or (`lo`) with a lo part: the kernel and
    the gathered form with the head products around them, then the kernel alone under each launch."""
    heads = mla.local_heads
    q = torch.randn(t, heads, mla.nope, device="cuda", generator=gen)
    latents = torch.randn(context, mla.rank_dim, device="cuda", generator=gen)
    latents = latents if lo else latents.bfloat16().float()
    tokens, counts = selection(context, t, gen)
    useful = 4.0 * heads * mla.rank_dim * float(counts.sum())
    served_applies = ops.selected_attention_applies

    def run(kernel: bool, rows: slice = slice(None)) -> torch.Tensor:
        ops.selected_attention_applies = served_applies if kernel else (lambda *a: False)  # type: ignore[assignment]
        try:
            return mla._attend_selected(q[rows], latents, tokens[rows], counts[rows], bf16_latents=not lo)
        finally:
            ops.selected_attention_applies = served_applies  # type: ignore[assignment]

    first = slice(0, 128)
    original = SparseMLA._on_tensor_cores
    SparseMLA._on_tensor_cores = lambda self, x: False  # type: ignore[assignment,method-assign]
    exact = run(False, first)  # the fp32 products (the CPU's form)
    SparseMLA._on_tensor_cores = original  # type: ignore[method-assign]
    row: dict = {"selected_tokens": tokens.shape[1], "counted_mean": float(counts.float().sum(1).mean())}
    for name, kernel in (("gathered", False), ("kernel", True)):
        ms = do_bench(lambda k=kernel: run(k), warmup=50, rep=300)
        row[name] = {"ms": round(ms, 3), "error": relative(run(kernel, first), exact)}
    row["speedup"] = round(row["gathered"]["ms"] / row["kernel"]["ms"], 2)
    q_abs = ops.split_product(q.transpose(0, 1), ops.split_bf16(mla.w_k)) * mla.scaling
    lat = ops.split_bf16(latents, not lo)
    served = triton_dsa.prompt_launch(torch.cuda.get_device_capability(), lo)
    default = dict(served)
    others = {f"launch_{k}": dict(v) for k, v in triton_dsa.PROMPT_LAUNCHES.items() if v != default}
    row["launch"], row["kernel_alone"] = default, {}
    for name, launch in {"default": default, **others, **(VARIANTS_LO if lo else VARIANTS)}.items():
        served.update({"heads_m": False, **launch})
        try:
            ms = do_bench(lambda: ops.selected_attention(q_abs, lat, tokens, counts), warmup=20, rep=200)
            row["kernel_alone"][name] = {"ms": round(ms, 3), "tflops": round(useful / ms / 1e9, 1)}
        except Exception as e:  # a launch that does not fit this GPU (shared memory, registers): say so
            row["kernel_alone"][name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        finally:
            served.clear()
            served.update(default)
        print(context, "lo" if lo else "bf16", name, row["kernel_alone"][name], flush=True)
    return row


INDEX_VARIANTS = {  # changes to the served launch (triton_dsa.index_launch), each timed beside it
    "ieee": {"precision": "ieee"},
    "pools32": {"pools": 32},
    "pools64": {"pools": 64},
    "pools128": {"pools": 128},
    "pools128_w8": {"pools": 128, "num_warps": 8},
    "queries4": {"queries": 4},
    "queries64": {"queries": 64},
    "warps8": {"num_warps": 8},
}


def index_case(context: int, t: int, gen: torch.Generator, keys_kind: str) -> dict:
    """The indexer's scores for a chunk of t queries ending at `context` (`--index`), its keys `keys_kind`: "fp32"
    an fp32 tensor (tf32x3 products; the prompt chunk's form before session 31), "bf16" / "fp8" the pool keys of a
    cache pool of that row type (the split bf16 form; fp8 keys as a bf16 copy with their scales). The torch form (a
    batched fp32 product per query, relu, a weighted sum over the heads, the mask; fp32 keys only) against the
    one-launch kernel under each launch: ms, and the largest difference from the float64 sums over the pools each
    query sees of the values the keys hold."""
    heads, dim, kpool = TEXT["index_n_heads"], TEXT["index_head_dim"], TEXT["index_kpool"]
    pools = context // kpool
    q = torch.randn(t, heads, dim, device="cuda", generator=gen)
    values = torch.randn(pools, dim, device="cuda", generator=gen) * 0.3
    keys: torch.Tensor | ops.PoolKeys = values[None]
    if keys_kind != "fp32":
        pool = KVPool(1, pools, dim, keys_kind, "cuda")
        pool.write(0, torch.arange(pools, device="cuda"), values)
        keys = ops.PoolKeys(pool, 0, slice(0, dim), torch.arange(pools, device="cuda")[None])
        values = keys.read()[0]
    head_w = torch.randn(t, heads, device="cuda", generator=gen) * heads**-0.5
    positions = torch.arange(context - t, context, device="cuda")
    args = (q, keys, head_w, positions, kpool, dim**-0.5)
    exact = torch.einsum("th,thp->tp", head_w.double(), torch.relu(torch.einsum("thd,pd->thp", q.double(),
        values.double()) * dim**-0.5))  # fmt: skip
    hidden = ops.reference.index_scores(*args) == torch.finfo(torch.float32).min

    def error(got: torch.Tensor) -> float:
        return relative(got.masked_fill(hidden, 0), exact.masked_fill(hidden, 0))

    row: dict = {"pools": pools, "gflop": round(2 * t * heads * pools * dim / 1e9, 2)}
    if keys_kind == "fp32":
        ms = do_bench(lambda: ops.reference.index_scores(*args), warmup=20, rep=200)
        row["torch"] = {"ms": round(ms, 3), "error": error(ops.reference.index_scores(*args))}
    served = triton_dsa.index_launch(
        torch.cuda.get_device_capability(), keys_kind != "fp32"
    )  # a chunk's bf16/fp8 keys: q's parts
    default = dict(served)
    for name, change in {"kernel": {}, **INDEX_VARIANTS}.items():
        if change and all(served.get(key) == value for key, value in change.items()):
            continue  # the served launch already
        if name == "ieee" and (keys_kind != "fp32" or context > 32768):  # fp32 keys' setting; 50x slower
            continue
        served.update(change)
        try:
            ms = do_bench(lambda: triton_dsa.index_scores(*args), warmup=20, rep=200)
            row[name] = {"ms": round(ms, 3), "error": error(triton_dsa.index_scores(*args)), "launch": dict(served)}
        except Exception as e:  # a launch that does not compile or fit: say so
            row[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        finally:
            served.clear()
            served.update(default)
        print(context, "index", keys_kind, name, row[name], flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="8192,32768")
    ap.add_argument("--tokens", type=int, default=2048, help="queries in the chunk")
    ap.add_argument("--tp", type=int, default=2, help="the heads are this share of the config's")
    ap.add_argument("--latents", default="bf16", help="bf16 (a bf16 cache's), lo (with a lo part), or both: bf16,lo")
    ap.add_argument("--index", action="store_true", help="the indexer's scores instead of the attention")
    ap.add_argument("--keys", default="fp32,bf16,fp8", help="--index: the keys' forms (fp32 tensor, bf16/fp8 pool)")
    ap.add_argument("--out", default="dsa_prompt.json")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    if args.index:
        result = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name()}
        rows: dict = {}
        for context in args.contexts.split(","):
            for kind in args.keys.split(","):
                rows.setdefault(context, {})[kind] = index_case(int(context), args.tokens, gen, kind)
                # written after each case: a capped run keeps what it finished
                Path(args.out).write_text(json.dumps({**result, "tokens": args.tokens, "index": rows}, indent=1))
        return 0
    heads = TEXT["num_attention_heads"] // args.tp
    mla = layer(heads, gen)
    result: dict = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "heads": heads,
        "tokens": args.tokens,
        "cases": {},
    }
    for kind in args.latents.split(","):
        for context in (int(c) for c in args.contexts.split(",")):
            row = case(mla, context, args.tokens, kind == "lo", gen)
            result["cases"][f"{kind}_{context}"] = row
            print(context, kind, {k: v for k, v in row.items() if k != "kernel_alone"}, flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
