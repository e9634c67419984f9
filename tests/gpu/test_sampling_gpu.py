"""Sampling a row where a GPU step made it (the scheduler samples decode rows on the device since session 38):
the same token as the host draws from the same row, at GLM-5.3-Flash's vocabulary, for every filter the sampler
has, on rows with a mask, NaN and huge logits too (the host's float64 logarithms and sums may differ from the GPU's in
the last bit, which could only matter at a near-tie: none in these rows); the first of equal maxima;
log-probabilities as the host computes them. Skipped without a GPU (never part of
CI; tests/engine/test_sampling.py checks the draws themselves on the CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.sampling import SamplingParams, first_max, rows_logprobs, sample, token_logprobs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

VOCAB = 154_880
PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.0, seed=3),
    SamplingParams(temperature=0.6, seed=4),
    SamplingParams(temperature=1.0, top_p=0.95, seed=5),
    SamplingParams(temperature=0.7, top_k=40, seed=6),
    SamplingParams(temperature=0.6, top_p=0.95, top_k=20, seed=7),
    SamplingParams(temperature=1.0, min_p=0.05, seed=8),
]


def _rows(count: int) -> torch.Tensor:
    """Rows shaped like a language model's (a bulk and a few raised tokens), some flat, one with ties at the top."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(count, VOCAB, generator=gen) * 2.5 - 2.0
    for i in range(count):
        top = torch.randperm(VOCAB, generator=gen)[:40]
        rows[i, top] += torch.linspace(25.0, 8.0, 40) * (i % 4) / 3
    rows[0, [900, 70_000]] = 40.0  # equal maxima: the lower id
    rows[1, ::2] = -math.inf  # a format's mask: half the vocabulary impossible
    rows[2, 5::7] = math.nan
    rows[3, :1000] *= 1e30  # huge logits (a broken model's): finite, far apart
    return rows


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"T{p.temperature}-p{p.top_p}-k{p.top_k}-m{p.min_p}")
def test_a_row_on_the_gpu_draws_the_hosts_token(params: SamplingParams) -> None:
    rows = _rows(24)
    on_gpu = rows.cuda()
    for i in range(rows.shape[0]):
        for position in (0, 4097):
            assert sample(on_gpu[i], params, position) == sample(rows[i], params, position), (i, position)


def test_first_max_on_the_gpu_takes_the_lowest_id() -> None:
    row = torch.zeros(VOCAB, device="cuda")
    row[[150_000, 80_000, 120_000]] = 2.0
    assert first_max(row) == 80_000
    ties = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1)).round()
    assert first_max(ties.cuda()) == int(torch.argmax(ties))


def test_log_probabilities_on_the_gpu_are_the_hosts() -> None:
    row = _rows(4)[1]
    token = int(torch.argmax(row))
    host = token_logprobs(row, token, 5)
    device = token_logprobs(row.cuda(), token, 5)
    assert math.isclose(device[0], host[0], rel_tol=1e-12, abs_tol=1e-12)
    assert [t for t, _ in device[1]] == [t for t, _ in host[1]]
    assert all(math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12) for (_, a), (_, b) in zip(device[1], host[1]))


def test_a_prompts_logprobs_on_the_gpu_are_the_hosts() -> None:
    """A prompt's rows (completions' echo) stay on the GPU, in blocks of DEVICE_ROWS: each row's values as the host
    computes them alone, the same top tokens."""
    rows = _rows(70)  # more than one block, a short last one
    tokens = torch.randint(0, VOCAB, (70,), generator=torch.Generator().manual_seed(2)).tolist()
    device = rows_logprobs(rows.cuda(), tokens, 5)
    for i, (value, best) in enumerate(device):
        host = token_logprobs(rows[i], tokens[i], 5)
        assert math.isclose(value, host[0], rel_tol=1e-12, abs_tol=1e-12), i
        assert [t for t, _ in best] == [t for t, _ in host[1]], i
        assert all(math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12) for (_, a), (_, b) in zip(best, host[1])), i


def test_a_prompts_logprobs_through_the_scheduler_on_the_gpu() -> None:
    """Completions' echo on the GPU through the real scheduler (the trained demo, chunks of 16): each prompt token's
    log-probability is the log-softmax of the model's own prompt logits at that row (float64 on the host, from the
    same chunks prefilled directly), the reply's first token the greedy one, and a plain request beside it is
    unaffected."""
    import threading

    from engine.checkpoint.demo import TRAINED
    from engine.models.glm5_next.model import Glm5NextForCausalLM
    from engine.parallel import ParallelGroup
    from engine.runner.executor import StepExecutor
    from engine.scheduler import Finished, PromptLogprobs, Request, Scheduler, Token

    model = Glm5NextForCausalLM.load(TRAINED, ParallelGroup.single("cuda"))
    prompt = list(range(5, 45))
    with torch.no_grad():  # the same chunks as the scheduler's, so the same logits
        seq = model.new_sequence(model.make_pool(64, "fp32"))
        chunks = [model.prefill(seq, prompt[i : i + 16], all_logits=True) for i in range(0, len(prompt), 16)]
        expected = torch.log_softmax(torch.cat(chunks).double().cpu(), dim=-1)
        seq.release()
    executor = StepExecutor(model, model.make_pool(2048, "fp32"), lanes=2, graphs=True)
    sched = Scheduler(executor, ParallelGroup.single("cuda"), parallel=2, max_queued=8, prefill_chunk=16)
    sched.start()
    got: dict[str, list] = {"echo": [], "plain": []}
    ends: dict[str, threading.Event] = {name: threading.Event() for name in got}
    prompts: list[PromptLogprobs] = []

    def sink(name: str):
        def take(event: object) -> None:
            if isinstance(event, PromptLogprobs):
                prompts.append(event)
            elif isinstance(event, Token):
                got[name].append(event.id)
            else:
                assert isinstance(event, Finished), event
                ends[name].set()

        return take

    try:
        params = SamplingParams(temperature=0.0, max_tokens=4)
        sched.submit(Request("echo", prompt, params, sink("echo"), frozenset(), logprobs=2, prompt_logprobs=True))
        sched.submit(Request("plain", prompt, params, sink("plain"), frozenset()))
        assert all(event.wait(300) for event in ends.values())
    finally:
        sched.stop()
    (entries,) = [p.entries for p in prompts]
    assert len(entries) == len(prompt) - 1
    for row, (value, best) in enumerate(entries):
        want = expected[row]
        assert math.isclose(value, float(want[prompt[row + 1]]), rel_tol=1e-6, abs_tol=1e-6), row
        assert len(best) == 2 and best[0][1] >= best[1][1]
    assert got["echo"] == got["plain"] and got["echo"][0] == int(torch.argmax(expected[-1]))


def test_a_steps_rows_together_on_the_gpu_draw_the_hosts_tokens() -> None:
    """A decode step's rows sampled together on the GPU (`sample_rows`, as the scheduler's `_draw` does; more rows
    than one pass takes): each row gets the token the host draws from it alone, for every parameter set, mixed."""
    from engine.sampling import SAMPLE_ROWS, sample_rows

    rows = _rows(SAMPLE_ROWS + 8)
    on_gpu = rows.cuda()
    for shift in range(len(PARAMS)):
        params = [PARAMS[(i + shift) % len(PARAMS)] for i in range(rows.shape[0])]
        positions = [4097 + 3 * i + shift for i in range(rows.shape[0])]
        want = [sample(rows[i], params[i], positions[i]) for i in range(rows.shape[0])]
        assert sample_rows(on_gpu, params, positions) == want, shift


def test_a_steps_rows_replayed_from_cuda_graphs_draw_the_hosts_tokens() -> None:
    """The passes replayed from CUDA graphs (`sample_rows(..., graphs=True)`, the scheduler's with --cuda-graphs on):
    row counts that fill a bucket and then leave rows of it over from a fuller pass (4 then 3 rows replay the 4-row
    graph; 35 rows are passes of 16, 16 and 3), each kind (all unfiltered, some greedy, some filtered; a bucket's
    kinds share its input, so a pass's padding holds another kind's rows and knobs), the same graphs replayed again
    on other rows and positions, fp32 and bf16 rows: each row gets the host's token for it alone, and graphs were
    captured."""
    from engine.sampling import DRAW_GRAPHS, SAMPLE_ROWS, sample_rows

    rows = _rows(SAMPLE_ROWS + 3)
    before = len(DRAW_GRAPHS)
    plain, filtered = PARAMS[1:3], PARAMS[3:]
    for dtype in (torch.float32, torch.bfloat16):
        given = rows.to(dtype)
        for count in (1, 2, 4, 3, 8, 5, 16, 13, SAMPLE_ROWS, SAMPLE_ROWS + 3):
            for kind in (plain, PARAMS, filtered, PARAMS[:1] + plain):
                for replay in range(2):  # the second replays the graphs the first captured, on other values
                    shift = count + replay
                    params = [kind[(i + shift) % len(kind)] for i in range(count)]
                    positions = [11 + 5 * i + replay for i in range(count)]
                    sub = given[shift : shift + count] if shift + count <= given.shape[0] else given[:count]
                    want = [sample(sub[i].float(), params[i], positions[i]) for i in range(count)]
                    assert sample_rows(sub.cuda(), params, positions, graphs=True) == want, (dtype, count, kind)
    assert len(DRAW_GRAPHS) > before


def test_the_schedulers_draws_replay_graphs_only_with_cuda_graphs(monkeypatch) -> None:
    """--cuda-graphs decides the sampling passes' graphs as it does the decode steps': a scheduler over a lane
    decoder with graphs samples through them, one without (or once a failed step capture turned its graphs off)
    samples eagerly; the replies (top_p, three lanes, the trained demo) are the same either way."""
    import threading

    from engine import sampling
    from engine.checkpoint.demo import TRAINED
    from engine.models.glm5_next.model import Glm5NextForCausalLM
    from engine.parallel import ParallelGroup
    from engine.runner.executor import StepExecutor
    from engine.scheduler import Finished, Request, Scheduler, Token

    calls: list[bool] = []
    real = sampling._device_rows

    def watched(rows, params, positions, graphs=False):
        calls.append(graphs)
        return real(rows, params, positions, graphs)

    monkeypatch.setattr(sampling, "_device_rows", watched)
    model = Glm5NextForCausalLM.load(TRAINED, ParallelGroup.single("cuda"))
    replies: dict[bool, dict[str, list[int]]] = {}
    for graphs in (True, False):
        calls.clear()
        executor = StepExecutor(model, model.make_pool(2048, "fp32"), lanes=3, graphs=graphs)
        sched = Scheduler(executor, ParallelGroup.single("cuda"), parallel=3, max_queued=8, prefill_chunk=16)
        got: dict[str, list[int]] = {f"r{i}": [] for i in range(3)}
        ends = {name: threading.Event() for name in got}

        def sink(name: str):
            def take(event: object) -> None:
                if isinstance(event, Token):
                    got[name].append(event.id)
                elif isinstance(event, Finished):
                    ends[name].set()

            return take

        sched.start()
        try:
            for i, name in enumerate(got):
                params = SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=12)
                sched.submit(Request(name, list(range(5 + i, 30)), params, sink(name), frozenset()))
            assert all(event.wait(300) for event in ends.values())
        finally:
            sched.stop()
        replies[graphs] = got
        assert calls and set(calls) == {graphs}, graphs
        assert sched._graph_draws == graphs
        executor.decoder.graphs = None  # as a failed step capture leaves it: the draws follow the steps, eager
        assert not sched._graph_draws
        assert all(len(tokens) == 12 for tokens in got.values()), got
    assert replies[True] == replies[False]
