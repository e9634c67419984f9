"""Prompt reuse on the GPU: the trained demo in bf16 with CUDA graphs through the real scheduler; resumed replies
equal cold ones (resends, next turns, a shared system prompt; MTP and copy drafts on and off) and kept states give way under
pool pressure, as tests/engine/test_reuse.py checks on the CPU. Runs on the lent H200 machine; skipped elsewhere."""

from __future__ import annotations

import pytest
import torch
from test_mtp_gpu import demo_mtp_cuda  # noqa: F401  (the trained demo on CUDA, bf16, its MTP layer loaded)
from test_reuse import test_kept_states_give_way_to_requests_and_stay_exact_under_pressure as pressure_check
from test_reuse import test_resumed_replies_equal_cold_replies as resumed_check

from engine.reuse import ROLE_TOKENS

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def demo(demo_mtp_cuda):  # noqa: F811
    model, tokenizer, eos = demo_mtp_cuda
    return model, tokenizer, eos, frozenset(i for i in map(tokenizer.token_to_id, ROLE_TOKENS) if i is not None)


@pytest.mark.parametrize("parallel,drafts", [(4, False), (3, True)])
def test_resumed_equal_cold_with_graphs_on_cuda(demo, parallel, drafts):
    resumed_check(demo, parallel, drafts)


@pytest.mark.parametrize("cap_states", [None, 3])
def test_kept_states_give_way_on_cuda(demo, cap_states):
    pressure_check(demo, cap_states)
