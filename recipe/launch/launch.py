"""The executor: make what the plan prepares, copy the checkpoint to workers that lack it, start every rank
(workers first, over ssh; rank 0 last, here), wait until rank 0 answers.

With RUNTIME=docker each rank is a container (`docker.py` beside this: one `docker run -d` per rank, recorded by
container id). Otherwise ranks run in their own session (so a Ctrl-C in the terminal does not reach them, and a stop
can signal a rank and everything it started), with output to LOG_DIR/run/rank<N>.log on their node. Each rank's
node, PID and start time go to the head's state file (rewritten after every rank, so a launch cut short can still be
stopped) that `stop` and `status` read. Nothing here prints: progress goes through a `Reporter`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from recipe.checkpoint.checkpoint import compare, copy_to_worker
from recipe.errors import LaunchError, RecipeError
from recipe.launch import docker, remote
from recipe.launch.logs import LogFollower, save_log, tail
from recipe.launch.runstate import RankProcess, RunState, ranks_alive, save_state, start_ticks
from recipe.net.nodes import LocalNode, SshNode, node_for, on_each
from recipe.net.ports import port_is_free
from recipe.plan.parts import PrepareStep
from recipe.plan.plan import Plan
from recipe.reporter import Quiet, Reporter
from recipe.settings import REPO_ROOT

POLL_S = 0.5
REMOTE_POLL_S = 2.0  # a worker rank's liveness costs an ssh round trip: asked less often than rank 0's /health
SECRET_NAMES = ("HF_TOKEN", "API_KEY")


def prepare(plan: Plan, reporter: Reporter, timeout_s: float = 1800) -> None:
    """Run each prepare step that is not done yet (output into a partial folder, renamed on success)."""
    for step in plan.prepare:
        if step.done or Path(step.final, "config.json").is_file():
            reporter.note(f"Reusing {step.final}")
            continue
        reporter.note(f"First run: {step.description} in {step.final}")
        _run_step(step, reporter, timeout_s)


def _run_step(step: PrepareStep, reporter: Reporter, timeout_s: float) -> None:
    shutil.rmtree(step.output, ignore_errors=True)
    Path(step.output).parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        step.argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        env=scrubbed_environ({}),
    )
    lines: list[str] = []

    def relay() -> None:
        for text in proc.stdout or ():
            lines.append(text.rstrip())
            reporter.line("make-demo", text.rstrip())

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    reader.join(timeout=5)
    if code != 0:
        raise LaunchError(
            f"{step.description} failed (exit code {code})",
            f"see the lines above; the command was: {' '.join(step.argv)}",
            logs={"make-demo": lines[-25:]},
        )
    shutil.rmtree(step.final, ignore_errors=True)
    os.replace(step.output, step.final)


class RankExited(LaunchError):
    """A rank exited (or could not be started) before the server was ready: the others are to be stopped."""


def workers_of(plan: Plan) -> list[str]:
    return list(dict.fromkeys(r.node for r in plan.ranks if r.node != "local"))


def sync_checkpoint(plan: Plan, reporter: Reporter) -> None:
    """Give every worker the head's checkpoint at the same path: compared first, copied only where it differs."""
    workers = [SshNode(w) for w in workers_of(plan)]
    folder = plan.host_checkpoint
    if not workers or not folder:
        return
    head = LocalNode()

    def one(worker: SshNode) -> str:
        differ = compare(head, worker, folder)
        if not differ:
            return f"{worker.name}: its copy of {folder} matches the head's"
        copied = copy_to_worker(head, worker, folder)
        return (
            f"{worker.name}: copied {folder} ({copied.files} files, "
            f"{copied.sent_bytes / 2**20:.1f} MiB sent), now identical to the head's"
        )

    outcomes = on_each(workers, one)
    for outcome in outcomes.values():
        if isinstance(outcome, BaseException):
            raise outcome
        reporter.note(outcome)


def scrubbed_environ(extra: Mapping[str, str]) -> dict[str, str]:
    """This environment without secrets, plus `extra`: what a local rank starts with."""
    env = {k: v for k, v in os.environ.items() if k not in SECRET_NAMES}
    env.update(extra)
    return env


def check_ports_free(plan: Plan, grace_s: float = 0.0) -> None:
    """Refuse a port another program holds; with grace_s, first wait that long for it to be released."""
    deadline = time.monotonic() + grace_s
    for rank in plan.ranks:
        for port in rank.ports:
            while not port_is_free(port) and time.monotonic() < deadline:
                time.sleep(0.2)
            if not port_is_free(port):
                name = "PORT" if port == rank.ports[0] else "MASTER_PORT"
                raise RecipeError(
                    f"port {port} ({name}) is already in use on this machine by another program",
                    f"stop that program, or write {name}=<a free port>",
                )


def ensure_supported(plan: Plan) -> None:
    """Refuse, before anything is touched, a plan this executor cannot run."""
    if plan.runtime not in ("process", "docker"):
        raise RecipeError(f"RUNTIME={plan.runtime} cannot be started", "write RUNTIME=docker or RUNTIME=process")


def launch(
    plan: Plan,
    secrets: Mapping[str, str],
    reporter: Reporter | None = None,
    image: str = "",
    cache_dir: str = "",
    log_dir: str = "",
    keep: int = 10,
) -> tuple[RunState, dict[int, subprocess.Popen]]:
    """Start every rank in the plan's order; returns the recorded state and the (local process) handles.
    The Docker runtime needs `image`, `cache_dir` (kernel caches) and `log_dir`/`keep` (a leftover's log)."""
    ensure_supported(plan)
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for secret in plan.secret_files:
        _write_secret(Path(secret.path), secrets[secret.setting])
    handles: dict[int, subprocess.Popen] = {}
    recorded: list[RankProcess] = []
    started_at = time.time()

    def record() -> RunState:
        state = RunState(
            runtime=plan.runtime,
            served_name=plan.served_name,
            api_url=plan.api_url,
            health_url=plan.health_url,
            started_at=started_at,
            ranks=tuple(recorded),
            ports=tuple(p for r in plan.ranks if r.node == "local" for p in r.ports),
            checkout=str(REPO_ROOT),
        )
        save_state(run_dir, state)
        return state

    ready = {}
    if plan.runtime == "docker":
        ready = docker.prepare_nodes(
            plan, image, os.path.join(cache_dir, "kernels"), Path(log_dir), keep, reporter or Quiet()
        )
    for rank in plan.ranks:
        try:
            if plan.runtime == "docker":
                recorded.append(docker.run_rank(node_for(rank.node), rank, ready[rank.node]))
            elif rank.node == "local":
                with open(rank.log, "wb") as log:
                    proc = subprocess.Popen(
                        rank.argv,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=scrubbed_environ(rank.env),
                        start_new_session=True,
                    )
                handles[rank.rank] = proc
                recorded.append(RankProcess(rank.rank, proc.pid, start_ticks(proc.pid) or 0, rank.log))
            else:
                recorded.append(remote.spawn(node_for(rank.node), rank))
        except RecipeError as error:
            record()
            raise RankExited(error.message, error.fix) from None
        record()
    return record(), handles


def _write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value)


def wait_ready(plan: Plan, state: RunState, timeout_s: float, reporter: Reporter, tick_s: float = 15.0) -> dict:
    """Follow the rank logs until rank 0's /health answers 200; fail early when a rank exits."""
    followers = {
        r.rank: docker.ContainerLogFollower(r.container) if r.container else LogFollower(Path(r.log))
        for r in state.ranks
        if r.node == "local"
    }
    try:
        return _wait(plan, state, timeout_s, reporter, tick_s, followers)
    finally:
        for follower in followers.values():
            getattr(follower, "close", lambda: None)()


def _wait(plan: Plan, state: RunState, timeout_s: float, reporter: Reporter, tick_s: float, followers: dict) -> dict:
    started = time.monotonic()
    next_tick = started + tick_s
    next_remote = started
    while True:
        for rank, follower in followers.items():
            for text in follower.new_lines():
                reporter.line(f"rank {rank}", text)
        remote_too = time.monotonic() >= next_remote
        _fail_if_a_rank_exited(state, remote_too)
        if remote_too:
            next_remote = time.monotonic() + REMOTE_POLL_S
        health = probe_health(plan.health_url)
        if health is not None:
            return health
        now = time.monotonic()
        if now - started > timeout_s:
            raise LaunchError(
                f"the server did not answer within {timeout_s:.0f}s (WAIT_TIMEOUT)",
                "the ranks are still running: follow their logs, or ./stop.sh",
                logs=last_lines(state),
            )
        if now >= next_tick:
            reporter.note(f"⋯ {now - started:.0f}s elapsed, waiting for rank 0 to answer {plan.health_url}")
            next_tick = now + tick_s
        time.sleep(POLL_S)


def _fail_if_a_rank_exited(state: RunState, remote_too: bool = True) -> None:
    alive: dict[int, bool | None] = {}
    for node in state.nodes:
        if node == "local" or remote_too:
            alive.update(ranks_alive([r for r in state.ranks if r.node == node]))
    dead = [r for r in state.ranks if alive.get(r.rank) is False]  # None: the node did not answer this time
    if dead:
        names = ", ".join(f"rank {r.rank} {r.where} ({r.ident})" for r in dead)
        logs = last_lines(state)
        fits = fitting_window(logs)
        if fits is not None:
            raise WindowTooLarge(
                f"{names} exited before the server was ready: the window does not fit; "
                f"the largest that does is {fits} tokens",
                "lower CONTEXT",
                logs=logs,
                fits=fits,
            )
        raise RankExited(f"{names} exited before the server was ready", "read the last log lines above", logs=logs)


class WindowTooLarge(RankExited):
    """Rank 0 refused the window before allocating and named the largest that fits: start again with it, once."""

    def __init__(self, message: str, fix: str, logs: dict, fits: int) -> None:
        super().__init__(message, fix, logs=logs)
        self.fits = fits


# The engine's refusal of a window that does not fit (engine/config.py `window_refusal`; it then exits 4):
# this prefix, then JSON with "largest_window". The recipe reads the line, never the sentence before it.
WINDOW_LINE = "window-does-not-fit: "


def fitting_window(logs: Mapping[str, list[str]]) -> int | None:
    """The window rank 0's log says fits, when it refused a larger one."""
    for source, lines in logs.items():
        if source.startswith("rank 0 "):
            for line in reversed(lines):
                if WINDOW_LINE in line:
                    try:
                        fits = int(json.loads(line.split(WINDOW_LINE, 1)[1])["largest_window"])
                    except (ValueError, KeyError, TypeError):
                        continue
                    if fits > 0:
                        return fits
    return None


def last_lines(state: RunState, count: int = 25) -> dict[str, list[str]]:
    """Every rank's last log lines, a worker's fetched over ssh (all nodes at once)."""

    def one(proc: RankProcess) -> list[str]:
        if proc.container:
            return docker.tail(proc, count)
        if proc.node == "local":
            return tail(Path(proc.log), count)
        return remote.tail(node_for(proc.node), proc.log, count)

    with ThreadPoolExecutor(max_workers=max(1, len(state.ranks))) as pool:
        lines = list(pool.map(one, state.ranks))
    return {
        f"rank {r.rank} {r.where} ({r.container[:12] if r.container else r.log})": found
        for r, found in zip(state.ranks, lines)
    }


def probe_health(url: str, timeout_s: float = 3.0) -> dict | None:
    """Rank 0's /health as JSON when it answers 200, else None."""
    kind, body = read_health(url, timeout_s)
    return body if kind == "serving" else None


def read_health(url: str, timeout_s: float = 3.0) -> tuple[str, dict | None]:
    """What rank 0's /health says: ("serving", body) on 200; ("not serving", body) on 503 (the body says why);
    ("silent", None) when the port takes the connection but nothing answers in time (a frozen or stuck rank 0);
    ("closed", None) when nothing listens yet (still loading) or any other failure."""
    try:
        reply = httpx.get(url, timeout=timeout_s)
    except httpx.TimeoutException as error:
        return ("closed", None) if isinstance(error, httpx.ConnectTimeout) else ("silent", None)
    except httpx.HTTPError:
        return "closed", None
    if reply.status_code not in (200, 503):
        return "closed", None
    try:
        body = reply.json()
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    return ("serving" if reply.status_code == 200 else "not serving"), body


def save_leftover_logs(plan: Plan, log_dir: Path, keep: int) -> list[Path]:
    """Logs a crashed run left in the run folder are evidence: save them before a new start overwrites them.
    (A container's log lives with the container: `docker.py` saves a leftover's before removing it.)"""
    if plan.runtime != "process":
        return []
    saved = []
    for rank in plan.ranks:
        path = save_log(Path(rank.log), log_dir, rank.rank, keep) if rank.node == "local" else None
        if path:
            saved.append(path)
            Path(rank.log).unlink(missing_ok=True)
    return saved
