"""Log-probabilities in OpenAI's two shapes: chat's `logprobs.content` (one entry a token, with `bytes` and
`top_logprobs`) and completions' legacy `tokens` / `token_logprobs` / `top_logprobs` / `text_offset` (with `echo`,
the prompt's tokens first: the first has none, each later one its log-probability given the tokens before it).

The values come from the scheduler (engine.sampling.token_logprobs): the log-softmax of the fp32 logits the sampler
reads, before temperature and filters, for every reply token (drafted or not: each verify row has its own logits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.server.generation import Generation
    from engine.server.state import ServerState

Alternatives = tuple[tuple[int, float], ...]


def _text(state: ServerState, token: int) -> str:
    return str(state.tokenizer.decode([token], skip_special_tokens=False))


def chat_entries(state: ServerState, generation: Generation, first: int, last: int) -> list[dict[str, Any]]:
    """`logprobs.content` entries for reply tokens [first, last)."""
    out = []
    for i in range(first, min(last, len(generation.token_logprobs))):
        logprob, alternatives = generation.token_logprobs[i]
        text = _text(state, generation.token_ids[i])
        out.append(
            {
                "token": text,
                "logprob": logprob,
                "bytes": list(text.encode()),
                "top_logprobs": [
                    {"token": t, "logprob": value, "bytes": list(t.encode())}
                    for t, value in ((_text(state, token), value) for token, value in alternatives)
                ],
            }
        )
    return out


def completion_logprobs(
    state: ServerState, generation: Generation, first: int, last: int, offset: int, echo: bool = False
) -> dict[str, Any]:
    """The legacy completions object for reply tokens [first, last) (after the prompt's with `echo`); text
    offsets count from `offset`, where this piece of text starts in the choice's text."""
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    entries: list[tuple[int, float | None, Alternatives | None]] = []
    if echo:
        prompt = generation.prompt_ids
        known = generation.prompt_token_logprobs
        entries.append((prompt[0], None, None))
        entries += [(token, *known[j]) if j < len(known) else (token, None, None) for j, token in enumerate(prompt[1:])]
    for i in range(first, min(last, len(generation.token_logprobs))):
        entries.append((generation.token_ids[i], *generation.token_logprobs[i]))
    offsets = []
    for token, value, alternatives in entries:
        text = _text(state, token)
        offsets.append(offset)
        offset += len(text)
        tokens.append(text)
        values.append(value)
        tops.append(None if alternatives is None else {_text(state, t): v for t, v in alternatives})
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
