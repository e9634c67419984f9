"""`sparks bench`: decode and prefill speed of a live server, measured through its OpenAI-compatible API.

Every request streams a chat completion (SSE) with a fixed reply length (`max_tokens`, `ignore_eos`), temperature 0
and a seed, thinking off. The client stamps each streamed delta as it arrives:

- time to first token (TTFT) = first delta − request sent;
- a request's decode rate = (completion_tokens − 1) / (last delta − first delta), the usage count from the server;
- a run's aggregate = Σ (completion_tokens − 1) / (latest last delta − earliest first delta) over its requests,
  all sent at once;
- prefill rate = prompt_tokens / TTFT of a one-token reply (TTFT includes one decode step and the HTTP path);
- prompt reuse: the TTFT of a prompt sent cold, then sent again ("resent"); and of a conversation under a long
  system prompt, then of a new conversation under the same system prompt ("system"); with the cached tokens the
  server reported.

Each figure is the median over `repeats` runs. Every prompt starts with a line naming its run, so no two prompts
share a prefix and a server's prompt reuse cannot shorten a TTFT, except where the reuse section sends a prompt
again on purpose. The core returns a `BenchResult` and never prints; progress goes through a callback.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import httpx

from recipe.bench.client import BenchClient
from recipe.bench.options import BenchOptions
from recipe.bench.result import BenchResult, DecodeRow, DecodeRun, PrefillRow, ReuseRow

KINDS = ("prose", "structured")
PROMPTS_DIR = Path(__file__).with_name("prompts")
Progress = Callable[[str], None]


def load_prompts(kind: str) -> list[str]:
    """The shipped prompts of one kind (prose, structured, filler): non-empty lines, # comments dropped."""
    lines = (PROMPTS_DIR / f"{kind}.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def run_bench(options: BenchOptions, progress: Progress = lambda _: None) -> BenchResult:
    """Warm up, then decode at each concurrency for each kind, then the prefill sweep. Raises RecipeError when
    the server cannot be reached or answers wrongly; a spent time budget skips what is left instead."""
    options.check()
    started = time.monotonic()
    with BenchClient(
        options.url,
        options.model,
        options.api_key,
        options.seed,
        options.request_timeout_s,
        deadline=started + options.budget_s,
    ) as client:
        server = client.server_facts()
        result = BenchResult(
            options,
            datetime.now(timezone.utc).isoformat(timespec="seconds"),
            socket.gethostname(),
            _client_versions(),
            server,
        )
        busy = server.get("requests_running", 0) + server.get("requests_waiting", 0)
        if busy:
            result.warnings.append(f"the server had {busy} request(s) running or waiting when the bench started")
        streams = (server.get("streams") or {}).get("max")
        if streams and max(options.concurrency) > streams:
            result.warnings.append(
                f"the server decodes {streams} requests at once: at higher concurrency the others "
                "wait, and their TTFT counts the wait"
            )
        client.check_model()
        before = (server.get("totals") or {}).get("completion_tokens")
        progress(f"warm-up: one {min(options.tokens, 8)}-token reply")
        client.stream_chat("(bench warm-up)\n" + load_prompts("prose")[0], min(options.tokens, 8))
        for kind in KINDS:
            for n in options.concurrency:
                row = _decode_row(client, options, kind, n, progress)
                if len(row.runs) < options.repeats:
                    result.skipped.append(
                        f"decode {kind} at {n}: {options.repeats - len(row.runs)} of "
                        f"{options.repeats} runs, the time budget (--budget) was spent"
                    )
                if row.runs:
                    result.decode.append(row)
        result.prefill = _prefill_sweep(client, options, server.get("context_length"), result.skipped, progress)
        result.reuse = _reuse_rows(client, options, server.get("context_length"), result.skipped, progress)
        result.client_completion_tokens = client.completion_tokens
        after = None if before is None else client.completion_total(at_least=before + client.completion_tokens)
        result.seconds = time.monotonic() - started
    _check_counts(result, before, after)
    return result


def _decode_row(client: BenchClient, options: BenchOptions, kind: str, n: int, progress: Progress) -> DecodeRow:
    """`repeats` runs of n requests sent at once (fewer once the time budget is spent)."""
    prompts = load_prompts(kind)
    runs: list[DecodeRun] = []
    for repeat in range(options.repeats):
        if client.out_of_time():
            break
        progress(f"decode {kind}: {n} at once, run {repeat + 1} of {options.repeats}")
        contents = [
            f"(bench {kind}, {n} at once, run {repeat + 1}, request {i + 1})\n"
            + prompts[(repeat * n + i) % len(prompts)]
            for i in range(n)
        ]
        pool = ThreadPoolExecutor(max_workers=n)
        try:
            futures = [pool.submit(client.stream_chat, text, options.tokens) for text in contents]
            runs.append(DecodeRun(tuple(f.result() for f in futures)))
        finally:  # on an error or Ctrl-C, don't wait here: closing the client then ends the other streams
            pool.shutdown(wait=False, cancel_futures=True)
    return DecodeRow(kind, n, tuple(runs))


def _prefill_sweep(
    client: BenchClient, options: BenchOptions, context: int | None, skipped: list[str], progress: Progress
) -> list[PrefillRow]:
    """Prompts grown from the filler text to each target size. Tokens per character are learnt from the server's
    own prompt_tokens (one short probe, then every measured prompt), so no tokenizer is needed on this side."""
    limit = _limit(context)
    header = "(bench prefill {tag}) Read the notes below, then name the paragraph that mentions the ferry.\n\n"
    per_char, overhead = _calibrate(client, header.format(tag="probe"))
    rows = []
    for target in sorted(set(options.prompt_sizes)):
        if limit is not None and target > limit:
            skipped.append(f"prefill {target}: over the server's window of {context} tokens")
            continue
        runs = []
        for repeat in range(options.repeats):
            if client.out_of_time():
                skipped.append(f"prefill {target}, run {repeat + 1}: the time budget (--budget) was spent")
                break
            progress(f"prefill: about {target} tokens, run {repeat + 1} of {options.repeats}")
            text = _filler(int((target - overhead) / per_char), header.format(tag=f"{target}, run {repeat + 1}"))
            timing = client.stream_chat(text, 1)
            runs.append(timing)
            per_char = max((timing.prompt_tokens - overhead) / len(text), 1e-3)
        if runs:
            rows.append(PrefillRow(target, tuple(runs)))
    return rows


def _limit(context: int | None) -> int | None:
    """The longest prompt the bench sends a server with this window (room left for the template and the reply)."""
    return context - max(64, context // 32) if context else None


def _calibrate(client: BenchClient, header: str) -> tuple[float, float]:
    """(tokens per filler character, tokens besides the filler) from two short probes: the server's own
    prompt_tokens, so no tokenizer is needed on this side."""
    probe = _filler(2000, header)
    timing = client.stream_chat(probe, 1)
    empty = client.stream_chat(header, 1)
    per_char = max((timing.prompt_tokens - empty.prompt_tokens) / (len(probe) - len(header)), 1e-3)
    return per_char, empty.prompt_tokens - per_char * len(header)


def _reuse_rows(
    client: BenchClient, options: BenchOptions, context: int | None, skipped: list[str], progress: Progress
) -> list[ReuseRow]:
    """For each size: a prompt cold, then the same prompt again; a conversation under a system prompt of that size,
    then a new one under the same system prompt. One-token replies; each run its own text, so runs do not share."""
    if not options.reuse_sizes:
        return []
    limit = _limit(context)
    per_char, overhead = _calibrate(client, "(bench reuse probe)\n")
    rows = []
    for target in sorted(set(options.reuse_sizes)):
        if limit is not None and target > limit:
            skipped.append(f"reuse {target}: over the server's window of {context} tokens")
            continue
        chars = int((target - overhead) / per_char)
        resent, system = [], []
        for repeat in range(options.repeats):
            if client.out_of_time():
                skipped.append(f"reuse {target}, run {repeat + 1}: the time budget (--budget) was spent")
                break
            progress(f"prompt reuse: about {target} tokens, run {repeat + 1} of {options.repeats}")
            text = _filler(chars, f"(bench reuse {target}, run {repeat + 1}) Which paragraph mentions the ferry?\n\n")
            resent.append((client.stream_chat(text, 1), client.stream_chat(text, 1)))
            shared = _filler(chars, f"(bench reuse system {target}, run {repeat + 1}) Answer from these notes.\n\n")
            first = client.stream_chat("Which paragraph mentions the ferry?", 1, system=shared)
            system.append((first, client.stream_chat("Which paragraph mentions the harbour?", 1, system=shared)))
        rows += [ReuseRow("resent", target, tuple(resent)), ReuseRow("system", target, tuple(system))]
    return [row for row in rows if row.runs]


def _filler(chars: int, header: str) -> str:
    paragraphs = load_prompts("filler")
    parts, size, k = [header], len(header), 0
    while size < chars:
        piece = f"§{k + 1}. {paragraphs[k % len(paragraphs)]}\n"
        parts.append(piece)
        size += len(piece)
        k += 1
    return "".join(parts)[: max(chars, len(header))]


def _check_counts(result: BenchResult, before: int | None, after: int | None) -> None:
    wanted = result.options.tokens
    short = [r for row in result.decode for run in row.runs for r in run.requests if r.completion_tokens != wanted]
    if short:
        result.warnings.append(
            f"{len(short)} decode request(s) got other than {wanted} tokens: the server may not "
            "honour ignore_eos, so its replies ended early"
        )
    cached = sum(r.cached_tokens for row in result.prefill for r in row.runs)
    cached += sum(cold.cached_tokens for row in result.reuse for cold, _ in row.runs)
    if cached:
        result.warnings.append(f"the server reused {cached} cached prompt tokens where the bench measures cold")
    if before is not None and after is not None:
        result.server_completion_tokens = after - before
        if after - before > result.client_completion_tokens:
            result.warnings.append(
                f"the server generated {after - before - result.client_completion_tokens} "
                "tokens for other clients during the bench: its figures may be low"
            )


def _client_versions() -> dict[str, str]:
    try:
        version = metadata.version("glm-sparks")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "sparks": version,
        "commit": _git_commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": str(os.cpu_count()),
        "httpx": httpx.__version__,
    }


def _git_commit() -> str:
    """The checkout's commit (with '+changes' when the tree differs from it), or 'unknown' outside a checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "recipe", "engine"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+changes" if dirty else "")
