"""DENSE=q4 / fp8 (engine/quant/dense.py) on the CPU: the quantiser (deterministic, bounded error, the range search
never worse than the plain range, views and tensor-parallel slices that are the whole's own bits); the model holds
exactly the weights `kept_bytes` says (what `engine fit` and `engine info` count); the trained demo's logits within
the bounds measured for each mode; per mode, a model's rows invariant in verify windows and beside other lanes
(batched ≡ alone) and rejected drafts leaving no trace; a q4 model's drafted ≡ serial through the scheduler; TP=2 ≡
TP=1 per mode over gloo. The GPU kernel compiled (sm_90, sm_121) and its arithmetic in torch: test_dense_triton.py;
run: tests/gpu/test_dense_gpu.py."""

from __future__ import annotations

import json

import pytest
import torch
from reference import make_reference
from test_drafts import (
    test_a_rejected_draft_leaves_every_state_bit_as_if_never_proposed as rejected_draft_check,
)
from test_drafts import (
    test_a_rows_logits_do_not_depend_on_window_width_or_neighbours as row_invariance_check,
)
from test_drafts import (
    test_drafted_replies_equal_serial_replies as drafted_equals_serial_check,
)
from test_tensor_parallel import run_ranks

from engine import footprint, quality
from engine.checkpoint.demo import TRAINED
from engine.checkpoint.info import checkpoint_tensors
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.quant import dense
from engine.quant.dense import QuantWeight, kept_bytes, quantize, tiled_shape

MODES = ("q4", "fp8")


def gaussian(out: int, width: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(out, width, generator=torch.Generator().manual_seed(seed)) * 0.02


def relative_error(q: QuantWeight, w: torch.Tensor) -> float:
    return float((q.dequantize() - w).norm() / w.norm())


@pytest.mark.parametrize("mode", MODES)
def test_quantising_is_deterministic_and_close(mode):
    w = gaussian(96, 256)
    a, b = quantize(w, mode), quantize(w.clone(), mode)
    assert isinstance(a, QuantWeight) and isinstance(b, QuantWeight) and a.shape == w.shape
    assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)) and torch.equal(a.scale, b.scale)
    # measured on Gaussian rows: q4 groups of 64 ~8.6 %, e4m3 ~2.6 %
    assert relative_error(a, w) < (0.095 if mode == "q4" else 0.03)
    assert a.nbytes() == (96 * 128 + 96 * 4 * 2 * 2 if mode == "q4" else 96 * 256 + 96 * 4 * 4)


def test_the_range_search_is_never_worse_than_the_plain_range(monkeypatch):
    w = gaussian(64, 512, seed=1) + torch.linspace(-0.05, 0.05, 512)  # skewed groups
    searched = quantize(w, "q4")
    monkeypatch.setattr(dense, "CLIPS", (1.0,))
    plain = quantize(w, "q4")
    err = [((q.dequantize() - w) ** 2).view(64, 8, 64).sum(-1) for q in (searched, plain)]  # type: ignore[union-attr]
    assert bool((err[0] <= err[1] * (1 + 1e-6)).all()) and float(err[0].sum()) < float(err[1].sum())


@pytest.mark.parametrize("mode", MODES)
def test_views_and_tensor_parallel_slices_are_the_wholes_own_bits(mode):
    w = gaussian(96, 256)
    whole = quantize(w, mode)
    assert isinstance(whole, QuantWeight)
    parts = whole.split([32, 64])
    assert torch.equal(torch.cat([p.dequantize() for p in parts]), whole.dequantize())
    rows = quantize(w[32:], mode)  # a column-split rank's rows
    assert torch.equal(rows.dequantize(), whole.dequantize()[32:])  # type: ignore[union-attr]
    if mode == "q4":  # a row-split rank's inputs: whole groups
        columns = quantize(w[:, 128:], mode)
        assert torch.equal(columns.dequantize(), whole.dequantize()[:, 128:])  # type: ignore[union-attr]


def test_q4_scales_and_offsets_are_one_word_an_output_and_group_in_every_slice():
    """The decode kernel loads a group's scale and offset of an output as one 32-bit word (`words`): `scale` and
    `offset` are views of `pairs`, and a row slice's words are the whole's, the scale's bits low."""
    whole = quantize(gaussian(96, 256), "q4")
    assert isinstance(whole, QuantWeight) and whole.pairs is not None and whole.offset is not None
    assert whole.pairs.shape == (4, 96, 2) and whole.pairs.is_contiguous()
    assert whole.scale.data_ptr() == whole.pairs.data_ptr() and whole.offset.data_ptr() == whole.scale.data_ptr() + 2
    for part in (whole, *whole.split([32, 64])):
        words = part.words()
        assert words.shape == (4, part.shape[0]) and words.dtype == torch.int32
        low, high = (words & 0xFFFF).to(torch.int16), (words >> 16).to(torch.int16)
        assert torch.equal(low.view(torch.float16), part.scale) and torch.equal(high.view(torch.float16), part.offset)
    assert whole.nbytes() == 96 * 128 + 4 * 96 * 4
    apart = QuantWeight("q4", whole.data, whole.scale.clone(), whole.offset.clone(), whole.group)  # interleaved anew
    assert torch.equal(apart.pairs, whole.pairs) and torch.equal(apart.dequantize(), whole.dequantize())


@pytest.mark.parametrize("mode", MODES)
def test_a_weight_is_tiled_with_the_same_values_and_slices(mode, monkeypatch):
    """The codes are kept tiled (TILE outputs of one group side by side, the outputs padded to whole tiles where
    that adds under 1 % to the rows): the same values, shape and bytes as the weight kept in rows, and row slices —
    from inside a tile, across tiles, the KDA projection's split — that are views of the one tiled tensor with the
    same values."""
    w = gaussian(12900, 128, seed=2)
    tiled = quantize(w, mode)
    monkeypatch.setattr(dense, "tiled_shape", tiling(False))
    rows = quantize(w, mode)
    assert isinstance(rows, QuantWeight) and isinstance(tiled, QuantWeight) and not rows.tiled and tiled.tiled
    per = 32 if mode == "q4" else 64
    assert tiled.data.shape == (101, 2, dense.TILE, per) and tiled.shape == rows.shape == w.shape
    assert torch.equal(tiled.codes().view(torch.uint8), rows.data.view(torch.uint8))
    assert torch.equal(tiled.dequantize(), rows.dequantize()) and tiled.nbytes() == rows.nbytes()
    assert not tiled.data.view(torch.uint8)[100, :, 12900 - 12800 :].any()  # the last tile's padding
    for part, whole in zip(tiled.split([5, 12800, 95]), rows.split([5, 12800, 95])):
        assert part.data.data_ptr() == tiled.data.data_ptr() and part.shape == whole.shape
        assert torch.equal(part.dequantize(), whole.dequantize())
        if mode == "q4":
            assert torch.equal(part.words(), whole.words())
    inner, twin = tiled.rows(70, 12890).rows(100, 12810), rows.rows(70, 12890).rows(100, 12810)  # a slice's slice
    assert inner.first == 170 and inner.shape == twin.shape and torch.equal(inner.dequantize(), twin.dequantize())
    with pytest.raises(AssertionError, match="rows 12800..13000 of 12900"):
        tiled.rows(12800, 13000)
    assert tiled_shape(1280, 128) and not tiled_shape(2000, 128)  # 48 rows of padding: 2.4 %
    assert not tiled_shape(1280, 96)  # not whole groups (fp8: a last, shorter group)


def tiling(flag: bool):
    """`tiled_shape` for a test: every weight of whole groups tiled (or none), whatever its padding (the GPU tests
    take it too)."""
    return lambda out, width, group=dense.GROUP: flag and width % group == 0


def test_an_input_width_groups_do_not_divide_stays_as_loaded():
    w = gaussian(8, 96)
    assert quantize(w, "q4") is w
    fp8 = quantize(w, "fp8")  # any width: a last, shorter group
    assert isinstance(fp8, QuantWeight) and fp8.scale.shape == (2, 8) and relative_error(fp8, w) < 0.03
    assert quantize(w, "bf16") is w
    with pytest.raises(ValueError, match="int8"):
        quantize(w, "int8")


def _quantised(obj, seen: set[int], depth: int = 0) -> int:
    """Values held in QuantWeights reachable from obj (each storage once)."""
    if isinstance(obj, QuantWeight):
        key = obj.data.untyped_storage().data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return obj.data.untyped_storage().nbytes() * (2 if obj.mode == "q4" else 1)
    if depth > 6 or isinstance(obj, torch.Tensor) or isinstance(obj, type):
        return 0
    items = obj if isinstance(obj, (list, tuple)) else vars(obj).values() if hasattr(obj, "__dict__") else ()
    return sum(_quantised(item, seen, depth + 1) for item in items if item is not getattr(obj, "group", None))


@pytest.mark.parametrize("mode", MODES)
def test_the_model_keeps_what_kept_bytes_counts(mode):
    """`engine fit` / `engine info` count with `kept_bytes`; the model's `store` calls must make the same choice."""
    model = Glm5NextForCausalLM.load(TRAINED, mtp=True, dense=mode)
    counted = sum(t.numel for t in checkpoint_tensors(TRAINED) or () if kept_bytes(t.name, t.shape, mode) is not None)
    assert counted > 0 and _quantised(model, set()) == counted
    assert footprint.dense_dtype(model) == mode and footprint.head_dtype(model) == "fp8"
    plain = Glm5NextForCausalLM.load(TRAINED, mtp=True)
    held, full = footprint.weight_bytes(model), footprint.weight_bytes(plain)
    assert held["routed_experts"] == full["routed_experts"]
    for kind in ("dense", "embeddings_and_head", "mtp"):
        assert held[kind] < full[kind], kind


# measured on the trained demo (python -m engine quality, docs/QUALITY.md): q4 KL 0.15 / top-1 75 %, fp8 0.03 / 91 %
BOUNDS = {"q4": (0.3, 0.6), "fp8": (0.08, 0.8)}


@pytest.mark.parametrize("mode", MODES)
def test_the_demos_logits_stay_within_the_measured_bounds(mode):
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(TRAINED / "tokenizer.json")).encode(quality.DEFAULT_TEXT.read_text()).ids[:192]
    runner = quality.Runner(str(TRAINED), "cpu")
    base = {"weights": "fp32", "dense": "bf16", "kv": "fp32", "kda": "chunked"}
    exact = runner.logprobs(base, ids, 64)
    scores = quality.compare(exact, runner.logprobs({**base, "dense": mode}, ids, 64))
    kl, top1 = BOUNDS[mode]
    assert 0 < scores["kl_mean"] < kl and scores["top1_agreement"] > top1, scores


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    path = tmp_path_factory.mktemp("grouped64")
    make_reference(path, "grouped64", seed=3)
    return path


@pytest.fixture(scope="module", params=MODES)
def quantised_model(grouped, request):
    """The grouped reference loaded in each reduced mode; its widths are multiples of the q4 group, so every dense
    weight is reduced in both modes and the checks below run through the quantised products only."""
    model = Glm5NextForCausalLM.load(grouped, dense=request.param)
    kda = model.layers[0].attn
    for weight in (kda.in_proj, kda.o_proj, model.layers[2].attn.o_proj):
        assert isinstance(weight, QuantWeight) and weight.mode == request.param
    return model


@torch.no_grad()
def test_rows_are_invariant_in_windows_and_beside_other_lanes_per_mode(quantised_model):
    row_invariance_check(quantised_model)


@torch.no_grad()
def test_rejected_drafts_leave_no_trace_per_mode(quantised_model):
    rejected_draft_check(quantised_model)


@torch.no_grad()
def test_q4_drafted_replies_equal_serial_replies():
    from tokenizers import Tokenizer

    model = Glm5NextForCausalLM.load(TRAINED, dense="q4")
    tokenizer = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    eos = frozenset(json.loads((TRAINED / "config.json").read_text())["text_config"]["eos_token_id"])
    drafted_equals_serial_check((model, tokenizer, eos), 4, False)


@torch.no_grad()
@pytest.mark.parametrize("mode", MODES)
def test_a_model_with_tiled_weights_gives_the_same_logits(grouped, mode, monkeypatch):
    """Every reduced weight of the grouped reference tiled (`tiled_shape` whatever the padding; the real model tiles
    every weight but those whose padding would add 1 % or more, e.g. DSA's x projection, 2,336 outputs) gives the
    same logits, bit for bit, as every weight kept in rows — the KDA input projection's named parts are slices of its
    tiles."""
    ids = [5, 17, 3, 42, 8, 1, 29]

    def logits():
        model = Glm5NextForCausalLM.load(grouped, dense=mode)
        seq = model.new_sequence(model.make_pool(64))
        first = model.prefill(seq, ids)
        return model, torch.cat([first.reshape(1, -1), model.decode([seq], [3])[0].reshape(1, -1)])

    monkeypatch.setattr(dense, "tiled_shape", tiling(False))
    _, plain = logits()
    monkeypatch.setattr(dense, "tiled_shape", tiling(True))
    model, tiled = logits()
    kda = model.layers[0].attn
    assert kda.in_proj.tiled and kda.f_a.tiled and kda.f_a.data.data_ptr() == kda.in_proj.data.data_ptr()
    assert torch.equal(plain, tiled)


@pytest.mark.parametrize("mode", MODES)
def test_tp2_equals_tp1_per_mode(grouped, tmp_path, mode):
    single = run_ranks(grouped, 1, tmp_path, dense=mode)[0]
    ranks = run_ranks(grouped, 2, tmp_path, dense=mode)
    for r in ranks:
        assert r["tokens"] == single["tokens"] and r["lane_tokens"] == single["tokens"]
        assert (r["logits"] - single["logits"]).abs().max() < 1e-4
    assert torch.equal(ranks[0]["logits"], ranks[1]["logits"]), "ranks must hold bit-identical logits"


@pytest.mark.slow
def test_a_server_started_with_dense_q4_says_so_and_serves(tmp_path):
    """`engine serve --dense q4` (what DENSE=q4 hands every rank) on the trained demo: /health names the dense and
    head types and holds fewer dense bytes than the bf16 run, and the openai SDK's greedy completion is the one the
    model gives when loaded with dense=q4 in this process."""
    import httpx
    from openai import OpenAI
    from test_api_live import LiveServer
    from tokenizers import Tokenizer

    flags = ["--parallel", "1", "--context", "256", "--max-tokens", "12", "--name", "demo", "--drafter", "none"]
    prompt = "<|user|>what is the capital of france?<|assistant|></think>"
    sizes = {}
    for mode in ("bf16", "q4"):
        live = LiveServer(TRAINED, tmp_path, [*flags, "--dense", mode], key=None, tp=1)
        try:
            health = httpx.get(f"{live.url}/health", timeout=10).json()
            sizes[mode] = health["memory"]["weights_bytes"]["dense"]
            if mode == "q4":
                assert health["weights"] == "q4" and health["memory"]["dense_dtype"] == "q4"
                assert health["memory"]["head_dtype"] == "fp8"
                client = OpenAI(base_url=f"{live.url}/v1", api_key="none")
                reply = client.completions.create(model="demo", prompt=prompt, temperature=0, max_tokens=12)
        finally:
            live.stop()
    assert sizes["q4"] < sizes["bf16"]
    tokenizer = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    model = Glm5NextForCausalLM.load(TRAINED, dense="q4")
    seq = model.new_sequence(model.make_pool(256))
    logits = model.prefill(seq, tokenizer.encode(prompt).ids)
    tokens = []
    for _ in range(reply.usage.completion_tokens):
        tokens.append(int(torch.argmax(logits.reshape(-1))))
        logits = model.decode([seq], [tokens[-1]])[0]
    assert reply.usage.completion_tokens > 0 and reply.choices[0].text == tokenizer.decode(tokens)
