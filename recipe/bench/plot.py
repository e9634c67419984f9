"""The PNG of a `sparks bench` result: decode (aggregate and per request), TTFT, and prefill. matplotlib is the
optional extra `bench`, imported only here and only when a plot is asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipe.bench.bench import KINDS
from recipe.bench.result import BenchResult
from recipe.errors import RecipeError

COLOURS = {"prose": "tab:blue", "structured": "tab:orange"}


def require_matplotlib() -> Any:
    """matplotlib.pyplot on the file-only Agg backend, or a RecipeError saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise RecipeError(
            "--plot needs matplotlib, which is not installed",
            "install the bench extra: .venv/bin/pip install -e '.[bench]' (or drop --plot)",
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plot(result: BenchResult, path: Path) -> Path:
    plt = require_matplotlib()
    fig, (decode, ttft, prefill) = plt.subplots(1, 3, figsize=(15, 4.6))
    for kind in KINDS:
        rows = [row for row in result.decode if row.kind == kind]
        if not rows:
            continue
        xs = [row.concurrency for row in rows]
        colour = COLOURS[kind]
        decode.plot(xs, [row.aggregate_tok_s for row in rows], "o-", color=colour, label=f"{kind}, aggregate")
        decode.plot(xs, [row.per_request_tok_s for row in rows], "s--", color=colour, label=f"{kind}, per request")
        ttft.plot(xs, [1000 * (row.ttft_s or 0) for row in rows], "o-", color=colour, label=kind)
    for axes, title, unit in ((decode, "Decode", "tok/s"), (ttft, "Time to first token", "ms")):
        axes.set(title=title, xlabel="requests at once", ylabel=unit)
        axes.set_xticks(sorted({row.concurrency for row in result.decode}) or [1])
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    if result.prefill:
        sizes = [row.prompt_tokens for row in result.prefill]
        prefill.plot(sizes, [row.prefill_tok_s for row in result.prefill], "o-", color="tab:green")
        prefill.set_xscale("log", base=2)
        prefill.set_xticks(sizes, [f"{s:,}" for s in sizes], rotation=30, fontsize=8)
        prefill.minorticks_off()
    prefill.set(title="Prefill", xlabel="prompt tokens", ylabel="tok/s")
    prefill.set_ylim(bottom=0)
    prefill.grid(alpha=0.3)
    fig.suptitle(
        f"sparks bench · {result.options.model} · {result.options.tokens}-token replies · "
        f"median of {result.options.repeats} · {result.host} · {result.date}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
