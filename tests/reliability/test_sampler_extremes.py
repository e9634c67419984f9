"""The sampler never fails, whatever the parameters or the logits: a property test over temperature (0, subnormal,
tiny, huge, infinite, NaN), top_p, top_k, min_p and seeds, on logits that include ±inf, NaN and huge values.

Regression for issue 13 (1): temperature 1e-308 with min_p 0.5 overflowed logits / T to inf, min_p then kept no
candidate and argmax() of an empty tensor raised on rank 0, which stopped every rank."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sampling import MIN_TEMPERATURE, SamplingParams, sample

VOCAB = 64

temperatures = st.one_of(
    st.sampled_from([0.0, 5e-324, 1e-308, 1e-300, 1e-12, MIN_TEMPERATURE, 1.0, 2.0, 1e300, math.inf, math.nan]),
    st.floats(min_value=0.0, max_value=1e308, allow_subnormal=True),
)
probabilities = st.one_of(
    st.sampled_from([0.0, 5e-324, 1e-300, 0.5, 1.0, math.nan]),
    st.floats(min_value=0.0, max_value=1.0, allow_subnormal=True),
)
special = st.sampled_from([math.inf, -math.inf, math.nan, 1e308, -1e308, 3.4e38, -3.4e38, 0.0])
logit_rows = st.lists(st.one_of(st.floats(min_value=-1e4, max_value=1e4), special), min_size=VOCAB, max_size=VOCAB)


def test_the_reported_request_samples_the_greedy_token() -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0)) * 10
    params = SamplingParams(temperature=1e-308, min_p=0.5, seed=3)
    assert sample(logits, params, 5) == int(torch.argmax(logits))
    assert sample(logits, SamplingParams(temperature=1e-308, top_k=5), 5) == int(torch.argmax(logits))
    assert sample(logits, SamplingParams(temperature=1e-308, top_p=0.3), 5) == int(torch.argmax(logits))


@settings(max_examples=400, deadline=None)
@given(
    logits=logit_rows,
    temperature=temperatures,
    top_p=probabilities,
    min_p=probabilities,
    top_k=st.integers(min_value=-5, max_value=2 * VOCAB),
    seed=st.integers(min_value=0, max_value=2**64 - 1),
    position=st.integers(min_value=0, max_value=2**40),
)
def test_sample_always_returns_a_token_and_is_deterministic(
    logits: list[float], temperature: float, top_p: float, min_p: float, top_k: int, seed: int, position: int
) -> None:
    row = torch.tensor(logits, dtype=torch.float32)
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)
    token = sample(row, params, position)
    assert 0 <= token < VOCAB
    assert sample(row.clone(), params, position) == token
    possible = ~torch.isnan(row) & (row > -math.inf)
    if bool((row == math.inf).any()):
        assert row[token] == math.inf  # an infinite logit outranks every finite one
    elif bool(possible.any()):
        assert bool(possible[token])  # never a NaN or -inf token while another is possible


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**64 - 1), temperature=st.floats(min_value=1e-300, max_value=1e-6))
def test_tiny_temperatures_are_greedy(seed: int, temperature: float) -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed % 1000))
    params = SamplingParams(temperature=temperature, top_p=0.9, min_p=0.2, top_k=10, seed=seed)
    assert sample(logits, params, 0) == int(torch.argmax(logits))
