"""The engine patch series: `patches/series` names patch files, one a line, applied in that order.

A patch is a unified diff against the repository root, as `git diff` writes it (`a/engine/serve.py`,
`b/engine/serve.py`), applied with `patch -p1 --forward` inside a copy of the engine. Blank lines and `#` comments
in `series` are ignored.

Standard library only: the image build runs this very file inside the container (`python3 apply_patches.py
PATCHES_DIR SOURCE_DIR`) so `sparks patches check` on the head and the build apply the series the same way, and a
patch that does not apply stops the build with its name.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SERIES = "series"
PATCH_TIMEOUT_S = 60


class SeriesError(Exception):
    """`series` names something that cannot be a patch of ours. Message says what to write instead."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


@dataclass(frozen=True)
class PatchOutcome:
    name: str
    status: str  # "ok", "fails", "not tried" (an earlier patch failed)
    detail: str = ""  # patch's own words when it fails


def read_series(patches_dir: Path) -> list[str]:
    """The patch file names in order; every one must exist in `patches_dir`. No `series` file: no patches."""
    series = patches_dir / SERIES
    if not series.is_file():
        return []
    names: list[str] = []
    for number, raw in enumerate(series.read_text(encoding="utf-8").splitlines(), start=1):
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        where = f"{series} line {number}"
        if "/" in name or name in (".", "..") or " " in name:
            raise SeriesError(
                f"{where}: {name!r} is not a plain file name",
                "list one patch file of patches/ a line, like 0001-engine-fix.patch",
            )
        if not (patches_dir / name).is_file():
            raise SeriesError(
                f"{where}: {name} is listed but there is no such file in {patches_dir}",
                f"add patches/{name} or remove the line",
            )
        if name in names:
            raise SeriesError(f"{where}: {name} is listed twice", "list each patch once")
        names.append(name)
    return names


def unlisted(patches_dir: Path) -> list[str]:
    """`*.patch` files in the folder that `series` does not name (so they are not applied)."""
    if not patches_dir.is_dir():
        return []
    listed = set(read_series(patches_dir))
    return sorted(p.name for p in patches_dir.glob("*.patch") if p.name not in listed)


def apply_series(patches_dir: Path, source_dir: Path) -> list[PatchOutcome]:
    """Apply each patch in order inside `source_dir`; after the first failure the rest are not tried."""
    if shutil.which("patch") is None:
        raise SeriesError("the `patch` program is not installed", "install it (apt install patch)")
    outcomes: list[PatchOutcome] = []
    failed = False
    for name in read_series(patches_dir):
        if failed:
            outcomes.append(PatchOutcome(name, "not tried"))
            continue
        done = subprocess.run(
            [
                "patch",
                "-p1",
                "--forward",
                "--batch",
                "--no-backup-if-mismatch",
                "-r",
                "-",
                "-d",
                str(source_dir),
                "-i",
                str((patches_dir / name).resolve()),
            ],
            capture_output=True,
            text=True,
            timeout=PATCH_TIMEOUT_S,
        )
        if done.returncode == 0:
            outcomes.append(PatchOutcome(name, "ok"))
        else:
            failed = True
            words = (done.stdout + done.stderr).strip().splitlines()
            outcomes.append(PatchOutcome(name, "fails", "; ".join(words[-4:]) or f"exit code {done.returncode}"))
    return outcomes


def main(argv: list[str]) -> int:
    """`python3 patches.py PATCHES_DIR SOURCE_DIR`: apply the series, print each patch, exit 1 naming a failure."""
    if len(argv) != 2:
        print("usage: patches.py PATCHES_DIR SOURCE_DIR", file=sys.stderr)
        return 2
    try:
        outcomes = apply_series(Path(argv[0]), Path(argv[1]))
    except SeriesError as error:
        print(f"patch series: {error.message} ({error.fix})", file=sys.stderr)
        return 1
    for outcome in outcomes:
        print(
            f"patch {outcome.name}: {outcome.status}" + (f" ({outcome.detail})" if outcome.detail else ""), flush=True
        )
    failures = [o for o in outcomes if o.status == "fails"]
    if failures:
        print(f"patch {failures[0].name} does not apply: {failures[0].detail}", file=sys.stderr)
        return 1
    print(f"patch series: {len(outcomes)} patch(es) applied")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
