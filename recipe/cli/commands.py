"""`sparks`: the command line. Parses options, calls the core, renders what it returns.

The one error boundary is `_guarded`: a RecipeError prints its message and fix and exits non-zero; any other
exception too, with a traceback only when SPARKS_DEBUG=1.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from recipe.bench.bench import run_bench
from recipe.bench.options import BenchOptions, api_url, parse_sizes
from recipe.bench.plot import require_matplotlib, write_plot
from recipe.bench.result import write_json
from recipe.checkpoint import checkpoint, download
from recipe.cli import ui
from recipe.cli.start import download_into_cache, settings_and_plan, start_or_restart
from recipe.errors import RecipeError
from recipe.image.image import check_patches
from recipe.launch import control
from recipe.net.nodes import LocalNode, SshNode, on_each
from recipe.preflight import preflight
from recipe.settings import REPO_ROOT, load_settings
from recipe.settings.docs import settings_markdown, update_readme
from recipe.top import view as top_view
from recipe.top.top import Top, TopClient, server_root

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Serve GLM-5.3-Flash on DGX Sparks, or on this machine when no WORKER is set.",
)
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


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
            ui.show_error(
                RecipeError(
                    f"unexpected {type(error).__name__}: {error}",
                    "run again with SPARKS_DEBUG=1 for the traceback, and report it",
                )
            )
            raise typer.Exit(1) from None
        raise typer.Exit(code)

    return run


@app.command(context_settings=PASS_THROUGH)
@_guarded
def start(ctx: typer.Context) -> int:
    """Start every rank (does nothing when already running). Extra arguments go to `engine serve` on every rank."""
    return start_or_restart(restart=False, extra=tuple(ctx.args))


@app.command(context_settings=PASS_THROUGH)
@_guarded
def restart(ctx: typer.Context) -> int:
    """Build and check the new plan first, then stop the running server and start again."""
    return start_or_restart(restart=True, extra=tuple(ctx.args))


@app.command()
@_guarded
def stop() -> int:
    """Stop every rank; each rank's log is saved under LOG_DIR."""
    settings = load_settings(rules=False)
    run_dir = control.run_dir_of(settings)
    if settings.dry_run:
        current = control.status(run_dir)
        ranks = ", ".join(str(r.rank) for r in current.state.ranks) if current.state else "none"
        ui.say(
            f"DRY_RUN=1: would stop ranks {ranks} (up to {settings.stop_timeout}s) and save their logs "
            f"under {settings.log_dir}; nothing is stopped."
        )
        return 0
    result = control.stop(
        run_dir, Path(settings.log_dir), settings.log_keep, settings.stop_timeout, ui.ConsoleReporter()
    )
    if not result.found and result.problem:  # never "nothing is running" from a record that cannot be read
        raise RecipeError(
            f"the run record {result.problem} and no rank record was found: nothing was stopped", ui.UNKNOWN_RUN
        )
    ui.show_stop(result)
    return 0


@app.command()
@_guarded
def status() -> int:
    """Show each rank, rank 0's health and the API URL. Exit code 0 while every rank runs and rank 0 does not
    report that it cannot serve (a silent or stopped rank), else 3."""
    settings = load_settings(rules=False)
    current = control.status(control.run_dir_of(settings))
    ui.show_status(current)
    return 0 if current.serving else 3


@app.command()
@_guarded
def plan(as_json: bool = typer.Option(False, "--json", help="print the plan as JSON")) -> int:
    """Print what `start` would run: every rank's command, environment, mounts and ports (secrets masked)."""
    settings, the_plan = settings_and_plan()
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
    reuse_sizes: str = typer.Option(
        "8k,32k", "--reuse-sizes", help="prompt reuse: cold vs resent, and a shared system prompt, in tokens ('' skips)"
    ),
    repeats: int = typer.Option(3, "--repeats", help="runs per figure; the median is shown"),
    json_out: Path | None = typer.Option(None, "--json", help="write the result as JSON here"),
    plot: Path | None = typer.Option(None, "--plot", help="write a PNG plot here (needs the bench extra)"),
    api_key: str = typer.Option("", "--api-key", help="bearer token (default: API_KEY)", show_default=False),
    timeout: float = typer.Option(600.0, "--timeout", help="seconds one request may take"),
    budget: float = typer.Option(3600.0, "--budget", help="seconds the whole bench may take; the rest is skipped"),
) -> int:
    """Measure a running server through its OpenAI API: decode tok/s at each concurrency (prose and JSON
    replies), time to first token, prefill tok/s over a sweep of prompt sizes, and prompt reuse (first token of a
    resent prompt and of a shared system prompt against cold)."""
    settings = load_settings()
    options = BenchOptions(
        url=api_url(url, settings.host, settings.port),
        model=model or settings.served_name,
        api_key=api_key or settings.api_key,
        concurrency=parse_sizes(concurrency, "--concurrency"),
        tokens=tokens,
        prompt_sizes=parse_sizes(prompt_sizes, "--prompt-sizes"),
        reuse_sizes=parse_sizes(reuse_sizes, "--reuse-sizes"),
        repeats=repeats,
        request_timeout_s=timeout,
        budget_s=budget,
    )
    if plot is not None:
        require_matplotlib()  # before minutes of measuring, not after
    result = run_bench(options, ui.ConsoleReporter().note)
    ui.show_bench(result)
    if json_out is not None:
        ui.say(f"JSON: {write_json(result, json_out)}")
    if plot is not None:
        ui.say(f"Plot: {write_plot(result, plot)}")
    return 0


@app.command()
@_guarded
def top(
    url: str = typer.Option("", "--url", help="server URL, with or without /v1 (default: HOST:PORT from the settings)"),
    interval: float = typer.Option(1.0, "--interval", min=0.1, help="seconds between polls"),
    once: bool = typer.Option(False, "--once", help="take two samples INTERVAL apart, show them once and exit"),
    as_json: bool = typer.Option(False, "--json", help="print one snapshot as JSON (implies --once)"),
    api_key: str = typer.Option(
        "",
        "--api-key",
        envvar="SPARKS_API_KEY",
        show_default=False,
        help="bearer token for /metrics (default: API_KEY)",
    ),
) -> int:
    """Live dashboard of a running server's /health and /metrics: streams, queue, decode and prefill tok/s, time
    to first token, the pool, each rank's heartbeat. Ctrl-C quits. With --once, exit code 3 when nothing answers."""
    if not url or not api_key:
        settings = load_settings(rules=False)
        url, api_key = url or server_root("", settings.host, settings.port), api_key or settings.api_key
    client = TopClient(server_root(url, "", 0), api_key)
    try:
        if not (once or as_json):
            return top_view.run_live(Top(client).poll, interval)
        shot = Top(client).once(interval)
    finally:
        client.close()
    if as_json:
        print(json.dumps(shot.to_dict(), indent=2))
    else:
        top_view.show(shot, interval)
    return 0


@app.command()
@_guarded
def doctor() -> int:
    """Check every machine: ssh, memory, disk, docker, rsync, the API port, the RoCE link. Exit code 1 on a failure."""
    settings = load_settings()
    current = control.status(control.run_dir_of(settings))
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
    download_into_cache(settings, ui.ConsoleReporter())
    return 0


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
    ui.say(
        f"Copying {folder} to {', '.join(settings.workers)} (rsync over ssh, resumable; a Hugging Face "
        "snapshot goes blobs first, then its links)"
    )
    outcomes = on_each(
        [SshNode(w) for w in settings.workers], lambda worker: checkpoint.copy_to_worker(head, worker, folder)
    )
    ui.show_copies(outcomes)
    return 1 if any(isinstance(o, BaseException) for o in outcomes.values()) else 0


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
        raise RecipeError(
            f"patch {failed[0].name} does not apply to engine/",
            f"update patches/{failed[0].name} for the current engine, or remove it from patches/series",
        )
    if outcomes:
        ui.say(f"All {len(outcomes)} patch(es) apply in order.")
    return 0
