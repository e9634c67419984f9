"""Engine benchmark on one GPU: the full-width GLM-5.3-Flash config at reduced depth, random bf16 weights.

    python bench/gpu_engine.py [--layers KKKD] [--out results.json] [--small DEMO_DIR]

Measures the decode step at batch 1..4 (after a 128-token prompt) three ways — the serving path replayed from CUDA
graphs (`graphs`), the same static step run op by op (`eager`), and the plain `model.decode` (`plain`) — with the
bytes a step must read and the fraction of HBM bandwidth that achieves (H200: 4.8 TB/s), and prefill throughput at
2k / 8k. With --small, also decode tok/s of our engine (graphs and eager) vs transformers' `generate` on the same
demo checkpoint. Weights are generated on the GPU (no checkpoint on disk); see docs/BENCHMARKS.md. The JSON is
rewritten after every figure, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.checkpoint.layout import text_tensors  # noqa: E402
from engine.models.glm5_next.config import TextConfig  # noqa: E402
from engine.models.glm5_next.model import Glm5NextForCausalLM  # noqa: E402
from engine.parallel import ParallelGroup  # noqa: E402

HBM_BYTES_S = 4.8e12
PROFILE = "--profile" in sys.argv


class RandomReader:
    """Stands in for CheckpointReader: every tensor the layout names, drawn on the GPU at a sensible scale."""

    def __init__(self, raw: dict, dtype: torch.dtype, device: str) -> None:
        self.specs = {s.name: s for s in text_tensors(raw)}
        self.specs["lm_head.weight"] = self.specs.get("lm_head.weight") or self.specs[
            "model.language_model.embed_tokens.weight"]
        self.dtype, self.device, self.path = dtype, device, Path("<random>")
        self.gen = torch.Generator(device=device).manual_seed(0)

    def has(self, name: str) -> bool:
        return name in self.specs

    def names(self) -> list[str]:
        return list(self.specs)

    def close(self) -> None:
        pass

    def get(self, name: str, dim: int | None = None, units: int | None = None) -> torch.Tensor:
        shape = self.specs[name].shape
        if name.endswith(("norm.weight", "_scale", "o_norm.weight")) or name.endswith("layernorm.weight"):
            return torch.ones(shape, dtype=self.dtype, device=self.device)
        if name.endswith(("A_log", "_base", "e_score_correction_bias", "compress_ape", "k_norm.bias")):
            return torch.zeros(shape, dtype=self.dtype, device=self.device)
        std = 1.0 if "embed_tokens" in name else 1 / math.sqrt(shape[-1])
        return (torch.randn(shape, generator=self.gen, device=self.device) * std).to(self.dtype)


def weight_bytes(model: Glm5NextForCausalLM, held: int) -> tuple[int, int]:
    """(bytes a decode step reads whatever the routing, bytes of one routed expert), from the `held` weight bytes:
    everything but the routed experts (an embedding lookup reads one row, so the table is left out too)."""
    moes = [layer.mlp for layer in model.layers if getattr(layer.mlp, "stacked", None) is not None]
    routed = sum(t.numel() * t.element_size() for moe in moes for t in moe.stacked)
    expert = sum(t[0].numel() * t.element_size() for t in moes[0].stacked) if moes else 0
    return held - routed - model.embed.numel() * model.embed.element_size(), expert


RESULT: dict = {}
OUT: Path | None = None


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


def engine_full_width(layers: str, device: str, config: Path) -> dict:
    raw = json.loads(config.read_text())
    text = dict(raw.get("text_config") or raw)
    kinds = {"K": "linear_attention", "D": "full_attention"}
    text.update(num_hidden_layers=len(layers), layer_types=[kinds[c] for c in layers],
                mlp_layer_types=["dense"] + ["sparse"] * (len(layers) - 1), indexer_types=["full"] * len(layers),
                num_nextn_predict_layers=0)
    raw = {"text_config": text}
    cfg = TextConfig.from_dict(raw)
    model = Glm5NextForCausalLM(cfg, RandomReader(raw, torch.bfloat16, device), ParallelGroup.single(device))
    held = torch.cuda.memory_allocated() if device == "cuda" else 0
    fixed, expert = weight_bytes(model, held)
    out = RESULT.setdefault("full_width", {})
    out.update(layers=layers, weights_gib=round(held / 2**30, 1))
    save()
    pool = model.make_pool(40_000, "bf16")
    ids = [(i * 7919) % (cfg.vocab_size - 20) + 10 for i in range(8192)]
    decoders = {"graphs": model.lane_decoder(pool, 4, graphs=device == "cuda"),
                "eager": model.lane_decoder(pool, 4, graphs=False)}
    moe_layers = sum(t == "sparse" for t in cfg.mlp_layer_types)
    for batch in (1, 2, 3, 4):
        unique = min(cfg.n_routed_experts, batch * cfg.num_experts_per_tok)
        read = fixed + moe_layers * unique * expert
        figures = out[f"decode_b{batch}"] = {"bytes_read_gb": round(read / 1e9, 2)}
        for mode in ("graphs", "eager", "plain"):
            decoder = decoders.get(mode)
            seqs = [decoder.new_sequence(lane) if decoder else model.new_sequence(pool) for lane in range(batch)]
            for s in seqs:
                model.prefill(s, ids[:128])
            tokens = [11] * batch
            decode = decoder.decode if decoder else model.decode
            decode(seqs, tokens)  # the graph is captured here
            step = timed(lambda: decode(seqs, tokens), 10)
            figures[mode] = {"step_ms": round(step * 1e3, 2), "tok_s": round(batch / step, 1),
                             "hbm_fraction": round(read / step / HBM_BYTES_S, 3)}
            for s in seqs:
                s.release()
            print(f"decode batch {batch} {mode}: {figures[mode]}", flush=True)
            save()
        if device == "cuda" and not decoders["graphs"].uses_graphs:
            figures["graphs"]["fell_back_to_eager"] = True
    if PROFILE:
        seq = model.new_sequence(pool)
        model.prefill(seq, ids[:128])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                model.decode([seq], [11])
            sync()
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25), flush=True)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), flush=True)
        seq.release()
    for length in (2048, 8192) if device == "cuda" else (256,):
        seq = model.new_sequence(pool)
        sync()
        start = time.perf_counter()
        for chunk in range(0, length, 2048):
            model.prefill(seq, ids[chunk: chunk + 2048])
        sync()
        out[f"prefill_{length}_tok_s"] = round(length / (time.perf_counter() - start), 1)
        seq.release()
        save()
    return out


def small_vs_transformers(path: str) -> dict:
    from transformers import Glm5NextForConditionalGeneration

    model = Glm5NextForCausalLM.load(path, ParallelGroup.single("cuda"))
    pool = model.make_pool(2048, "bf16")
    ids = list(range(5, 133))
    ours = {}
    for mode in ("graphs", "eager"):
        decoder = model.lane_decoder(pool, 1, graphs=mode == "graphs")
        seq = decoder.new_sequence(0)
        nxt = [int(model.prefill(seq, ids).argmax())]
        step = lambda: nxt.__setitem__(0, int(decoder.decode([seq], nxt)[0].argmax()))  # noqa: E731
        step()
        ours[mode] = 1 / timed(step, 32)
        seq.release()
    ref = Glm5NextForConditionalGeneration.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    prompt = torch.tensor([ids], device="cuda")
    ref.generate(prompt, max_new_tokens=4, do_sample=False)
    torch.cuda.synchronize()
    start = time.perf_counter()
    ref.generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    torch.cuda.synchronize()
    theirs = 32 / (time.perf_counter() - start)
    return {"ours_decode_tok_s": round(ours["graphs"], 1), "ours_eager_decode_tok_s": round(ours["eager"], 1),
            "transformers_generate_tok_s": round(theirs, 1), "speedup": round(ours["graphs"] / theirs, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="KKKD")
    ap.add_argument("--small", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", action="store_true", help="print a torch.profiler table of 3 decode steps")
    ap.add_argument("--config", default=str(ROOT / "engine/checkpoint/glm53_flash_config.json"),
                    help="architecture to draw (a demo config.json gives a CPU-sized smoke run)")
    args = ap.parse_args()
    global OUT
    OUT = Path(args.out) if args.out else None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    RESULT.update(gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
                  date=time.strftime("%Y-%m-%d"))
    RESULT["full_width"] = engine_full_width(args.layers, device, Path(args.config))
    save()
    if args.small:
        RESULT["small_demo"] = small_vs_transformers(args.small)
        save()
    print(json.dumps(RESULT, indent=1))


if __name__ == "__main__":
    main()
