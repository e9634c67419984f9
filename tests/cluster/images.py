"""The test bed's Python base image: what BASE_IMAGE is on the namespaced nodes (they have no route out, so the
engine image must build there with IMAGE_OFFLINE=1 from a base that already holds every dependency).

Use it from a cluster test:

    from images import ensure_base_image, image_settings
    env = bed.environ(**image_settings(bed))      # BASE_IMAGE=sparks-base:test, IMAGE_OFFLINE=1
    # ... ./start.sh with RUNTIME=docker: the recipe builds its image on the head and ships it to the workers

`ensure_base_image(bed) -> str` loads the base into the HEAD node's dockerd only and returns its name; the workers
get the engine image through the recipe's own ship step (`docker save | ssh | docker load`).

How the base is made (measured on the developer machine, 2 cores; printed on every cold build):
  1. `debootstrap --variant=minbase --include=python3,patch bookworm` (Debian 12: python3 is 3.11), ~43 s;
  2. the engine's runtime packages installed into the rootfs's /usr/local/lib/python3.11/dist-packages by the
     host's pip with `--target --python-version 3.11 --platform manylinux... --only-binary=:all:` (CPU
     torch==2.13.0 as scripts/bootstrap.sh pins it, numpy, docker/requirements.txt, pip and setuptools for the
     offline engine install), ~24 s. Copying the host venv's files instead took ~11 s, but only works while the
     host's Python is 3.11 and its venv holds exactly the engine's packages; pip into the rootfs is exact anywhere;
  3. torch's tests and C++ headers, and triton (xgrammar's, for GPU masks only), removed (~145 + 640 MB less to
     ship).
Each step's result (the minbase tarball, the finished root file system) is cached under SPARKS_TESTBED_CACHE
(default /var/cache/sparks-testbed), keyed by what goes into it (BUILD_VERSION, the suite, the packages, the pins),
and survives test sessions; a test session then only `tar | docker import`s the root file system into the head's
dockerd. Builds are serialised by a lock file (several sessions may start at once).

Needs root, debootstrap and a route to the Debian mirror and the package index the first time (the root namespace
only: this is set-up, no test traffic); without them `BaseImageUnavailable` says why and the tests skip with it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SPARKS_TESTBED_CACHE", "/var/cache/sparks-testbed"))
BASE_TAG = "sparks-base:test"
KEY_LABEL = "sparks-testbed.base-key"
SUITE = "bookworm"
PYTHON = "3.11"  # bookworm's python3
INCLUDE = ("python3", "patch")
MIRROR = os.environ.get("SPARKS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# under dist-packages: not needed to serve on the CPU (triton comes with xgrammar on x86-64, for its GPU kernels)
STRIPPED = ("torch/test", "torch/include", "bin", "triton")
BUILD_VERSION = 1  # raise it when the way the base is made changes (the cache key holds it)
DEBOOTSTRAP_TIMEOUT_S = 900
PIP_TIMEOUT_S = 1200
LOCK_WAIT_S = 2400
IMPORT_TIMEOUT_S = 600

timings: dict[str, float] = {}


class BaseImageUnavailable(Exception):
    """The base image cannot be made on this machine; the message says why (the tests skip with it)."""


def missing_prerequisites() -> str:
    if os.geteuid() != 0:
        return "needs root (debootstrap)"
    missing = [t for t in ("debootstrap", "docker", "tar") if not shutil.which(t)]
    return f"missing {', '.join(missing)} (TESTBED_DOCKER=1 scripts/testbed-deps.sh installs them)" if missing else ""


def image_settings(bed) -> dict[str, str]:
    """The settings a test bed start needs to build the engine image on the head: merge into `bed.environ()`."""
    return {"BASE_IMAGE": ensure_base_image(bed), "IMAGE_OFFLINE": "1"}


def ensure_base_image(bed) -> str:
    """Load the base image into the head node's dockerd (building the cached tarball first if needed)."""
    rootfs = base_rootfs()
    key = rootfs.name.rsplit("-", 1)[1]
    docker = ["docker", "-H", f"unix://{bed.path_on('head', 'run/docker.sock')}"]
    found = subprocess.run(
        [*docker, "image", "inspect", "--format", f'{{{{ index .Config.Labels "{KEY_LABEL}" }}}}', BASE_TAG],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if found.returncode == 0 and found.stdout.strip() == key:
        return BASE_TAG
    started = time.monotonic()
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
    try:
        subprocess.run(
            [
                *docker,
                "import",
                "--change",
                f"LABEL {KEY_LABEL}={key}",
                "--change",
                "ENV LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1",
                "--change",
                'CMD ["python3"]',
                "-",
                BASE_TAG,
            ],
            stdin=tar.stdout,
            check=True,
            capture_output=True,
            timeout=IMPORT_TIMEOUT_S,
        )
    finally:
        tar.stdout.close()
        if tar.wait(timeout=IMPORT_TIMEOUT_S) != 0:
            raise RuntimeError(f"tar of {rootfs} failed")
    _timed("import into the head's dockerd", started)
    return BASE_TAG


def base_key() -> str:
    """What the base image is made of: a change here, in the pins or in the CPU torch pin rebuilds it."""
    recipe = f"{BUILD_VERSION} {SUITE} {INCLUDE} {PYTHON} {STRIPPED} {platform.machine()} torch=={cpu_torch()}"
    digest = hashlib.sha256(recipe.encode())
    digest.update((REPO / "docker" / "requirements.txt").read_bytes())
    return digest.hexdigest()[:12]


def cpu_torch() -> str:
    """The CPU torch version scripts/bootstrap.sh installs (one place says it)."""
    for line in (REPO / "scripts" / "bootstrap.sh").read_text().splitlines():
        if line.startswith("CPU_TORCH="):
            return line.split("=", 1)[1].strip().strip('"')
    raise RuntimeError("scripts/bootstrap.sh has no CPU_TORCH= line")


def base_rootfs() -> Path:
    """The cached root file system of the base image; made once (under a lock) when absent."""
    reason = missing_prerequisites()
    if reason:
        raise BaseImageUnavailable(reason)
    CACHE.mkdir(parents=True, exist_ok=True)
    final = CACHE / f"sparks-base-{base_key()}"
    if final.is_dir():
        return final
    with _locked(CACHE / ".lock"):
        if final.is_dir():  # another session made it while we waited
            return final
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=CACHE, prefix="build-") as scratch:
            rootfs = Path(scratch) / "rootfs"
            _unpack(_minbase_tarball(), rootfs)
            _install_packages(rootfs)
            _strip(rootfs)
            rootfs.rename(final)  # whole or not at all: a half-made rootfs is never taken for a cached one
        _timed("base image built (cold)", started)
        for old in CACHE.glob("sparks-base-*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    return final


def _minbase_tarball() -> Path:
    key = hashlib.sha256(f"{SUITE} {INCLUDE} {platform.machine()}".encode()).hexdigest()[:12]
    tarball = CACHE / f"{SUITE}-minbase-{key}.tar"
    if tarball.exists():
        return tarball
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="debootstrap-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        done = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE, str(rootfs), MIRROR],
            capture_output=True,
            text=True,
            timeout=DEBOOTSTRAP_TIMEOUT_S,
        )
        if done.returncode != 0:
            words = (done.stdout + done.stderr).strip().splitlines()[-3:]
            raise BaseImageUnavailable(f"debootstrap {SUITE} from {MIRROR} failed: {' / '.join(words)}")
        shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        _tar(rootfs, tarball)
    _timed(f"debootstrap {SUITE} minbase", started)
    return tarball


def _install_packages(rootfs: Path) -> None:
    started = time.monotonic()
    target = rootfs / "usr" / "local" / "lib" / f"python{PYTHON}" / "dist-packages"
    machine = platform.machine()
    argv = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--target",
        str(target),
        "--python-version",
        PYTHON,
        "--implementation",
        "cp",
        "--abi",
        f"cp{PYTHON.replace('.', '')}",
        "--only-binary=:all:",
        "--platform",
        f"manylinux_2_28_{machine}",
        "--platform",
        f"manylinux_2_17_{machine}",
        f"torch=={cpu_torch()}",
        "numpy>=1.26,<3",
        "-r",
        str(REPO / "docker" / "requirements.txt"),
        "pip",
        "setuptools>=77",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    if done.returncode != 0:
        words = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise BaseImageUnavailable(f"pip could not install the engine's packages into the base: {' / '.join(words)}")
    _timed("pip install into the rootfs", started)


def _strip(rootfs: Path) -> None:
    site = rootfs / "usr" / "local" / "lib" / f"python{PYTHON}" / "dist-packages"
    for relative in STRIPPED:
        shutil.rmtree(site / relative, ignore_errors=True)
    for cache in site.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)


def _unpack(tarball: Path, rootfs: Path) -> None:
    rootfs.mkdir()
    subprocess.run(["tar", "-C", str(rootfs), "-xf", str(tarball)], check=True, timeout=IMPORT_TIMEOUT_S)


def _tar(rootfs: Path, tarball: Path) -> None:
    partial = tarball.with_suffix(".partial")
    subprocess.run(
        ["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."], check=True, timeout=IMPORT_TIMEOUT_S
    )
    partial.rename(tarball)  # a half-written tarball is never taken for a cached one


class _locked:
    """An exclusive lock on a file, waited for at most LOCK_WAIT_S."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.stream = open(self.path, "a")
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self.stream, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.stream.close()
                    raise BaseImageUnavailable(f"{self.path} stayed locked for {LOCK_WAIT_S}s (another build?)")
                time.sleep(1)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.stream, fcntl.LOCK_UN)
        self.stream.close()


def _timed(what: str, started: float) -> None:
    seconds = time.monotonic() - started
    timings[what] = seconds
    print(f"[images] {what}: {seconds:.1f}s", file=sys.stderr, flush=True)


if __name__ == "__main__":  # build (or find) the cached tarball by hand: python tests/cluster/images.py
    print(base_rootfs())
