"""Checks of every machine before anything is stopped or started: `sparks doctor` shows them all, `start` stops at
the first failure.

Each check returns a `Check` (ok / warn / fail, what was found, what to do). Checks run commands through nodes
(`recipe.nodes`), so a worker is checked over ssh exactly as the launch will reach it, and tests can hand in
nodes and a sysfs root of their own. Nothing here prints.
"""

from __future__ import annotations

import itertools
import os
import socket
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from recipe import download
from recipe.checkpoint import differences, head_checkpoint_dir, hf_repo_of, missing_bytes, read_manifest
from recipe.errors import RecipeError
from recipe.launch import port_is_free
from recipe.link import Link, LinkError, detect_link
from recipe.nodes import LocalNode, Node, NodeError, SshNode, ssh_fix
from recipe.settings import Settings

GIB = 1024 ** 3
CHECKPOINT_ESTIMATE_GIB = 170  # the pinned checkpoint's size, when none of it is here yet
DISK_SPARE_GIB = 5           # kept free beyond what the checkpoint needs
OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Check:
    name: str
    node: str            # "head" or the worker's ssh target
    status: str          # ok | warn | fail
    message: str
    fix: str = ""


@dataclass
class Context:
    """What the checks look at. `head` runs commands here; `workers[i]` is rank i+1's node."""

    settings: Settings
    head: Node
    workers: Sequence[Node]
    sysfs_root: str = "/sys"
    api_port_ours: bool = False        # our own running server holds PORT (restart): not a conflict
    links: list[Link] = field(default_factory=list)   # filled by the link check: rank i+1's link to the head
    worker_links: list[tuple[int, int, Link]] = field(default_factory=list)   # (rank a, rank b, their link)
    # Bytes of the pinned revision the head's cache lacks, as the Hub lists them (None: do not ask the Hub).
    hub_need: Callable[[Settings], int] | None = None
    hub_answer: tuple[int | None, RecipeError | None] | None = None   # hub_need's answer (bytes, or why not)


class PreflightError(RecipeError):
    """A check failed; `start` stops here, before anything was stopped or started."""


def context_for(settings: Settings, api_port_ours: bool = False) -> Context:
    return Context(settings=settings, head=LocalNode(), workers=[SshNode(w) for w in settings.workers],
                   sysfs_root=os.environ.get("SPARKS_SYSFS_ROOT", "/sys"), api_port_ours=api_port_ours,
                   hub_need=lambda s: download.needed(s).missing_bytes)


def run_checks(ctx: Context) -> Iterator[Check]:
    """Every check in order. A worker that ssh cannot reach is checked no further (each later check would fail
    the same way)."""
    yield check_tp(ctx)
    reachable = []
    for worker in ctx.workers:
        check = check_ssh(worker)
        yield check
        if check.status != FAIL:
            reachable.append(worker)
    docker = ctx.settings.effective_runtime == "docker"
    for node in [ctx.head, *reachable]:
        yield check_memory(ctx, node)
        yield check_disk(ctx, node)
        if ctx.workers:
            yield check_rsync(node)
        if docker:
            yield check_docker(node)
    if download.wanted(ctx.settings):
        yield check_head_checkpoint(ctx)
        yield check_cache_writable(ctx, ctx.head)
    for worker in reachable:
        yield check_cache_writable(ctx, worker)
        yield check_copy(ctx, worker)
    yield check_port(ctx)
    if ctx.workers and len(reachable) == len(ctx.workers):   # every runtime across nodes meets on the link
        yield from check_links(ctx)


def first_failure(ctx: Context, on_check: Callable[[Check], None] = lambda c: None) -> None:
    """Run the checks until one fails; raise it as a PreflightError (for `start`)."""
    for check in run_checks(ctx):
        on_check(check)
        if check.status == FAIL:
            raise PreflightError(f"{label(check)}: {check.message}", check.fix)


def label(check: Check) -> str:
    return f"{check.name} ({check.node})"


def _where(node: Node) -> str:
    return "head" if node.is_local else node.name


# ---------------------------------------------------------------- the checks


def check_tp(ctx: Context) -> Check:
    s = ctx.settings
    if not s.workers:
        return Check("ranks", "head", OK, f"TP={s.tp}: every rank on this machine ({s.effective_runtime})")
    where = ", ".join(f"rank {i} on {w}" for i, w in enumerate(s.workers, start=1))
    if len(s.workers) != s.tp - 1:
        return Check("ranks", "head", FAIL, f"TP={s.tp} needs {s.tp - 1} worker(s), {len(s.workers)} set",
                     "set TP to the number of Sparks (./start-tp3.sh for three)")
    return Check("ranks", "head", OK, f"TP={s.tp}: rank 0 here, {where}")


def check_ssh(worker: Node) -> Check:
    result = worker.run(["true"], timeout_s=30)
    if result.ok:
        return Check("ssh", worker.name, OK, "key-based login works")
    return Check("ssh", worker.name, FAIL, f"cannot log in without a password: {result.last_error_line()}",
                 ssh_fix(worker.name, result))


def mem_available_gib(meminfo: str) -> float:
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / GIB
    raise NodeError("/proc/meminfo has no MemAvailable line", "a Linux kernel of 3.14 or newer is needed")


def check_memory(ctx: Context, node: Node) -> Check:
    try:
        available = mem_available_gib(node.output(["cat", "/proc/meminfo"]))
    except RecipeError as error:
        return Check("memory", _where(node), FAIL, error.message, error.fix)
    text = f"{available:.0f} GiB available"
    if not ctx.workers and ctx.settings.effective_runtime == "process":
        return Check("memory", _where(node), OK, f"{text} (the embedded default needs a few GiB)")
    threshold = ctx.settings.memory_warn_gib
    if available < threshold:
        return Check("memory", _where(node), WARN, f"only {text}; GLM-5.3-Flash needs ~{threshold:.0f} GiB free "
                     "(MEMORY_WARN_GIB)", "stop other GPU work there (docker ps; nvidia-smi), or lower CONTEXT")
    return Check("memory", _where(node), OK, text)


def free_bytes(node: Node, path: str) -> int:
    """Free bytes on the filesystem holding `path` (or its nearest existing parent)."""
    script = 'p="$1"; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -Pk "$p" | tail -n 1'
    fields = node.output(["sh", "-c", script, "df", path]).split()
    return int(fields[3]) * 1024


def check_disk(ctx: Context, node: Node) -> Check:
    folder = head_checkpoint_dir(ctx.settings)
    if folder is None:
        return Check("disk", _where(node), OK, "the demo checkpoint is small (made under CACHE_DIR)")
    try:
        free = free_bytes(node, folder)
        need, how = _checkpoint_need(ctx, node, folder)
    except RecipeError as error:
        return Check("disk", _where(node), FAIL, error.message, error.fix)
    spare = DISK_SPARE_GIB * GIB if need else 0
    text = f"{free / GIB:.0f} GiB free under {folder}, {need / GIB:.1f} GiB of checkpoint still to come ({how})"
    if free < need + spare:
        return Check("disk", _where(node), FAIL, text, f"free {(need + spare - free) / GIB:.0f} GiB there, or point "
                     "HF_CACHE (CHECKPOINT) at a larger disk")
    return Check("disk", _where(node), OK, text)


def _checkpoint_need(ctx: Context, node: Node, folder: str) -> tuple[int, str]:
    """Only what is missing counts, and how that was found: on a worker, what differs from the head's copy; on the
    head, the files the Hub lists that the cache lacks (an estimate when the Hub cannot be asked)."""
    head = read_manifest(ctx.head, folder)
    if not node.is_local:
        if not head:
            return CHECKPOINT_ESTIMATE_GIB * GIB, "estimate: the head has none of it yet"
        return missing_bytes(head, read_manifest(node, folder)), "what differs from the head's copy"
    if head and not download.incomplete_files(folder):
        return 0, "complete here"
    if ctx.hub_need is None or not download.wanted(ctx.settings):
        if head:
            return 0, "CHECKPOINT is served as it is"
        return CHECKPOINT_ESTIMATE_GIB * GIB, "estimate: none of it is here"
    need, why = ask_hub(ctx)
    if need is not None:
        return need, "the files the Hub lists that the cache lacks"
    have = sum(size for _, size in head)
    return max(0, CHECKPOINT_ESTIMATE_GIB * GIB - have), f"estimate: {why.message if why else 'unknown'}"


def ask_hub(ctx: Context) -> tuple[int | None, RecipeError | None]:
    """Bytes of the pinned revision the head's cache lacks (None and why, when the Hub cannot say); asked once."""
    if ctx.hub_answer is None:
        if ctx.hub_need is None:
            ctx.hub_answer = (None, RecipeError("the Hub was not asked"))
        else:
            try:
                ctx.hub_answer = (ctx.hub_need(ctx.settings), None)
            except RecipeError as error:
                ctx.hub_answer = (None, error)
    return ctx.hub_answer


def check_head_checkpoint(ctx: Context) -> Check:
    """The pinned snapshot on the head: complete, or fetchable (the Hub answers); an incomplete snapshot the Hub
    cannot complete stops `start` here, before anything is stopped."""
    folder = head_checkpoint_dir(ctx.settings) or ""
    missing = download.incomplete_files(folder) if os.path.isdir(folder) else ["all of it"]
    if not missing:
        return Check("checkpoint", "head", OK, f"{folder} is complete here")
    need, why = ask_hub(ctx)
    if need is not None:
        return Check("checkpoint", "head", OK, f"{need / GIB:.1f} GiB still to download (start fetches it; or "
                     "sparks download)")
    return Check("checkpoint", "head", FAIL, f"{ctx.settings.model_id} @ {ctx.settings.model_revision or 'main'} "
                 f"is not complete here (missing {', '.join(missing[:3])}) and {why.message if why else '?'}",
                 why.fix if why and why.fix and not isinstance(why, download.HubUnreachable) else
                 "connect this machine to the network (or unset HF_HUB_OFFLINE), or copy the snapshot into HF_CACHE")


def check_rsync(node: Node) -> Check:
    result = node.run(["rsync", "--version"], timeout_s=30)
    if result.ok:
        return Check("rsync", _where(node), OK, " ".join(result.stdout.split()[:3]))
    return Check("rsync", _where(node), FAIL, "rsync is not installed", "sudo apt install rsync (on that node)")


def check_docker(node: Node) -> Check:
    result = node.run(["docker", "info", "--format", "{{json .Runtimes}}"], timeout_s=30)
    error = result.stderr.lower()
    if result.code == 127 or "not found" in error:
        return Check("docker", _where(node), FAIL, "docker is not installed", "install Docker with the NVIDIA "
                     "Container Toolkit (DGX OS ships both)")
    if not result.ok and "permission denied" in error:
        return Check("docker", _where(node), FAIL, "the docker daemon refuses this user (permission denied on its "
                     "socket)", "add the user to the docker group: sudo usermod -aG docker $USER, then log in again")
    if not result.ok:
        return Check("docker", _where(node), FAIL, f"the docker daemon does not answer: {result.last_error_line()}",
                     "start it: sudo systemctl enable --now docker")
    if "nvidia" not in result.stdout:
        return Check("docker", _where(node), WARN, "docker answers, but lists no nvidia runtime; --gpus may fail",
                     "install the NVIDIA Container Toolkit (nvidia-ctk runtime configure --runtime=docker)")
    return Check("docker", _where(node), OK, "docker answers this user and lists the nvidia runtime")


# For each path: the nearest folder that exists must be writable (what a copy or download creates goes there).
WRITABLE_SCRIPT = 'for p in "$@"; do while [ ! -e "$p" ]; do p=$(dirname "$p"); done; [ -w "$p" ] || echo "$p"; done'


def check_cache_writable(ctx: Context, node: Node) -> Check:
    """Where the download (head) or the copy (worker) writes, this user may write: a cache a container created as
    root is the usual reason it may not."""
    where = _where(node)
    folder = head_checkpoint_dir(ctx.settings)
    if folder is None:
        return Check("cache", where, OK, "nothing to copy there")
    if node.is_local:
        if os.path.isdir(folder) and not download.incomplete_files(folder):
            return Check("cache", where, OK, f"{folder} is complete here: the download writes nothing")
        repo = os.path.dirname(os.path.dirname(folder))
    else:
        repo = hf_repo_of(folder)
    paths = [folder] if repo is None else [os.path.join(repo, "blobs"), folder, os.path.join(repo, "refs")]
    result = node.run(["sh", "-c", WRITABLE_SCRIPT, "writable", *paths], timeout_s=30)
    if not result.ok:
        return Check("cache", where, FAIL, f"cannot check {folder} there: {result.last_error_line()}",
                     node.fix_for(result))
    locked = list(dict.fromkeys(result.stdout.split()))
    if locked:
        return Check("cache", where, FAIL, f"this user cannot write {', '.join(locked)}",
                     f"a container may have left it owned by root: sudo chown -R $USER {locked[0]}"
                     f"{' (on this machine)' if node.is_local else ' on ' + node.name}")
    return Check("cache", where, OK, f"{repo or folder} can be written")


def check_copy(ctx: Context, worker: Node) -> Check:
    folder = head_checkpoint_dir(ctx.settings)
    if folder is None:
        return Check("checkpoint", worker.name, OK, "every rank makes the demo checkpoint itself")
    try:
        head, theirs = read_manifest(ctx.head, folder), read_manifest(worker, folder)
    except RecipeError as error:
        return Check("checkpoint", worker.name, FAIL, error.message, error.fix)
    if head and head == theirs:
        return Check("checkpoint", worker.name, OK, f"{len(head)} files, identical to the head's")
    if not theirs:
        return Check("checkpoint", worker.name, WARN, f"{folder} is not there yet", "start copies it (or sparks copy)")
    shown = "; ".join(differences(head, theirs, limit=3))
    return Check("checkpoint", worker.name, WARN, f"its copy differs from the head's: {shown}",
                 "sparks copy repairs it (only what differs is sent)")


def check_port(ctx: Context) -> Check:
    port = ctx.settings.port
    if ctx.api_port_ours:
        return Check("port", "head", OK, f"{port} is held by the running server, which a restart stops first")
    if port_is_free(port):
        return Check("port", "head", OK, f"{port} (PORT) is free")
    return Check("port", "head", FAIL, f"{port} (PORT) is already in use on this machine",
                 "stop the program holding it (ss -ltnp), or write PORT=<a free port>")


def check_links(ctx: Context) -> Iterator[Check]:
    """Each worker's link, detected first for all of them: with three Sparks the head's port to one worker is
    expected to have no partner on the other, which is then not worth a warning."""
    found: dict[int, Link | Check] = {}
    for rank, worker in enumerate(ctx.workers, start=1):
        try:
            found[rank] = detect_link(ctx.head, worker, _peer(ctx.settings, rank), bool(_explicit(ctx.settings, rank)),
                                      ctx.sysfs_root)
        except (LinkError, NodeError) as error:
            found[rank] = Check("link", worker.name, FAIL, error.message, error.fix)
    links = {rank: link for rank, link in found.items() if isinstance(link, Link)}
    for rank, worker in enumerate(ctx.workers, start=1):
        link = found[rank]
        if isinstance(link, Check):
            yield link
            continue
        other_ports = {r.head_ifname for other, l in links.items() if other != rank for r in l.rails}
        link = link.sharing(other_ports)
        ctx.links.append(link)
        yield _link_check(worker.name, link)
    if len(links) == len(ctx.workers) >= 2:
        yield from _worker_pair_links(ctx, links)


def _worker_pair_links(ctx: Context, links: dict[int, Link]) -> Iterator[Check]:
    """Three Sparks: ranks 1 and 2 talk to each other too, over their own cable (found from rank 1's side)."""
    for a, b in itertools.combinations(range(1, len(ctx.workers) + 1), 2):
        near, far = ctx.workers[a - 1], ctx.workers[b - 1]
        where = f"{near.name} <-> {far.name}"
        try:
            link = detect_link(near, far, "", False, ctx.sysfs_root)
        except (LinkError, NodeError) as error:
            yield Check("link", where, FAIL, error.message, error.fix)
            continue
        link = link.sharing({r.worker_ifname for r in links[a].rails})   # rank a's ports to the head
        towards_head = {links[a].primary.gid_index, links[b].primary.gid_index}
        if towards_head != {link.primary.gid_index}:
            yield Check("link", where, FAIL, f"{link.summary()}, but GID {'/'.join(map(str, sorted(towards_head)))} "
                        "towards the head", "NCCL takes one RoCE v2 GID index per rank: give every ConnectX-7 port "
                        "its IPv4 address the same way on all three Sparks")
            continue
        ctx.worker_links.append((a, b, link))
        yield _link_check(where, link)


def _link_check(where: str, link: Link) -> Check:
    notes = link.all_notes()
    status = WARN if any("not used" in note for note in notes) else OK
    return Check("link", where, status, "; ".join([link.summary(), *notes]))


def _explicit(settings: Settings, rank: int) -> str:
    return settings.fabric_peer if rank == 1 else settings.fabric_peer2


def _peer(settings: Settings, rank: int) -> str:
    return resolve_ipv4(_explicit(settings, rank) or settings.workers[rank - 1].rpartition("@")[2])


def resolve_ipv4(host: str) -> str:
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
    except (socket.gaierror, IndexError):
        raise LinkError(f"cannot resolve {host} to an IPv4 address",
                        "write the worker's address instead of its name (WORKER, FABRIC_PEER)") from None
