"""Checks of every machine before anything is stopped or started: `sparks doctor` shows them all, `start` stops at
the first failure.

Each check returns a `Check` (ok / warn / fail, what was found, what to do). Checks run commands through nodes
(`recipe.net.nodes`), so a worker is checked over ssh exactly as the launch will reach it, and tests can hand in
nodes and a sysfs root of their own. Nothing here prints.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from recipe.checkpoint import download
from recipe.errors import RecipeError
from recipe.net.nodes import LocalNode, Node, NodeError, SshNode, ssh_fix
from recipe.net.ports import port_is_free
from recipe.preflight.check import FAIL, GIB, OK, WARN, Check, Context, where
from recipe.preflight.checkpoint import check_cache_writable, check_copy, check_disk, check_head_checkpoint, free_bytes
from recipe.preflight.link import check_links, resolve_ipv4
from recipe.settings import Settings

__all__ = [
    "Check",
    "Context",
    "OK",
    "WARN",
    "FAIL",
    "PreflightError",
    "context_for",
    "run_checks",
    "first_failure",
    "check_cache_writable",
    "check_links",
    "free_bytes",
    "resolve_ipv4",
]


class PreflightError(RecipeError):
    """A check failed; `start` stops here, before anything was stopped or started."""


def context_for(settings: Settings, api_port_ours: bool = False) -> Context:
    return Context(
        settings=settings,
        head=LocalNode(),
        workers=[SshNode(w) for w in settings.workers],
        sysfs_root=os.environ.get("SPARKS_SYSFS_ROOT", "/sys"),
        api_port_ours=api_port_ours,
        hub_need=lambda s: download.needed(s).missing_bytes,
    )


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
    if ctx.workers and len(reachable) == len(ctx.workers):  # every runtime across nodes meets on the link
        yield from check_links(ctx)


def first_failure(ctx: Context, on_check: Callable[[Check], None] = lambda c: None) -> None:
    """Run the checks until one fails; raise it as a PreflightError (for `start`)."""
    for check in run_checks(ctx):
        on_check(check)
        if check.status == FAIL:
            raise PreflightError(f"{label(check)}: {check.message}", check.fix)


def label(check: Check) -> str:
    return f"{check.name} ({check.node})"


# ---------------------------------------------------------------- the checks


def check_tp(ctx: Context) -> Check:
    s = ctx.settings
    if not s.workers:
        return Check("ranks", "head", OK, f"TP={s.tp}: every rank on this machine ({s.effective_runtime})")
    where = ", ".join(f"rank {i} on {w}" for i, w in enumerate(s.workers, start=1))
    if len(s.workers) != s.tp - 1:
        return Check(
            "ranks",
            "head",
            FAIL,
            f"TP={s.tp} needs {s.tp - 1} worker(s), {len(s.workers)} set",
            "set TP to the number of Sparks (./start-tp3.sh for three)",
        )
    return Check("ranks", "head", OK, f"TP={s.tp}: rank 0 here, {where}")


def check_ssh(worker: Node) -> Check:
    result = worker.run(["true"], timeout_s=30)
    if result.ok:
        return Check("ssh", worker.name, OK, "key-based login works")
    return Check(
        "ssh",
        worker.name,
        FAIL,
        f"cannot log in without a password: {result.last_error_line()}",
        ssh_fix(worker.name, result),
    )


def mem_available_gib(meminfo: str) -> float:
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / GIB
    raise NodeError("/proc/meminfo has no MemAvailable line", "a Linux kernel of 3.14 or newer is needed")


def check_memory(ctx: Context, node: Node) -> Check:
    try:
        available = mem_available_gib(node.output(["cat", "/proc/meminfo"]))
    except RecipeError as error:
        return Check("memory", where(node), FAIL, error.message, error.fix)
    text = f"{available:.0f} GiB available"
    if not ctx.workers and ctx.settings.effective_runtime == "process":
        return Check("memory", where(node), OK, f"{text} (the embedded default needs a few GiB)")
    threshold = ctx.settings.memory_warn_gib
    if available < threshold:
        return Check(
            "memory",
            where(node),
            WARN,
            f"only {text}; GLM-5.3-Flash needs ~{threshold:.0f} GiB free (MEMORY_WARN_GIB)",
            "stop other GPU work there (docker ps; nvidia-smi), or lower CONTEXT",
        )
    return Check("memory", where(node), OK, text)


def check_rsync(node: Node) -> Check:
    result = node.run(["rsync", "--version"], timeout_s=30)
    if result.ok:
        return Check("rsync", where(node), OK, " ".join(result.stdout.split()[:3]))
    return Check("rsync", where(node), FAIL, "rsync is not installed", "sudo apt install rsync (on that node)")


def check_docker(node: Node) -> Check:
    result = node.run(["docker", "info", "--format", "{{json .Runtimes}}"], timeout_s=30)
    error = result.stderr.lower()
    if result.code == 127 or "not found" in error:
        return Check(
            "docker",
            where(node),
            FAIL,
            "docker is not installed",
            "install Docker with the NVIDIA Container Toolkit (DGX OS ships both)",
        )
    if not result.ok and "permission denied" in error:
        return Check(
            "docker",
            where(node),
            FAIL,
            "the docker daemon refuses this user (permission denied on its socket)",
            "add the user to the docker group: sudo usermod -aG docker $USER, then log in again",
        )
    if not result.ok:
        return Check(
            "docker",
            where(node),
            FAIL,
            f"the docker daemon does not answer: {result.last_error_line()}",
            "start it: sudo systemctl enable --now docker",
        )
    if "nvidia" not in result.stdout:
        return Check(
            "docker",
            where(node),
            WARN,
            "docker answers, but lists no nvidia runtime; --gpus may fail",
            "install the NVIDIA Container Toolkit (nvidia-ctk runtime configure --runtime=docker)",
        )
    return Check("docker", where(node), OK, "docker answers this user and lists the nvidia runtime")


def check_port(ctx: Context) -> Check:
    port = ctx.settings.port
    if ctx.api_port_ours:
        return Check("port", "head", OK, f"{port} is held by the running server, which a restart stops first")
    if port_is_free(port):
        return Check("port", "head", OK, f"{port} (PORT) is free")
    return Check(
        "port",
        "head",
        FAIL,
        f"{port} (PORT) is already in use on this machine",
        "stop the program holding it (ss -ltnp), or write PORT=<a free port>",
    )
