"""fla-core's autotuned choices for the KDA prompt kernels: record them on a GPU, and time a first start with and
without them.

    python bench/fla_configs.py record --heads 32 --head-dim 128 --out DIR   # autotune, then DIR/<kernel>.json
    python bench/fla_configs.py time --heads 32 --head-dim 128 [--out result.json]
    python bench/fla_configs.py derive --source DIR --out DIR2 [--heads-list ...] [--smem 101376] [--cap KERNEL=N]   # no GPU
    python bench/fla_configs.py gate --out DIR   # no GPU, no fla-core: the gate kernel's file from the cumsum's

`record` runs `fla_kda.warm` (the engine's load-time warm-up: every kernel `chunk_kda` launches autotunes on its
first call) and the form with the decay given (`kda_chunked`, which tests/gpu/test_fla_configs_gpu.py runs too),
then writes each of fla-core's cached autotuners' choices in the file format fla-core reads back
(fla/ops/utils/cache.py: `{kernel_name}.json` with `autotune_entries` keyed by the md5 of the tuning key, and a
`default_config`), one file a kernel. `time` measures what a process's first `warm` takes under the environment it
is given (a fresh TRITON_CACHE_DIR: compiles included; with FLA_CACHE_MODE / FLA_CONFIG_DIR set, fla-core reads the
recorded choices instead of autotuning), then one 2,048-token chunk of one layer in the served form, as a check that
the kernels chosen run as fast. Both print JSON.

`gate` (on any machine) writes, in a shipped folder recorded before session 37 (whose `record` left the gate kernel
out), the choices of fla-core's gate kernel (`kda_gate_chunk_cumsum`,
which the engine's KDA prompt chunks take since session 37: the log-decay made from f_b's output and summed along
each chunk) from those recorded there for the cumsum kernel it replaces (`chunk_local_cumsum`): the same [BT × BS]
tile read, summed along the chunk and written, from the same candidates (BS × 2, 4 or 8 warps). Its tuning key is
the cumsum's without the batch, with four fp32 tensors (g, A_log, dt_bias, the output) where the cumsum has two.
Chosen by that likeness, not tuned; tests/gpu/test_fla_configs_gpu.py checks that a first start reads them.

`derive` (on any machine, fla-core importable) writes the files the engine ships (engine/ops/fla_configs/<GPU>/):
each recorded choice also under the tuning keys of the other head counts a rank can hold (GLM-5.3-Flash's
64 KDA heads at TP=1..4, `--heads-list`; the same choice, since a key holds the head count but the tiles do not depend on it), and,
with `--smem`, each choice checked against fla-core's own candidates for a GPU with that much shared memory a block
(its lists shrink below 166,912 bytes: a GB10's 101,376 keeps only 1–2 pipeline stages for the state kernel): the
recorded choice where it is a candidate there, else the candidate with the same tiles and warps and the most stages
below the recorded, else the first candidate with the same tiles. fla-core's lists do not bound every kernel's
shared memory: `--cap KERNEL=STAGES` lowers a choice whose compiled kernel measured too large (`time` reports each
compiled kernel's shared memory a block; on an H200 the KDA recompute kernel's recorded 4 stages take 163,840 bytes,
2 stages fit a GB10).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.ops import fla_kda  # noqa: E402

LOWER_BOUND = -5.0  # GLM-5.3-Flash's KDA gate bound (linear_attn_config.gate_lower_bound), as the engine warms up


def _served(state, q, k, v, g, beta):
    """One chunk in the form the engine's prompt chunks take (`fla_kda.GATE_IN_KERNEL`: g handed over as f_b's output,
    A_log and dt_bias zero, GLM-5.3-Flash's bound)."""
    if fla_kda.GATE_IN_KERNEL:
        heads, dim = g.shape[1:]
        zeros = torch.zeros(heads, device=g.device), torch.zeros(heads * dim, device=g.device)
        return fla_kda.kda_gated(state, q, k, v, g, beta, *zeros, LOWER_BOUND)
    return fla_kda.kda_chunked(state, q, k, v, g, beta)


def _both_forms(heads: int, head_dim: int, device: torch.device) -> None:
    """The engine's warm-up (the served form), then the form with the decay given (`kda_chunked`, which the GPU
    test of the shipped choices also runs): every kernel either launches autotuned or read from the shipped files."""
    fla_kda.warm(heads, head_dim, device, LOWER_BOUND)
    with torch.no_grad():
        fla_kda.kda_chunked(*fla_kda.random_inputs(128, heads, head_dim, device))
    torch.cuda.synchronize(device)


def _chunk_ms(heads: int, head_dim: int, device: torch.device, tokens: int = 2048, repeats: int = 20) -> float:
    args = fla_kda.random_inputs(tokens, heads, head_dim, device, seed=1)
    with torch.no_grad():
        _served(*args)
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            _served(*args)
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / repeats * 1e3


def _autotuners() -> list:
    from fla.ops.utils.cache import CachedAutotuner

    return [o for o in gc.get_objects() if isinstance(o, CachedAutotuner) and o.cache]


def record(heads: int, head_dim: int, out: Path) -> dict:
    import triton
    from fla.ops.utils.cache import AutotuneKey

    device = torch.device("cuda")
    start = time.perf_counter()
    _both_forms(heads, head_dim, device)
    warm_s = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    kernels = {}
    for tuner in _autotuners():
        entries = {}
        for key, config in tuner.cache.items():
            chosen = {
                "kwargs": dict(config.kwargs),
                "num_warps": config.num_warps,
                "num_stages": config.num_stages,
                "num_ctas": getattr(config, "num_ctas", 1),
                "maxnreg": getattr(config, "maxnreg", None),
            }
            entries[AutotuneKey.key_hash(key)] = {
                "autotune_key": AutotuneKey.normalize_autotune_key(key),
                "config": chosen,
            }
        first = next(iter(entries.values()))["config"]
        body = {
            "kernel_name": tuner.kernel_name,
            "triton_version": triton.__version__,
            "autotune_entries": entries,
            "default_config": first,
            "candidates": len(tuner.configs),
        }
        (out / f"{tuner.kernel_name}.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
        kernels[tuner.kernel_name] = {"candidates": len(tuner.configs), "chosen": first}
    return {"warm_s": round(warm_s, 1), "kernels": kernels, "chunk_2k_ms": round(_chunk_ms(heads, head_dim, device), 3)}


def time_first_start(heads: int, head_dim: int) -> dict:
    import os

    device = torch.device("cuda")
    torch.zeros(1, device=device)  # the CUDA context, outside the figure
    start = time.perf_counter()
    _both_forms(heads, head_dim, device)
    warm_s = time.perf_counter() - start
    from fla.ops.utils import cache

    return {
        "warm_s": round(warm_s, 1),
        "fla_cache_mode": cache.FLA_CACHE_MODE.value,  # the module's, as the engine may have set it
        "fla_config_dir": str(cache.get_fla_config_dir()),
        "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"),
        "chunk_2k_ms": round(_chunk_ms(heads, head_dim, device), 3),
        "chosen": {t.kernel_name: str(next(iter(t.cache.values()))) for t in _autotuners()},
        "shared_bytes": _shared_bytes(os.environ.get("TRITON_CACHE_DIR")),
    }


def _shared_bytes(cache_dir: str | None) -> dict[str, list[int]]:
    """Shared memory a block of every kernel compiled into `cache_dir` (Triton's metadata files), by kernel name."""
    out: dict[str, list[int]] = {}
    for meta in Path(cache_dir or "/nonexistent").glob("*/*.json"):
        try:
            data = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "shared" in data and "name" in data:
            out.setdefault(data["name"], []).append(data["shared"])
    return {k: sorted(set(v)) for k, v in sorted(out.items())}


def _candidates(kernels: set[str], smem: int | None) -> dict[str, object]:
    """fla-core's cached autotuners of `kernels`, imported as on a GPU with `smem` bytes of shared memory a block
    (None: this machine's)."""
    if smem is not None:  # fla-core reads the shared memory (and caches it) as its kernel modules import
        import triton

        assert "fla" not in sys.modules, "fla-core was imported before the shared memory was set"

        class Properties:
            @staticmethod
            def get_device_properties(index: int) -> dict:
                return {"max_shared_mem": smem}

        class Stand:  # Triton's active driver as fla-core's import sees it: one device with `smem`, no GPU target
            utils = Properties()

            def get_current_target(self):
                raise RuntimeError("no GPU here: configurations derived for another one")

        triton.runtime.driver.set_active(Stand())
        torch.cuda.device_count = lambda: 1  # fla-core asks torch how many devices to read it for
    from fla.ops.kda.chunk import chunk_kda  # noqa: F401  (imports every kernel chunk_kda launches)
    from fla.ops.utils.cache import CachedAutotuner

    return {o.kernel_name: o for o in gc.get_objects() if isinstance(o, CachedAutotuner) and o.kernel_name in kernels}


def _nearest(chosen: dict, tuner, cap: int | None = None) -> dict:
    """The recorded choice where the candidates hold it (with at most `cap` stages), else the candidate with the same
    tiles and warps and the most stages below it, else the first with the same tiles, else the first."""

    def form(c) -> dict:
        return {"kwargs": dict(c.kwargs), "num_warps": c.num_warps, "num_stages": c.num_stages}

    if cap is not None and chosen["num_stages"] > cap:
        chosen = {**chosen, "num_stages": cap}
    options = [form(c) for c in tuner.configs if cap is None or c.num_stages <= cap]
    same = [o for o in options if o["kwargs"] == chosen["kwargs"]]
    for pick in (
        [o for o in options if o == {k: chosen[k] for k in ("kwargs", "num_warps", "num_stages")}],
        sorted(
            (o for o in same if o["num_warps"] == chosen["num_warps"] and o["num_stages"] <= chosen["num_stages"]),
            key=lambda o: -o["num_stages"],
        ),
        same,
        options,
    ):
        if pick:
            return {**chosen, **pick[0]}
    raise ValueError(f"{tuner.kernel_name}: no candidate configuration")


def derive(source: Path, out: Path, heads: list[int], smem: int | None, caps: dict[str, int]) -> dict:
    bodies = [json.loads(f.read_text()) for f in sorted(source.glob("*.json"))]
    files = {body["kernel_name"]: body for body in bodies}
    tuners = _candidates(set(files), smem)
    from fla.ops.utils.cache import AutotuneKey

    out.mkdir(parents=True, exist_ok=True)
    report = {}
    for name, body in files.items():
        tuner = tuners[name]
        names = [n for n in tuner.keys if n in tuner.arg_names]  # the key's leading values, in this order
        entries = {}
        for entry in body["autotune_entries"].values():
            config = _nearest(entry["config"], tuner, caps.get(name))
            for h in heads:
                key = [
                    h if i < len(names) and names[i] in ("H", "HV") else v for i, v in enumerate(entry["autotune_key"])
                ]
                entries[AutotuneKey.key_hash(tuple(key))] = {"autotune_key": key, "config": config}
            report[name] = {"recorded": entry["config"], "shipped": config, "candidates": len(tuner.configs)}
        body = {**body, "autotune_entries": entries, "default_config": next(iter(entries.values()))["config"]}
        body["candidates"] = len(tuner.configs)
        (out / f"{name}.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    return report


CUMSUM, GATE = "chunk_local_cumsum_vector_kernel", "kda_gate_chunk_cumsum_vector_kernel"


def gate_from_cumsum(folder: Path) -> dict:
    """`gate` (the docstring): GATE.json in `folder` from CUMSUM.json there; fla-core's key hash (the md5 of the
    key's compact sorted JSON, fla/ops/utils/cache.py) computed here, so fla-core need not be importable."""
    import hashlib

    body = json.loads((folder / f"{CUMSUM}.json").read_text())
    entries = {}
    for entry in body["autotune_entries"].values():
        batch, *rest = entry["autotune_key"]  # B, H, S, BT, IS_VARLEN, REVERSE, the dtypes of s and o
        assert batch == 1 and rest[-2:] == ["torch.float32"] * 2, entry["autotune_key"]
        key = rest[:-2] + ["torch.float32"] * 4  # H, S, BT, IS_VARLEN, REVERSE, the dtypes of s, A_log, dt_bias, o
        digest = hashlib.md5(json.dumps(key, separators=(",", ":"), sort_keys=True).encode()).hexdigest()
        entries[digest] = {"autotune_key": key, "config": entry["config"]}
    gate = {**body, "kernel_name": GATE, "autotune_entries": entries}
    gate["default_config"] = next(iter(entries.values()))["config"]
    (folder / f"{GATE}.json").write_text(json.dumps(gate, indent=1, sort_keys=True) + "\n")
    return {
        "from": CUMSUM,
        "entries": len(entries),
        "configs": sorted({json.dumps(e["config"]) for e in entries.values()}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("record", "time", "derive", "gate"))
    parser.add_argument("--source", type=Path, default=None, help="derive: the recorded files")
    parser.add_argument("--smem", type=int, default=None, help="derive: shared memory a block of the target GPU")
    parser.add_argument(
        "--cap",
        action="append",
        default=[],
        metavar="KERNEL=STAGES",
        help="derive: at most this many pipeline stages for KERNEL (its recorded choice compiled too large)",
    )
    parser.add_argument("--heads", type=int, default=32, help="KDA heads a rank holds (GLM-5.3-Flash at TP=2: 32)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--heads-list", default="64,32,22,21,16", help="derive: head counts a rank can hold")
    parser.add_argument("--out", type=Path, default=None, help="record: the directory; time: a JSON file")
    args = parser.parse_args()
    if args.what == "gate":
        if args.out is None:
            parser.error("gate needs --out DIR (a shipped folder holding the cumsum kernel's file)")
        result = gate_from_cumsum(args.out)
    elif args.what == "derive":
        if args.source is None or args.out is None:
            parser.error("derive needs --source DIR and --out DIR")
        heads = [int(h) for h in str(args.heads_list).split(",")]
        caps = {name: int(stages) for name, stages in (c.split("=") for c in args.cap)}
        result = derive(args.source, args.out, heads, args.smem, caps)
    elif args.what == "record":
        if args.out is None:
            parser.error("record needs --out DIR")
        result = record(args.heads, args.head_dim, args.out)
    else:
        result = time_first_start(args.heads, args.head_dim)
        if args.out is not None:
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
