"""`sparks top` on the terminal: one `TopSnapshot` as a table, and the live loop that redraws it (rich `Live`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from recipe.top.top import Rate, TopSnapshot, Ttft

DASH = "—"
# Not ui.console: that one does not wrap (soft_wrap), and Live must know how many lines a frame takes to redraw it.
console = Console(highlight=False)


def render(shot: TopSnapshot, interval_s: float, live: bool = True) -> RenderableType:
    when = f"every {interval_s:g} s · Ctrl-C quits" if live else f"two samples {interval_s:g} s apart"
    title = Text.from_markup(f"[bold]sparks top[/] [dim]· {escape(shot.url)} · {when}[/]")
    if not shot.answering:
        return Group(
            title,
            Text.from_markup(
                f"[bold red]not answering[/] ({escape(shot.problem or '?')}) "
                f"[dim]· trying again every {interval_s:g} s[/]"
            ),
        )
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, text in _rows(shot):
        grid.add_row(label, text)
    lines: list[RenderableType] = [title, grid]
    if shot.metrics_problem:
        lines.append(Text.from_markup(f"[yellow]{escape(shot.metrics_problem)}[/]"))
    return Group(*lines)


def show(shot: TopSnapshot, interval_s: float) -> None:
    console.print(render(shot, interval_s, live=False))


def run_live(poll: Callable[[], TopSnapshot], interval_s: float) -> int:
    """Redraw every `interval_s` until Ctrl-C (exit code 0); an unreachable server is shown and polled again."""
    try:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                started = time.monotonic()
                live.update(render(poll(), interval_s), refresh=True)
                time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return 0


def _rows(shot: TopSnapshot) -> list[tuple[str, str]]:
    engine = "[green]ok[/]" if shot.ok else f"[bold red]NOT ok:[/] {escape(shot.error or 'no reason given')}"
    who = f"{escape(shot.model or '?')} · up {_duration(shot.uptime_s)}"
    streams = shot.streams or {}
    rows = [
        ("Engine", f"{engine} [dim]· {who}[/]"),
        (
            "Streams",
            f"{streams.get('busy', '?')} busy ({streams.get('decoding', '?')} decoding, "
            f"{streams.get('prefilling', '?')} prefilling) · {streams.get('free', '?')} free · "
            f"{streams.get('max', '?')} max",
        ),
        ("Requests", f"{_int(shot.requests_running)} running · {_int(shot.requests_waiting)} waiting"),
        ("Decode", _rate(shot.decode)),
        ("Prefill", _rate(shot.prefill) + " [dim](prompt tokens admitted)[/]"),
        ("TTFT", _ttft(shot.ttft)),
        ("Pool", _pool(shot)),
        ("Reuse", reuse(shot.prompt_reuse)),
        ("Ranks", _ranks(shot)),
    ]
    if shot.totals:
        rows.append(("Served", served(shot.totals)))
    return rows


def served(totals: dict) -> str:
    """/health's totals: requests, prompt and generated tokens, and the steps that ran out of GPU memory (their
    requests failed) when there were any."""
    text = (
        f"{_int(totals.get('requests'))} requests · {_int(totals.get('prompt_tokens'))} "
        f"prompt tokens · {_int(totals.get('completion_tokens'))} tokens generated"
    )
    if totals.get("out_of_memory"):
        text += f" · [red]{_int(totals['out_of_memory'])} steps out of GPU memory[/]"
    return text


def _rate(rate: Rate | None) -> str:
    if rate is None:
        return DASH
    if rate.minute_span_s < 1.5:  # no longer history yet (the first poll, or --once)
        return f"{_tok_s(rate.last_second)} last second"
    span = "last minute" if rate.minute_span_s >= 54 else f"last {rate.minute_span_s:.0f} s"
    return f"{_tok_s(rate.last_second)} last second · {_tok_s(rate.last_minute)} {span}"


def _ttft(ttft: Ttft | None) -> str:
    if ttft is None:
        return DASH
    if ttft.p50_s is None:
        return f"{DASH} [dim](no first token yet)[/]"
    return (
        f"p50 {_seconds(ttft.p50_s)} · p95 {_seconds(ttft.p95_s)} [dim]({ttft.window}, {ttft.observations} requests)[/]"
    )


def _pool(shot: TopSnapshot) -> str:
    used, total = shot.pool_used_tokens, shot.pool_tokens
    if used is None or not total:
        return DASH
    return f"{used:,} tokens used · {shot.pool_free_tokens:,} free of {total:,} ({100 * used / total:.0f} %)"


def reuse(counts: dict | None) -> str:
    """Prompt reuse as /health reports it: kept states, the rows they hold, and how many looked-up prompt tokens
    were resumed rather than prefilled."""
    if not counts:
        return DASH
    if not counts.get("enabled"):
        return "off"
    queries, hits = counts.get("queries_tokens") or 0, counts.get("hits_tokens") or 0
    share = f"{100 * hits / queries:.0f} %" if queries else DASH
    return (
        f"{_int(counts.get('states'))} kept states · {_int(counts.get('tokens'))} tokens held · {share} of prompt "
        f"tokens resumed [dim]({hits:,} of {queries:,})[/]"
    )


def _ranks(shot: TopSnapshot) -> str:
    if not shot.ranks:
        return DASH
    return " · ".join(
        f"rank {r.rank} "
        + ("[green]live[/]" if r.live else "[bold red]silent[/]")
        + f" [dim]({r.silent_s:.1f} s since heartbeat)[/]"
        for r in shot.ranks
    )


def _tok_s(value: float | None) -> str:
    return DASH if value is None else f"{value:,.1f} tok/s"


def _seconds(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{1000 * value:,.0f} ms" if value < 1 else f"{value:,.2f} s"


def _int(value: int | None) -> str:
    return DASH if value is None else f"{value:,}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}h {rest // 60:02d}m {rest % 60:02d}s" if hours else f"{rest // 60}m {rest % 60:02d}s"
