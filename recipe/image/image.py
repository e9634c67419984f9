"""The engine image on every Spark: built on the head from docker/Dockerfile, compared by content identity, shipped
to workers that lack it.

The identity is a sha256 over every file of the build context (the Dockerfile, the pins, the patch applier,
pyproject.toml, the engine tree, patches/series and the patches it lists), in byte order of their paths, plus
BASE_IMAGE. The build stores it as the image label `glm-sparks.identity`, so two machines hold the same engine
exactly when their labels match, whatever their image stores did to the image ID (containerd and overlay2 give the
same image different IDs). A worker lacking it gets it as `docker save IMAGE | ssh worker docker load`, streamed,
every worker at once.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from recipe.errors import RecipeError
from recipe.image.patches import PatchOutcome, SeriesError, apply_series, read_series, unlisted
from recipe.image.ship import ship
from recipe.net.nodes import LocalNode, Node, SshNode, on_each
from recipe.reporter import Reporter
from recipe.settings import REPO_ROOT, Settings

LABEL = "glm-sparks.identity"
SKIPPED_PARTS = ("__pycache__",)
SKIPPED_SUFFIXES = (".pyc", ".pyo")
README_STANDIN = b"The GLM-5.3-Flash engine (see the glm-sparks repository).\n"  # pyproject names a readme
BUILD_TIMEOUT_S = 3600
BUILD_LOG_TAIL = 30
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the classic builder colours the build's stderr


class ImageError(RecipeError):
    """The image could not be built, inspected or shipped."""


@dataclass(frozen=True)
class ContextFile:
    """One file of the build context: its path there, and where its bytes come from (a file or given bytes)."""

    path: str
    source: Path | None = None
    data: bytes | None = None

    def read(self) -> bytes:
        if self.data is not None:
            return self.data
        if self.source is None:
            raise RuntimeError(f"context file {self.path} names neither a source file nor its bytes")
        return self.source.read_bytes()


@dataclass(frozen=True)
class ImageSpec:
    tag: str
    base_image: str
    offline: bool
    identity: str
    files: tuple[ContextFile, ...] = field(repr=False)

    @property
    def short(self) -> str:
        """The first 12 hex digits: enough to tell images apart in messages and folder names."""
        return self.identity[:12]


@dataclass
class NodeImage:
    """What ensure did on one node."""

    node: str
    action: str  # "had it", "built", "shipped"
    seconds: float = 0.0
    bytes_sent: int = 0


@dataclass(frozen=True)
class ImageReport:
    """What ensure_image did: the image and identity every node now holds, and each node's outcome."""

    tag: str
    identity: str
    nodes: tuple[NodeImage, ...]


def context_files(repo: Path = REPO_ROOT) -> tuple[ContextFile, ...]:
    """Every file the build context holds, sorted by the bytes of its path (no locale can reorder them)."""
    files = [
        ContextFile("Dockerfile", repo / "docker" / "Dockerfile"),
        ContextFile("requirements.txt", repo / "docker" / "requirements.txt"),
        ContextFile("apply_patches.py", repo / "recipe" / "image" / "patches.py"),
        ContextFile("src/pyproject.toml", repo / "pyproject.toml"),
        ContextFile("src/README.md", data=README_STANDIN),
    ]
    files += [ContextFile(f"src/{path}", repo / path) for path in _engine_tree(repo)]
    patches = repo / "patches"
    try:
        names = read_series(patches)
    except SeriesError as error:
        raise ImageError(error.message, error.fix) from None
    # An empty series still needs the folder in the context (the Dockerfile copies it).
    files.append(
        ContextFile("patches/series", patches / "series")
        if (patches / "series").is_file()
        else ContextFile("patches/series", data=b"")
    )
    files += [ContextFile(f"patches/{name}", patches / name) for name in names]
    for item in files:
        if item.source is not None and not item.source.is_file():
            raise ImageError(
                f"{item.source} is missing, and the engine image is built from it",
                "restore it from the repository (git checkout -- <path>)",
            )
    return tuple(sorted(files, key=lambda f: f.path.encode()))


def _engine_tree(repo: Path) -> Iterator[str]:
    for path in (repo / "engine").rglob("*"):
        relative = path.relative_to(repo)
        if (
            path.is_file()
            and not any(p in SKIPPED_PARTS for p in relative.parts)
            and path.suffix not in SKIPPED_SUFFIXES
        ):
            yield relative.as_posix()


def identity_of(files: tuple[ContextFile, ...], base_image: str) -> str:
    digest = hashlib.sha256()
    for item in files:
        data = item.read()
        digest.update(item.path.encode() + b"\0" + str(len(data)).encode() + b"\0")
        digest.update(hashlib.sha256(data).digest())
    digest.update(b"base\0" + base_image.encode())
    return digest.hexdigest()


def image_spec(settings: Settings, repo: Path = REPO_ROOT) -> ImageSpec:
    # Read once: the identity and the context written for the build come from the same bytes, even while someone
    # edits engine/.
    files = tuple(ContextFile(f.path, data=f.read()) for f in context_files(repo))
    return ImageSpec(
        settings.image, settings.base_image, settings.image_offline, identity_of(files, settings.base_image), files
    )


def identity_on(node: Node, tag: str) -> str | None:
    """The identity label of `tag` on that node; None when the node has no such image ("" when it has no label)."""
    result = node.run(
        ["docker", "image", "inspect", "--format", f'{{{{ index .Config.Labels "{LABEL}" }}}}', tag], timeout_s=60
    )
    if result.ok:
        value = result.stdout.strip()
        return "" if value in ("", "<no value>") else value
    if "no such image" in result.stderr.lower():
        return None
    raise ImageError(
        f"cannot ask docker on {node.name} about {tag}: {result.last_error_line()}",
        node.fix_for(result)
        if result.code == 255
        else f"check that docker runs there and this user may use it (docker info on {node.name})",
    )


def write_context(spec: ImageSpec, folder: Path) -> None:
    for item in spec.files:
        target = folder / item.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(item.read())


def build(spec: ImageSpec, note: Callable[[str], None], node: Node | None = None) -> float:
    """`docker build` on the head (this machine); seconds taken. A patch that does not apply is named."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sparks-image-") as scratch:
        write_context(spec, Path(scratch))
        _run_build(build_argv(spec, scratch), spec.tag, note)
    found = identity_on(node or LocalNode(), spec.tag)
    if found != spec.identity:
        raise ImageError(
            f"the image built as {spec.tag} carries identity {found!r}, not {spec.short}",
            "run again; if it persists, report it with the build output above",
        )
    return time.monotonic() - started


def build_argv(spec: ImageSpec, context: str) -> list[str]:
    return [
        "docker",
        "build",
        "--tag",
        spec.tag,
        "--build-arg",
        f"BASE_IMAGE={spec.base_image}",
        "--build-arg",
        f"IDENTITY={spec.identity}",
        "--build-arg",
        f"OFFLINE={int(spec.offline)}",
        context,
    ]


def _run_build(argv: list[str], tag: str, note: Callable[[str], None]) -> None:
    tail: deque[str] = deque(maxlen=BUILD_LOG_TAIL)
    env = {**os.environ, "BUILDKIT_PROGRESS": "plain"}
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        errors="replace",
    )
    if proc.stdout is None:
        raise RuntimeError("docker build's output must be a pipe (stdout=PIPE above)")
    timer = _kill_after(proc, BUILD_TIMEOUT_S)
    try:
        for line in proc.stdout:
            line = ANSI.sub("", line).rstrip()
            tail.append(line)
            if _is_progress(line):
                note(line)
        code = proc.wait()
    finally:
        timer.cancel()
    if code == 0:
        return
    failed = next((text for text in tail if " does not apply: " in text and "patch " in text), "")
    if failed:
        name = failed.split("patch ", 1)[1].split(" does not apply", 1)[0]
        raise ImageError(
            f"patch {name} does not apply to engine/ (listed in patches/series): the image build "
            f"stopped. patch said: {failed.split(' does not apply: ', 1)[1]}",
            f"update patches/{name} for the current engine, or remove it from patches/series; "
            "`sparks patches check` tries the series without building",
        )
    for line in tail:
        note(f"│ {line}")
    raise ImageError(
        f"docker build of {tag} failed (exit code {code}): {tail[-1] if tail else 'no output'}",
        "read the build's last lines above; with IMAGE_OFFLINE=1 every pin of docker/requirements.txt "
        "must already be installed in BASE_IMAGE",
    )


def _is_progress(line: str) -> bool:
    # the classic builder's "Step 3/9 : RUN ...", BuildKit's "#7 [3/6] RUN ...", and the patch applier's lines
    return line.startswith("Step ") or (line.startswith("#") and " [" in line[:8]) or line.startswith("patch ")


def _kill_after(proc: subprocess.Popen, seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, proc.kill)
    timer.daemon = True
    timer.start()
    return timer


def worker_nodes(settings: Settings) -> list[SshNode]:
    return [SshNode(w) for w in settings.workers]


def ensure_image(
    settings: Settings, reporter: Reporter, head: Node | None = None, repo: Path = REPO_ROOT
) -> ImageReport:
    """Make every node hold the image with this checkout's identity: build it on the head when the head's lacks
    it, ship it to each worker that lacks it (all at once). Returns each node's outcome; raises naming every node
    that failed."""
    head = head or LocalNode()
    spec = image_spec(settings, repo)
    reporter.note(f"Image {spec.tag}, identity {spec.short} (engine, patches, pins, base {spec.base_image})")
    outcomes = [_ensure_on_head(spec, head, reporter)]
    workers = worker_nodes(settings)
    results = on_each(workers, lambda worker: _ensure_on_worker(spec, head, worker, reporter))
    failed = []
    for name, result in results.items():
        if isinstance(result, BaseException):
            failed.append(f"{name}: {result.message if isinstance(result, RecipeError) else result}")
        else:
            outcomes.append(result)
    for outcome in outcomes:
        reporter.note(_describe(outcome))
    if failed:
        raise ImageError(
            f"the image did not reach every worker ({'; '.join(failed)})",
            "fix what is named, then start again: workers that already hold it are not sent it twice",
        )
    return ImageReport(spec.tag, spec.identity, tuple(outcomes))


def _ensure_on_head(spec: ImageSpec, head: Node, reporter: Reporter) -> NodeImage:
    found = identity_on(head, spec.tag)
    if found == spec.identity:
        return NodeImage(head.name, "had it")
    why = "not built yet" if found is None else f"has identity {found[:12] or '(none)'}"
    reporter.note(
        f"Building {spec.tag} on this machine ({why}); base {spec.base_image}" + (", offline" if spec.offline else "")
    )
    return NodeImage(head.name, "built", build(spec, reporter.note, head))


def _ensure_on_worker(spec: ImageSpec, head: Node, worker: SshNode, reporter: Reporter) -> NodeImage:
    if identity_on(worker, spec.tag) == spec.identity:
        return NodeImage(worker.name, "had it")
    started = time.monotonic()
    sent = ship(spec.tag, head, worker, lambda text: reporter.note(f"{worker.name}: {text}"))
    found = identity_on(worker, spec.tag)
    if found != spec.identity:
        raise ImageError(
            f"{worker.name}'s {spec.tag} has identity {(found or 'none')[:12]} after the copy, not {spec.short}",
            f"check docker load there (docker image ls on {worker.name})",
        )
    return NodeImage(worker.name, "shipped", time.monotonic() - started, sent)


def _describe(outcome: NodeImage) -> str:
    if outcome.action == "had it":
        return f"{outcome.node}: already has it"
    if outcome.action == "built":
        return f"{outcome.node}: built in {outcome.seconds:.1f}s"
    return (
        f"{outcome.node}: sent {outcome.bytes_sent / 2**20:.0f} MiB in {outcome.seconds:.1f}s "
        f"({outcome.bytes_sent / 2**20 / max(outcome.seconds, 1e-3):.0f} MiB/s)"
    )


def plan_lines(settings: Settings, head: Node | None = None, repo: Path = REPO_ROOT) -> list[str]:
    """DRY_RUN: what ensure_image would do on each node, asking docker only (nothing is built or sent)."""
    head = head or LocalNode()
    spec = image_spec(settings, repo)
    lines = [
        f"Image {spec.tag}, identity {spec.short} (base {spec.base_image}"
        + (", offline build" if spec.offline else "")
        + ")"
    ]
    for node, verb in [(head, "build it here"), *((w, "send it there") for w in worker_nodes(settings))]:
        try:
            found = identity_on(node, spec.tag)
        except ImageError as error:
            lines.append(f"  {node.name}: unknown ({error.message}); would {verb} if it lacks it")
            continue
        if found == spec.identity:
            lines.append(f"  {node.name}: has it; nothing to do")
        else:
            state = "no such image" if found is None else f"identity {found[:12] or '(none)'}"
            lines.append(f"  {node.name}: {state}; would {verb}")
    return lines


def check_patches(repo: Path = REPO_ROOT) -> tuple[list[PatchOutcome], list[str]]:
    """`sparks patches check`: the series applied in order to a scratch copy of engine/ (as the build would);
    each patch's outcome, and the patch files that series does not list."""
    patches = repo / "patches"
    try:
        with tempfile.TemporaryDirectory(prefix="sparks-patches-") as scratch:
            for item in context_files(repo):
                if item.path.startswith("src/"):
                    target = Path(scratch) / item.path[len("src/") :]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(item.read())
            return apply_series(patches, Path(scratch)), unlisted(patches)
    except SeriesError as error:
        raise ImageError(error.message, error.fix) from None
