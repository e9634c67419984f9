"""The engine image without docker: its identity (what it covers, byte order, what it ignores), the patch series
(order, failures named, unlisted files), the build's argv and failure messages, the pins against pyproject, and
the save | load stream (real pipes; `cat` stands in for docker's two ends: docker itself is exercised on the
namespaced test bed in tests/cluster/test_image.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from recipe.image import ship
from recipe.image.image import ImageError, _run_build, build_argv, check_patches, context_files, identity_of, image_spec
from recipe.image.patches import main as apply_main
from recipe.net.nodes import LocalNode
from recipe.settings import REPO_ROOT, load_settings

GOOD = """--- a/engine/alpha.py
+++ b/engine/alpha.py
@@ -1,2 +1,2 @@
 first = 1
-second = 2
+second = 22
"""
STALE = """--- a/engine/alpha.py
+++ b/engine/alpha.py
@@ -1,2 +1,2 @@
 first = 100
-not = there
+still = not
"""
LATER = """--- /dev/null
+++ b/engine/added.py
@@ -0,0 +1 @@
+added = True
"""


def make_repo(
    root: Path, engine: dict[str, str], patches: dict[str, str] | None = None, series: list[str] | None = None
) -> Path:
    """A repository with what the image is built from: docker/, recipe/image/patches.py, pyproject.toml, engine/."""
    shutil.copytree(REPO_ROOT / "docker", root / "docker")
    (root / "recipe" / "image").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "recipe" / "image" / "patches.py", root / "recipe" / "image" / "patches.py")
    shutil.copy(REPO_ROOT / "pyproject.toml", root / "pyproject.toml")
    for path, text in engine.items():
        (root / "engine" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "engine" / path).write_text(text)
    (root / "patches").mkdir()
    for name, text in (patches or {}).items():
        (root / "patches" / name).write_text(text)
    names = list(patches or {}) if series is None else series
    (root / "patches" / "series").write_text("# order matters\n" + "".join(f"{n}\n" for n in names))
    return root


needs_patch = pytest.mark.skipif(shutil.which("patch") is None, reason="the `patch` program is not installed here")
ENGINE = {"alpha.py": "first = 1\nsecond = 2\n", "__init__.py": "", "sub/beta.py": "x = 1\n"}


def identity(repo: Path, base: str = "base:1") -> str:
    return identity_of(context_files(repo), base)


def test_identity_is_the_same_for_the_same_content_whatever_order_the_files_were_written(tmp_path):
    one = make_repo(tmp_path / "one", ENGINE, {"0001-good.patch": GOOD})
    two = make_repo(tmp_path / "two", dict(reversed(list(ENGINE.items()))), {"0001-good.patch": GOOD})
    assert identity(one) == identity(two)
    assert len(identity(one)) == 64


def test_context_files_are_in_byte_order_of_their_paths(tmp_path):
    repo = make_repo(tmp_path, {**ENGINE, "Zeta.py": "", "_under.py": "", "a_b.py": "", "a-b.py": ""})
    paths = [f.path for f in context_files(repo)]
    assert paths == sorted(paths, key=str.encode)
    assert paths.index("src/engine/Zeta.py") < paths.index("src/engine/_under.py") < paths.index("src/engine/a_b.py")


def test_identity_covers_engine_patches_pins_and_base(tmp_path):
    repo = make_repo(tmp_path, ENGINE, {"0001-good.patch": GOOD, "0002-later.patch": LATER})
    before = identity(repo)
    assert identity(repo, "base:2") != before, "another base image is another image"

    (repo / "engine" / "alpha.py").write_text("first = 1\nsecond = 3\n")
    assert identity(repo) != before, "an engine file changed"
    (repo / "engine" / "alpha.py").write_text(ENGINE["alpha.py"])
    assert identity(repo) == before

    (repo / "patches" / "0002-later.patch").write_text(LATER.replace("True", "False"))
    assert identity(repo) != before, "a patch changed"
    (repo / "patches" / "0002-later.patch").write_text(LATER)

    (repo / "patches" / "series").write_text("0002-later.patch\n0001-good.patch\n")
    assert identity(repo) != before, "the series order changed"
    (repo / "patches" / "series").write_text("# order matters\n0001-good.patch\n0002-later.patch\n")
    assert identity(repo) == before

    pins = repo / "docker" / "requirements.txt"
    pins.write_text(pins.read_text().replace("jinja2==", "jinja2==9"))
    assert identity(repo) != before, "a pin changed"


def test_identity_ignores_bytecode_and_unlisted_patches(tmp_path):
    repo = make_repo(tmp_path, ENGINE, {"0001-good.patch": GOOD})
    before = identity(repo)
    (repo / "engine" / "__pycache__").mkdir()
    (repo / "engine" / "__pycache__" / "alpha.cpython-311.pyc").write_bytes(b"\0")
    (repo / "engine" / "stray.pyc").write_bytes(b"\0")
    (repo / "patches" / "9999-draft.patch").write_text(LATER)
    assert identity(repo) == before


def test_the_spec_takes_tag_base_and_offline_from_the_settings(tmp_path):
    repo = make_repo(tmp_path, ENGINE)
    settings = load_settings(tmp_path, {"BASE_IMAGE": "sparks-base:test", "IMAGE_OFFLINE": "1", "IMAGE": "e:2"})
    spec = image_spec(settings, repo)
    assert (spec.tag, spec.base_image, spec.offline) == ("e:2", "sparks-base:test", True)
    assert spec.identity == identity(repo, "sparks-base:test") and spec.short == spec.identity[:12]
    assert build_argv(spec, "/ctx") == [
        "docker",
        "build",
        "--tag",
        "e:2",
        "--build-arg",
        "BASE_IMAGE=sparks-base:test",
        "--build-arg",
        f"IDENTITY={spec.identity}",
        "--build-arg",
        "OFFLINE=1",
        "/ctx",
    ]


@needs_patch
def test_patches_check_reports_each_patch_and_stops_trying_after_a_failure(tmp_path):
    repo = make_repo(tmp_path, ENGINE, {"0001-good.patch": GOOD, "0002-stale.patch": STALE, "0003-later.patch": LATER})
    (repo / "patches" / "0004-unlisted.patch").write_text(LATER)
    outcomes, unlisted = check_patches(repo)
    assert [(o.name, o.status) for o in outcomes] == [
        ("0001-good.patch", "ok"),
        ("0002-stale.patch", "fails"),
        ("0003-later.patch", "not tried"),
    ]
    assert "FAILED" in outcomes[1].detail or "fail" in outcomes[1].detail.lower()
    assert unlisted == ["0004-unlisted.patch"]
    assert (repo / "engine" / "alpha.py").read_text() == ENGINE["alpha.py"], "the check never touches engine/"


@needs_patch
def test_patches_check_passes_a_good_series(tmp_path):
    repo = make_repo(tmp_path, ENGINE, {"0001-good.patch": GOOD, "0002-later.patch": LATER})
    outcomes, unlisted = check_patches(repo)
    assert [o.status for o in outcomes] == ["ok", "ok"] and unlisted == []


@pytest.mark.parametrize(
    "line, words",
    [
        ("0009-missing.patch", "line 2: 0009-missing.patch is listed but there is no"),
        ("sub/0001.patch", "line 2: 'sub/0001.patch' is not a plain file name"),
        ("0001-good.patch\n0001-good.patch", "line 3: 0001-good.patch is listed twice"),
    ],
)
def test_a_bad_series_line_is_named(tmp_path, line, words):
    repo = make_repo(tmp_path, ENGINE, {"0001-good.patch": GOOD}, series=[])
    (repo / "patches" / "series").write_text(f"# header\n{line}\n")
    with pytest.raises(ImageError) as raised:
        context_files(repo)
    assert f"patches/series {words}" in raised.value.message


@needs_patch
def test_the_build_time_applier_exits_naming_the_patch_that_does_not_apply(tmp_path, capsys):
    repo = make_repo(tmp_path, ENGINE, {"0001-good.patch": GOOD, "0002-stale.patch": STALE})
    assert apply_main([str(repo / "patches"), str(repo)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("patch 0002-stale.patch does not apply: ")


def test_a_build_that_stops_at_a_patch_names_it():
    script = (
        "echo 'Step 3/9 : RUN apply'; echo 'patch 0001-a.patch: ok'; "
        "echo 'patch 0002-b.patch does not apply: Hunk #1 FAILED at 3.'; exit 1"
    )
    notes: list[str] = []
    with pytest.raises(ImageError) as raised:
        _run_build(["sh", "-c", script], "e:1", notes.append)
    assert raised.value.message.startswith("patch 0002-b.patch does not apply to engine/")
    assert "Hunk #1 FAILED" in raised.value.message and "sparks patches check" in raised.value.fix
    assert notes[:2] == ["Step 3/9 : RUN apply", "patch 0001-a.patch: ok"]


def test_another_build_failure_shows_its_last_lines():
    notes: list[str] = []
    with pytest.raises(ImageError) as raised:
        _run_build(
            ["sh", "-c", "echo 'ERROR: No matching distribution found for fastapi'; exit 1"], "e:1", notes.append
        )
    assert "docker build of e:1 failed (exit code 1): ERROR: No matching distribution" in raised.value.message
    assert "IMAGE_OFFLINE=1" in raised.value.fix
    assert any("No matching distribution" in n for n in notes)


def test_pins_are_exact_and_inside_the_engine_extras():
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    extra = {Requirement(r).name.lower().replace("_", "-"): Requirement(r) for r in extras["engine"] + extras["gpu"]}
    pins = [
        Requirement(line)
        for line in (REPO_ROOT / "docker" / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    pinned = {p.name.lower().replace("_", "-"): p for p in pins}
    assert set(pinned) == set(extra) - {"torch", "numpy"}, (
        "every engine and gpu package but the base image's torch/numpy"
    )
    for name, pin in pinned.items():
        (spec,) = pin.specifier
        assert spec.operator == "==", f"{name} is pinned exactly"
        assert extra[name].specifier.contains(spec.version), f"{name}=={spec.version} is inside pyproject's range"


class Piped(LocalNode):
    """A node whose `docker save` / `docker load` are `cat` from / into files: the stream in between is real."""

    def __init__(
        self, name: str, save_from: Path | None = None, load_into: Path | None = None, load_fails: bool = False
    ) -> None:
        super().__init__()
        self.name, self.target = name, name
        self.save_from, self.load_into, self.load_fails = save_from, load_into, load_fails

    def _wrap(self, argv):
        if argv[:2] == ["docker", "save"]:
            return ["cat", str(self.save_from)]
        if argv[:2] == ["docker", "load"]:
            return (
                ["sh", "-c", "head -c 1000 >/dev/null; echo 'no space left on device' >&2; exit 1"]
                if self.load_fails
                else ["sh", "-c", f"cat > {self.load_into}"]
            )
        return ["sh", "-c", "echo 3000000"]  # docker image inspect --format {{.Size}}


def test_ship_streams_every_byte_and_reports_progress(tmp_path, monkeypatch):
    image = tmp_path / "image.tar"
    image.write_bytes(bytes(range(256)) * 12000)  # ~3 MB, several chunks
    monkeypatch.setattr(ship, "CHUNK", 64 * 1024)
    monkeypatch.setattr(ship, "REPORT_EVERY_S", 0.0)
    notes: list[str] = []
    sent = ship.ship("e:1", Piped("head", save_from=image), Piped("w1", load_into=tmp_path / "got"), notes.append)
    assert sent == image.stat().st_size
    assert (tmp_path / "got").read_bytes() == image.read_bytes()
    assert any("MiB sent (" in n and "%" in n for n in notes), notes


def test_ship_names_the_worker_when_load_fails(tmp_path):
    image = tmp_path / "image.tar"
    image.write_bytes(b"x" * 3_000_000)
    with pytest.raises(ship.ShipError) as raised:
        ship.ship("e:1", Piped("head", save_from=image), Piped("w1", load_fails=True), lambda _: None)
    assert raised.value.message.startswith("docker load on w1 failed") and "no space left" in raised.value.message


def test_patches_check_command_on_this_checkout():
    from typer.testing import CliRunner

    from recipe.cli import app

    result = CliRunner().invoke(app, ["patches", "check"])
    assert result.exit_code == 0, result.output
    listed = [
        line for line in (REPO_ROOT / "patches" / "series").read_text().splitlines() if line.split("#", 1)[0].strip()
    ]
    assert ("lists no patch" in result.output) if not listed else (f"All {len(listed)} patch(es)" in result.output)
