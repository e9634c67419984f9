"""Our model against transformers' glm5_next on tiny random checkpoints (fp32, CPU).

Each config mixes layer types and expert counts differently; prompts run past index_topk so the indexer's sparse
selection is exercised. Logits must agree within 1e-3; 32 greedy tokens must agree except after a step where the
reference itself is at a near-tie (top-two margin < 0.05).
"""

from __future__ import annotations

import pytest
import torch
from reference import CONFIGS, make_reference

from engine.models.glm5_next.model import Glm5NextForCausalLM

PROMPT_LEN, NEW_TOKENS, TOL, NEAR_TIE = 40, 32, 1e-3, 0.05


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    ref = make_reference(path, request.param, seed=1)
    return request.param, ref, Glm5NextForCausalLM.load(path)


def prompt(seed: int = 7, length: int = PROMPT_LEN) -> list[int]:
    return torch.randint(1, 97, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def reference_greedy(ref, ids: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Prefill then one token at a time through transformers' cache; tokens and per-step logits."""
    from transformers import DynamicCache

    cache = DynamicCache(config=ref.config.text_config)
    out = ref(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    tokens, logits = [], []
    with torch.no_grad():
        for _ in range(n):
            step = out.logits[0, -1]
            logits.append(step)
            tokens.append(int(step.argmax()))
            out = ref(input_ids=torch.tensor([[tokens[-1]]]), cache=out.cache, use_cache=True)
    return tokens, logits


def ours_greedy(model, ids: list[int], n: int, chunk: int | None = None) -> tuple[list[int], list[torch.Tensor]]:
    seq = model.new_sequence(model.make_pool(len(ids) + n + 8))
    chunk = chunk or len(ids)
    for start in range(0, len(ids), chunk):
        step = model.prefill(seq, ids[start : start + chunk])
    tokens, logits = [], []
    for _ in range(n):
        logits.append(step)
        tokens.append(int(step.argmax()))
        step = model.decode([seq], [tokens[-1]])[0]
    return tokens, logits


def margin(logits: torch.Tensor) -> float:
    top = logits.topk(2).values
    return float(top[0] - top[1])


def assert_greedy_agree(ours: list[int], theirs: list[int], their_logits: list[torch.Tensor]) -> None:
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            assert margin(their_logits[i]) < NEAR_TIE, f"token {i}: ours {a}, reference {b} with a clear margin"
            return


@torch.no_grad()
def test_whole_prompt_logits_match(pair):
    _, ref, model = pair
    ids = prompt()
    theirs = ref(input_ids=torch.tensor([ids])).logits[0]
    seq = model.new_sequence(model.make_pool(PROMPT_LEN))
    ours = model.prefill(seq, ids)
    assert (ours - theirs[-1]).abs().max() < TOL
    # every position, token by token from an empty state, against the whole-prompt forward
    seq = model.new_sequence(model.make_pool(PROMPT_LEN))
    steps = [model.prefill(seq, ids[:1])] + [model.decode([seq], [t])[0] for t in ids[1:]]
    assert (torch.stack(steps) - theirs).abs().max() < TOL


@torch.no_grad()
def test_prefill_then_decode_matches_reference(pair):
    _, ref, model = pair
    ids = prompt(seed=11)
    their_tokens, their_logits = reference_greedy(ref, ids, NEW_TOKENS)
    our_tokens, our_logits = ours_greedy(model, ids, NEW_TOKENS)
    assert_greedy_agree(our_tokens, their_tokens, their_logits)
    agree = next((i for i, (a, b) in enumerate(zip(our_tokens, their_tokens)) if a != b), NEW_TOKENS)
    diffs = [float((a - b).abs().max()) for a, b in zip(our_logits[:agree], their_logits[:agree])]
    assert max(diffs) < TOL
    assert agree >= NEW_TOKENS // 2, "greedy paths parted early; pick a seed without near-ties"


@torch.no_grad()
def test_sparse_selection_is_engaged(pair):
    name, _, model = pair
    cfg = model.cfg
    assert PROMPT_LEN // cfg.index_kpool > cfg.index_topk // cfg.index_kpool, f"{name} never leaves the dense regime"


@torch.no_grad()
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_continues_exactly(pair, chunk):
    _, _, model = pair
    ids = prompt(seed=3)
    whole, _ = ours_greedy(model, ids, NEW_TOKENS)
    chunked, _ = ours_greedy(model, ids, NEW_TOKENS, chunk=chunk)
    assert chunked == whole


@torch.no_grad()
def test_batched_decode_equals_alone(pair):
    _, _, model = pair
    prompts = [prompt(seed=s, length=n) for s, n in ((1, 5), (2, 23), (3, 40), (4, 13))]
    alone = [ours_greedy(model, p, 12)[0] for p in prompts]
    pool = model.make_pool(sum(len(p) for p in prompts) + 64)
    seqs = [model.new_sequence(pool) for _ in prompts]
    nxt = [int(model.prefill(s, p).argmax()) for s, p in zip(seqs, prompts)]
    together = [[t] for t in nxt]
    for _ in range(11):
        nxt = model.decode(seqs, nxt).argmax(-1).tolist()
        for out, t in zip(together, nxt):
            out.append(t)
    assert together == alone
    for seq in seqs:
        seq.release()
    assert pool.free_tokens == pool.num_tokens


@torch.no_grad()
def test_demo_checkpoint_same_greedy_tokens_in_both_engines(tmp_path):
    """`make-demo` output loads in transformers unchanged, and both engines pick the same 32 greedy tokens."""
    from transformers import Glm5NextForConditionalGeneration

    from engine.checkpoint.demo import write_demo

    path = write_demo(tmp_path / "demo", seed=0, size="tiny")
    ref = Glm5NextForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    model = Glm5NextForCausalLM.load(path)
    ids = torch.randint(5, model.cfg.vocab_size, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    their_tokens, their_logits = reference_greedy(ref, ids, NEW_TOKENS)
    our_tokens, _ = ours_greedy(model, ids, NEW_TOKENS)
    assert_greedy_agree(our_tokens, their_tokens, their_logits)
    assert our_tokens[:8] == their_tokens[:8]


@torch.no_grad()
def test_token_by_token_prompts_equal_chunked(tmp_path):
    """KDA_CHUNKED=0 (--kda-chunked 0): prompts run the delta rule token by token; same greedy tokens as the chunked
    form, logits to fp32 rounding, over a prompt of several 64-token chunks."""
    make_reference(tmp_path, "moe16", seed=1)
    chunked = Glm5NextForCausalLM.load(tmp_path)
    steps = Glm5NextForCausalLM.load(tmp_path, kda_chunked=False)
    assert (chunked.kda_prompt_form, steps.kda_prompt_form) == ("chunked", "steps")
    ids = prompt(seed=5, length=150)
    want_tokens, want_logits = ours_greedy(chunked, ids, 16)
    tokens, logits = ours_greedy(steps, ids, 16)
    assert tokens == want_tokens
    assert max(float((a - b).abs().max()) for a, b in zip(logits, want_logits)) < 1e-4


@torch.no_grad()
def test_sparse_prompt_attention_in_query_blocks(pair, monkeypatch):
    """Past the dense regime a prompt chunk's queries gather their selected latents a block at a time; one query a
    block gives the same logits as the whole chunk in one block."""
    from engine.models.glm5_next.dsa import SparseMLA

    _, _, model = pair
    ids = prompt(seed=9)
    whole = model.prefill(model.new_sequence(model.make_pool(PROMPT_LEN)), ids)
    monkeypatch.setattr(SparseMLA, "GATHER_ELEMENTS", 1)
    blocks = model.prefill(model.new_sequence(model.make_pool(PROMPT_LEN)), ids)
    assert (whole - blocks).abs().max() < 1e-5
