"""The static decode step (lanes: per-lane state tensors, slot tables, on-device selection) against the plain decode
path, on tiny random checkpoints on the CPU (eager; the same step is what CUDA graphs capture, tests/gpu).

A schedule of streams with mixed prompt lengths — past the indexer's selection size, so sparse selection runs —
joins and leaves lanes while others decode; every stream must get the greedy tokens and logits it gets decoded
alone through `model.decode`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
from reference import make_reference
from test_parity import ours_greedy, prompt

from engine import ops
from engine.cache import KVPool
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.runner.lanes import LaneDecoder

TOKENS = 10
# (prompt seed, prompt length, lane, the step at which it joins); lane 0 is used twice: its first stream leaves
SCHEDULE = [(1, 5, 0, 0), (3, 40, 2, 0), (2, 23, 1, 3), (4, 13, 0, TOKENS), (5, 61, 1, TOKENS + 3)]


@pytest.fixture(scope="module", params=["kda3_dsa1", "dsa_heavy"])
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    make_reference(path, request.param, seed=1)
    return Glm5NextForCausalLM.load(path)


def run_schedule(model, kv: str = "fp32", min_span: int = 8):
    """Every stream of SCHEDULE through one LaneDecoder; per stream its greedy tokens and logits, and the pool."""
    pool = model.make_pool(256, kv)
    decoder = LaneDecoder(model, pool, num_lanes=3, graphs=False)
    decoder.min_span, decoder.pad_spans = min_span, min_span > 0  # padded spans as under graphs (0: exact spans)
    live: dict[int, tuple[int, object]] = {}  # lane -> (stream index, sequence)
    out = {i: ([], []) for i in range(len(SCHEDULE))}
    for step in range(60):
        for i, (seed, length, lane, start) in enumerate(SCHEDULE):
            if start == step:
                assert lane not in live
                seq = decoder.new_sequence(lane)
                logits = model.prefill(seq, prompt(seed=seed, length=length))
                out[i][1].append(logits)
                out[i][0].append(int(logits.argmax()))
                live[lane] = (i, seq)
        if not live:
            break
        lanes = sorted(live, reverse=step % 2 == 1)  # the batch order changes too
        logits = decoder.decode([live[lane][1] for lane in lanes], [out[live[lane][0]][0][-1] for lane in lanes])
        for row, lane in enumerate(lanes):
            i, seq = live[lane]
            out[i][1].append(logits[row])
            out[i][0].append(int(logits[row].argmax()))
            if len(out[i][0]) == TOKENS:
                seq.release()
                del live[lane]
    return out, pool


@torch.no_grad()
def test_lanes_give_each_stream_its_alone_decode(model):
    got, pool = run_schedule(model)
    for i, (seed, length, _, _) in enumerate(SCHEDULE):
        tokens, logits = ours_greedy(model, prompt(seed=seed, length=length), TOKENS)
        assert got[i][0] == tokens, f"stream {i} (prompt {length} tokens)"
        # fp32 on the CPU: BLAS blocks a batched matmul differently from a one-row one; 1.5e-4 was seen on a 2-core
        # machine (the base commit too), the tokens equal
        assert max(float((a - b).abs().max()) for a, b in zip(got[i][1], logits)) < 5e-4
    assert pool.free_tokens == pool.num_tokens


@torch.no_grad()
def test_exact_spans_without_padding(model):
    got, _ = run_schedule(model, min_span=0)
    for i, (seed, length, _, _) in enumerate(SCHEDULE):
        assert got[i][0] == ours_greedy(model, prompt(seed=seed, length=length), TOKENS)[0], f"stream {i}"


@torch.no_grad()
def test_a_one_token_prompt_on_exact_spans(model):
    """Spans shorter than one pool (no complete pool to score yet) on the eager path."""
    decoder = LaneDecoder(model, model.make_pool(32), num_lanes=1, graphs=False)
    seq = decoder.new_sequence(0)
    logits = model.prefill(seq, [7])
    tokens, _ = ours_greedy(model, [7], 6)
    got = [int(logits.argmax())]
    for _ in range(5):
        got.append(int(decoder.decode([seq], [got[-1]])[0].argmax()))
    assert got == tokens


@torch.no_grad()
def test_sparse_selection_runs_past_the_selection_size(model):
    """The schedule's long prompts see more pools than the indexer may pick (else this tests the dense regime only)."""
    cfg = model.cfg
    assert max(length for _, length, _, _ in SCHEDULE) // cfg.index_kpool > cfg.index_topk // cfg.index_kpool


@torch.no_grad()
@pytest.mark.parametrize("keep_tail", [True, False])
def test_static_selection_equals_the_plain_one(model, keep_tail, monkeypatch):
    """Per position, the padded on-device selection picks exactly the tokens the plain path's selection marks (with
    and without index_kpool_always_select_tail)."""
    layer = next(layer.attn for layer in model.layers if layer.is_dsa and layer.attn.runs_indexer)
    monkeypatch.setattr(layer, "keep_tail", keep_tail)
    gen = torch.Generator().manual_seed(0)
    length, span = 37, 64
    rows = torch.randn(span, layer.row_width, generator=gen)
    pool = KVPool(layer.pool_layer + 1, span, layer.row_width)
    slots = torch.arange(span)
    pool.write(layer.pool_layer, slots, rows)
    x = torch.randn(length, model.cfg.hidden_size, generator=gen)
    q_low = torch.randn(length, model.cfg.q_lora_rank, generator=gen)
    positions = torch.arange(length)
    width = span + layer.kpool  # wide enough for a tail past the span
    keys = rows[None, layer.kpool - 1 :: layer.kpool, layer.rank_dim : layer.key_end]  # each pool's last row's key
    static = selected_mask(
        layer._select_lanes(ops.linear(x, layer.head_weights), q_low, keys.expand(length, -1, -1), positions), width
    )
    whole = selected_mask(layer._select(x, q_low, pool, slots[:length], positions), width)  # the prompt-chunk form
    assert torch.equal(static, whole)
    for pos in range(length):
        one = slice(pos, pos + 1)
        plain = layer._select(x[one], q_low[one], pool, slots[: pos + 1], positions[one])
        assert torch.equal(static[pos], selected_mask(plain, width)[0]), f"position {pos}"
        assert not static[pos, pos + 1 :].any()


@torch.no_grad()
@pytest.mark.parametrize("keep_tail", [True, False])
def test_a_span_of_no_more_pools_than_picked_scores_none_and_chooses_alike(model, keep_tail, monkeypatch):
    """A step's span of at most `pick` pools: every pool is chosen whatever its score, so `_select_lanes` scores
    none (`_choose_pools` is not called) and gives the tokens, and with the step's table the slots, the scored
    choice gives; a span of one pool more scores."""
    layer = next(layer.attn for layer in model.layers if layer.is_dsa and layer.attn.runs_indexer)
    monkeypatch.setattr(layer, "keep_tail", keep_tail)
    gen = torch.Generator().manual_seed(4)
    for n_pools in (1, layer.pick, layer.pick + 1):
        span = n_pools * layer.kpool
        positions = torch.arange(span - 3, span + 2).clamp(max=span - 1)  # queries at and past the span's end
        rows = positions.shape[0]
        keys = torch.randn(rows, n_pools, layer.idx_dim, generator=gen)
        head_logits = torch.randn(rows, layer.idx_heads, generator=gen)
        q_low = torch.randn(rows, model.cfg.q_lora_rank, generator=gen)
        table = torch.randperm(1000, generator=gen)[: rows * span].view(rows, span)
        scored = layer._choose_pools(head_logits, q_low, keys, positions, alone=True)
        assert scored.shape == (rows, min(n_pools, layer.pick))
        want = layer._pool_tokens(scored, positions, n_pools, layer.pick, table)
        calls = []
        choose = layer._choose_pools
        monkeypatch.setattr(layer, "_choose_pools", lambda *a, **k: calls.append(1) or choose(*a, **k))
        got = layer._select_lanes(head_logits, q_low, keys, positions, table)
        monkeypatch.undo()
        monkeypatch.setattr(layer, "keep_tail", keep_tail)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), n_pools
        assert bool(calls) == (n_pools > layer.pick), n_pools
        assert got[1][:, : n_pools * layer.kpool].any()  # the complete pools count


def selected_mask(selection, width: int) -> torch.Tensor:
    """A DSA selection as a bool mask [T, width]: a causal mask as it is, (tokens, counts) scattered (and no token
    counted twice)."""
    if isinstance(selection, torch.Tensor):
        return torch.nn.functional.pad(selection, (0, width - selection.shape[1]))
    tokens, counts = selection
    hits = torch.zeros(tokens.shape[0], width, dtype=torch.long).scatter_add_(1, tokens, counts.long())
    assert int(hits.max()) <= 1
    return hits > 0


@torch.no_grad()
def test_bf16_pool_and_a_one_bucket_span(model):
    """The same with bf16 rows and a span that never changes (the longest bucket from the start)."""
    got, _ = run_schedule(model, kv="bf16", min_span=128)
    for i, (seed, length, _, _) in enumerate(SCHEDULE):
        ids = prompt(seed=seed, length=length)
        seq = model.new_sequence(model.make_pool(length + TOKENS, "bf16"))
        step = model.prefill(seq, ids)
        for t in range(TOKENS - 1):
            assert int(step.argmax()) == got[i][0][t]
            assert (got[i][1][t] - step).abs().max() < 1e-3  # bf16 rows: summation order shows in the last bits
            step = model.decode([seq], [got[i][0][t]])[0]


def test_lane_outside_the_table_is_refused(model):
    decoder = LaneDecoder(model, model.make_pool(16), num_lanes=2, graphs=False)
    with pytest.raises(ValueError, match="lane 2 is outside 0..1"):
        decoder.new_sequence(2)


class HostReads:
    """Records every op that reads a tensor's value on the host or makes a shape from data (what syncs a GPU and
    breaks a CUDA graph capture). .item()/int(t)/bool(t) reach _local_scalar_dense; .tolist() and .numpy() read the
    memory without dispatching any op, so `mode` wraps those two as well; a boolean mask as an index is a nonzero.
    A device-to-host copy (.cpu()) is a no-op on the CPU and goes unseen here: tests/gpu's captures catch it."""

    FORBIDDEN = (
        "_local_scalar_dense",
        "nonzero",
        "unique",
        "masked_select",
        "repeat_interleave",
        "bincount",
        "aten.equal",
        "allclose",
    )
    INDEXING = ("aten.index.Tensor", "aten.index_put")
    UNDISPATCHED = ("tolist", "numpy")

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        found = self.found = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = str(func)
                if any(forbidden in name for forbidden in HostReads.FORBIDDEN):
                    found.append(name)
                elif name.startswith(HostReads.INDEXING) and any(
                    isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1]
                ):
                    found.append(f"{name} with a boolean mask")
                return func(*args, **(kwargs or {}))

        self._dispatch = Mode()

    @property
    def mode(self) -> contextlib.AbstractContextManager[None]:
        """A context (a fresh one each `with`) in which the reads are recorded."""
        return self._watching()

    @contextlib.contextmanager
    def _watching(self) -> Iterator[None]:
        defined = {name: torch.Tensor.__dict__.get(name) for name in self.UNDISPATCHED}  # None: inherited
        for name in self.UNDISPATCHED:
            setattr(torch.Tensor, name, self._recording(name, getattr(torch.Tensor, name)))
        try:
            with self._dispatch:
                yield
        finally:
            for name, method in defined.items():
                if method is None:
                    delattr(torch.Tensor, name)
                else:
                    setattr(torch.Tensor, name, method)

    def _recording(self, name: str, method: Callable) -> Callable:
        def read(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
            self.found.append(f"Tensor.{name}")
            return method(tensor, *args, **kwargs)

        return read


def sync_free_moe(self, x):
    """The MoE as a dense sum over experts weighted by the routing (same value; no host read): the CPU stand-in for
    the GPU's Triton routed-experts kernel, whose own sync-freedom tests/gpu checks by capturing it."""
    chosen, weights = self.route(x)
    dense = torch.zeros(x.shape[0], len(self.experts)).scatter(1, chosen, weights)
    out = self.shared.partial(x)
    for e, expert in enumerate(self.experts):
        out = out + expert.partial(x) * dense[:, e : e + 1]
    return self.group.sum_partials(out)


@torch.no_grad()
def test_the_static_step_never_reads_the_device_from_the_host(model, monkeypatch):
    from engine.models.glm5_next.moe import MoE

    monkeypatch.setattr(MoE, "__call__", sync_free_moe)
    decoder = LaneDecoder(model, model.make_pool(128), num_lanes=2, graphs=False)
    seqs = [decoder.new_sequence(lane) for lane in (0, 1)]
    for seq, length in zip(seqs, (40, 9)):
        model.prefill(seq, prompt(seed=length, length=length))
    inputs = torch.tensor([[0, 1], [5, 6], [40, 9], [s.next_slot() for s in seqs]])
    host = HostReads()
    with host.mode:
        model.decode_step(decoder.state, inputs, 64)
    assert host.found == []
    with host.mode:  # the plain path neither (its DSA layer's regime and span come from the lengths)
        model.decode(seqs, [5, 6])
    assert host.found == []
    with host.mode:  # what the check catches: a tensor's value read on the host, by dispatch or not, a mask index
        int(inputs.sum())
        inputs[0].tolist()
        inputs[1][inputs[0] > 0]
    assert host.found == ["aten._local_scalar_dense.default", "Tensor.tolist", "aten.index.Tensor with a boolean mask"]
    assert "tolist" not in torch.Tensor.__dict__  # the wrapper is gone once the context ends


@torch.no_grad()
def test_the_verify_step_never_reads_the_device_from_the_host(model, monkeypatch):
    """The verify step as `LaneDecoder.verify` runs it (the inputs built from host-side ints, then
    `decode_step` over three lanes' windows of up to four rows, one window shorter so padding rows sit on the scratch
    lane, a span padded as under graphs, sparse DSA selection past the selection size) and `commit` keeping a prefix
    of each window, for two rounds: no op reads a device value on the host. Not covered: reading the logits after the
    step (sampling and acceptance, on the host by design), and the GPU's own kernels: this runs the CPU's op forms,
    with `sync_free_moe` for the CPU MoE (which picks experts on the host), as the plain step's check does; the
    captures in tests/gpu are the check there."""
    from engine.models.glm5_next.moe import MoE

    monkeypatch.setattr(MoE, "__call__", sync_free_moe)
    decoder = LaneDecoder(model, model.make_pool(256), num_lanes=3, graphs=False, window=4)
    decoder.min_span, decoder.pad_spans = 64, True
    seqs = [decoder.new_sequence(lane) for lane in (0, 1, 2)]
    for seq, length in zip(seqs, (40, 9, 23)):
        model.prefill(seq, prompt(seed=length, length=length))
    assert 40 // model.cfg.index_kpool > model.cfg.index_topk // model.cfg.index_kpool  # sparse selection runs
    host = HostReads()
    with host.mode:
        for windows, keeps in (
            (([1, 2, 3, 4], [5, 6], [7, 8, 9, 10]), (3, 1, 4)),
            (([4, 3], [2, 1, 0], [9]), (2, 3, 1)),
        ):
            logits = decoder.verify(seqs, list(windows))
            for seq, keep in zip(seqs, keeps):
                decoder.commit(seq, keep)
    assert host.found == []
    assert logits.shape[:2] == (3, 3)
