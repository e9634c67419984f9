"""Ranks as containers: one `docker run -d` per rank on its node (workers over ssh, rank 0 here), their logs, stop.

Each node is made ready first with one command: docker answers, the image is there (its id names the node's kernel
cache folder, made now), the node's user (containers run as it), and containers a previous run left under our
names (their logs are saved, then they are removed: a crash's evidence is kept, and a name is never taken twice).
Every container started is recorded by id in the head's state file right away, so a launch cut short can still be
stopped. Stop asks each node's containers to exit (`docker stop -t STOP_TIMEOUT`: SIGTERM, then SIGKILL), saves
each rank's log under LOG_DIR here (gzipped, rotated like the process runtime's), then removes the containers.
Nothing here prints: progress goes through a `Reporter`.
"""

from __future__ import annotations

import dataclasses
import queue
import re
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from recipe.errors import RecipeError
from recipe.image.image import LABEL
from recipe.launch.logs import save_log_data
from recipe.launch.runstate import RankProcess, RankStop
from recipe.net.nodes import Node, node_for, on_each
from recipe.plan.docker import IMAGE_ID, NODE_USER
from recipe.plan.parts import RankPlan
from recipe.plan.plan import Plan
from recipe.reporter import Reporter

RUN_TIMEOUT_S = 60
LOG_TIMEOUT_S = 60

# Arguments: image, identity label, kernel cache root. Prints "image <id12> <uid:gid>", then "container <name> <id>"
# per container. The image's identity label names the kernel cache (the same build has the same label on every
# node); an image without one is known by its id there.
_READY_SH = r"""
docker info >/dev/null 2>&1 || { echo "docker does not answer on this node: $(docker info 2>&1 | tail -n 1)" >&2; exit 3; }
id=$(docker image inspect -f "{{index .Config.Labels \"$2\"}} {{.Id}}" "$1" 2>/dev/null) || {
  echo "image $1 is not on this node" >&2; exit 4; }
case $id in "<no value> "*|" "*|"unset "*) id=${id#* };; esac
id=${id#sha256:}; id=$(printf %.12s "$id")
mkdir -p "$3/$id" || exit 5
echo "image $id $(id -u):$(id -g)"
docker ps -a --no-trunc --format '{{.Names}} {{.ID}}' | sed 's/^/container /'
"""

# Arguments: timeout in seconds, then container ids. Prints "ID before running|exited|gone", then "ID after CODE".
_STOP_SH = r"""
T=$1; shift
for c in "$@"; do
  s=$(docker inspect -f '{{.State.Running}}' "$c" 2>/dev/null) || s=gone
  case $s in true) s=running;; false) s=exited;; esac
  echo "$c before $s"
done
docker stop -t "$T" "$@" >/dev/null 2>&1
for c in "$@"; do echo "$c after $(docker inspect -f '{{.State.ExitCode}}' "$c" 2>/dev/null || echo gone)"; done
"""


class ContainerError(RecipeError):
    """A node's docker could not start, inspect or stop a rank's container."""


@dataclass(frozen=True)
class NodeReady:
    image_id: str  # first 12 hex digits of the image's id on that node
    user: str  # uid:gid the containers run as
    leftovers: tuple[tuple[str, str], ...]  # (name, id) of containers a previous run left under our names


def container_names(plan: Plan) -> dict[int, str]:
    """Each rank's container name (the word after --name in its command)."""
    return {r.rank: r.argv[r.argv.index("--name") + 1] for r in plan.ranks}


def ready_node(node: Node, plan: Plan, image: str, kernel_root: str) -> NodeReady:
    result = node.run(["sh", "-c", _READY_SH, "ready", image, LABEL, kernel_root], timeout_s=RUN_TIMEOUT_S)
    if not result.ok:
        where = "here" if node.is_local else f"on {node.name}"
        fix = (
            node.fix_for(result)
            if result.code in (124, 255)
            else f"build or copy the image there first (docker image ls {image} {where})"
            if result.code == 4
            else "start docker there and let this user use it (sudo usermod -aG docker $USER)"
        )
        raise ContainerError(f"cannot start containers {where}: {result.last_error_line()}", fix)
    lines = result.stdout.splitlines()
    _, image_id, user = lines[0].split()
    pattern = re.compile(re.escape(_name_prefix(plan)) + r"-rank\d+$")
    leftovers = tuple(
        (name, cid)
        for _, name, cid in (line.split() for line in lines[1:] if line.count(" ") == 2)
        if pattern.match(name)
    )
    return NodeReady(image_id, user, leftovers)


def _name_prefix(plan: Plan) -> str:
    return container_names(plan)[0].rsplit("-rank", 1)[0]


def for_node(rank: RankPlan, ready: NodeReady) -> tuple[str, ...]:
    """The rank's command with the node's values in place of the plan's placeholders."""
    return tuple(word.replace(IMAGE_ID, ready.image_id).replace(NODE_USER, ready.user) for word in rank.argv)


def clear_leftovers(node: Node, ready: NodeReady, log_dir: Path, keep: int, reporter: Reporter) -> None:
    """Containers a crashed or interrupted run left under our names: log saved (evidence), then removed."""
    for name, cid in ready.leftovers:
        rank = int(name.rsplit("-rank", 1)[1])
        saved = save_container_log(node, cid, rank, log_dir, keep)
        node.run(["docker", "rm", "-f", cid], timeout_s=RUN_TIMEOUT_S)
        where = "here" if node.is_local else f"on {node.name}"
        reporter.note(f"Removed the previous container {name} {where}" + (f"; its log: {saved}" if saved else ""))


def prepare_nodes(
    plan: Plan, image: str, kernel_root: str, log_dir: Path, keep: int, reporter: Reporter
) -> dict[str, NodeReady]:
    """Every node of the plan made ready at once; the first failure (in plan order) is raised after all answered."""
    nodes = [node_for(n) for n in dict.fromkeys(r.node for r in plan.ranks)]
    found = on_each(nodes, lambda node: ready_node(node, plan, image, kernel_root))
    ready: dict[str, NodeReady] = {}
    for node in nodes:
        outcome = found[node.name]
        if isinstance(outcome, BaseException):
            raise outcome
        ready[node.name] = outcome
    for node in nodes:
        clear_leftovers(node, ready[node.name], log_dir, keep, reporter)
    return ready


def run_rank(node: Node, rank: RankPlan, ready: NodeReady) -> RankProcess:
    """`docker run -d` one rank on its node; returns it recorded by container id."""
    result = node.run(for_node(rank, ready), timeout_s=RUN_TIMEOUT_S)
    cid = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    if not result.ok or not re.fullmatch(r"[0-9a-f]{64}", cid):
        where = "here" if node.is_local else f"on {node.name}"
        raise ContainerError(
            f"could not start rank {rank.rank}'s container {where}: {docker_error(result)}",
            node.fix_for(result)
            if result.code in (124, 255)
            else "see docker's message; ./start.sh stops what did start",
        )
    return RankProcess(rank.rank, 0, 0, rank.log, node.name, container=cid)


def docker_error(result) -> str:
    """docker's own reason ("docker: Error response from daemon: ..."), not its closing "Run 'docker run --help'"."""
    for line in result.stderr.splitlines():
        if line.startswith("docker:"):
            return line[len("docker:") :].strip()
    return result.last_error_line()


def tail(proc: RankProcess, count: int = 25) -> list[str]:
    """A container rank's last log lines; one line saying why when they cannot be read."""
    data = node_for(proc.node).fetch(
        ["sh", "-c", 'docker logs --tail "$1" "$2" 2>&1', "tail", str(count), proc.container], timeout_s=LOG_TIMEOUT_S
    )
    if data is None:
        return [f"(could not read the log of container {proc.container[:12]} {proc.where})"]
    return [line.decode(errors="replace") for line in data.splitlines()[-count:]]


def save_container_log(node: Node, container: str, rank: int, log_dir: Path, keep: int) -> Path | None:
    """A container's whole log into LOG_DIR here, gzipped and rotated like a process rank's."""
    data = node.fetch(["sh", "-c", 'docker logs "$1" 2>&1', "logs", container], timeout_s=LOG_TIMEOUT_S)
    return None if data is None else save_log_data(data, log_dir, rank, keep)


def stop_containers(node: Node, ranks: list[RankProcess], timeout_s: float, log_dir: Path, keep: int) -> list[RankStop]:
    """Stop one node's containers together (SIGTERM, STOP_TIMEOUT, SIGKILL), save each log here, remove them."""
    result = node.run(
        ["sh", "-c", _STOP_SH, "stop", str(int(timeout_s)), *(r.container for r in ranks)], timeout_s=timeout_s + 60
    )
    if not result.ok:
        why = f"unknown: {result.last_error_line()}"
        return [RankStop(r.rank, 0, why, None, r.node, r.container) for r in ranks]
    said = {}
    for line in result.stdout.splitlines():
        cid, when, value = (line.split() + ["", "", ""])[:3]
        said[(cid, when)] = value
    outcomes = []
    for proc in ranks:
        before, after = said.get((proc.container, "before"), "gone"), said.get((proc.container, "after"), "gone")
        outcome = "was not running" if before != "running" else "killed" if after == "137" else "stopped"
        saved = save_container_log(node, proc.container, proc.rank, log_dir, keep) if before != "gone" else None
        outcomes.append(RankStop(proc.rank, 0, outcome, saved, proc.node, proc.container))
    present = [p.container for p in ranks if said.get((p.container, "before"), "gone") != "gone"]
    if present:
        removed = node.run(["docker", "rm", "-f", *present], timeout_s=RUN_TIMEOUT_S)
        if not removed.ok:
            why = f"unknown: stopped, but not removed ({removed.last_error_line()})"
            outcomes = [dataclasses.replace(o, outcome=why) for o in outcomes]
    return outcomes


class ContainerLogFollower:
    """New lines of a container here (`docker logs -f`, read by a thread): what rank 0 prints while it loads."""

    def __init__(self, container: str) -> None:
        self._lines: queue.Queue[str] = queue.Queue()
        self._proc = subprocess.Popen(
            ["docker", "logs", "-f", container],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in self._proc.stdout or ():
            self._lines.put(raw.decode(errors="replace").rstrip("\r\n"))

    def new_lines(self) -> list[str]:
        found = []
        while not self._lines.empty():
            found.append(self._lines.get_nowait())
        return found

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class ContainerWatch:
    """A container here, asked like a process handle: `poll()` is None while it runs, else its exit code."""

    def __init__(self, container: str) -> None:
        self.container = container

    def poll(self) -> int | None:
        result = node_for("local").run(
            ["docker", "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", self.container],
            timeout_s=RUN_TIMEOUT_S,
        )
        if not result.ok:
            return 1 if "no such" in result.stderr.lower() else None  # removed: gone; docker not answering: wait
        running, code = (result.stdout.split() + ["", ""])[:2]
        return None if running == "true" else int(code) if code.lstrip("-").isdigit() else 1
