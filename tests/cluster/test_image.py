"""The engine image on real dockerds: built on the head from the test bed's base image (tests/cluster/images.py)
with no route out (IMAGE_OFFLINE=1), shipped to a worker by `docker save | ssh | docker load`, compared by its
identity label; a patch that does not apply stops the build, named. The recipe runs in the head's namespace and
reaches the worker only over ssh.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from images import BaseImageUnavailable, image_settings

REPO = Path(__file__).resolve().parents[2]
SPARKS = str(REPO / ".venv" / "bin" / "sparks")
LABEL = "glm-sparks.identity"
TAG = "sparks-image-test:1"  # its own tag: other cluster tests on this bed may hold the default IMAGE already

# Runs on the head: ensure_image for the settings in the environment, from the repository given (a scratch copy
# for the patch tests); prints each node's outcome as JSON, or the error's message and fix.
DRIVER = """
import json, sys
from pathlib import Path
from recipe.errors import RecipeError
from recipe.image.image import ensure_image
from recipe.reporter import Quiet
from recipe.settings import load_settings

settings = load_settings()
reporter = Quiet()
try:
    report = ensure_image(settings, reporter, repo=Path(sys.argv[1]))
except RecipeError as error:
    print(json.dumps({"error": error.message, "fix": error.fix, "notes": reporter.notes}))
    sys.exit(3)
print(json.dumps({"identity": report.identity, "notes": reporter.notes,
                  "outcomes": [o.__dict__ for o in report.nodes]}))
"""


@pytest.fixture(scope="module")
def env(bed):
    try:
        extra = image_settings(bed)
    except BaseImageUnavailable as reason:
        pytest.skip(f"test bed base image: {reason}")
    return bed.environ(IMAGE=TAG, COLUMNS="200", **extra)


def ensure(bed, env: dict[str, str], repo: Path = REPO, **settings: str) -> tuple[int, dict, float]:
    started = time.monotonic()
    done = bed.on_head([sys.executable, "-c", DRIVER, str(repo)], {**env, **settings}, timeout_s=900)
    seconds = time.monotonic() - started
    assert done.stdout.strip(), f"driver printed nothing: {done.stderr[-2000:]}"
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1]), seconds


def identity_on(bed, node: str, tag: str) -> str:
    """Asked of that node's dockerd through its socket (a file; no network is used)."""
    done = subprocess.run(
        [
            "docker",
            "-H",
            f"unix://{bed.path_on(node, 'run/docker.sock')}",
            "image",
            "inspect",
            "--format",
            f'{{{{ index .Config.Labels "{LABEL}" }}}}',
            tag,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout.strip() if done.returncode == 0 else ""


def dry_run_image_lines(bed, env: dict[str, str]) -> list[str]:
    done = bed.on_head([SPARKS, "start"], {**env, "DRY_RUN": "1"}, timeout_s=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"Image {TAG}, identity "))
    return [line.strip() for line in lines[start + 1 : start + 3]]


def test_dry_run_says_what_would_be_built_and_sent(bed, env):
    worker = env["WORKER"]
    assert dry_run_image_lines(bed, env) == [
        "local: no such image; would build it here",
        f"{worker}: no such image; would send it there",
    ]
    assert identity_on(bed, "head", TAG) == "", "DRY_RUN builds nothing"


def test_build_on_head_then_ship_to_worker_once(bed, env):
    code, first, build_ship_s = ensure(bed, env)
    assert code == 0, first
    actions = {o["node"]: o["action"] for o in first["outcomes"]}
    worker = env["WORKER"]
    assert actions == {"local": "built", worker: "shipped"}, first["notes"]
    sent = next(o for o in first["outcomes"] if o["node"] == worker)["bytes_sent"]
    assert sent > 100 * 2**20, "the whole image travels to a worker that has none of it"
    assert identity_on(bed, "head", TAG) == first["identity"]
    assert identity_on(bed, "w1", TAG) == first["identity"]
    assert identity_on(bed, "w2", TAG) == "", "w2 is not configured"
    assert any("MiB sent" in n for n in first["notes"]), "the copy reports its progress in bytes"

    code, second, again_s = ensure(bed, env)
    assert code == 0, second
    assert [o["action"] for o in second["outcomes"]] == ["had it", "had it"]
    assert all(o["bytes_sent"] == 0 for o in second["outcomes"])
    print(
        f"\n[image] ensure (build on head + ship to one worker): {build_ship_s:.1f}s; "
        f"{'; '.join(n for n in first['notes'] if n.startswith(('local:', worker + ':')) and ' in ' in n)}; "
        f"second ensure: {again_s:.1f}s"
    )

    assert dry_run_image_lines(bed, env) == ["local: has it; nothing to do", f"{worker}: has it; nothing to do"]

    # the shipped image runs the engine on the worker (its dockerd, no network inside)
    ran = subprocess.run(
        [
            "docker",
            "-H",
            f"unix://{bed.path_on('w1', 'run/docker.sock')}",
            "run",
            "--rm",
            "--network",
            "none",
            TAG,
            "python3",
            "-c",
            "import engine.serve, torch; print('ok', torch.__version__)",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0 and ran.stdout.startswith("ok 2."), ran.stderr[-1500:]


def test_a_second_worker_gets_it_while_the_first_is_left_alone(bed, env):
    w1, w2 = env["WORKER"], f"root@{bed.nodes['w2'].address}"
    code, result, seconds = ensure(bed, env, TP="3", WORKER2=w2)
    assert code == 0, result
    assert {o["node"]: o["action"] for o in result["outcomes"]} == {"local": "had it", w1: "had it", w2: "shipped"}
    assert identity_on(bed, "w2", TAG) == result["identity"]
    print(f"\n[image] ensure with w2 lacking it: {seconds:.1f}s")


def test_an_unreachable_worker_is_named_and_the_others_still_reported(bed, env):
    gone = "root@10.77.0.99"  # in the test bed's subnet, inside its namespaces: no such node answers
    code, result, _ = ensure(bed, env, TP="3", WORKER2=gone)
    assert code == 3, result
    assert result["error"].startswith("the image did not reach every worker") and gone in result["error"]
    assert f"{env['WORKER']}: already has it" in result["notes"]


def scratch_repo(tmp_path: Path, patches: dict[str, str]) -> Path:
    """A copy of what the image is built from, with these patches listed in order."""
    repo = tmp_path / "repo"
    for part in ("docker", "engine"):
        shutil.copytree(REPO / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "recipe" / "image").mkdir(parents=True)
    shutil.copy(REPO / "recipe" / "image" / "patches.py", repo / "recipe" / "image" / "patches.py")
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    (repo / "patches").mkdir()
    for name, text in patches.items():
        (repo / "patches" / name).write_text(text)
    (repo / "patches" / "series").write_text("".join(f"{name}\n" for name in patches))
    return repo


GOOD = """--- /dev/null
+++ b/engine/patched_marker.py
@@ -0,0 +1 @@
+PATCHED_BY_SERIES = True
"""
STALE = """--- a/engine/parallel.py
+++ b/engine/parallel.py
@@ -1,3 +1,3 @@
-this line is not in the engine
+nor is this one
 and neither is this
 or this
"""


def test_a_patch_that_does_not_apply_stops_the_build_named(bed, env, tmp_path):
    repo = scratch_repo(tmp_path, {"0001-good.patch": GOOD, "0002-stale.patch": STALE})
    code, result, _ = ensure(bed, env, repo, IMAGE="sparks-patch-test:1")
    assert code == 3, result
    assert "patch 0002-stale.patch does not apply" in result["error"], result
    assert "patches/series" in result["error"] and "sparks patches check" in result["fix"]
    assert any("patch 0001-good.patch: ok" in n for n in result["notes"]), "\n".join(result["notes"])
    assert identity_on(bed, "head", "sparks-patch-test:1") == ""


def test_applied_patches_are_in_the_image(bed, env, tmp_path):
    repo = scratch_repo(tmp_path, {"0001-good.patch": GOOD})
    code, result, _ = ensure(bed, env, repo, IMAGE="sparks-patch-test:2", WORKER="", TP="1")
    assert code == 0, result
    ran = subprocess.run(
        [
            "docker",
            "-H",
            f"unix://{bed.path_on('head', 'run/docker.sock')}",
            "run",
            "--rm",
            "--network",
            "none",
            "sparks-patch-test:2",
            "python3",
            "-c",
            "from engine.patched_marker import PATCHED_BY_SERIES as p; print(p)",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.stdout.strip() == "True", ran.stderr[-1500:]
