"""One prompt chunk (2,048 tokens, TP=1 shapes) through grouped_experts, for a profiler to look at `_exl3_grouped`:
ncu --kernel-name _exl3_grouped --launch-skip 2 --launch-count 1 --section ... python bench/exl3_prompt_profile.py
"""

import json
from pathlib import Path

import torch

from engine.ops import triton_exl3 as tx
from engine.quant import exl3

cfg = json.loads((Path(__file__).resolve().parents[1] / "engine/checkpoint/glm53_flash_config.json").read_text())
t = cfg["text_config"]
hidden, width, k, experts = (
    t["hidden_size"],
    t["moe_intermediate_size"],
    t["num_experts_per_tok"],
    t["n_routed_experts"],
)
gen = torch.Generator(device="cuda").manual_seed(0)


def bank(m, kk, n):
    trellis = torch.randint(-32768, 32768, (m, kk // 16, n // 16, 64), device="cuda", generator=gen).to(torch.int16)
    suh = (torch.rand(m, kk, device="cuda", generator=gen) / kk**0.5).half()
    return exl3.Exl3Bank(trellis, suh, (torch.rand(m, n, device="cuda", generator=gen) + 0.5).half(), "mcg")


gate_up, down = bank(2 * experts, hidden, width), bank(experts, width, hidden)
x = torch.randn(2048, hidden, device="cuda", generator=gen)
chosen = torch.rand(2048, experts, device="cuda", generator=gen).topk(k, dim=-1).indices
weights = torch.rand(2048, k, device="cuda", generator=gen)
for _ in range(3):
    tx.grouped_experts(x, chosen, weights, gate_up, down, 10.0)
torch.cuda.synchronize()
