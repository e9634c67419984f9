"""Engine benchmark on the GPU: the full-width GLM-5.3-Flash config at reduced depth, random bf16 weights.

    python bench/gpu_engine.py [--layers KKKD|released] [--exl3-experts] [--shard 2] [--out results.json]
                               [--small DEMO_DIR] [--tp2 auto|on|off]

Measures the decode step at batch 1..4 (after a 128-token prompt) three ways — the serving path replayed from CUDA
graphs (`graphs`), the same static step run op by op (`eager`), and the plain `model.decode` (`plain`) — with the
bytes a step must read and the fraction of HBM bandwidth that achieves (H200: 4.8 TB/s), and prefill throughput at
2k / 8k / 32k. Per-layer times: the graph step timed with the model cut to its first 0, 1, 3 and 4 layers (KKKD:
head alone, + a KDA layer with the dense MLP, + two KDA layers with the MoE, + a DSA layer with the MoE), so each
layer kind's time is a difference; projected to the full depth from the released config's pattern
(engine/checkpoint/glm53_flash_config.json: 45 layers, 3 KDA dense, 31 KDA MoE, 11 DSA MoE). With two GPUs
(`--tp2 auto`), the same per-layer times at TP=2 over NCCL (one process per GPU, graphs with the collectives
inside) and their projection to full depth. With --small, also decode tok/s of our engine (graphs and eager) vs
transformers' `generate` on the same demo checkpoint. Weights are generated on the GPU (no checkpoint on disk);
see docs/BENCHMARKS.md. The JSON is rewritten after every figure, so a run cut short keeps what it measured.

The served model at its real depth: `--layers released` builds the config's own 45 layers (its attention and MLP
pattern), `--exl3-experts` keeps the routed experts as random 4-bit mcg EXL3 banks (the served checkpoint's format,
the engine's EXL3 kernels) instead of bf16, and `--shard 2` builds rank 0's TP=2 share on this one GPU
(`ShardStandIn`): every kernel runs at the shapes a Spark of the pair runs, the collectives become local copies of
their size, and `gb10_projection` adds the link's share by arithmetic (collectives counted in one step).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.checkpoint.info import rank_share  # noqa: E402
from engine.checkpoint.layout import text_config, text_tensors  # noqa: E402
from engine.checkpoint.loader import load_dtype  # noqa: E402
from engine.models.glm5_next.config import TextConfig  # noqa: E402
from engine.models.glm5_next.model import Glm5NextForCausalLM  # noqa: E402
from engine.parallel import ParallelGroup, shard_range  # noqa: E402
from engine.quant import exl3  # noqa: E402
from engine.runner.lanes import LaneDecoder  # noqa: E402

HBM_BYTES_S = 4.8e12
GB10_BYTES_S = 273e9  # one Spark's LPDDR5x, nominal
GB10_CEILING_BYTES_S = 232e9  # its measured read ceiling (FACTS.md: ~231-234 GB/s)
GB10_BEST_FRACTION = 0.85  # of that ceiling: the best single-stream MoE decode measured there (FACTS.md: 85-90 %)
LINK_US = {"one-shot RoCE all-reduce": 23.0, "NCCL all-reduce": 60.0}  # one small collective, FACTS.md
BF16_PEAK_FLOPS = 989e12  # H200 SXM, dense bf16 tensor cores
BATCHES = (1, 2, 3, 4)
CUTS = (0, 1, 3, 4)  # layers kept for the per-layer times (KKKD: head, +K dense, +2 K MoE, +D MoE)
PROFILE = "--profile" in sys.argv
MODES = ("graphs", "eager", "plain")
PREFILL = True
LONG_CONTEXTS: tuple[int, ...] = ()
BREAKDOWN: tuple[int, ...] = ()
PROFILE_PREFILL: tuple[int, ...] = ()


class RandomReader:
    """Stands in for CheckpointReader: every tensor the layout names, drawn on the GPU at a sensible scale."""

    def __init__(self, raw: dict, dtype: torch.dtype, device: str, group: ParallelGroup | None = None) -> None:
        self.group = group or ParallelGroup.single(device)
        self.specs = {s.name: s for s in text_tensors(raw)}
        self.specs["lm_head.weight"] = (
            self.specs.get("lm_head.weight") or self.specs["model.language_model.embed_tokens.weight"]
        )
        self.dtype, self.device, self.path = dtype, device, Path("<random>")
        self.gen = torch.Generator(device=device).manual_seed(0)

    def has(self, name: str) -> bool:
        return name in self.specs

    def names(self) -> list[str]:
        return list(self.specs)

    def close(self) -> None:
        pass

    def get(self, name: str, dim: int | None = None, units: int | None = None) -> torch.Tensor:
        """The tensor drawn whole (the same on every rank: same seed, same order), then this rank's share of it
        (as CheckpointReader.get: `units` equal blocks of `dim`)."""
        full = self._draw(name)
        if dim is None or self.group.world == 1:
            return full
        units = units or full.shape[dim]
        width = full.shape[dim] // units
        start, stop = shard_range(units, self.group.rank, self.group.world)
        share = full.narrow(dim, start * width, (stop - start) * width)
        # a copy of its own: a view would keep the whole tensor's storage alive (the memory, and the bytes counted)
        return torch.empty_like(share, memory_format=torch.contiguous_format).copy_(share)

    def _draw(self, name: str) -> torch.Tensor:
        shape = self.specs[name].shape
        dtype = load_dtype(name, self.dtype)  # as CheckpointReader reads it
        if name.endswith(("norm.weight", "_scale", "o_norm.weight")) or name.endswith("layernorm.weight"):
            return torch.ones(shape, dtype=dtype, device=self.device)
        if name.endswith(("A_log", "_base", "e_score_correction_bias", "compress_ape", "k_norm.bias")):
            return torch.zeros(shape, dtype=dtype, device=self.device)
        std = 1.0 if "embed_tokens" in name else 1 / math.sqrt(shape[-1])
        return (torch.randn(shape, generator=self.gen, device=self.device) * std).to(dtype)


class ShardStandIn(ParallelGroup):
    """Rank 0 of a `world`-rank tensor-parallel group, alone on one GPU (a bench stand-in: the second GPU, or the
    Sparks' link, is not here). The weights are rank 0's share, so every kernel runs at the shard's shapes; a
    collective becomes a local copy of the size it would gather (the other ranks' parts are rank 0's own, so the
    numbers are not the model's, the work is). The step then times the shard's compute and memory traffic, not the
    link: `calls` and `bytes` count the collectives, for the link's share added by arithmetic."""

    calls: int = 0
    bytes: int = 0

    def _gather_flat(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.bytes += tensor.numel() * tensor.element_size()
        return tensor.contiguous().reshape(1, *tensor.shape).expand(self.world, *tensor.shape).clone()

    def all_agree(self, ok: bool) -> bool:
        return ok

    def broadcast_object(self, obj=None):
        return obj

    def all_gather_object(self, obj) -> list:
        return [obj] * self.world


def random_expert_banks(reader: RandomReader, prefix: str, experts: int) -> tuple[exl3.Exl3Bank, exl3.Exl3Bank]:
    """Stands in for engine/checkpoint/exl3.py `read_expert_banks`: a MoE layer's routed experts as random 4-bit mcg
    EXL3 banks (the served checkpoint's format; any trellis bitstream is a valid encoding), this rank's whole-block
    TP share of the expert width (gate/up by outputs, down by inputs)."""
    from exl3_prompt_bench import random_bank

    width, hidden = reader.specs[f"{prefix}experts.0.gate_proj.weight"].shape
    start, stop = shard_range(width // exl3.HADAMARD_BLOCK, reader.group.rank, reader.group.world)
    share = (stop - start) * exl3.HADAMARD_BLOCK
    return random_bank(2 * experts, hidden, share, reader.gen), random_bank(experts, share, hidden, reader.gen)


def weight_bytes(model: Glm5NextForCausalLM, held: int) -> tuple[int, int, int]:
    """(bytes a decode step reads whatever the routing, bytes of one routed expert, weights of one routed expert),
    from the `held` weight bytes: everything but the routed experts (an embedding lookup reads one row, so the table
    is left out too). EXL3 experts: their trellis and scales."""
    moes = [layer.mlp for layer in model.layers if hasattr(layer.mlp, "num_routed")]
    expert = weights = 0
    if moes and moes[0].exl3 is not None:
        parts = ((moes[0].exl3.gate_up, 2), (moes[0].exl3.down, 1))  # gate and up: two matrices an expert
        expert = sum(n * sum(t[0].nbytes for t in (b.trellis, b.suh, b.svh)) for b, n in parts)
        weights = sum(n * b.suh.shape[1] * b.svh.shape[1] for b, n in parts)
    elif moes and moes[0].stacked is not None:
        expert = sum(t[0].numel() * t.element_size() for t in moes[0].stacked)
        weights = sum(t[0].numel() for t in moes[0].stacked)
    routed = sum(moe.num_routed for moe in moes) * expert  # a bf16 bank may also hold the shared expert: read always
    return held - routed - model.embed.numel() * model.embed.element_size(), expert, weights


RESULT: dict = {}
OUT: Path | None = None
DENSE = "bf16"  # --dense: how the dense weights are kept (engine/quant/dense.py)
EXL3 = False  # --exl3-experts
SHARD = 1  # --shard
PREFILL_LENGTHS = (2048, 8192, 32768)
PREFILL_REPEATS = 3
PREFILL_CHUNK = 2048  # --prefill-chunk: prompt tokens a prefill step (the engine's GPU default)
PRECISION = False  # --prompt-precision


def save() -> None:
    """Rewrite the JSON with everything measured so far."""
    if OUT is not None:
        OUT.write_text(json.dumps(RESULT, indent=1))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeat: int) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync()
    return (time.perf_counter() - start) / repeat


def text_config_for(layers: str, config: Path, mtp: bool = False) -> dict:
    """`config`'s text config cut to `layers` (K: KDA, D: DSA; the first layer's MLP dense, the rest MoE;
    `released`: as it is), with the MTP layer when `mtp`."""
    raw = json.loads(config.read_text())
    text = dict(raw.get("text_config") or raw)
    kinds = {"K": "linear_attention", "D": "full_attention"}
    if layers != "released":
        text.update(
            num_hidden_layers=len(layers),
            layer_types=[kinds[c] for c in layers],
            mlp_layer_types=["dense"] + ["sparse"] * (len(layers) - 1),
            indexer_types=["full"] * len(layers),
        )
    text.update(num_nextn_predict_layers=int(mtp))
    return text


def build(
    layers: str,
    device: str,
    config: Path,
    group: ParallelGroup | None = None,
    mtp: bool = False,
    exl3_experts: bool = False,
    shard: int = 1,
    dense: str | None = None,
):
    """The full-width model with `layers` (K: KDA, D: DSA; the first layer's MLP dense, the rest MoE; `released`:
    the config's own layers), random weights (this rank's share of them under `group`; `shard` > 1 without a group:
    rank 0's share of that many, on this device, `ShardStandIn`), the routed experts EXL3 when `exl3_experts`, with
    the MTP layer loaded to draft when `mtp`, the dense weights kept as `dense` (default: --dense); (model, cfg)."""
    raw = {"text_config": text_config_for(layers, config, mtp)}
    cfg = TextConfig.from_dict(raw)
    if group is None:
        group = ShardStandIn(0, shard, torch.device(device)) if shard > 1 else ParallelGroup.single(device)
    reader = RandomReader(raw, torch.bfloat16, device, group)
    dense = dense or DENSE
    if not exl3_experts:
        return Glm5NextForCausalLM(cfg, reader, group, mtp=mtp, dense=dense), cfg
    from engine.models.glm5_next import moe

    served = moe.read_expert_banks
    moe.read_expert_banks = random_expert_banks  # type: ignore[assignment]
    try:
        return Glm5NextForCausalLM(cfg, reader, group, mtp=mtp, dense=dense), cfg
    finally:
        moe.read_expert_banks = served


def prompt_ids(cfg: TextConfig, n: int) -> list[int]:
    return [(i * 7919) % (cfg.vocab_size - 20) + 10 for i in range(n)]


def lane_inputs(ids: list[int], batch: int) -> tuple[list[list[int]], list[int]]:
    """Each lane's 128-token prompt and next token, different for every lane (from `ids`, ≥ 128 × batch tokens), so
    the lanes' tokens route to different experts as distinct streams do: identical lanes would all read one token's
    experts."""
    return [ids[128 * lane : 128 * (lane + 1)] for lane in range(batch)], [11 + 7 * lane for lane in range(batch)]


def engine_full_width(layers: str, device: str, config: Path) -> dict:
    model, cfg = build(layers, device, config, exl3_experts=EXL3, shard=SHARD)
    held = torch.cuda.memory_allocated() if device == "cuda" else 0
    fixed, expert, expert_weights = weight_bytes(model, held)
    out = RESULT.setdefault("full_width", {})
    out.update(
        layers=layers if layers != "released" else f"released ({cfg.num_hidden_layers} layers)",
        weights_gib=round(held / 2**30, 1),
        routed_expert_mb=round(expert / 1e6, 2),
    )
    save()
    longest = max(LONG_CONTEXTS, default=0)  # the long-context steps' prompts (and their span) must fit
    pool = model.make_pool(max(40_000, longest + 64) if device == "cuda" else max(2048, longest + 64), "bf16")
    ids = prompt_ids(cfg, max(32768 if device == "cuda" else 512, longest))
    decoders = {
        "graphs": LaneDecoder(model, pool, 4, graphs=device == "cuda"),
        "eager": LaneDecoder(model, pool, 4, graphs=False),
    }
    moe_layers = sum(t == "sparse" for t in cfg.mlp_layer_types)
    stand_in = model.group if isinstance(model.group, ShardStandIn) else None
    for batch in BATCHES:
        unique = min(cfg.n_routed_experts, batch * cfg.num_experts_per_tok)
        read = fixed + moe_layers * unique * expert
        figures = out[f"decode_b{batch}"] = {"bytes_read_gb": round(read / 1e9, 2)}
        for mode in MODES:
            decoder = decoders.get(mode)
            seqs = [decoder.new_sequence(lane) if decoder else model.new_sequence(pool) for lane in range(batch)]
            prompts, tokens = lane_inputs(ids, batch)
            for s, prompt in zip(seqs, prompts):
                model.prefill(s, prompt)
            decode = decoder.decode if decoder else model.decode
            if stand_in is not None and mode == "eager":  # the collectives one step makes (eager: every call seen)
                stand_in.calls = stand_in.bytes = 0
                decode(seqs, tokens)
                figures["collectives"] = {"calls": stand_in.calls, "kib": round(stand_in.bytes / 1024, 1)}
            decode(seqs, tokens)  # the graph is captured here
            step = timed(lambda: decode(seqs, tokens), 10)
            figures[mode] = {
                "step_ms": round(step * 1e3, 2),
                "tok_s": round(batch / step, 1),
                "hbm_fraction": round(read / step / HBM_BYTES_S, 3),
            }
            for s in seqs:
                s.release()
            print(f"decode batch {batch} {mode}: {figures[mode]}", flush=True)
            save()
        if device == "cuda" and "graphs" in MODES and not decoders["graphs"].uses_graphs:
            figures["graphs"]["fell_back_to_eager"] = True
        if "graphs" in figures and "collectives" in figures and held:  # the CPU holds no measured bytes
            figures["gb10_projection"] = gb10_projection(
                read, figures["graphs"]["step_ms"] / 1e3, figures["collectives"]["calls"], batch
            )
            save()
    if "graphs" in MODES:
        out["decode_b1"]["graphs_read_back"] = read_back_decode(model, decoders["graphs"], ids)
        print(f"decode batch 1, graphs, each token read back: {out['decode_b1']['graphs_read_back']}", flush=True)
        save()
    del decoders
    if PROFILE:
        out["profile_b1"] = profile_step(model, pool, ids, graphs=device == "cuda")
        save()
    if layers == "KKKD" and MODES:
        cuts = layer_cut_times(model, pool, ids, graphs=device == "cuda")
        out["per_layer_ms"] = per_layer(cuts)
        out["full_depth"] = full_depth(out["per_layer_ms"], config, world=SHARD, exl3_experts=EXL3)
        print(f"per layer (ms): {out['per_layer_ms']}\nfull depth: {out['full_depth']}", flush=True)
        save()
    if LONG_CONTEXTS:
        out["decode_long_context"] = long_context_decode(model, pool, ids, LONG_CONTEXTS, graphs=device == "cuda")
        save()
    if BREAKDOWN:
        out["prefill_breakdown"] = prefill_breakdown(model, pool, ids, BREAKDOWN)
        save()
    if PROFILE_PREFILL:
        out["prefill_profile"] = profile_prefill(model, pool, ids, PROFILE_PREFILL)
        save()
    if PRECISION and device == "cuda":
        out["dsa_prompt_precision"] = prompt_attention_precision(model, pool, ids, 8192)
        save()
    if PREFILL:
        # matmul FLOPs a prompt token costs: 2 per weight it multiplies (a bf16 weight's 2 bytes), the LM head left
        # out (a chunk's logits are its last token's), top_k routed experts a MoE layer; attention and the delta
        # rule are not counted, so the fraction of peak is a floor
        # (dense weights counted from bf16 bytes: with DENSE q4 / fp8 only the rates are given)
        head = model.lm_head.numel() * model.lm_head.element_size() if DENSE == "bf16" else 0
        bf16 = held and DENSE == "bf16"
        routed = moe_layers * cfg.num_experts_per_tok * 2 * expert_weights
        flops = fixed - head + routed if bf16 else 0  # CPU: not counted
        lengths = PREFILL_LENGTHS if device == "cuda" else (256,)
        out["prefill"] = prefill_rates(model, pool, ids, lengths, flops, PREFILL_REPEATS)
        save()
    return out


def read_back_decode(model: Glm5NextForCausalLM, decoder: LaneDecoder, ids: list[int], steps: int = 32) -> dict:
    """Greedy decoding at batch 1 as a client sees it: each step's token read back to the host and fed to the next
    (the serving path's step; `decode_bN` above times steps that feed a fixed token)."""
    seq = decoder.new_sequence(0)
    try:
        nxt = [int(model.prefill(seq, ids[:128]).argmax())]
        step = lambda: nxt.__setitem__(0, int(decoder.decode([seq], nxt)[0].argmax()))  # noqa: E731
        step()
        per = timed(step, steps)
    finally:
        seq.release()
    return {"step_ms": round(per * 1e3, 2), "tok_s": round(1 / per, 1)}


def transformers_warm(layers: str, config: Path, lengths: tuple[int, ...], new_tokens: int = 32) -> dict:
    """transformers' own glm5_next (the numerical reference) at the same config, random bf16 weights on the GPU, its
    defaults, measured warm (one untimed call of each kind first): greedy decode through `generate` (which reads each
    token back), the prompt's share taken out; one prompt of each length in a single forward (the last token's
    logits only), median of 3."""
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

    text = text_config_for(layers, config)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            ref = Glm5NextForConditionalGeneration(Glm5NextConfig(text_config=text)).eval()
    finally:
        torch.set_default_dtype(default)
    ids = torch.tensor([prompt_ids(TextConfig.from_dict({"text_config": text}), max(lengths))], device="cuda")
    out: dict = {"transformers": __import__("transformers").__version__}
    with torch.no_grad():
        prompt = ids[:, :128]

        def generate(n: int) -> None:
            ref.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)

        generate(4)
        first, whole = timed(lambda: generate(1), 3), timed(lambda: generate(new_tokens + 1), 2)
        out["decode_tok_s"] = round(new_tokens / (whole - first), 1)
        print(f"transformers decode (warm): {out['decode_tok_s']} tok/s", flush=True)
        for length in lengths:
            forward = functools.partial(ref, input_ids=ids[:, :length], logits_to_keep=1)
            forward()
            runs = sorted(length / timed(forward, 1) for _ in range(3))
            out[f"prefill_t{length}_tok_s"] = round(runs[1], 1)
            print(f"transformers prefill {length} (warm): {runs[1]:.1f} tok/s", flush=True)
    return out


def gb10_projection(read: int, step_s: float, collectives: int, batch: int) -> dict:
    """A decode step of this shard projected to one Spark of a TP=2 pair, three ways, each plus the link's share
    (`collectives` small collectives a step at each measured latency, FACTS.md):
    - `at_h200_efficiency`: the bytes at the GB10's nominal bandwidth times the fraction of HBM this step reached on
      the H200. Pessimistic: a step that is bound by kernel latency on the H200 (batch 1 is) is not bound by it in
      proportion to its bytes;
    - `at_best_gb10_decode`: the bytes at the best MoE decode measured on a GB10 (85 % of its ~232 GB/s ceiling).
      Optimistic: every kernel as bandwidth-bound as the best one there;
    - `best_plus_h200_latency`: that, plus the time the H200 step took beyond its own bytes at 85 % of HBM (its
      latency, carried over as it is)."""
    efficiency = read / step_s / HBM_BYTES_S
    bound = read / (GB10_CEILING_BYTES_S * GB10_BEST_FRACTION)
    latency = max(0.0, step_s - read / (HBM_BYTES_S * GB10_BEST_FRACTION))
    memory_ms = {
        "at_h200_efficiency": read / (GB10_BYTES_S * efficiency) * 1e3,
        "at_best_gb10_decode": bound * 1e3,
        "best_plus_h200_latency": (bound + latency) * 1e3,
    }
    out: dict = {
        "bytes_read_gb": round(read / 1e9, 3),
        "h200_efficiency": round(efficiency, 3),
        "memory_ms": {k: round(v, 2) for k, v in memory_ms.items()},
        "link_ms": {name: round(collectives * us / 1e3, 2) for name, us in LINK_US.items()},
    }
    for memory, ms in memory_ms.items():
        for link, us in LINK_US.items():
            out[f"tok_s {memory}, {link}"] = round(batch / (ms + collectives * us / 1e3) * 1e3, 1)
    return out


def long_context_decode(
    model: Glm5NextForCausalLM, pool, ids: list[int], contexts: tuple[int, ...], graphs: bool, steps: int = 10
) -> dict:
    """The batch-1 serving step (graphs on a GPU) after a prompt of each length: step ms and the span it read (the
    DSA layers' cost grows with it), and the prompt's own time in 2,048-token chunks (its first chunks' compiles
    included for the first length) and on a GPU the most memory its chunks took beyond what was allocated before
    (weights, pool, lanes: what the serve's memory reserve must hold)."""
    out: dict = {}
    decoder = LaneDecoder(model, pool, 1, graphs=graphs)
    for context in contexts:
        seq = decoder.new_sequence(0)
        try:
            sync()
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
                held = torch.cuda.memory_allocated()
            start = time.perf_counter()
            for chunk in range(0, context, 2048):
                model.prefill(seq, ids[chunk : min(context, chunk + 2048)])
            sync()
            prompt_s = time.perf_counter() - start
            beyond = torch.cuda.max_memory_allocated() - held if torch.cuda.is_available() else None
            decoder.decode([seq], [11])  # captures this span's graph
            step = timed(lambda: decoder.decode([seq], [11]), steps)
            out[f"t{context}"] = {
                "step_ms": round(step * 1e3, 2),
                "span": decoder.span_for(seq.length + 1),
                "prompt_s": round(prompt_s, 3),
                "prompt_tok_s": round(context / prompt_s, 1),
                "prompt_peak_beyond_gib": None if beyond is None else round(beyond / 2**30, 3),
            }
        except torch.OutOfMemoryError as exc:
            out[f"t{context}"] = f"out of memory: {str(exc).splitlines()[0]}"
        finally:
            seq.release()
        print(f"decode after {context}: {out[f't{context}']}", flush=True)
    return out


def prefill_breakdown(model: Glm5NextForCausalLM, pool, ids: list[int], contexts: tuple[int, ...]) -> dict:
    """Where one 2,048-token prompt chunk's time goes when it ends at each context: per layer its attention, its
    MLP, and the rest of the layer (hyper-connections, norms), ms. Each part is synchronised on its own, so the parts
    add up to a little more than the chunk takes plainly."""
    out: dict = {}
    for context in contexts:
        seq = model.new_sequence(pool)
        for chunk in range(0, context - 2048, 2048):
            model.prefill(seq, ids[chunk : chunk + 2048])
        parts: dict[str, float] = {}

        def timing(name: str, fn):
            def run(*args, **kwargs):
                sync()
                start = time.perf_counter()
                result = fn(*args, **kwargs)
                sync()
                parts[name] = parts.get(name, 0.0) + (time.perf_counter() - start) * 1e3
                return result

            return run

        mlps = [layer.mlp for layer in model.layers]
        layer_calls = []
        for i, layer in enumerate(model.layers):
            kind = "dsa" if layer.is_dsa else "kda"
            layer.attn.prefill = timing(f"{i} {kind} attention", layer.attn.prefill)  # shadows the method
            layer.mlp = timing(f"{i} {type(layer.mlp).__name__}", layer.mlp)
            layer_calls.append(layer.forward)
            layer.forward = timing(f"{i} whole layer", layer.forward)
        try:
            sync()
            start = time.perf_counter()
            model.prefill(seq, ids[context - 2048 : context])
            sync()
            total = (time.perf_counter() - start) * 1e3
        finally:
            for layer, mlp, forward in zip(model.layers, mlps, layer_calls):
                del layer.attn.prefill
                layer.mlp, layer.forward = mlp, forward
            seq.release()
        for i, layer in enumerate(model.layers):
            kind = "dsa" if layer.is_dsa else "kda"
            whole = parts.pop(f"{i} whole layer")
            parts[f"{i} rest of the layer"] = (
                whole - parts[f"{i} {kind} attention"] - parts[f"{i} {type(layer.mlp).__name__}"]
            )
        out[f"t{context}"] = {"chunk_ms": round(total, 1), **{k: round(v, 1) for k, v in parts.items()}}
        print(f"prefill chunk ending at {context}: {out[f't{context}']}", flush=True)
    return out


def gpu_kernels(prof) -> list:
    """A torch.profiler run's kernels (names with GPU time), the most GPU time first."""
    return sorted((e for e in prof.key_averages() if e.device_time_total > 0), key=lambda e: -e.device_time_total)


def profile_prefill(model: Glm5NextForCausalLM, pool, ids: list[int], contexts: tuple[int, ...]) -> dict:
    """The 2,048-token prompt chunk ending at each context under torch.profiler (after the same prompt once
    unprofiled, so compiles and autotunes are done): GPU time per kernel name (its launches; the 60 largest), the
    kernels' total and the chunk's wall time meanwhile (under the profiler)."""
    if not torch.cuda.is_available():
        return {"skipped": "no GPU"}
    out: dict = {}
    for context in contexts:
        for profiled in (False, True):
            seq = model.new_sequence(pool)
            try:
                for chunk in range(0, context - 2048, 2048):
                    model.prefill(seq, ids[chunk : chunk + 2048])
                last = ids[context - 2048 : context]
                sync()
                if not profiled:
                    model.prefill(seq, last)
                    continue
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    wall = timed(lambda: model.prefill(seq, last), 1)
            finally:
                seq.release()
        kernels = gpu_kernels(prof)
        table = [
            {"kernel": e.key[:100], "launches": e.count, "ms": round(e.device_time_total / 1e3, 2)}
            for e in kernels[:60]
        ]
        out[f"t{context}"] = {
            "wall_ms": round(wall * 1e3, 1),
            "kernel_ms": round(sum(e.device_time_total for e in kernels) / 1e3, 1),
            "launches": sum(e.count for e in kernels),
            "top": table,
        }
        print(f"prefill chunk ending at {context}: wall {wall * 1e3:.1f} ms", flush=True)
        for row in table:
            print(f"{row['ms']:9.2f} ms  x{row['launches']:<6} {row['kernel']}", flush=True)
    return out


def prompt_logits(model: Glm5NextForCausalLM, pool, ids: list[int], length: int) -> torch.Tensor:
    """The last logits of one `length`-token prompt, prefilled in 2,048-token chunks as the rate figures are."""
    seq = model.new_sequence(pool)
    try:
        for chunk in range(0, length, 2048):
            logits = model.prefill(seq, ids[chunk : chunk + 2048])
        return logits
    finally:
        seq.release()


def prompt_attention_precision(model: Glm5NextForCausalLM, pool, ids: list[int], length: int) -> dict:
    """How far DSA's prompt attention on the tensor cores (`ops.split_product`, the CUDA default for prompt chunks)
    lands from the fp32 products it replaced, on the bench's own prompt: every `_attend` / `_attend_selected` call
    of one `length`-token prompt runs both ways (the fp32 result goes on), each call's max |difference| / max
    |fp32|."""
    from engine.models.glm5_next.dsa import SparseMLA

    errors: dict[str, list[float]] = {"dense_regime": [], "selected_tokens": []}
    plain = {"dense_regime": SparseMLA._attend, "selected_tokens": SparseMLA._attend_selected}
    gate = SparseMLA._on_tensor_cores

    def both(kind: str):
        def run(self, *args):
            SparseMLA._on_tensor_cores = lambda self, q: False
            want = plain[kind](self, *args)
            SparseMLA._on_tensor_cores = gate
            got = plain[kind](self, *args)
            errors[kind].append(float((got - want).abs().max() / want.abs().max()))
            return want

        return run

    SparseMLA._attend, SparseMLA._attend_selected = both("dense_regime"), both("selected_tokens")
    try:
        prompt_logits(model, pool, ids, length)
    finally:
        SparseMLA._attend, SparseMLA._attend_selected = plain["dense_regime"], plain["selected_tokens"]
        SparseMLA._on_tensor_cores = gate
    out = {
        "prompt_tokens": length,
        **{k: {"calls": len(v), "max_relative": max(v, default=None)} for k, v in errors.items()},
    }
    print(f"DSA prompt attention, split bf16 vs fp32: {out}", flush=True)
    return out


def prefill_rates(
    model: Glm5NextForCausalLM, pool, ids: list[int], lengths: tuple[int, ...], flops_per_token: int, repeats: int = 3
) -> dict:
    """One stream's prompt in chunks of PREFILL_CHUNK tokens (2,048, the engine's GPU default, unless
    --prefill-chunk): one untimed prompt first (compiles, autotunes, allocator), then each length `repeats` times;
    tok/s of every run, the median, and the median's fraction of the H200's bf16 peak."""

    def once(length: int) -> float:
        seq = model.new_sequence(pool)
        try:
            sync()
            start = time.perf_counter()
            for chunk in range(0, length, PREFILL_CHUNK):
                model.prefill(seq, ids[chunk : chunk + PREFILL_CHUNK])
            sync()
            return length / (time.perf_counter() - start)
        finally:
            seq.release()

    out: dict = {
        "chunk": PREFILL_CHUNK,
        "kda_prompt_form": model.kda_prompt_form,
        "matmul_gflop_per_token": round(flops_per_token / 1e9, 3),
    }
    once(min(lengths))
    for length in lengths:
        try:
            runs = sorted(once(length) for _ in range(repeats))
        except torch.OutOfMemoryError as exc:
            out[f"t{length}"] = f"out of memory: {str(exc).splitlines()[0]}"
            continue
        median = runs[(len(runs) - 1) // 2]  # of an even count, the lower middle
        out[f"t{length}"] = {
            "tok_s": round(median, 1),
            "runs": [round(r, 1) for r in runs],
            "bf16_peak_fraction": round(median * flops_per_token / BF16_PEAK_FLOPS, 4) if flops_per_token > 0 else None,
        }
        print(f"prefill {length}: {out[f't{length}']}", flush=True)
    return out


def profile_step(model: Glm5NextForCausalLM, pool, ids: list[int], graphs: bool, steps: int = 5) -> dict:
    """The batch-1 serving step (graph replays on a GPU) under torch.profiler (`profile_calls`)."""
    if not torch.cuda.is_available():
        return {"skipped": "no GPU"}
    decoder = LaneDecoder(model, pool, 1, graphs=graphs)
    seq = decoder.new_sequence(0)
    model.prefill(seq, ids[:128])
    decoder.decode([seq], [11])
    out = profile_calls(lambda: decoder.decode([seq], [11]), steps)
    seq.release()
    return out


def profile_calls(fn, steps: int) -> dict:
    """`fn` (warmed up: compiled, captured) `steps` times under torch.profiler: GPU time per kernel name (with its
    launches a call; the 40 largest), the kernels a call, their GPU time a call, and the wall time of a call
    meanwhile."""
    sync()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        wall = timed(fn, steps)
    kernels = gpu_kernels(prof)
    total = sum(e.device_time_total for e in kernels) / steps
    table = [
        {
            "kernel": e.key[:90],
            "per_step": round(e.count / steps, 1),
            "us_per_step": round(e.device_time_total / steps, 1),
        }
        for e in kernels[:40]
    ]
    for row in table:
        print(f"{row['us_per_step']:9.1f} us  x{row['per_step']:<6} {row['kernel']}", flush=True)
    return {
        "wall_ms": round(wall * 1e3, 3),
        "kernel_us": round(total, 1),
        "kernels_per_step": round(sum(e.count for e in kernels) / steps, 1),
        "top": table,
    }


def layer_cut_times(model: Glm5NextForCausalLM, pool, ids: list[int], graphs: bool, repeat: int = 10) -> dict:
    """Decode step (ms) per batch with the model cut to its first k layers, k in CUTS (graphs on a GPU)."""
    layers, times = model.layers, {}
    try:
        for k in CUTS:
            model.layers = layers[:k]
            decoder = LaneDecoder(model, pool, max(BATCHES), graphs=graphs)
            times[k] = {}
            for batch in BATCHES:
                seqs = [decoder.new_sequence(lane) for lane in range(batch)]
                prompts, tokens = lane_inputs(ids, batch)
                for s, prompt in zip(seqs, prompts):
                    model.prefill(s, prompt)
                decoder.decode(seqs, tokens)  # capture
                # the best of 3 rounds: the per-layer figures are differences of these, so noise counts double
                step = functools.partial(decoder.decode, seqs, tokens)
                times[k][batch] = min(timed(step, repeat) for _ in range(3)) * 1e3
                for s in seqs:
                    s.release()
            if graphs and not decoder.uses_graphs:
                times["fell_back_to_eager"] = True
            del decoder
    finally:
        model.layers = layers
    return times


def per_layer(cuts: dict) -> dict:
    """Per layer kind and batch (ms): the head (embedding, final norm, LM head, vocab gather) and the marginal
    time of each layer kind, from the cut times of KKKD."""
    kinds = {
        "head": lambda b: cuts[0][b],
        "kda_dense": lambda b: cuts[1][b] - cuts[0][b],
        "kda_moe": lambda b: (cuts[3][b] - cuts[1][b]) / 2,
        "dsa_moe": lambda b: cuts[4][b] - cuts[3][b],
    }
    out = {kind: {f"b{b}": round(f(b), 3) for b in BATCHES} for kind, f in kinds.items()}
    if cuts.get("fell_back_to_eager"):
        out["fell_back_to_eager"] = True
    return out


def layer_counts(config: Path) -> dict[str, int]:
    """How many layers of each measured kind the released model has."""
    cfg = text_config(json.loads(config.read_text()))
    counts = {"kda_dense": 0, "kda_moe": 0, "dsa_moe": 0, "dsa_dense": 0}
    for i in range(cfg["num_hidden_layers"]):
        attention = "kda" if cfg["layer_types"][i] == "linear_attention" else "dsa"
        mlp = "dense" if (cfg.get("mlp_layer_types") or [])[i : i + 1] == ["dense"] else "moe"
        counts[f"{attention}_{mlp}"] += 1
    return counts


def full_depth_bytes(config: Path, world: int, batch: int) -> int:
    """Weight bytes one rank reads in a decode step of the released model (bf16; the embedding table is left out: a
    lookup reads one row; routed experts: the distinct ones of `batch` tokens, at most top-k each)."""
    raw = json.loads(config.read_text())
    text = dict(raw.get("text_config") or raw)
    text["num_nextn_predict_layers"] = 0
    raw = {"text_config": text}
    cfg = text_config(raw)
    unique = min(cfg["n_routed_experts"], batch * cfg["num_experts_per_tok"])
    total = 0
    for spec in text_tensors(raw):
        if spec.name.endswith("embed_tokens.weight"):
            continue
        share = rank_share(spec, raw, 0, world)
        if ".mlp.experts." in spec.name:  # every routed expert alike: count `unique` of them per layer
            if spec.name.split(".mlp.experts.")[1].startswith("0."):
                total += share * unique
            continue
        total += share
    return total


def full_depth(per: dict, config: Path, world: int, exl3_experts: bool = False) -> dict:
    """The decode step of the released depth: head + Σ count × per-layer time (the measured kinds), per batch;
    with the bytes one rank must read and the HBM fraction that time achieves (bf16 weights: not counted for EXL3
    experts; `--layers released` measures those)."""
    counts = layer_counts(config)
    if counts.pop("dsa_dense"):
        return {"skipped": "the config has DSA layers with a dense MLP, a kind not measured"}
    out = {"layers": counts}
    for b in BATCHES:
        ms = per["head"][f"b{b}"] + sum(n * per[kind][f"b{b}"] for kind, n in counts.items())
        out[f"b{b}"] = {"step_ms": round(ms, 2), "tok_s": round(b / ms * 1e3, 1)}
        if not exl3_experts:
            read = full_depth_bytes(config, world, b)
            out[f"b{b}"].update(
                bytes_read_gb_per_rank=round(read / 1e9, 2), hbm_fraction=round(read / (ms / 1e3) / HBM_BYTES_S, 3)
            )
    return out


def tp2_rank(args: argparse.Namespace) -> None:
    """One rank of the TP=2 per-layer run (started by `tp2_per_layer`): rank 0 writes the cut times."""
    device = f"cuda:{args.tp_rank}" if torch.cuda.is_available() else "cpu"
    if device != "cpu":
        torch.cuda.set_device(device)
    group = ParallelGroup.init(2, args.tp_rank, "127.0.0.1", args.tp_port, device=device, timeout_s=120)
    model, cfg = build(args.layers, device, Path(args.config), group)
    held = torch.cuda.memory_allocated() if device != "cpu" else 0
    pool = model.make_pool(4096, "bf16")
    cuts = layer_cut_times(model, pool, prompt_ids(cfg, 128 * max(BATCHES)), graphs=device != "cpu")
    if args.tp_rank == 0:
        Path(args.tp_out).write_text(json.dumps({"cuts": cuts, "weights_gib_per_rank": round(held / 2**30, 1)}))
    sync()
    from engine.parallel import exit_process

    exit_process(0)  # no backend teardown: it can abort (gloo) or hang (NCCL after graphs); see exit_process


def tp2_per_layer(layers: str, config: Path, timeout_s: float) -> dict:
    """Per-layer times at TP=2 over NCCL (two GPUs; gloo on the CPU for a smoke run): two processes, bounded."""
    from socket import socket

    with socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    part = (
        Path(tempfile.gettempdir()) / f"gpu_engine-tp2-{os.getpid()}.json"
    )  # rank 0's figures (not in --out's folder)
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--layers",
                layers,
                "--config",
                str(config),
                "--tp-rank",
                str(r),
                "--tp-port",
                str(port),
                "--tp-out",
                str(part),
            ],
            env=env,
        )
        for r in (0, 1)
    ]
    deadline, codes = time.monotonic() + timeout_s, []
    try:
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append("timed out")
    finally:  # also on Ctrl-C / the final run's SIGINT: never leave a rank holding a GPU
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    if codes != [0, 0] or not part.exists():
        return {"failed": f"TP=2 ranks exited {codes}"}
    got = json.loads(part.read_text())
    part.unlink()
    cuts = {
        int(k) if k.isdigit() else k: ({int(b): v for b, v in t.items()} if isinstance(t, dict) else t)
        for k, t in got["cuts"].items()
    }
    per = per_layer(cuts)
    return {
        "weights_gib_per_rank": got["weights_gib_per_rank"],
        "per_layer_ms": per,
        "full_depth": full_depth(per, config, world=2),
    }


def small_vs_transformers(path: str) -> dict:
    from transformers import Glm5NextForConditionalGeneration

    model = Glm5NextForCausalLM.load(path, ParallelGroup.single("cuda"))
    pool = model.make_pool(2048, "bf16")
    ids = list(range(5, 133))
    ours = {
        mode: read_back_decode(model, LaneDecoder(model, pool, 1, graphs=mode == "graphs"), ids)["tok_s"]
        for mode in ("graphs", "eager")
    }
    ref = Glm5NextForConditionalGeneration.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    prompt = torch.tensor([ids], device="cuda")
    ref.generate(prompt, max_new_tokens=4, do_sample=False)
    torch.cuda.synchronize()
    start = time.perf_counter()
    ref.generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    torch.cuda.synchronize()
    theirs = 32 / (time.perf_counter() - start)
    return {
        "ours_decode_tok_s": round(ours["graphs"], 1),
        "ours_eager_decode_tok_s": round(ours["eager"], 1),
        "transformers_generate_tok_s": round(theirs, 1),
        "speedup": round(ours["graphs"] / theirs, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="KKKD", help="K/D letters (KDA/DSA layers), or 'released': the config's own")
    ap.add_argument("--exl3-experts", action="store_true", help="routed experts as random 4-bit EXL3 banks (GPU)")
    ap.add_argument("--shard", type=int, default=1, help="rank 0's TP share of this many ranks, on this one GPU")
    ap.add_argument("--prefill-lengths", default="2048,8192,32768", help="prompt lengths timed (GPU)")
    ap.add_argument("--prefill-repeats", type=int, default=3, help="runs of each prompt length (the median is kept)")
    ap.add_argument("--prefill-chunk", type=int, default=2048, help="prompt tokens a prefill step in the rate figures")
    ap.add_argument(
        "--transformers", action="store_true", help="then transformers' glm5_next at the same config, warm (GPU)"
    )
    ap.add_argument("--small", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", action="store_true", help="GPU time per kernel of the batch-1 serving step")
    ap.add_argument("--modes", default="graphs,eager,plain", help="decode paths timed (graphs, eager, plain)")
    ap.add_argument("--no-prefill", action="store_true", help="skip the prefill figures")
    ap.add_argument("--moe-loop", action="store_true", help="prompt MoE as the loop over experts, not grouped GEMMs")
    ap.add_argument("--shared-inline", action="store_true", help="a step's shared expert on the step's own stream")
    ap.add_argument(
        "--prompt-precision",
        action="store_true",
        help="DSA's prompt attention on the tensor cores against fp32 products, call by call over an 8k prompt (GPU)",
    )
    ap.add_argument("--dense", choices=("bf16", "q4", "fp8"), default="bf16", help="how the dense weights are kept")
    ap.add_argument(
        "--exl3-gemv", choices=("mma", "fma"), default=None, help="the EXL3 decode GEMV's form (default: the engine's)"
    )
    ap.add_argument("--long-contexts", default="", help="batch-1 decode step after prompts this long (e.g. 8192,32768)")
    ap.add_argument(
        "--profile-prefill", default="", help="GPU time per kernel of the 2k chunk ending at these contexts"
    )
    ap.add_argument(
        "--prefill-breakdown", default="", help="time per layer part of the 2k chunk ending at these contexts"
    )
    ap.add_argument(
        "--config",
        default=str(ROOT / "engine/checkpoint/glm53_flash_config.json"),
        help="architecture to draw (a demo config.json gives a CPU-sized smoke run)",
    )
    ap.add_argument(
        "--tp2",
        choices=("auto", "on", "off"),
        default="auto",
        help="per-layer times at TP=2 too (auto: when two GPUs are visible; on: also gloo on the CPU)",
    )
    ap.add_argument(
        "--hc-unchained",
        action="store_true",
        help="a step's hyper-connections in three launches each, the form before session 26 (triton_mhc.CHAIN)",
    )
    ap.add_argument(
        "--hc-gates-inline",
        action="store_true",
        help="a step's post and comb made in `_hc_mix`, on the step's stream (triton_mhc.GATES_BESIDE off)",
    )
    ap.add_argument("--tp2-timeout", type=float, default=100.0, help="seconds the TP=2 run may take")
    ap.add_argument("--tp-rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tp-port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--tp-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tp_rank is not None:
        tp2_rank(args)
        return
    global \
        OUT, \
        MODES, \
        PREFILL, \
        LONG_CONTEXTS, \
        BREAKDOWN, \
        PROFILE_PREFILL, \
        DENSE, \
        EXL3, \
        SHARD, \
        PREFILL_LENGTHS, \
        PREFILL_REPEATS, \
        PREFILL_CHUNK, \
        PRECISION
    PRECISION = args.prompt_precision
    if args.exl3_gemv:
        from engine.ops import triton_exl3

        triton_exl3.LAUNCH_DEFAULTS["form"] = args.exl3_gemv
    DENSE, EXL3, SHARD = args.dense, args.exl3_experts, args.shard
    PREFILL_LENGTHS = tuple(int(n) for n in args.prefill_lengths.split(",") if n)
    PREFILL_REPEATS, PREFILL_CHUNK = args.prefill_repeats, args.prefill_chunk
    if args.hc_unchained or args.hc_gates_inline:
        from engine.ops import triton_mhc

        triton_mhc.CHAIN = not args.hc_unchained
        triton_mhc.GATES_BESIDE = not args.hc_gates_inline
    if args.moe_loop or args.shared_inline:
        from engine.models.glm5_next import moe

        moe.GROUPED_GEMM = not args.moe_loop
        moe.SHARED_BESIDE = not args.shared_inline
    LONG_CONTEXTS = tuple(int(n) for n in args.long_contexts.split(",") if n)
    BREAKDOWN = tuple(int(n) for n in args.prefill_breakdown.split(",") if n)
    PROFILE_PREFILL = tuple(int(n) for n in args.profile_prefill.split(",") if n)
    OUT = Path(args.out) if args.out else None
    MODES, PREFILL = tuple(m for m in args.modes.split(",") if m and m != "none"), not args.no_prefill
    device = "cuda" if torch.cuda.is_available() else "cpu"
    RESULT.update(
        moe_prompt="loop over experts" if args.moe_loop else "grouped GEMM",
        shared_expert="on the step's stream" if args.shared_inline else "beside, on a second stream (engine default)",
        dense=args.dense,
        exl3_gemv=args.exl3_gemv or "engine default",
        hyper_connections="three launches a step's sublayer" if args.hc_unchained else "chained (engine default)",
        hc_gates="in _hc_mix, on the step's stream"
        if args.hc_gates_inline
        else "beside, on a second stream (engine default)",
        routed_experts="EXL3 4-bit mcg (random trellis)" if args.exl3_experts else "bf16",
        shard=f"rank 0 of {args.shard} (ShardStandIn: one GPU, collectives as local copies)"
        if args.shard > 1
        else None,
        gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu",
        torch=torch.__version__,
        date=time.strftime("%Y-%m-%d"),
        gpus=torch.cuda.device_count(),
    )
    RESULT["full_width"] = engine_full_width(args.layers, device, Path(args.config))
    save()
    want_tp2 = args.tp2 == "on" or (args.tp2 == "auto" and torch.cuda.device_count() >= 2)
    if want_tp2 and args.layers == "KKKD":
        if device == "cuda":
            torch.cuda.empty_cache()  # GPU 0 is shared with TP=2's rank 0: give back what the 32k prefill cached
        RESULT["tp2"] = tp2_per_layer(args.layers, Path(args.config), args.tp2_timeout)
        print(f"TP=2: {RESULT['tp2']}", flush=True)
        save()
    elif args.tp2 == "auto":
        RESULT["tp2"] = {"skipped": f"{torch.cuda.device_count()} GPU(s) visible; TP=2 needs 2"}
    if args.transformers and device == "cuda":
        torch.cuda.empty_cache()
        RESULT["transformers_warm"] = transformers_warm(args.layers, Path(args.config), PREFILL_LENGTHS[:2])
        ours, theirs = RESULT["full_width"], RESULT["transformers_warm"]
        RESULT["ours_vs_transformers"] = {
            "decode_read_back": round(ours["decode_b1"]["graphs_read_back"]["tok_s"] / theirs["decode_tok_s"], 2),
            **{
                f"prefill_t{n}": round(ours["prefill"][f"t{n}"]["tok_s"] / theirs[f"prefill_t{n}_tok_s"], 2)
                for n in PREFILL_LENGTHS[:2]
                if isinstance(ours.get("prefill", {}).get(f"t{n}"), dict)
            },
        }
        print(f"ours / transformers: {RESULT['ours_vs_transformers']}", flush=True)
        save()
    if args.small:
        RESULT["small_demo"] = small_vs_transformers(args.small)
        save()
    print(json.dumps(RESULT, indent=1))


if __name__ == "__main__":
    main()
