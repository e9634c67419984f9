"""`sparks start` / `restart`: the start flow, step by step (checks, checkpoint, image, clearing the way, launch,
loading, smoke test), with its console output. Part of the command line layer (it prints through ui); the
commands themselves are in commands.py, which is the error boundary."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from recipe.checkpoint import download
from recipe.cli import ui
from recipe.errors import LaunchError
from recipe.image.image import ensure_image, plan_lines
from recipe.launch import control, launch, prestart
from recipe.launch.docker import ContainerLogFollower, ContainerWatch
from recipe.launch.logs import LogFollower
from recipe.launch.smoke import smoke_image, smoke_test
from recipe.plan.host import LinkFacts, detect_host
from recipe.plan.plan import Plan, build_plan
from recipe.preflight import preflight
from recipe.settings import Settings, load_settings

STEPS = 6
PORT_GRACE_S = 20.0  # how long a restart waits for the stopped ranks' ports to be released


def settings_and_plan(extra: tuple[str, ...] = ()) -> tuple[Settings, Plan]:
    settings = load_settings()
    for warning in settings.warnings:
        ui.warn(warning)
    return settings, build_plan(settings, detect_host(), extra)


def start_or_restart(restart: bool, extra: tuple[str, ...]) -> int:
    settings, the_plan = settings_and_plan(extra)
    current = control.status(Path(the_plan.run_dir))
    if settings.dry_run:
        return _dry_run(settings, _with_links(settings, the_plan, extra, current, must_pass=False), current, restart)
    # status() gives a state whenever ranks were found, so a running status always has one
    if current.running and current.state is not None and not restart:
        ui.say(
            f"{current.state.served_name} is already running ({len(current.state.ranks)} ranks, API "
            f"{current.state.api_url}): nothing to do."
        )
        ui.say("./start.sh restart restarts it (with new settings, say); ./stop.sh stops it.")
        return 0
    launch.ensure_supported(the_plan)
    clock = StepClock()
    the_plan = _with_links(settings, the_plan, extra, current, must_pass=True)
    # Everything that can be checked is checked while the last run (if any) still serves: the folders, HOST and
    # the ports now, the checkpoint and the window once it is here; a failure stops nothing.
    prestart.check_settings_here(settings, the_plan, current)
    clock.lap("checks")
    ui.headline(settings, the_plan)
    reporter = ui.ConsoleReporter()
    ui.step(1, STEPS, "Settings checked")
    # Checkpoint and image are made ready while the last run (if any) still serves too, so a restart is down only
    # from the stop to the new ranks' readiness.
    ui.step(2, STEPS, "Checkpoint")
    download_into_cache(settings, reporter)
    launch.prepare(the_plan, reporter)
    prestart.check_checkpoint(settings, the_plan)
    prestart.check_window(settings, the_plan, reporter)
    launch.sync_checkpoint(the_plan, reporter)
    clock.lap("checkpoint")
    _image_step(settings, the_plan, reporter)
    clock.lap("image")
    ui.step(4, STEPS, f"Clearing the way, then launching {the_plan.tp} rank(s), workers first, rank 0 last")
    _clear_previous(settings, current, reporter)
    # Ports the stopped ranks held can stay taken for a moment after their processes are gone (a closing socket).
    launch.check_ports_free(the_plan, grace_s=PORT_GRACE_S if current.state is not None else 0.0)
    clock.lap("clear")
    launch.save_leftover_logs(the_plan, Path(settings.log_dir), settings.log_keep)
    state, handles = _launch(settings, the_plan, reporter)
    clock.lap("launch")
    if settings.foreground:
        return _follow(settings, the_plan, state, handles)
    return _wait_and_check(settings, the_plan, state, reporter, clock)


def _launch(settings: Settings, the_plan: Plan, reporter: ui.ConsoleReporter) -> tuple[Any, dict]:
    with _stop_all_on(launch.RankExited, settings, reporter):
        state, handles = launch.launch(
            the_plan,
            {"API_KEY": settings.api_key},
            reporter,
            image=settings.image,
            cache_dir=settings.cache_dir,
            log_dir=settings.log_dir,
            keep=settings.log_keep,
        )
    for proc in state.ranks:
        reporter.note(f"rank {proc.rank} {proc.where}: {proc.ident}, log {proc.log}")
    return state, handles


class StepClock:
    """Wall time of each start step, for the closing line (and for tuning a slow start)."""

    def __init__(self) -> None:
        self.started = self.last = time.monotonic()
        self.laps: list[tuple[str, float]] = []

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps.append((name, now - self.last))
        self.last = now

    def summary(self) -> str:
        parts = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in self.laps)
        return f"Started in {time.monotonic() - self.started:.1f}s ({parts})"


@contextlib.contextmanager
def _stop_all_on(
    kind: type[LaunchError], settings: Settings, reporter: ui.ConsoleReporter, refit: bool = False
) -> Iterator[None]:
    """A rank that exits before the server is ready takes the others down with it: no rank is left on any node.
    With `refit`, a window that does not fit is raised as it is (after the stop) for one more start."""
    try:
        yield
    except kind as error:
        reporter.warn(f"{error.message}: stopping every rank on every node")
        result = control.stop(
            control.run_dir_of(settings), Path(settings.log_dir), settings.log_keep, settings.stop_timeout, reporter
        )
        left = [r for r in result.ranks if r.outcome.startswith("unknown")]
        if refit and not left and isinstance(error, launch.WindowTooLarge):
            raise
        fix = (
            f"every rank was stopped and its log saved under {settings.log_dir}; read the last lines above"
            if not left
            else f"rank(s) {', '.join(str(r.rank) for r in left)} could not be reached to stop: ./stop.sh tries again"
        )
        raise LaunchError(error.message, fix, logs=error.logs) from None


def _with_links(
    settings: Settings, the_plan: Plan, extra: tuple[str, ...], current: control.Status, must_pass: bool
) -> Plan:
    """With workers configured: check every machine (stopping at the first failure for a real start; only
    reporting under DRY_RUN), then plan with the detected links."""
    if not settings.workers:
        return the_plan
    ctx = preflight.context_for(settings, api_port_ours=current.state is not None)
    if must_pass:
        preflight.first_failure(ctx, ui.show_check)
    else:
        for check in preflight.run_checks(ctx):
            ui.show_check(check)
    if len(ctx.links) != len(settings.workers):
        return the_plan
    host = dataclasses.replace(detect_host(), link=LinkFacts.from_links(ctx.links, ctx.worker_links))
    return build_plan(settings, host, extra)


def download_into_cache(settings: Settings, reporter: ui.ConsoleReporter) -> None:
    if download.wanted(settings):
        fetched = download.fetch(settings, lambda done, total: reporter.note(download.progress_line(done, total)))
        reporter.note(fetched.note)


def _dry_run(settings: Settings, the_plan: Plan, current: control.Status, restart: bool) -> int:
    ui.headline(settings, the_plan)
    ui.say("DRY_RUN=1: printing the plan; nothing is stopped, started or written.")
    if current.running:
        ui.say(
            "DRY_RUN: the server is running now; a real restart would stop it first"
            if restart
            else "DRY_RUN: the server is running now; a real start would do nothing"
        )
    elif current.state is not None:
        ui.say("DRY_RUN: a previous run is recorded but not all of its ranks run; a real start would stop it first")
    ui.show_plan(the_plan, settings)
    if the_plan.runtime == "docker":
        for text in plan_lines(settings):
            ui.say(text)
    return 0


def _clear_previous(settings: Settings, current: control.Status, reporter: ui.ConsoleReporter) -> None:
    """Stop what the last run left (recorded in current.state)."""
    if current.state is None:
        reporter.note("Nothing running before: starting fresh")
        return
    why = (
        "restart: stopping the running server"
        if current.running
        else (
            "only some ranks of the last run are running: stopping them first"
            if current.partly_running
            else "the last run's ranks have exited: saving their logs"
        )
    )
    reporter.note(why)
    result = control.stop(
        control.run_dir_of(settings), Path(settings.log_dir), settings.log_keep, settings.stop_timeout, reporter
    )
    for rank in result.ranks:
        reporter.note(
            f"rank {rank.rank}: {rank.outcome}" + (f", log saved to {rank.saved_log}" if rank.saved_log else "")
        )


def _wait_and_check(
    settings: Settings, the_plan: Plan, state: Any, reporter: ui.ConsoleReporter, clock: StepClock
) -> int:
    ui.step(5, STEPS, f"Loading on every rank (up to {settings.wait_timeout}s, WAIT_TIMEOUT)")
    started = time.monotonic()
    try:
        with _stop_all_on(launch.RankExited, settings, reporter, refit=True):
            health = launch.wait_ready(the_plan, state, settings.wait_timeout, reporter)
    except launch.WindowTooLarge as error:  # rank 0 named the window that fits: start again with it, once
        reporter.warn(
            f"this start's memory holds a {error.fits}-token window, not {settings.context}: "
            f"starting again with --context {error.fits}"
        )
        settings = dataclasses.replace(
            settings, context=error.fits, origins={**settings.origins, "CONTEXT": "the window rank 0 named"}
        )
        the_plan = the_plan.rebuilt(settings)
        launch.check_ports_free(the_plan, grace_s=PORT_GRACE_S)
        state, _ = _launch(settings, the_plan, reporter)
        with _stop_all_on(launch.RankExited, settings, reporter):
            health = launch.wait_ready(the_plan, state, settings.wait_timeout, reporter)
    reporter.note(f"Rank 0 answered after {time.monotonic() - started:.0f}s")
    clock.lap("loading")
    ui.step(6, STEPS, "Smoke test: one short chat request through rank 0 (and one with an image, with VISION=1)")
    try:
        result = smoke_test(the_plan.api_url, the_plan.served_name, settings.api_key)
    except LaunchError as error:
        raise LaunchError(error.message, error.fix, logs=launch.last_lines(state)) from None
    reporter.note(f"OK: {result.text.strip()[:60]!r}, {result.completion_tokens} tokens in {result.seconds:.1f}s")
    if (health.get("vision") or {}).get("enabled"):
        try:
            seconds = smoke_image(the_plan.api_url, the_plan.served_name, settings.api_key)
        except LaunchError as error:
            raise LaunchError(error.message, error.fix, logs=launch.last_lines(state)) from None
        reporter.note(f"OK: an image request answered in {seconds:.1f}s")
        result = dataclasses.replace(result, image_seconds=seconds)
    clock.lap("smoke")
    reporter.note(clock.summary())
    ui.live_banner(the_plan, settings, health, result)
    return 0


def _follow(settings: Settings, the_plan: Plan, state: Any, handles: dict) -> int:
    """FOREGROUND=1: print rank 0's log as it grows until rank 0 exits; Ctrl-C or any rank exiting stops all.
    (A worker's rank is watched through rank 0: the engine's peer watch ends rank 0 when a peer dies.)"""
    rank0 = next(r for r in state.ranks if r.rank == 0)
    follower: ContainerLogFollower | LogFollower
    if rank0.container:  # a container here: its log through docker, its end through docker inspect
        follower = ContainerLogFollower(rank0.container)
        handles = {0: ContainerWatch(rank0.container)}
    else:
        follower = LogFollower(Path(the_plan.rank0.log))
    reporter = ui.ConsoleReporter()
    stop_all = functools.partial(
        control.stop, Path(the_plan.run_dir), Path(settings.log_dir), settings.log_keep, settings.stop_timeout, reporter
    )
    ui.say(f"FOREGROUND=1: following rank 0's log ({the_plan.rank0.log}); Ctrl-C stops every rank.")
    try:
        while True:
            for text in follower.new_lines():
                print(text, flush=True)
            polled = {rank: h.poll() for rank, h in handles.items()}
            exited = {rank: code for rank, code in polled.items() if code is not None}
            if exited:
                break
            time.sleep(0.5 if rank0.container else 0.2)
    except KeyboardInterrupt:
        getattr(follower, "close", lambda: None)()
        stop_all()
        return 130
    time.sleep(0.5)  # the last lines (docker logs -f delivers them a moment after the exit)
    for text in follower.new_lines():
        print(text, flush=True)
    getattr(follower, "close", lambda: None)()
    for rank, code in exited.items():
        ui.warn(f"rank {rank} exited with code {code}: stopping the others")
    stop_all()
    return exited.get(0, 1) or (1 if any(exited.values()) else 0)


def _image_step(settings: Settings, the_plan: Plan, reporter: ui.ConsoleReporter) -> None:
    """RUNTIME=docker: the engine image with this checkout's identity on every node (built here, sent to workers)."""
    if the_plan.runtime != "docker":
        ui.step(3, STEPS, "Engine image: none needed (ranks run as processes)")
        return
    ui.step(3, STEPS, f"Engine image {settings.image} on every node")
    ensure_image(settings, reporter)
