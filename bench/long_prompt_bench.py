"""A long prompt's last chunk through one DSA layer at the released widths: its time, and the memory it takes beyond
the cache and the weights (session 29).

The cache pool holds `span - chunk` random rows (the released row: latent 512 | index key 128 | gate score 128) of
the chosen row type; the chunk's `chunk` queries then run `SparseMLA.prefill` as a prompt chunk does — its rows
written, the indexer's choice over the pools of the span, attention over the chosen tokens. A prompt of a 1M window
runs hundreds of such chunks at spans up to the window, so what one chunk takes beyond the cache is what the
memory left beside the pool must hold.

    python bench/long_prompt_bench.py [--spans 32768,131072,524288] [--kv bf16,fp8] [--chunk N] [--profile] [--out FILE]

Each case runs in a process of its own: on the CPU its peak is the process's resident high-water mark (VmHWM,
set back to what is held just before the chunk) less what it held then; on a GPU
`torch.cuda.max_memory_allocated` less what was allocated before. Time: median of `--repeats` runs of the same chunk
(the first, not timed, warms up). The results file is written after each case.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine.cache import KVPool, Sequence  # noqa: E402
from engine.models.glm5_next.config import TextConfig  # noqa: E402
from engine.models.glm5_next.dsa import SparseMLA  # noqa: E402
from engine.parallel import ParallelGroup  # noqa: E402

CONFIG = ROOT / "engine" / "checkpoint" / "glm53_flash_config.json"
FILL = 1 << 16  # rows written to the pool at a time while it is filled (keeps the fill's own peak low)


def resident() -> int:
    """Bytes this process holds now (/proc/self/statm's resident pages)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


def high_water() -> int:
    """Bytes this process has held at most since `reset_high_water` (/proc/self/status VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_high_water() -> None:
    """The resident high-water mark set back to what is held now (Linux: 5 into /proc/self/clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def kernels(run, top: int = 12) -> list[list]:
    """The GPU kernels one `run()` launches (torch.profiler), the `top` by their time: [name, ms, calls]."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda e: -e.device_time_total)
    return [[e.key[:90], round(e.device_time_total / 1e3, 3), e.count] for e in rows[:top]]


def case(kv: str, span: int, chunk: int, repeats: int, device: str, profiled: bool = False) -> dict:
    """One (row type, span): the layer and a pool holding span - chunk rows, then the chunk's prefill timed (and,
    `profiled` on a GPU, its kernels)."""
    from gpu_engine import RandomReader, text_config_for

    raw = {"text_config": text_config_for("D", CONFIG)}
    cfg = TextConfig.from_dict(raw)
    group = ParallelGroup.single(device)
    reader = RandomReader(raw, torch.bfloat16 if device == "cuda" else torch.float32, device, group)
    layer = SparseMLA(cfg, reader, "model.language_model.layers.0.", group, 0, runs_indexer=True)
    pool = KVPool(1, span, layer.row_width, kv, device)
    seq = Sequence(pool)
    gen = torch.Generator(device=device).manual_seed(0)
    done = span - chunk
    for start in range(0, done, FILL):
        n = min(FILL, done - start)
        pool.write(0, seq.grow(n), torch.randn(n, layer.row_width, generator=gen, device=device))
    seq.length = done
    seq.grow(chunk)
    x = torch.randn(chunk, cfg.hidden_size, generator=gen, device=device) * 0.5
    del reader
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        sync()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        else:
            reset_high_water()
            before = resident()
        layer.prefill(x, seq, {})
        sync()
        if device == "cuda":
            peak = torch.cuda.max_memory_allocated() - before
        else:
            peak = high_water() - before
        times = []
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            layer.prefill(x, seq, {})
            sync()
            times.append(time.perf_counter() - start)
        found = {
            "chunk_ms": round(statistics.median(times) * 1e3, 1),
            "peak_beyond_gib": round(peak / 2**30, 3),
            "pool_gib": round(pool.rows.numel() * pool.rows.element_size() / 2**30, 3),
        }
        if profiled and device == "cuda":
            found["kernels"] = kernels(lambda: layer.prefill(x, seq, {}))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", default="32768,131072,524288")
    ap.add_argument("--kv", default="bf16,fp8")
    ap.add_argument(
        "--chunk", type=int, default=0, help="queries in the chunk (default: 2048 on a GPU, 128 on the CPU)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", action="store_true", help="GPU: each case's kernels by their time (one chunk)")
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)  # KV,SPAN: run one case here, print its JSON
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    chunk = args.chunk or (2048 if device == "cuda" else 128)
    if args.case:
        kv, span = args.case.split(",")
        print(json.dumps(case(kv, int(span), chunk, args.repeats, device, args.profile)))
        return
    result: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "chunk": chunk,
        "runs": {},
    }
    for kv in args.kv.split(","):
        for span in args.spans.split(","):
            cmd = [sys.executable, __file__, "--case", f"{kv},{span}", "--chunk", str(chunk)]
            cmd += ["--repeats", str(args.repeats)] + (["--profile"] if args.profile else [])
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                got: dict | str = f"failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else '?'}"
            else:
                got = json.loads(done.stdout.strip().splitlines()[-1])
            result["runs"][f"{kv}_s{span}"] = got
            print(kv, span, got, flush=True)
            if args.out:  # after each case: a run cut short keeps what it measured
                Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
