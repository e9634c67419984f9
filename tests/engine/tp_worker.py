"""One rank of a tensor-parallel greedy run (started by test_tensor_parallel.py as a real process over gloo).

Two runs over the same two prompts: the plain path (`model.decode`) and the serving path (`LaneDecoder`'s static
step, eager on the CPU, with the padded spans CUDA graphs use); then the static step once more while recording host
reads (there must be none, collectives included: they are what a CUDA graph captures on GPUs), and two agreements
(`ParallelGroup.all_agree`) where every rank says yes, then where the last rank says no."""

from __future__ import annotations

import sys

import torch

from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup, exit_process
from engine.runner.lanes import LaneDecoder


def greedy(model, prefill, decode, seqs, ids) -> tuple[list, torch.Tensor]:
    step = torch.stack([prefill(seqs[0], ids), prefill(seqs[1], ids[:17])])
    tokens, logits = [], []
    for _ in range(16):
        logits.append(step)
        nxt = step.argmax(-1).tolist()
        tokens.append(nxt)
        step = decode(seqs, nxt)
    return tokens, torch.stack(logits).cpu()


def main(checkpoint: str, world: int, rank: int, port: int, out: str, device: str = "cpu", dense: str = "bf16") -> None:
    torch.set_num_threads(1)
    if device == "cuda":
        device = f"cuda:{rank}"
        torch.cuda.set_device(device)
    group = ParallelGroup.init(world, rank, "127.0.0.1", port, device=device, timeout_s=120)
    model = Glm5NextForCausalLM.load(checkpoint, group, dtype=torch.float32, dense=dense)  # the reference precision
    ids = torch.randint(1, 97, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    pool = model.make_pool(128)
    tokens, logits = greedy(model, model.prefill, model.decode, [model.new_sequence(pool) for _ in range(2)], ids)

    decoder = LaneDecoder(model, model.make_pool(128), num_lanes=3, graphs=True)
    decoder.min_span, decoder.pad_spans = 16, True  # the spans graphs would use: 16, 32, 64
    seqs = [decoder.new_sequence(2), decoder.new_sequence(0)]
    lane_tokens, lane_logits = greedy(model, model.prefill, decoder.decode, seqs, ids)

    # on the CPU (the GPU proves it by capturing: tests/gpu/test_graphs_tp.py; its MoE stand-in is CPU-only)
    reads = host_reads_of_the_static_step(model, decoder, seqs) if device == "cpu" else None
    agree = [group.all_agree(True), group.all_agree(rank != world - 1)]
    torch.save(
        {
            "tokens": tokens,
            "logits": logits,
            "lane_tokens": lane_tokens,
            "lane_logits": lane_logits,
            "uses_graphs": decoder.uses_graphs,
            "host_reads": reads,
            "agree": agree,
        },
        out,
    )
    exit_process(0)  # no backend teardown: it can abort (gloo) or hang (NCCL after graphs); see exit_process


def host_reads_of_the_static_step(model, decoder, seqs) -> list[str]:
    from test_lane_decode import HostReads, sync_free_moe

    from engine.models.glm5_next.moe import MoE

    plain_call = MoE.__call__
    MoE.__call__ = sync_free_moe  # the CPU MoE picks experts on the host; the GPU's Triton kernel does not
    try:
        inputs = torch.tensor([[s.lane for s in seqs], [5, 6], [s.length for s in seqs], [s.next_slot() for s in seqs]])
        host = HostReads()
        with host.mode:
            model.decode_step(decoder.state, inputs, 64)
        return host.found
    finally:
        MoE.__call__ = plain_call


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], *sys.argv[6:])
