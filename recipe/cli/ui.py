"""Everything the CLI shows: step headers, progress lines, the plan, tables and the LIVE banner (rich)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from recipe.bench.result import BenchResult
from recipe.checkpoint.checkpoint import CopyResult
from recipe.errors import LaunchError, RecipeError
from recipe.launch.control import Status, StopResult
from recipe.launch.smoke import SmokeResult
from recipe.plan.plan import Plan
from recipe.preflight.check import Check
from recipe.settings import Settings
from recipe.settings.schema import load_specs

console = Console(highlight=False, soft_wrap=True)
errors = Console(stderr=True, highlight=False, soft_wrap=True)


class ConsoleReporter:
    """The launcher's progress, printed: notes, warnings and rank log lines (indented under the step)."""

    def note(self, text: str) -> None:
        console.print(f"  {escape(text)}")

    def warn(self, text: str) -> None:
        errors.print(f"  [yellow]warning:[/] {escape(text)}")

    def line(self, source: str, text: str) -> None:
        if text.strip():
            console.print(f"  [dim]│ {escape(source)}:[/] {escape(text)}")


def step(number: int, total: int, text: str) -> None:
    console.print(f"[bold magenta][{number}/{total}][/] [bold]{escape(text)}[/]")


def say(text: str) -> None:
    console.print(escape(text))


def warn(text: str) -> None:
    errors.print(f"[yellow]warning:[/] {escape(text)}")


UNKNOWN_RUN = (
    "Ranks may still run: look for them (ps -ef | grep 'engine serve'; docker ps for containers) and "
    "stop them by PID or name; ./start.sh writes a new record"
)


def show_error(error: RecipeError) -> None:
    if isinstance(error, LaunchError):
        for source, lines in error.logs.items():
            errors.print(f"[dim]── {escape(source)}: last log lines ──[/]")
            for text in lines or ["(empty)"]:
                errors.print(f"  [dim]│[/] {escape(text)}")
    errors.print(
        f"[bold red]error:[/] {escape(error.message)}" + (f" [dim]→[/] {escape(error.fix)}" if error.fix else "")
    )


def headline(settings: Settings, plan: Plan) -> None:
    workers = sorted({r.node for r in plan.ranks if r.node != "local"})
    if plan.runtime == "process" and workers:
        where = (
            f"{plan.tp} processes on the {plan.device}: rank 0 here, the rest on {', '.join(workers)}; "
            f"checkpoint {plan.checkpoint}"
        )
    elif plan.runtime == "process":
        where = f"embedded default: {plan.tp} local process(es) on this machine's {plan.device}, " + (
            "the trained demo checkpoint (3.8 MB, trained here on synthetic chats; not GLM-5.3-Flash)"
            if plan.prepare
            else f"checkpoint {plan.checkpoint}"
        )
    else:
        where = (
            f"{plan.tp} container(s) on the {plan.device}"
            + (f": rank 0 here, the rest on {', '.join(workers)}" if workers else "")
            + f"; {settings.checkpoint or settings.model_id}"
        )
    console.print(f"[bold]GLM-5.3-Flash on Sparks[/] [dim]· {escape(where)}[/]")
    s = plan.summary
    console.print(f"[dim]{s['parallel']} at once · {s['context']}-token window · {s['kv']} KV · port {s['port']}[/]")


def show_plan(plan: Plan, settings: Settings) -> None:
    for prep in plan.prepare:
        state = "already there, reused" if prep.done else "not there yet: would be made first"
        console.print(f"[bold]prepare[/] {escape(prep.final)} ({state})")
        console.print(f"    {escape(shlex.join(prep.argv))}")
    for secret in plan.secret_files:
        console.print(f"[bold]secret file[/] {escape(secret.path)} (mode 600, holds {secret.setting})")
    for rank, item in zip(plan.ranks, plan.to_dict()["ranks"]):
        where = "here" if rank.node == "local" else f"on {rank.node}"
        console.print(f"[bold]rank {rank.rank}[/] {where} ({rank.runtime}):")
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in item["env"].items())
        console.print(f"    [dim]env:[/] {escape(env)}")
        for mount in item["mounts"]:
            console.print(f"    [dim]mount:[/] {escape(mount)}")
        console.print(f"    {escape(shlex.join(rank.argv))}", soft_wrap=True)
        ports = ", ".join(str(p) for p in rank.ports) or "none"
        console.print(f"    [dim]listens on: {ports} · log: {escape(rank.log)}[/]")
    console.print(
        f"[dim]start order: ranks {', '.join(str(r.rank) for r in plan.ranks)} · API {escape(plan.api_url)}[/]"
    )


def drafts_words(settings: Settings, health: dict) -> str:
    """What drafts: the drafter /health names, and the tokens per step the smoke test committed; the settings only
    when /health has no `drafts` (an engine that does not report them)."""
    drafts = health.get("drafts") or {
        "drafter": settings.drafter if settings.draft_tokens > 0 else "none",
        "draft_tokens": settings.draft_tokens,
    }
    if drafts.get("drafter", "none") == "none":
        return "no drafts"
    per_step = drafts.get("tokens_per_step")
    measured = f", smoke test {per_step:.2f} tokens/step" if per_step else ""
    return f"{drafts['drafter']} drafts (up to {drafts.get('draft_tokens')}{measured})"


def serving_words(settings: Settings, health: dict) -> str:
    """How the server serves, as /health reports it: lanes, the cache's row type, the dense weights and the drafts.
    A setting stands in only for a field /health leaves out (an engine that does not report it), so the banner
    states what runs rather than what was asked for."""
    lanes = (health.get("streams") or {}).get("max", settings.parallel)
    rows = (health.get("memory") or {}).get("pool_rows", settings.kv)
    dense = health.get("weights", settings.dense)
    return f"{lanes} at once · {rows} KV · {dense} dense weights · {drafts_words(settings, health)}"


def memory_line(health: dict) -> str | None:
    """What rank 0 holds, as /health's `memory` reads it off the tensors: weights (and the biggest kind), the pool
    and its row type, the lane states; None from an engine that does not report it."""
    memory = health.get("memory") or {}
    weights = memory.get("weights_bytes") or {}
    if not weights:
        return None
    kinds = {k: v for k, v in weights.items() if k != "total"}
    biggest = max(kinds, key=lambda k: kinds[k]) if kinds else None
    part = f" ({biggest.replace('_', ' ')} {_bytes(kinds[biggest])})" if biggest else ""
    return (
        f"rank 0: weights {_bytes(weights.get('total', 0))}{part} · pool {_bytes(memory.get('pool_bytes', 0))} "
        f"({memory.get('pool_rows')} rows) · lane states {_bytes(memory.get('lane_state_bytes', 0))}"
    )


def vision_words(health: dict) -> str:
    """Images (and videos) as /health reports them: taken (data URLs, and https URLs when fetched) and the tower's
    bytes on rank 0, or nothing when off."""
    vision = health.get("vision") or {}
    if not vision.get("enabled"):
        return ""
    sources = "data: and https URLs" if vision.get("urls") else "data: URLs"
    kinds = "images and video" if vision.get("max_videos") else "images"
    return f" · {kinds} ({sources}; tower {_bytes(vision.get('tower_bytes', 0))} on rank 0)"


def reuse_words(health: dict) -> str:
    """Prompt reuse as /health reports it: on (and its snapshot cap), or nothing when off or not reported."""
    reuse = health.get("prompt_reuse") or {}
    return f" · prompt reuse (states up to {_bytes(reuse.get('cap_bytes', 0))})" if reuse.get("enabled") else ""


def _bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def live_banner(plan: Plan, settings: Settings, health: dict, smoke: SmokeResult) -> None:
    window = health.get("context_length", plan.summary["context"])
    extras = (" · thinking" if settings.thinking else "") + reuse_words(health) + vision_words(health)
    console.print(f"\n[bold green]✔ {escape(plan.served_name)} is LIVE[/] on port {settings.port}")
    rows = [
        ("API", f"{plan.api_url}  (model: {plan.served_name}; OpenAI-compatible)"),
        ("Window", f"{window} tokens · {serving_words(settings, health)}{extras}"),
        ("Ranks", f"{plan.tp} × {plan.runtime} on the {plan.device}" + (" (demo checkpoint)" if plan.prepare else "")),
        *([("Memory", line)] if (line := memory_line(health)) else []),
        (
            "Smoke",
            f"{smoke.text.strip()[:40]!r} in {smoke.seconds:.1f}s"
            + (f" · an image answered in {smoke.image_seconds:.1f}s" if smoke.image_seconds is not None else ""),
        ),
        ("Logs", "  ".join(f"rank {r.rank}: {r.log}" for r in sorted(plan.ranks, key=lambda r: r.rank))),
        ("Restart", "./start.sh restart"),
        ("Stop", "./stop.sh"),
    ]
    for label, text in rows:
        console.print(f"  [bold]{label:<8}[/] {escape(text)}")


def show_stop(result: StopResult) -> None:
    if not result.found:
        say("Nothing is running (no recorded ranks): nothing to stop.")
        return
    for rank in result.ranks:
        saved = f"; its log: {rank.saved_log}" if rank.saved_log else ""
        where = "here" if rank.node == "local" else f"on {rank.node}"
        say(f"rank {rank.rank} {where} ({rank.ident}): {rank.outcome}{saved}")
    left = [r for r in result.ranks if r.outcome.startswith("unknown")]
    if left:
        warn(
            f"rank(s) {', '.join(str(r.rank) for r in left)} could not be reached; they are still recorded: "
            "./stop.sh tries again once the worker answers"
        )
    else:
        say("Stopped every rank.")


def show_status(status: Status) -> None:
    if status.problem:
        warn(
            f"the run record {status.problem}: "
            + (
                "the ranks below come from their own records (rank<N>.json)"
                if status.state
                else "and no rank record was found, so whether ranks run here is unknown"
            )
        )
    if status.state is None:
        say(UNKNOWN_RUN if status.problem else "Not running (no recorded ranks). Start it with ./start.sh")
        return
    if status.state.checkout:
        say(f"Run of the checkout {status.state.checkout}")
    table = Table(show_edge=False)
    for column in ("rank", "node", "pid / container", "state", "log"):
        table.add_column(column)
    shown = {True: "[green]running[/]", False: "[red]exited[/]", None: "[yellow]unknown (node not reached)[/]"}
    for proc in sorted(status.state.ranks, key=lambda r: r.rank):
        table.add_row(
            str(proc.rank),
            escape("here" if proc.node == "local" else proc.node),
            str(proc.container[:12] or proc.pid),
            shown[status.alive.get(proc.rank)],
            escape(proc.log),
        )
    console.print(table)
    for proc in status.exited:
        say(f"rank {proc.rank} {proc.where} ({proc.ident}) has exited")
    if status.said == "not serving":
        say(
            f"Health: NOT serving · {(status.health or {}).get('error', 'rank 0 says it cannot serve')} · "
            f"API {status.state.api_url}"
        )
    elif status.said == "silent":
        say(
            "Health: NOT serving · rank 0 takes connections but does not answer (frozen or stuck) · "
            "./start.sh restart starts again"
        )
    elif status.health is not None:
        h = status.health
        say(
            f"Health: answering · {h.get('requests_running', '?')} request(s) running · "
            f"window {h.get('context_length', '?')} tokens · API {status.state.api_url}"
        )
    elif status.running:
        say(f"Health: rank 0 runs but {status.state.health_url} does not answer yet (still loading?)")
    else:
        say("Some ranks have exited: ./start.sh restart starts them again, ./stop.sh cleans up.")


STATUS_STYLE = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]fail[/]"}


def show_check(check: Check) -> None:
    """One check as a line (start prints them as they run)."""
    fix = f" [dim]→ {escape(check.fix)}[/]" if check.fix and check.status != "ok" else ""
    console.print(
        f"  {STATUS_STYLE[check.status]} {escape(check.name)} ({escape(check.node)}): {escape(check.message)}{fix}"
    )


def show_checks(checks: list[Check]) -> None:
    table = Table(show_edge=False)
    for column in ("check", "node", "status", "found", "what to do"):
        table.add_column(column)
    for check in checks:
        table.add_row(
            check.name,
            escape(check.node),
            STATUS_STYLE[check.status],
            escape(check.message),
            escape(check.fix) if check.status != "ok" else "",
        )
    console.print(table)
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    say(
        f"{len(checks)} checks: {failed} failed, {warned} warning(s)"
        if failed or warned
        else f"All {len(checks)} checks passed."
    )


def show_copies(outcomes: Mapping[str, CopyResult | BaseException]) -> None:
    for worker, outcome in outcomes.items():
        if isinstance(outcome, RecipeError):
            errors.print(f"[bold red]{escape(worker)}:[/] {escape(outcome.one_line())}")
        elif isinstance(outcome, BaseException):
            errors.print(f"[bold red]{escape(worker)}:[/] unexpected {type(outcome).__name__}: {escape(str(outcome))}")
        else:
            say(
                f"{worker}: {outcome.files} files, {outcome.total_bytes / 2**30:.2f} GiB, identical to the head's "
                f"({outcome.sent_bytes / 2**20:.1f} MiB sent this time)"
            )


def show_settings(settings: Settings) -> None:
    table = Table(show_edge=False)
    for column in ("setting", "value", "from"):
        table.add_column(column)
    for name in load_specs():
        table.add_row(name, escape(settings.shown(name)), settings.origins.get(name, "default"))
    console.print(table)


def show_bench(result: BenchResult) -> None:
    """`sparks bench`: the decode table (as the reference recipe publishes it), the prefill table, notes."""
    decode = Table(
        title=f"Decode · {result.options.tokens}-token replies · median of {result.options.repeats} · tok/s",
        show_edge=False,
    )
    decode.add_column("Requests", justify="right")
    for kind in ("Prose", "Structured"):
        for name in (kind, "Per request", "TTFT"):
            decode.add_column(name, justify="right")
    for n in sorted({row.concurrency for row in result.decode}):
        cells = [str(n)]
        for kind in ("prose", "structured"):
            row = next((r for r in result.decode if r.kind == kind and r.concurrency == n), None)
            cells += (
                [_num(row.aggregate_tok_s), _num(row.per_request_tok_s), _ms(row.ttft_s)] if row else ["-", "-", "-"]
            )
        decode.add_row(*cells)
    console.print(decode)
    if result.prefill:
        prefill = Table(title="Prefill (one request, one-token reply)", show_edge=False)
        for name in ("Prompt tokens", "Prefill tok/s", "First token"):
            prefill.add_column(name, justify="right")
        for sample in result.prefill:
            prefill.add_row(f"{sample.prompt_tokens:,}", _num(sample.prefill_tok_s), f"{sample.ttft_s or 0:.2f} s")
        console.print(prefill)
    if result.reuse:
        reuse = Table(title="Prompt reuse (one-token replies: cold, then resumed)", show_edge=False)
        for name in ("Case", "Prompt tokens", "Cached", "Cold first token", "Resumed", "Share"):
            reuse.add_column(name, justify="right")
        for kept in result.reuse:
            reuse.add_row(
                "resent" if kept.kind == "resent" else "same system",
                f"{kept.prompt_tokens:,}",
                f"{kept.cached_tokens:,}",
                _ms(kept.cold_ttft_s),
                _ms(kept.warm_ttft_s),
                "-" if kept.ratio is None else f"{100 * kept.ratio:.1f} %",
            )
        console.print(reuse)
    window = result.server.get("context_length")
    say(
        f"{result.options.model} at {result.options.url}"
        + (f" · window {window} tokens" if window else "")
        + f" · {result.host} · {result.date} · {result.seconds:.0f}s"
    )
    for line in result.skipped:
        say(f"skipped: {line}")
    for line in result.warnings:
        warn(line)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:,.0f} ms"
