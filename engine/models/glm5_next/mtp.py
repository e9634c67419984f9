"""The checkpoint's multi-token-prediction layer (`layers.{num_hidden_layers}`), used to draft.

DeepSeek-V3 form, one layer: the row at position q mixes the embedding of token q with the main model's final
(normed) hidden row at q-1 — x = eh_proj(enorm(embed(t_q)) ‖ hnorm(h_{q-1})) — then runs one plain pre-norm block
(absorbed MLA with its own indexer and its own pool layer, then the routed MoE with its shared expert; no
hyper-connections) and predicts token q+1 through `shared_head.norm` and the main model's LM head. Feeding the final
normed hidden row (not the streams' pre-norm mean) follows vLLM; its reported next-token agreement is 0.739 against
0.696 (../shared/research/engine_model.md §1.3). On the trained demo the two feeds train to the same draft-1
agreement (85.2 % and 85.5 %, bench/mtp_feed.py, docs/BENCHMARKS.md).

Its cache rows follow the main model's positions: the row of position q holds (h_{q-1}, t_q), so a prompt chunk
writes exactly its own positions (the hidden row before the chunk is carried on the sequence: `Sequence.hidden`) and
a decode step absorbs the tokens it committed at their own positions. Drafting chains the layer: the row of the
lane's pending token gives draft 1; draft j+1 comes from a row at the next position fed draft j and the layer's own
output hidden. Those chained rows lie past the lane's committed length and are written again by the next step's
absorb before anything reads them as committed.

A draft never changes a reply (the verify step accepts a draft only when it equals the serial sample), so this layer
decides only how many tokens a step commits. Every rank computes the same drafts: the logits are gathered whole
(identical bits everywhere) before the argmax.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine import ops
from engine.checkpoint.loader import CheckpointReader
from engine.models.glm5_next.config import TextConfig
from engine.models.glm5_next.dsa import SparseMLA
from engine.models.glm5_next.moe import MoE
from engine.parallel import ParallelGroup
from engine.quant.dense import Store, keep


class MtpLayer:
    def __init__(
        self,
        cfg: TextConfig,
        reader: CheckpointReader,
        prefix: str,
        group: ParallelGroup,
        pool_layer: int,
        store: Store = keep,
    ) -> None:
        self.eps = cfg.rms_norm_eps
        self.enorm = reader.get(prefix + "enorm.weight").float()
        self.hnorm = reader.get(prefix + "hnorm.weight").float()
        self.eh_proj = store(reader.get(prefix + "eh_proj.weight"))  # replicated [hidden, 2 * hidden]
        self.input_norm = reader.get(prefix + "input_layernorm.weight").float()
        self.post_norm = reader.get(prefix + "post_attention_layernorm.weight").float()
        self.head_norm = reader.get(prefix + "shared_head.norm.weight").float()
        self.attn = SparseMLA(cfg, reader, prefix, group, pool_layer, runs_indexer=True, store=store)
        self.mlp = MoE(cfg, reader, prefix, group, store)

    def forward(
        self, embedded: torch.Tensor, hidden: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """Rows [N, hidden]: each token's embedding and the hidden row before it -> the layer's output rows."""
        x = ops.linear(
            torch.cat(
                [ops.rms_norm(embedded, self.enorm, self.eps), ops.rms_norm(hidden, self.hnorm, self.eps)], dim=-1
            ),
            self.eh_proj,
        )
        x = x + attend(ops.rms_norm(x, self.input_norm, self.eps))
        return x + self.mlp(ops.rms_norm(x, self.post_norm, self.eps))

    def head_input(self, out: torch.Tensor) -> torch.Tensor:
        """The layer's output rows as the LM head reads them."""
        return ops.rms_norm(out, self.head_norm, self.eps)
