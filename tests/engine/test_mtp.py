"""MTP drafts on the CPU: the engine's MTP layer against the trainer's differentiable forward (what was trained is what
drafts), the lanes' absorb/chain plumbing against that forward at every committed position, a rejected MTP draft
leaving no trace in the layer's cache, no host read in the MTP step, and drafted ≡ `"draft": false` through the real
Scheduler with mtp and mtp+copy on the trained demo, stop strings included (whose MTP layer is trained: `train-demo`
trains it after the main model)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from test_drafts import check_stop_strings, demo_prompts, params_for, serve

from engine.checkpoint.demo import TRAINED
from engine.checkpoint.layout import PREFIX
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.runner.lanes import LaneDecoder
from engine.train.mtp import mtp_forward

WINDOW = 4


@pytest.fixture(scope="module")
def demo_mtp():
    import json

    from tokenizers import Tokenizer

    model = Glm5NextForCausalLM.load(TRAINED, mtp=True)
    tokenizer = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    eos = frozenset(json.loads((TRAINED / "config.json").read_text())["text_config"]["eos_token_id"])
    return model, tokenizer, eos


def reference_logits(model, ids: list[int]) -> torch.Tensor:
    """The trainer's MTP forward over a whole sequence [T, vocab] from the engine's own main hidden rows (the
    trainer's main model is transformers', whose parity with ours is tests/engine/test_parity.py's business)."""
    layer = f"{PREFIX}layers.{model.cfg.num_hidden_layers}."
    weights = {}
    for path in sorted(TRAINED.glob("*.safetensors")):
        weights.update({n[len(layer) :]: t.float() for n, t in load_file(str(path)).items() if n.startswith(layer)})
    seq = model.new_sequence(model.make_pool(len(ids) + 1))
    seq.grow(len(ids))
    hidden = model._final(model._run(ids, lambda layer, h: layer.attn.prefill(h, seq, {})))
    seq.release()
    before = torch.cat([torch.zeros_like(hidden[:1]), hidden[:-1]])[None]
    embedded = F.embedding(torch.tensor([ids]), model.embed.float())
    return mtp_forward(weights, model.cfg, embedded, before, model.lm_head.float())[0]


@torch.no_grad()
def test_the_engines_mtp_layer_is_the_trained_one(demo_mtp):
    model, tokenizer, _ = demo_mtp
    ids = demo_prompts(tokenizer, 7)[0][:90]
    rows = []
    forward = model.mtp.forward

    def keep(embedded, hidden, attend):
        rows.append(forward(embedded, hidden, attend))
        return rows[-1]

    model.mtp.forward = keep
    try:
        seq = model.new_sequence(model.make_pool(128))
        for start in range(0, len(ids), 32):  # in chunks, as served: the hidden row before a chunk is carried
            model.prefill(seq, ids[start : start + 32])
    finally:
        del model.mtp.forward
    ours = model._head(model.mtp.head_input(torch.cat(rows)))
    ref = reference_logits(model, ids)
    assert (ours - ref).abs().max() < 1e-4
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def drafted_lane(model, prompt: list[int], pendings: list[int], keeps: list[int], graphs: bool = False):
    """A lane fed `prompt`, then verify steps of [pending, 3 MTP drafts] keeping keeps[i] rows each (the pending token
    and keeps[i] - 1 of its drafts, as if accepted), the next pending token taken from `pendings`. Returns the decoder,
    the sequence, every token fed after the prompt, and (position, draft 1) of each step."""
    decoder = LaneDecoder(model, model.make_pool(512), num_lanes=2, graphs=graphs, window=WINDOW)
    seq = decoder.new_sequence(1)
    model.prefill(seq, prompt)
    fed: list[int] = []
    firsts = []
    pending, absorb = pendings[0], [pendings[0]]
    for step, keep in enumerate(keeps):
        decoder.verify([seq], [[pending, *([-1] * (WINDOW - 1))]], [absorb])
        assert decoder.proposed is not None
        drafts = [int(t) for t in decoder.proposed[0]]
        firsts.append((seq.length, drafts[0]))
        decoder.commit(seq, keep)
        fed += [pending, *drafts[: keep - 1]]
        pending = pendings[step + 1]
        absorb = [*drafts[: keep - 1], pending]
    return decoder, seq, fed + [pending], firsts


@torch.no_grad()
def test_lane_drafts_follow_the_layer_at_every_committed_position(demo_mtp):
    """Draft 1 of every verify step is the layer's prediction at the lane's pending token, given what was committed
    (absorbed in blocks of 1..WINDOW tokens, right-aligned); chained drafts are the layer's own guesses."""
    model, tokenizer, _ = demo_mtp
    prompt, pendings = demo_prompts(tokenizer, 8)[1], demo_prompts(tokenizer, 8)[2][:8]
    _, _, fed, firsts = drafted_lane(model, prompt, pendings, [1, 3, 2, 4, 1, 2])
    ref = reference_logits(model, prompt + fed).argmax(-1)
    for position, draft in firsts:
        assert draft == int(ref[position]), f"draft 1 at position {position}"


@torch.no_grad()
def test_a_rejected_mtp_draft_leaves_no_trace_in_its_cache(demo_mtp, graphs: bool = False):
    """The MTP layer's rows at absorbed positions are the same bits whether the lane drafted (rows written past its
    length by chained drafts, drafts not kept) or took one token a step."""
    model, tokenizer, _ = demo_mtp
    prompt, pendings = demo_prompts(tokenizer, 8)[3], demo_prompts(tokenizer, 8)[4][:6]
    keeps = [3, 1, 4, 2, 2]
    drafted, seq, fed, firsts = drafted_lane(model, prompt, pendings, keeps, graphs)
    absorbed = firsts[-1][0] + 1  # positions whose MTP row holds committed tokens (the last pending one's included)
    serial = LaneDecoder(model, model.make_pool(512), num_lanes=2, graphs=graphs, window=WINDOW)
    one = serial.new_sequence(0)
    model.prefill(one, prompt)
    for token in fed[: absorbed - len(prompt)]:
        serial.verify([one], [[token]], [[token]])
        serial.commit(one, 1)
    layer = model.mtp.attn.pool_layer
    ours = drafted.pool.read(layer, drafted.state.slots[1, :absorbed])
    theirs = serial.pool.read(layer, serial.state.slots[0, :absorbed])
    assert torch.equal(ours, theirs)


def words_allowing(tokens: list[int], vocab: int):
    """The int32 words of a mask allowing `tokens` only (bit j of word w is token 32w + j)."""
    import numpy as np

    words = np.zeros(-(-vocab // 32), dtype=np.uint32)
    for token in tokens:
        words[token >> 5] |= np.uint32(1 << (token & 31))
    return words.view(np.int32)


def test_a_draft_mask_leaves_exactly_its_tokens():
    """`_allowed_only`'s bit arithmetic on int32 words: bit 31 (a negative word), a word of -1 (its 32 tokens) and
    a row of -1 words (every token, the logits unchanged)."""
    from engine.models.glm5_next.model import _allowed_only

    logits = torch.randn(3, 70, generator=torch.Generator().manual_seed(0))
    keep = [[31, 63, 64], list(range(32, 64)), list(range(70))]
    words = torch.tensor(words_allowing(keep[0], 70)), torch.tensor(words_allowing(keep[1], 70))
    rows = torch.stack([*words, torch.full((3,), -1, dtype=torch.int32)])
    assert rows[0, 0] < 0 and rows[1, 1] == -1
    out = _allowed_only(logits, rows)
    for row, tokens in enumerate(keep):
        kept = torch.zeros(70, dtype=torch.bool)
        kept[tokens] = True
        assert torch.equal(out[row][kept], logits[row][kept]) and bool((out[row][~kept] == float("-inf")).all())


@torch.no_grad()
def test_a_masked_lanes_first_mtp_draft_is_the_best_token_its_mask_allows(demo_mtp):
    """A lane given a mask (a structured output's next-token mask) drafts, as draft 1, the allowed token the layer
    ranks highest; a lane beside it without a mask drafts the layer's own first choice, and so does the masked lane
    once a later step gives it no mask (its row set back to every token)."""
    model, tokenizer, _ = demo_mtp
    prompts = demo_prompts(tokenizer, 8)
    decoder = LaneDecoder(model, model.make_pool(1024), num_lanes=3, graphs=False, window=WINDOW)
    seqs = [decoder.new_sequence(lane) for lane in (0, 2)]
    ids = [prompts[5][:40], prompts[6][:30]]
    pending = [prompts[5][40], prompts[6][30]]
    for seq, prompt in zip(seqs, ids):
        model.prefill(seq, prompt)
    ranked = reference_logits(model, ids[0] + [pending[0]])[len(ids[0])].argsort(descending=True).tolist()
    allowed = [ranked[9], ranked[4], ranked[1], (ranked[0] + 1) % model.vocab_size]
    allowed = [t for t in allowed if t != ranked[0]]
    best = min(allowed, key=ranked.index)
    masks = {0: words_allowing(allowed, model.vocab_size)}
    decoder.verify(seqs, [[pending[0], -1, -1, -1], [pending[1], -1, -1, -1]], [[pending[0]], [pending[1]]], masks)
    assert decoder.proposed is not None
    first = [int(t) for t in decoder.proposed[:, 0]]
    assert first[0] == best != ranked[0]
    other = reference_logits(model, ids[1] + [pending[1]])[len(ids[1])].argmax()
    assert first[1] == int(other)
    decoder.commit(seqs[0], 1)
    decoder.commit(seqs[1], 1)
    nxt = prompts[5][41]
    decoder.verify(seqs[:1], [[nxt, -1, -1, -1]], [[nxt]])
    assert decoder._masked == set()
    again = reference_logits(model, ids[0] + [pending[0], nxt])[len(ids[0]) + 1].argmax()
    assert int(decoder.proposed[0, 0]) == int(again)


@torch.no_grad()
def test_the_mtp_draft_chain_never_reads_the_device_from_the_host(demo_mtp, monkeypatch):
    """The MTP step as `LaneDecoder.verify` runs it before the verify step it feeds (two lanes absorbing blocks of
    different widths, right-aligned, then the chain to three drafts; the drafts written into the windows' rows on the
    device) and `commit`, for two rounds: no op reads a device value on the host (tests/engine/test_lane_decode.py
    `HostReads`). Not covered: rank 0 reading `proposed` after the step to count acceptance (on the host by design,
    so it sits between the rounds, outside the check), and the GPU's own kernels: this runs the CPU's op forms, with
    `sync_free_moe` for the MTP layer's MoE and the main layers' as in the plain step's check."""
    from test_lane_decode import HostReads, sync_free_moe

    from engine.models.glm5_next.moe import MoE

    model, tokenizer, _ = demo_mtp
    monkeypatch.setattr(MoE, "__call__", sync_free_moe)
    decoder = LaneDecoder(model, model.make_pool(512), num_lanes=3, graphs=False, window=WINDOW)
    decoder.min_span, decoder.pad_spans = 64, True  # spans as under graphs
    seqs = [decoder.new_sequence(lane) for lane in (2, 0)]
    for seq, ids, length in zip(seqs, demo_prompts(tokenizer, 8), (70, 45)):
        model.prefill(seq, ids[:length])
    host = HostReads()
    with host.mode:
        decoder.verify(seqs, [[11, -1, -1, -1], [12, -1, -1]], [[11], [12]])
    assert host.found == []
    assert decoder.proposed is not None and decoder.proposed.shape == (2, 3)  # the chain ran to its third draft
    drafts = decoder.proposed.tolist()  # as the executor reads them after the step
    with host.mode:
        decoder.commit(seqs[0], 3)
        decoder.commit(seqs[1], 2)
        decoder.verify(seqs, [[13, -1, -1, -1], [14, -1]], [[*drafts[0][:2], 13], [drafts[1][0], 14]])
        decoder.commit(seqs[0], 4)
        decoder.commit(seqs[1], 1)
    assert host.found == []
    assert decoder.proposed.shape == (2, 3)


@torch.no_grad()
@pytest.mark.parametrize("drafter,parallel,stagger", [("mtp", 4, False), ("mtp+copy", 3, True), ("mtp", 1, False)])
def test_mtp_drafted_replies_equal_serial_replies(demo_mtp, drafter, parallel, stagger, graphs: bool = False):
    """Every reply (token ids, text, finish reason) the same drafted by the MTP layer (alone or beside copy drafts) and
    with `"draft": false`; then stop strings taken from those replies cut both alike (test_drafts.py
    `check_stop_strings`)."""
    prompts = demo_prompts(demo_mtp[1], 20 if parallel > 1 else 10)
    serial, none = serve(demo_mtp, prompts, False, parallel, stagger, graphs, drafter)
    drafted, counts = serve(demo_mtp, prompts, True, parallel, stagger, graphs, drafter)
    assert none["drafted"] == 0
    for i, (a, b) in enumerate(zip(serial, drafted)):
        assert a == b, f"request {i} ({params_for(i)})"
    mtp = counts["by_drafter"]["mtp"]
    assert mtp["accepted"] > 0 and mtp["drafted"] > mtp["accepted"], counts  # both outcomes, from the MTP layer
    assert counts["committed"] > counts["windows"]
    if drafter == "mtp":
        assert counts["by_drafter"]["copy"]["drafted"] == 0
    check_stop_strings(demo_mtp, prompts, drafted, parallel, stagger, graphs, drafter)
