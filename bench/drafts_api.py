"""Drafts through the API on the committed trained demo: tokens per step and speed-up against `"draft": false`.

    python bench/drafts_api.py [--out drafts_api.json] [--max-tokens 96] [--repeats 3] [--tp 1] [--drafter mtp+copy]

Starts `python -m engine serve` on engine/checkpoint/trained_demo (CPU) with the default drafter (mtp+copy, 3 drafts
a step; --drafter another) and sends each prompt through the `openai` SDK's chat completions, greedy, both ways:
drafted and with `extra_body={"draft": False}`. Four sets of prompts:

- prose: the demo's own chat kinds (OK, a sum, a fact, an answer from a tool's result), thinking as drawn;
- structured: two tool calls (the demo's call markup) and two JSON replies under `response_format` json_schema;
- copy_heavy: a reply that repeats what the conversation already holds — the same tool call or JSON asked for again
  after an earlier identical exchange, a question asked twice, a list to repeat;
- tool_choice_required: the two tool calls and the repeated one with tool_choice "required" (the call under its
  format: its markup and keys drafted as forced text).

Per prompt and per set: committed tokens per lane window and drafted / accepted tokens, by drafter too (the
difference of /health's draft counters around each request: one request at a time), the reply's own usage counts,
wall time (median of --repeats runs each way, the two ways in turn) and tokens/s both ways, the speed-up. Each
prompt is first sent once untimed (two tokens: compiles its grammar, warms the verify path); prompt reuse is off so
every run prefills alike. Every drafted and `"draft": false` reply of a prompt must be the same token ids and text:
the equality is recorded and any difference makes the exit status 1, as does a reply whose usage counts differ
from what it moved /health's counters by.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "engine")]
from test_api_live import LiveServer  # noqa: E402  (the live tests' server: free ports, waits for "ready")

from engine.checkpoint.demo import TRAINED  # noqa: E402
from engine.train import synthetic  # noqa: E402

COUNTS = ("windows", "committed", "drafted", "accepted")
CITIES = ["Paris", "Tokyo", "Berlin", "Rome"]


@dataclass(frozen=True)
class Prompt:
    name: str
    form: str  # "text", "tool_call" or "json": what the reply is asked to be
    request: dict[str, Any]  # chat.completions.create keyword arguments besides model, temperature, max_tokens


def api_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A synthetic conversation in OpenAI's wire form: tool-call arguments as JSON text, call ids on both sides."""
    out = []
    for i, message in enumerate(messages):
        m = {k: v for k, v in message.items() if v is not None}
        if m.get("tool_calls"):
            functions = [c["function"] for c in m["tool_calls"]]
            m["tool_calls"] = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": f["name"], "arguments": json.dumps(f["arguments"])},
                }
                for f in functions
            ]
        if m["role"] == "tool":
            m["tool_call_id"] = f"call_{i - 1}"
        out.append(m)
    return out


def from_synthetic(kind: str, index: int = 0) -> Prompt:
    """The `index`th held-out example of one of the demo's training kinds, as the trainer rendered it."""
    weights = tuple(float(k == kind) for k in synthetic.KINDS)
    example = synthetic.examples("eval", 18, index + 1, weights)[index]
    request: dict[str, Any] = {
        "messages": api_messages(example.messages),
        "reasoning_effort": (example.effort if example.thinking else "none"),
    }
    if example.effort is None and example.thinking:
        del request["reasoning_effort"]  # the server's default: thinking on, no effort line
    if example.tools:
        request["tools"] = example.tools
    return Prompt(f"{kind}{index}", "tool_call" if kind == "tool_call" else "text", request)


def json_schema(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def closed(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


FORECAST = closed({"city": {"enum": CITIES}, "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer"}})
FORECASTS = json_schema("forecasts", closed({"forecasts": {"type": "array", "items": FORECAST}}))
EMAIL = json_schema(
    "email",
    closed(
        {"to": {"enum": ["alice@example.com", "bob@example.com", "carol@example.com"]}, "subject": {"type": "string"}}
    ),
)


def structured() -> list[Prompt]:
    ask = "Give the forecasts for Paris, Tokyo, Berlin and Rome as JSON."
    email = "Send an email to bob@example.com with the subject Lunch. Write it as JSON."
    return [
        from_synthetic("tool_call", 0),
        from_synthetic("tool_call", 1),
        Prompt(
            "json_forecasts", "json", {"messages": [{"role": "user", "content": ask}], "response_format": FORECASTS}
        ),
        Prompt("json_email", "json", {"messages": [{"role": "user", "content": email}], "response_format": EMAIL}),
    ]


def asked_again(first: list[dict[str, Any]], question: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": question}, *first, {"role": "user", "content": question}]


def copy_heavy() -> list[Prompt]:
    email = "Send an email to carol@example.com with the subject Status update."
    call = {"name": "send_email", "arguments": json.dumps({"to": "carol@example.com", "subject": "Status update"})}
    sent = [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "c0", "content": json.dumps({"status": "sent"})},
        {"role": "assistant", "content": "The email to carol@example.com has been sent."},
    ]
    forecasts = json.dumps({"forecasts": [{"city": c, "unit": "celsius", "days": 3} for c in CITIES]})
    words = "river apple tiger orange purple winter"
    off = {"reasoning_effort": "none"}
    return [
        Prompt(
            "tool_call_again",
            "tool_call",
            {"messages": asked_again(sent, email), "tools": [synthetic.TOOLS["send_email"]], **off},
        ),
        Prompt(
            "json_again",
            "json",
            {
                "messages": asked_again([{"role": "assistant", "content": forecasts}], "Give the forecasts as JSON."),
                "response_format": FORECASTS,
                **off,
            },
        ),
        Prompt(
            "fact_again",
            "text",
            {
                "messages": asked_again(
                    [{"role": "assistant", "content": "Tokyo is the capital of Japan."}],
                    "What is the capital of Japan?",
                ),
                **off,
            },
        ),
        Prompt(
            "repeat_again",
            "text",
            {"messages": asked_again([{"role": "assistant", "content": words}], f"Repeat after me: {words}"), **off},
        ),
    ]


def required(prompt: Prompt) -> Prompt:
    """The same tool-call prompt with tool_choice "required": the reply is a call under the tools' format, whose
    markup and argument keys the scheduler drafts as forced text."""
    return Prompt(f"{prompt.name}_required", prompt.form, {**prompt.request, "tool_choice": "required"})


def prompt_sets() -> dict[str, list[Prompt]]:
    prose = [from_synthetic(kind) for kind in ("ok", "arith", "fact", "tool_answer")]
    again = next(p for p in copy_heavy() if p.name == "tool_call_again")
    calls = [required(from_synthetic("tool_call", 0)), required(from_synthetic("tool_call", 1)), required(again)]
    return {"prose": prose, "structured": structured(), "copy_heavy": copy_heavy(), "tool_choice_required": calls}


def send(client: openai.OpenAI, http: httpx.Client, prompt: Prompt, draft: bool, max_tokens: int) -> dict[str, Any]:
    """One request, alone on the server: its reply, time, and the draft counters it moved."""
    before = http.get("/health").json()["drafts"]
    started = time.perf_counter()
    reply = client.chat.completions.create(
        model="demo",
        temperature=0.0,
        max_tokens=max_tokens,
        extra_body={"draft": draft, "return_token_ids": True},
        **prompt.request,
    )
    seconds = time.perf_counter() - started
    tokens = reply.usage.completion_tokens
    after = http.get("/health").json()["drafts"]  # a reply's end goes out once its last window is counted
    choice, details = reply.choices[0], reply.usage.completion_tokens_details
    usage = [details.accepted_prediction_tokens, details.rejected_prediction_tokens]
    moved = {key: after[key] - before[key] for key in COUNTS}
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return {
        "s": seconds,
        "tokens": tokens,
        "token_ids": choice.model_extra["token_ids"],
        "text": [choice.message.content, (choice.message.model_extra or {}).get("reasoning_content"), calls],
        "finish": choice.finish_reason,
        "usage_drafts": usage,
        # every reply token but the first (sampled after the prompt) committed by a lane window, and the reply's
        # usage the same drafts as /health's counters moved by
        "counts_settled": moved["committed"] == tokens - 1
        and usage in ([[moved["accepted"], moved["drafted"] - moved["accepted"]]] if draft else [[None, None], [0, 0]]),
        **moved,
        "accepted_by": {
            name: c["accepted"] - before["by_drafter"][name]["accepted"] for name, c in after["by_drafter"].items()
        },
    }


def measure(client: openai.OpenAI, http: httpx.Client, prompt: Prompt, repeats: int, max_tokens: int) -> dict[str, Any]:
    """A prompt sent `repeats` times each way, drafted and `"draft": false` in turn (so drift on busy cores falls on
    both); times are medians, counts the first drafted run's (greedy: every run drafts alike)."""
    send(client, http, prompt, True, 2)  # untimed: compiles the prompt's grammar, warms the verify path
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for repeat in range(repeats):
        for draft in (True, False) if repeat % 2 == 0 else (False, True):
            runs[draft].append(send(client, http, prompt, draft, max_tokens))
    drafted, serial = runs[True][0], runs[False][0]
    same = all(r["token_ids"] == serial["token_ids"] and r["text"] == serial["text"] for r in runs[True] + runs[False])
    return {
        "prompt": prompt.name,
        "form": prompt.form,
        "tokens": drafted["tokens"],
        "finish": drafted["finish"],
        "identical": same,
        "counts_settled": all(r["counts_settled"] for r in runs[True] + runs[False]),
        **{key: drafted[key] for key in COUNTS},
        "accepted_by": drafted["accepted_by"],
        "usage_accepted_rejected": drafted["usage_drafts"],  # the reply's own usage
        "drafted_s": round(statistics.median(r["s"] for r in runs[True]), 3),
        "serial_s": round(statistics.median(r["s"] for r in runs[False]), 3),
        "serial_windows": serial["windows"],
        "reply": drafted["text"],
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    total = {key: sum(r[key] for r in rows) for key in (*COUNTS, "tokens", "drafted_s", "serial_s")}
    return {
        "prompts": len(rows),
        **total,
        "tokens_per_step": round(total["committed"] / total["windows"], 2) if total["windows"] else None,
        "acceptance": round(total["accepted"] / total["drafted"], 3) if total["drafted"] else None,
        "drafted_tok_s": round(total["tokens"] / total["drafted_s"], 1),
        "serial_tok_s": round(total["tokens"] / total["serial_s"], 1),
        "speedup": round(total["serial_s"] / total["drafted_s"], 2),
        "identical": all(r["identical"] for r in rows),
    }


def table(result: dict[str, Any]) -> str:
    head = (
        "| set | prompts | tokens | tokens per step | drafted / accepted | tok/s draft false → drafted | speed-up "
        "| identical |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, s in result["sets"].items():
        lines.append(
            f"| {name} | {s['prompts']} | {s['tokens']} | {s['tokens_per_step']} | {s['drafted']} / {s['accepted']} "
            f"| {s['serial_tok_s']} → {s['drafted_tok_s']} | {s['speedup']}× | {'yes' if s['identical'] else 'NO'} |"
        )
    lines += [
        "",
        "| set | prompt | form | tokens | tokens per step | drafted / accepted (format, mtp, copy) "
        "| draft false → drafted s |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for name, rows in result["prompts"].items():
        for r in rows:
            per_step = round(r["committed"] / r["windows"], 2) if r["windows"] else None
            by = r["accepted_by"]
            lines.append(
                f"| {name} | {r['prompt']} | {r['form']} | {r['tokens']} | {per_step} "
                f"| {r['drafted']} / {r['accepted']} ({by.get('format', 0)}, {by['mtp']}, {by['copy']}) "
                f"| {r['serial_s']} → {r['drafted_s']} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each prompt each way")
    parser.add_argument("--tp", type=int, default=1, help="ranks of the server (gloo on the CPU)")
    parser.add_argument("--drafter", default="mtp+copy", help="the server's --drafter (mtp+copy, copy, mtp)")
    args = parser.parse_args()
    started = time.perf_counter()
    flags = ["--drafter", args.drafter, "--parallel", "1", "--context", "1024", "--prompt-reuse", "0", "--name", "demo"]
    result: dict[str, Any] = {**vars(args), "prompts": {}, "sets": {}}
    with tempfile.TemporaryDirectory() as logs:
        server = LiveServer(TRAINED, Path(logs), flags, key=None, tp=args.tp)
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
            with httpx.Client(base_url=server.url, timeout=60) as http:
                drafts = http.get("/health").json()["drafts"]
                result["drafter"], result["draft_tokens"] = drafts["drafter"], drafts["draft_tokens"]
                for name, prompts in prompt_sets().items():
                    rows = [measure(client, http, p, args.repeats, args.max_tokens) for p in prompts]
                    result["prompts"][name], result["sets"][name] = rows, summary(rows)
                    print(name, result["sets"][name], flush=True)
        finally:
            server.stop()
    copy_structured = [r for r in result["prompts"]["copy_heavy"] if r["form"] != "text"]
    result["sets"]["copy_heavy_structured"] = summary(copy_structured)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    print(table(result))
    print(f"whole run: {result['wall_s']} s")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    rows = [r for rs in result["prompts"].values() for r in rs]
    return 0 if all(r["identical"] and r["counts_settled"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
