"""Wall time of the checkpoint copy to a worker on the cluster test bed (namespaces, real sshd and rsync; needs root).

    python bench/checkpoint_copy.py [--mib 1024] [--blobs 8] [--json out.json]

An HF-cache snapshot of `--blobs` blobs totalling `--mib` MiB (one of them a xet-style link out of the cache) is
copied head → w1 with `sparks copy`: cold, then again with nothing to send, then after one blob was truncated on
the worker. `sparks doctor` is timed once. Prints a JSON line. Figures depend on the machine (rsync over ssh is
cipher-bound here); they are not asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "cluster"))
from testbed import TestBed, missing_prerequisites  # noqa: E402

SPARKS = str(REPO / ".venv" / "bin" / "sparks")
REV = "0" * 40
MIB = 1024 * 1024


def make_cache(bed: TestBed, mib: int, blobs: int) -> None:
    repo = bed.path_on("head", "hf/hub/models--org--model")
    snap = repo / "snapshots" / REV
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (snap / "config.json").write_text("{}\n")
    chunk = os.urandom(MIB)
    for i in range(blobs):
        target = repo / "blobs" / f"blob{i}"
        if i == 0:  # a xet-style blob: a link to a file outside the cache
            target = bed.path_on("head", "xet-chunk")
            (repo / "blobs" / "blob0").symlink_to(target)
        with open(target, "wb") as out:
            for _ in range(mib // blobs):
                out.write(chunk)
        (snap / f"model-{i:05d}.safetensors").symlink_to(f"../../blobs/blob{i}")


def timed(bed: TestBed, env: dict, *args: str) -> float:
    started = time.monotonic()
    done = bed.on_head([SPARKS, *args], env, timeout_s=1800)
    if done.returncode not in (0, 1) or (args[0] == "copy" and done.returncode):
        raise SystemExit(f"sparks {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return round(time.monotonic() - started, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--blobs", type=int, default=8)
    ap.add_argument("--json")
    args = ap.parse_args()
    reason = missing_prerequisites(docker=False)
    if reason:
        raise SystemExit(f"cannot run the test bed here: {reason}")
    bed = TestBed(workers=1, docker=False).up()
    try:
        make_cache(bed, args.mib, args.blobs)
        env = bed.environ(MODEL_ID="org/model", MODEL_REVISION=REV, CHECKPOINT="", HF_HUB_OFFLINE="1")
        result = {
            "mib": args.mib,
            "blobs": args.blobs,
            "copy_cold_s": timed(bed, env, "copy"),
            "copy_nothing_to_send_s": timed(bed, env, "copy"),
        }
        blob = bed.path_on("w1", "hf/hub/models--org--model/blobs/blob1")
        os.truncate(blob, blob.stat().st_size // 2)
        result["copy_half_blob_missing_s"] = timed(bed, env, "copy")
        result["doctor_s"] = timed(bed, env, "doctor")
    finally:
        bed.down()
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
