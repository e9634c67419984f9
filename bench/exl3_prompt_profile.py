"""One prompt chunk (2,048 tokens, TP=1 shapes) through grouped_experts, for a profiler to look at `_exl3_grouped`:
ncu --kernel-name _exl3_grouped --launch-skip 2 --launch-count 1 --section ... python bench/exl3_prompt_profile.py
(the layer's shapes and random banks are bench/exl3_prompt_bench.py's)
"""

import torch
from exl3_prompt_bench import EXPERTS, HIDDEN, INTER, TOP_K, random_bank

from engine.ops import triton_exl3 as tx

gen = torch.Generator(device="cuda").manual_seed(0)
gate_up, down = random_bank(2 * EXPERTS, HIDDEN, INTER, gen), random_bank(EXPERTS, INTER, HIDDEN, gen)
x = torch.randn(2048, HIDDEN, device="cuda", generator=gen)
chosen = torch.rand(2048, EXPERTS, device="cuda", generator=gen).topk(TOP_K, dim=-1).indices
weights = torch.rand(2048, TOP_K, device="cuda", generator=gen)
for _ in range(3):
    tx.grouped_experts(x, chosen, weights, gate_up, down, 10.0)
torch.cuda.synchronize()
