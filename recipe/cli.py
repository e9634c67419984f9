"""`sparks`: the command line. Parses options, calls the core, renders what it returns.

The one error boundary is `_guarded`: a RecipeError prints its message and fix and exits non-zero; any other
exception too, with a traceback only when SPARKS_DEBUG=1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import typer

from recipe import checkpoint, control, download, launch, launch_docker, preflight, ui
from recipe.docs import settings_markdown, update_readme
from recipe.errors import LaunchError, RecipeError
from recipe.host import LinkFacts, detect_host
from recipe.image import check_patches, ensure_image, plan_lines
from recipe.logs import LogFollower
from recipe.nodes import LocalNode, SshNode, on_each
from recipe.plan import Plan, build_plan
from recipe.settings import REPO_ROOT, Settings, load_settings
from recipe.smoke import smoke_test

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Serve GLM-5.3-Flash on DGX Sparks, or on this machine when no WORKER is set.")
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}
STEPS = 6
PORT_GRACE_S = 20.0   # how long a restart waits for the stopped ranks' ports to be released


def _guarded(command: Callable[..., int | None]) -> Callable[..., None]:
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            code = command(*args, **kwargs) or 0
        except RecipeError as error:
            if os.environ.get("SPARKS_DEBUG") == "1":
                raise
            ui.show_error(error)
            raise typer.Exit(error.exit_code) from None
        except KeyboardInterrupt:
            ui.warn("interrupted")
            raise typer.Exit(130) from None
        except (typer.Exit, SystemExit):
            raise
        except Exception as error:  # a defect: say so plainly, keep the traceback for SPARKS_DEBUG=1
            if os.environ.get("SPARKS_DEBUG") == "1":
                raise
            ui.show_error(RecipeError(f"unexpected {type(error).__name__}: {error}",
                                      "run again with SPARKS_DEBUG=1 for the traceback, and report it"))
            raise typer.Exit(1) from None
        raise typer.Exit(code)

    return run


def _settings_and_plan(extra: tuple[str, ...] = ()) -> tuple[Settings, Plan]:
    settings = load_settings()
    for warning in settings.warnings:
        ui.warn(warning)
    return settings, build_plan(settings, detect_host(), extra)


@app.command(context_settings=PASS_THROUGH)
@_guarded
def start(ctx: typer.Context) -> int:
    """Start every rank (does nothing when already running). Extra arguments go to `engine serve` on every rank."""
    return _start(restart=False, extra=tuple(ctx.args))


@app.command(context_settings=PASS_THROUGH)
@_guarded
def restart(ctx: typer.Context) -> int:
    """Build and check the new plan first, then stop the running server and start again."""
    return _start(restart=True, extra=tuple(ctx.args))


@app.command()
@_guarded
def stop() -> int:
    """Stop every rank; each rank's log is saved under LOG_DIR."""
    settings = load_settings(rules=False)
    run_dir = Path(settings.log_dir, "run")
    if settings.dry_run:
        current = control.status(run_dir)
        ranks = ", ".join(str(r.rank) for r in current.state.ranks) if current.state else "none"
        ui.say(f"DRY_RUN=1: would stop ranks {ranks} (up to {settings.stop_timeout}s) and save their logs "
               f"under {settings.log_dir}; nothing is stopped.")
        return 0
    ui.show_stop(control.stop(run_dir, Path(settings.log_dir), settings.log_keep, settings.stop_timeout,
                              ui.ConsoleReporter()))
    return 0


@app.command()
@_guarded
def status() -> int:
    """Show each rank, rank 0's health and the API URL. Exit code 0 while every rank runs, else 3."""
    settings = load_settings(rules=False)
    current = control.status(Path(settings.log_dir, "run"))
    ui.show_status(current)
    return 0 if current.running else 3


@app.command()
@_guarded
def plan(as_json: bool = typer.Option(False, "--json", help="print the plan as JSON")) -> int:
    """Print what `start` would run: every rank's command, environment, mounts and ports (secrets masked)."""
    settings, the_plan = _settings_and_plan()
    if as_json:
        print(the_plan.to_json())
    else:
        ui.show_plan(the_plan, settings)
    return 0


@app.command("settings")
@_guarded
def settings_command(
    markdown: bool = typer.Option(False, "--markdown", help="print the README's settings table"),
    write_readme: bool = typer.Option(False, "--write-readme", help="regenerate the table inside README.md"),
) -> int:
    """Show every setting's effective value and where it came from (secrets hidden)."""
    if markdown:
        print(settings_markdown())
    elif write_readme:
        changed = update_readme(REPO_ROOT / "README.md")
        ui.say("README.md updated." if changed else "README.md was already up to date.")
    else:
        ui.show_settings(load_settings())
    return 0


@app.command()
@_guarded
def bench(
    url: str = typer.Option("", "--url", help="API base URL (default: http://HOST:PORT/v1 from the settings)"),
    model: str = typer.Option("", "--model", help="model id (default: SERVED_NAME)"),
    concurrency: str = typer.Option("1,2,3,4", "--concurrency", help="requests at once, comma-separated"),
    tokens: int = typer.Option(256, "--tokens", help="reply length of every decode request"),
    prompt_sizes: str = typer.Option("512,2k,8k,32k", "--prompt-sizes", help="prefill sweep, in tokens"),
    repeats: int = typer.Option(3, "--repeats", help="runs per figure; the median is shown"),
    json_out: Path | None = typer.Option(None, "--json", help="write the result as JSON here"),
    plot: Path | None = typer.Option(None, "--plot", help="write a PNG plot here (needs the bench extra)"),
    api_key: str = typer.Option("", "--api-key", help="bearer token (default: API_KEY)", show_default=False),
    timeout: float = typer.Option(600.0, "--timeout", help="seconds one request may take"),
    budget: float = typer.Option(3600.0, "--budget", help="seconds the whole bench may take; the rest is skipped"),
) -> int:
    """Measure a running server through its OpenAI API: decode tok/s at each concurrency (prose and JSON
    replies), time to first token, and prefill tok/s over a sweep of prompt sizes."""
    from recipe.bench import BenchOptions, api_url, parse_sizes, run_bench
    from recipe.bench_result import write_json

    settings = load_settings()
    options = BenchOptions(url=api_url(url, settings.host, settings.port), model=model or settings.served_name,
                           api_key=api_key or settings.api_key, concurrency=parse_sizes(concurrency, "--concurrency"),
                           tokens=tokens, prompt_sizes=parse_sizes(prompt_sizes, "--prompt-sizes"), repeats=repeats,
                           request_timeout_s=timeout, budget_s=budget)
    if plot is not None:
        from recipe.bench_plot import require_matplotlib, write_plot
        require_matplotlib()  # before minutes of measuring, not after
    result = run_bench(options, ui.ConsoleReporter().note)
    ui.show_bench(result)
    if json_out is not None:
        ui.say(f"JSON: {write_json(result, json_out)}")
    if plot is not None:
        ui.say(f"Plot: {write_plot(result, plot)}")
    return 0

def _start(restart: bool, extra: tuple[str, ...]) -> int:
    settings, the_plan = _settings_and_plan(extra)
    current = control.status(Path(the_plan.run_dir))
    if settings.dry_run:
        return _dry_run(settings, _with_links(settings, the_plan, extra, current, must_pass=False), current, restart)
    if current.running and not restart:
        ui.say(f"{current.state.served_name} is already running ({len(current.state.ranks)} ranks, API "
               f"{current.state.api_url}): nothing to do.")
        ui.say("./start.sh restart restarts it (with new settings, say); ./stop.sh stops it.")
        return 0
    launch.ensure_supported(the_plan)
    clock = StepClock()
    the_plan = _with_links(settings, the_plan, extra, current, must_pass=True)
    clock.lap("checks")
    ui.headline(settings, the_plan)
    reporter = ui.ConsoleReporter()
    ui.step(1, STEPS, "Settings checked")
    if current.state is None:   # nothing of ours to stop: a port taken now is another program's, refused up front
        launch.check_ports_free(the_plan)
    # Checkpoint and image are made ready while the last run (if any) still serves: a failure here stops nothing,
    # and a restart is down only from the stop to the new ranks' readiness.
    ui.step(2, STEPS, "Checkpoint")
    _download(settings, reporter)
    launch.prepare(the_plan, reporter)
    launch.sync_checkpoint(the_plan, reporter)
    clock.lap("checkpoint")
    _image_step(settings, the_plan, reporter)
    clock.lap("image")
    ui.step(4, STEPS, f"Clearing the way, then launching {the_plan.tp} rank(s), workers first, rank 0 last")
    stopped = _clear_previous(settings, current, reporter)
    # Ports the stopped ranks held can stay taken for a moment after their processes are gone (a closing socket).
    launch.check_ports_free(the_plan, grace_s=PORT_GRACE_S if stopped else 0.0)
    clock.lap("clear")
    launch.save_leftover_logs(the_plan, Path(settings.log_dir), settings.log_keep)
    state, handles = _launch(settings, the_plan, reporter)
    clock.lap("launch")
    if settings.foreground:
        return _follow(settings, the_plan, state, handles)
    return _wait_and_check(settings, the_plan, state, reporter, clock)


def _launch(settings: Settings, the_plan: Plan, reporter: ui.ConsoleReporter) -> tuple[Any, dict]:
    with _stop_all_on(launch.RankExited, settings, reporter):
        state, handles = launch.launch(the_plan, {"API_KEY": settings.api_key}, reporter, image=settings.image,
                                       cache_dir=settings.cache_dir, log_dir=settings.log_dir, keep=settings.log_keep)
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
def _stop_all_on(kind: type[LaunchError], settings: Settings, reporter: ui.ConsoleReporter,
                 refit: bool = False) -> Iterator[None]:
    """A rank that exits before the server is ready takes the others down with it: no rank is left on any node.
    With `refit`, a window that does not fit is raised as it is (after the stop) for one more start."""
    try:
        yield
    except kind as error:
        reporter.warn(f"{error.message}: stopping every rank on every node")
        result = control.stop(Path(settings.log_dir, "run"), Path(settings.log_dir), settings.log_keep,
                              settings.stop_timeout, reporter)
        left = [r for r in result.ranks if r.outcome.startswith("unknown")]
        if refit and not left and isinstance(error, launch.WindowTooLarge):
            raise
        fix = (f"every rank was stopped and its log saved under {settings.log_dir}; read the last lines above"
               if not left else f"rank(s) {', '.join(str(r.rank) for r in left)} could not be reached to stop: "
               "./stop.sh tries again")
        raise LaunchError(error.message, fix, logs=error.logs) from None


def _with_links(settings: Settings, the_plan: Plan, extra: tuple[str, ...], current: control.Status,
                must_pass: bool) -> Plan:
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


@app.command()
@_guarded
def doctor() -> int:
    """Check every machine: ssh, memory, disk, docker, rsync, the API port, the RoCE link. Exit code 1 on a failure."""
    settings = load_settings()
    current = control.status(Path(settings.log_dir, "run"))
    checks = list(preflight.run_checks(preflight.context_for(settings, api_port_ours=current.state is not None)))
    ui.show_checks(checks)
    return 1 if any(c.status == preflight.FAIL for c in checks) else 0


@app.command("download")
@_guarded
def download_command() -> int:
    """Fetch the pinned checkpoint into HF_CACHE here (only the files the cache lacks; offline, check the cache)."""
    settings = load_settings()
    if not download.wanted(settings):
        ui.say("The ranks read CHECKPOINT (or the embedded default's demo checkpoint): nothing to download.")
        return 0
    _download(settings, ui.ConsoleReporter())
    return 0


def _download(settings: Settings, reporter: ui.ConsoleReporter) -> None:
    if download.wanted(settings):
        fetched = download.fetch(settings, lambda done, total: reporter.note(download.progress_line(done, total)))
        reporter.note(fetched.note)


@app.command("copy")
@_guarded
def copy_command() -> int:
    """Copy the checkpoint to every worker (resumable: run again after an interruption), then compare manifests."""
    settings = load_settings()
    folder = checkpoint.head_checkpoint_dir(settings)
    if not settings.workers or folder is None:
        ui.say("No worker is configured (WORKER): every rank reads this machine's checkpoint; nothing to copy.")
        return 0
    head = LocalNode()
    ui.say(f"Copying {folder} to {', '.join(settings.workers)} (rsync over ssh, resumable; a Hugging Face "
           "snapshot goes blobs first, then its links)")
    outcomes = on_each([SshNode(w) for w in settings.workers],
                       lambda worker: checkpoint.copy_to_worker(head, worker, folder))
    ui.show_copies(outcomes)
    return 1 if any(isinstance(o, BaseException) for o in outcomes.values()) else 0


def _dry_run(settings: Settings, the_plan: Plan, current: control.Status, restart: bool) -> int:
    ui.headline(settings, the_plan)
    ui.say("DRY_RUN=1: printing the plan; nothing is stopped, started or written.")
    if current.running:
        ui.say("DRY_RUN: the server is running now; a real restart would stop it first"
               if restart else "DRY_RUN: the server is running now; a real start would do nothing")
    elif current.state is not None:
        ui.say("DRY_RUN: a previous run is recorded but not all of its ranks run; a real start would stop it first")
    ui.show_plan(the_plan, settings)
    if the_plan.runtime == "docker":
        for text in plan_lines(settings):
            ui.say(text)
    return 0


def _clear_previous(settings: Settings, current: control.Status, reporter: ui.ConsoleReporter) -> bool:
    """Stop what the last run left; True when something was stopped."""
    if current.state is None:
        reporter.note("Nothing running before: starting fresh")
        return False
    why = "restart: stopping the running server" if current.running else (
        "only some ranks of the last run are running: stopping them first" if current.partly_running
        else "the last run's ranks have exited: saving their logs")
    reporter.note(why)
    result = control.stop(Path(settings.log_dir, "run"), Path(settings.log_dir), settings.log_keep,
                          settings.stop_timeout, reporter)
    for rank in result.ranks:
        reporter.note(f"rank {rank.rank}: {rank.outcome}" + (f", log saved to {rank.saved_log}" if rank.saved_log else ""))
    return True


def _wait_and_check(settings: Settings, the_plan: Plan, state: Any, reporter: ui.ConsoleReporter,
                    clock: StepClock) -> int:
    ui.step(5, STEPS, f"Loading on every rank (up to {settings.wait_timeout}s, WAIT_TIMEOUT)")
    started = time.monotonic()
    try:
        with _stop_all_on(launch.RankExited, settings, reporter, refit=True):
            health = launch.wait_ready(the_plan, state, settings.wait_timeout, reporter)
    except launch.WindowTooLarge as error:   # rank 0 named the window that fits: start again with it, once
        reporter.warn(f"this start's memory holds a {error.fits}-token window, not {settings.context}: "
                      f"starting again with --context {error.fits}")
        the_plan = the_plan.with_context(error.fits)
        launch.check_ports_free(the_plan, grace_s=PORT_GRACE_S)
        state, _ = _launch(settings, the_plan, reporter)
        with _stop_all_on(launch.RankExited, settings, reporter):
            health = launch.wait_ready(the_plan, state, settings.wait_timeout, reporter)
    reporter.note(f"Rank 0 answered after {time.monotonic() - started:.0f}s")
    clock.lap("loading")
    ui.step(6, STEPS, "Smoke test: one short chat request through rank 0")
    try:
        result = smoke_test(the_plan.api_url, the_plan.served_name, settings.api_key)
    except LaunchError as error:
        raise LaunchError(error.message, error.fix, logs=launch.last_lines(state)) from None
    reporter.note(f"OK: {result.text.strip()[:60]!r}, {result.completion_tokens} tokens in {result.seconds:.1f}s")
    clock.lap("smoke")
    reporter.note(clock.summary())
    ui.live_banner(the_plan, settings, health, result)
    return 0


def _follow(settings: Settings, the_plan: Plan, state: Any, handles: dict) -> int:
    """FOREGROUND=1: print rank 0's log as it grows until rank 0 exits; Ctrl-C or any rank exiting stops all.
    (A worker's rank is watched through rank 0: the engine's peer watch ends rank 0 when a peer dies.)"""
    rank0 = next(r for r in state.ranks if r.rank == 0)
    if rank0.container:   # a container here: its log through docker, its end through docker inspect
        follower = launch_docker.ContainerLogFollower(rank0.container)
        handles = {0: launch_docker.ContainerWatch(rank0.container)}
    else:
        follower = LogFollower(Path(the_plan.rank0.log))
    reporter = ui.ConsoleReporter()
    stop_all = functools.partial(control.stop, Path(the_plan.run_dir), Path(settings.log_dir), settings.log_keep,
                                 settings.stop_timeout, reporter)
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
    time.sleep(0.5)   # the last lines (docker logs -f delivers them a moment after the exit)
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


patches_app = typer.Typer(no_args_is_help=True, help="The engine patch series (patches/series).")
app.add_typer(patches_app, name="patches")


@patches_app.command("check")
@_guarded
def patches_check() -> int:
    """Apply patches/series in order to a scratch copy of engine/ and report each patch; nothing is built."""
    outcomes, unlisted = check_patches()
    if not outcomes:
        ui.say("patches/series lists no patch: the image gets engine/ as it is.")
    for outcome in outcomes:
        ui.say(f"  {outcome.status:<9} {outcome.name}" + (f"  ({outcome.detail})" if outcome.detail else ""))
    for name in unlisted:
        ui.warn(f"patches/{name} is not listed in patches/series, so it is not applied")
    failed = [o for o in outcomes if o.status == "fails"]
    if failed:
        raise RecipeError(f"patch {failed[0].name} does not apply to engine/",
                          f"update patches/{failed[0].name} for the current engine, or remove it from patches/series")
    if outcomes:
        ui.say(f"All {len(outcomes)} patch(es) apply in order.")
    return 0
