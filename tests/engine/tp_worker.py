"""One rank of a tensor-parallel greedy run (started by test_tensor_parallel.py as a real process over gloo)."""

from __future__ import annotations

import sys

import torch

from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup


def main(checkpoint: str, world: int, rank: int, port: int, out: str, device: str = "cpu") -> None:
    torch.set_num_threads(1)
    if device == "cuda":
        device = f"cuda:{rank}"
        torch.cuda.set_device(device)
    group = ParallelGroup.init(world, rank, "127.0.0.1", port, device=device, timeout_s=120)
    model = Glm5NextForCausalLM.load(checkpoint, group, dtype=torch.float32)  # the reference precision
    ids = torch.randint(1, 97, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    pool = model.make_pool(128)
    seqs = [model.new_sequence(pool), model.new_sequence(pool)]
    step = torch.stack([model.prefill(seqs[0], ids), model.prefill(seqs[1], ids[:17])])
    tokens, logits = [], []
    for _ in range(16):
        logits.append(step)
        nxt = step.argmax(-1).tolist()
        tokens.append(nxt)
        step = model.decode(seqs, nxt)
    torch.save({"tokens": tokens, "logits": torch.stack(logits).cpu()}, out)
    group.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], *sys.argv[6:])
