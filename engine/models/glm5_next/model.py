"""GLM-5.3-Flash's text tower: embeddings → hc_mult streams → decoder layers → stream mean → norm → LM head.

Two entry points over explicit per-stream state (`engine.cache.Sequence`):
- `prefill(seq, ids)`: a chunk of one stream's prompt (any size, continuing where the stream stopped);
- `decode(seqs, ids)`: one token for each of several streams.
Both return fp32 logits for the last token of each stream, identical on every rank.
Serving decodes through the runner instead (engine/runner/lanes.py `LaneDecoder`): the same step with per-lane state
tensors and fixed shapes (`decode_step`), replayed from CUDA graphs on a GPU. Loaded with `mtp=True`, the checkpoint's
multi-token-prediction layer drafts (mtp.py, `mtp_draft`): every prompt chunk also writes its rows, so a lane can
draft from its first decode step on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch

from engine import ops
from engine.cache import KVPool, LaneState, Sequence
from engine.checkpoint.loader import CheckpointReader
from engine.models.glm5_next.config import DSA, TextConfig
from engine.models.glm5_next.dsa import SparseMLA
from engine.models.glm5_next.kda import KimiDeltaAttention
from engine.models.glm5_next.mhc import HyperConnection
from engine.models.glm5_next.moe import DenseMLP, MoE
from engine.models.glm5_next.mtp import MtpLayer
from engine.models.glm5_next.step import LaneStep
from engine.ops import fla_kda
from engine.parallel import ParallelGroup, shard_range
from engine.quant.dense import HEAD_MODE, Store, keep, storer

PREFIX = "model.language_model."
# rows in place of some tokens' embeddings in a prompt chunk: (offsets in the chunk, rows [n, hidden])
Embeds = tuple[list[int], torch.Tensor]


def _checkpoint_prefix(reader: CheckpointReader) -> str:
    for prefix in (PREFIX, "model."):
        if reader.has(prefix + "embed_tokens.weight"):
            return prefix
    raise RuntimeError(f"{reader.path}: no embed_tokens.weight under {PREFIX!r} or 'model.'")


def cache_bytes_per_token(cfg: TextConfig, kv: str, mtp: bool = False) -> int:
    """Pool bytes one token takes across the DSA layers (and the MTP layer when it drafts: `mtp`), from the config
    alone (`engine fit` asks without loading)."""
    layers = len(cfg.dsa_layers) + (mtp and cfg.num_nextn_predict_layers > 0)
    return KVPool.bytes_per_token(max(layers, 1), cfg.pool_row_width, kv)


def _allowed_only(logits: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """logits [B, V] with the tokens `words` [B, ceil(V / 32)] int32 does not allow at -inf (bit j of word w is token
    32w + j; a word of -1 allows its 32)."""
    ids = torch.arange(logits.shape[-1], device=logits.device, dtype=torch.int32)
    bits = (words[:, ids >> 5] >> (ids & 31)) & 1
    return logits.masked_fill(bits == 0, float("-inf"))


class DecoderLayer:
    def __init__(
        self,
        cfg: TextConfig,
        reader: CheckpointReader,
        prefix: str,
        group: ParallelGroup,
        index: int,
        pool_layer: int | None,
        kda_chunked: bool = True,
        store: Store = keep,
    ) -> None:
        self.eps = cfg.rms_norm_eps
        self.input_norm = reader.get(prefix + "input_layernorm.weight").float()
        self.post_norm = reader.get(prefix + "post_attention_layernorm.weight").float()
        self.attn_hc = HyperConnection(cfg, reader, prefix + "hc_attn")
        self.ffn_hc = HyperConnection(cfg, reader, prefix + "hc_ffn")
        self.is_dsa = cfg.layer_types[index] == DSA
        self.attn: SparseMLA | KimiDeltaAttention
        if pool_layer is not None:  # a DSA layer: its rows in the pool
            self.attn = SparseMLA(cfg, reader, prefix, group, pool_layer, cfg.indexer_types[index] == "full", store)
        else:
            self.attn = KimiDeltaAttention(cfg, reader, prefix, group, index, kda_chunked, store)
        sparse = cfg.mlp_layer_types[index] == "sparse"
        self.mlp = (MoE if sparse else DenseMLP)(cfg, reader, prefix, group, store)

    def forward(self, streams: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        streams = self.attn_hc.around(streams, attend, self.input_norm, self.eps)
        return self.ffn_hc.around(streams, self.mlp, self.post_norm, self.eps)


class Glm5NextForCausalLM:
    def __init__(
        self,
        cfg: TextConfig,
        reader: CheckpointReader,
        group: ParallelGroup,
        progress: Callable[[str], None] | None = None,
        kda_chunked: bool = True,
        mtp: bool = False,
        dense: str = "bf16",
    ) -> None:
        self.cfg, self.group = cfg, group
        self.dense_mode = dense  # how the dense weights are kept (engine/quant/dense.py); the head: HEAD_MODE[dense]
        store = storer(dense)
        prefix = _checkpoint_prefix(reader)
        self.vocab_start, self.vocab_stop = shard_range(cfg.vocab_size, group.rank, group.world)
        # every rank's vocab shard width, fixed at load: the logits gather reads nothing back from the device
        self.vocab_widths = tuple(
            stop - start for start, stop in (shard_range(cfg.vocab_size, r, group.world) for r in range(group.world))
        )
        self.embed = reader.get(prefix + "embed_tokens.weight", dim=0)
        self.norm = reader.get(prefix + "norm.weight").float()
        head = "lm_head.weight" if reader.has("lm_head.weight") else prefix + "embed_tokens.weight"
        self.lm_head = storer(HEAD_MODE[dense])(reader.get(head, dim=0))
        self.layers: list[DecoderLayer] = []
        dsa_seen = 0
        for i in range(cfg.num_hidden_layers):
            self.layers.append(
                DecoderLayer(
                    cfg,
                    reader,
                    f"{prefix}layers.{i}.",
                    group,
                    i,
                    dsa_seen if cfg.layer_types[i] == DSA else None,
                    kda_chunked,
                    store,
                )
            )
            dsa_seen += cfg.layer_types[i] == DSA
            if progress:
                progress(f"loaded layer {i + 1}/{cfg.num_hidden_layers}")
        for layer, following in zip(self.layers, [*self.layers[1:], None]):  # the streams' way through the stack
            layer.attn_hc.next = layer.ffn_hc
            layer.ffn_hc.next = following.attn_hc if following is not None else None
        # the MTP layer only when it drafts (`mtp`): its weights and its pool layer cost nothing otherwise
        mtp_prefix = f"{prefix}layers.{cfg.num_hidden_layers}."
        held = cfg.num_nextn_predict_layers > 0 and reader.has(mtp_prefix + "eh_proj.weight")
        self.mtp = MtpLayer(cfg, reader, mtp_prefix, group, dsa_seen, store) if mtp and held else None
        self.num_pool_layers = max(dsa_seen + (self.mtp is not None), 1)
        if self.kda_prompt_form == "fla":  # compile (or autotune) fla-core's prompt kernels now, not on a request
            if progress:
                progress("preparing the KDA prompt kernels (fla-core: compiled, or tuned where no choice is shipped)")
            kda = self.kda_layers[0]
            fla_kda.warm(kda.local_heads, kda.head_dim, group.device, kda.lower_bound)

    @classmethod
    def load(
        cls,
        path: str | Path,
        group: ParallelGroup | None = None,
        progress: Callable[[str], None] | None = None,
        dtype: torch.dtype | None = None,
        kda_chunked: bool = True,
        mtp: bool = False,
        dense: str = "bf16",
    ) -> Glm5NextForCausalLM:
        """Weights in `dtype` (default: fp32 on the CPU — the reference precision — and bf16 on CUDA); norms and gates
        are always kept in fp32, the control tensors the checkpoint stores in fp32 load as fp32 on every device (the
        routers and their bias, KDA's conv taps, dt_bias and A_log, the hyper-connections' base and scale:
        `layout.kept_fp32`), the hyper-connections' maps and DSA's absorbed kv_b run in fp32 products on their values
        as read (a bf16 load keeps them bf16: fp32 products of the same values, half the bytes), and
        activations are fp32 throughout. `mtp`: load the multi-token-prediction layer to draft with (when the
        checkpoint has one).
        `dense`: how the dense (non-expert) weights are kept — bf16 as loaded (`dtype`), or q4 / fp8 quantised at
        load (engine/quant/dense.py)."""
        group = group or ParallelGroup.single()
        cfg = TextConfig.from_file(path)
        dtype = dtype or (torch.bfloat16 if group.device.type == "cuda" else torch.float32)
        reader = CheckpointReader(path, group, dtype=dtype, device=group.device)
        try:
            return cls(cfg, reader, group, progress, kda_chunked, mtp, dense)
        finally:
            reader.close()

    @property
    def kda_prompt_form(self) -> str | None:
        """How the KDA layers run a prompt's delta rule ("fla", "chunked" or "steps"; kda.prompt_form), or None
        without KDA layers."""
        return self.kda_layers[0].prompt_form if self.kda_layers else None

    @property
    def kda_layers(self) -> list[KimiDeltaAttention]:
        """The linear-attention sublayers, in layer order."""
        return [layer.attn for layer in self.layers if isinstance(layer.attn, KimiDeltaAttention)]

    # -- state ---------------------------------------------------------------------------------------------------
    @property
    def pool_row_width(self) -> int:
        return self.cfg.pool_row_width

    def cache_bytes_per_token(self, kv: str = "fp32") -> int:
        return KVPool.bytes_per_token(self.num_pool_layers, self.cfg.pool_row_width, kv)

    def make_pool(self, num_tokens: int, kv: str = "fp32") -> KVPool:
        return KVPool(self.num_pool_layers, num_tokens, self.cfg.pool_row_width, kv, self.embed.device)

    @property
    def mtp_hidden_size(self) -> int:
        """Width of the hidden rows a lane keeps for the MTP layer (0 without it)."""
        return self.cfg.hidden_size if self.mtp is not None else 0

    @property
    def vocab_size(self) -> int:
        """Width of a row of logits: the LM head's outputs (past the tokenizer's vocabulary where it is padded)."""
        return self.cfg.vocab_size

    def new_sequence(self, pool: KVPool) -> Sequence:
        return Sequence(pool)

    def kda_state_shapes(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
        """Per KDA layer: this rank's (delta-rule state, conv window) shape of one stream."""
        return {kda.layer: kda.state_shapes for kda in self.kda_layers}

    # -- forward -------------------------------------------------------------------------------------------------
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start
        inside = (local >= 0) & (local < self.embed.shape[0])
        rows = self.embed[local.clamp(0, self.embed.shape[0] - 1)].float() * inside[:, None]
        return self.group.sum_partials(rows)

    def _final(self, streams: torch.Tensor) -> torch.Tensor:
        """The streams' mean, normed: the rows the LM head reads (and the MTP layer's hidden input)."""
        return ops.rms_norm(
            ops.row_blocks(lambda rows: rows.mean(dim=1), streams, kind="mean"), self.norm, self.cfg.rms_norm_eps
        )

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.group.gather_last_dim(ops.linear(hidden, self.lm_head), self.vocab_widths)

    def _logits(self, streams: torch.Tensor) -> torch.Tensor:
        return self._head(self._final(streams))

    def _inputs(self, ids: torch.Tensor, embeds: Embeds | None) -> torch.Tensor:
        """The rows the layers take in: the tokens' embeddings, with `embeds` (chunk offsets, rows: an image's
        tower output) in place of the embeddings at those offsets, as transformers places image rows."""
        x = self._embed(ids)
        if embeds is not None:
            where, rows = embeds
            x[torch.as_tensor(where, dtype=torch.long, device=x.device)] = rows.to(x.device, x.dtype)
        return x

    def _run(
        self,
        ids: list[int] | torch.Tensor,
        attend_fn: Callable[[DecoderLayer, torch.Tensor], torch.Tensor],
        embeds: Embeds | None = None,
    ) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor):
            ids = torch.tensor(ids, dtype=torch.long, device=self.embed.device)
        x = self._inputs(ids, embeds)
        streams = x.unsqueeze(1).expand(-1, self.cfg.hc_mult, -1).contiguous()
        for layer in self.layers:
            streams = layer.forward(streams, functools.partial(attend_fn, layer))
        return streams

    @torch.no_grad()
    def prefill(
        self, seq: Sequence, ids: list[int], all_logits: bool = False, embeds: Embeds | None = None
    ) -> torch.Tensor:
        """Consume a chunk of one stream's tokens; fp32 logits [vocab] of its last token (`all_logits`: [T, vocab],
        every token's, for prompt logprobs). `embeds`: (offsets in the chunk, rows) taking the place of those
        tokens' embeddings (an image's rows from the vision tower; the MTP layer takes them in too)."""
        if not ids:
            raise ValueError("prefill needs at least one token")
        if seq.num_slots < seq.length + len(ids):
            seq.grow(seq.length + len(ids) - seq.num_slots)
        selection: dict = {}
        streams = self._run(ids, lambda layer, h: layer.attn.prefill(h, seq, selection), embeds)
        if self.mtp is None:
            seq.length += len(ids)
            return self._logits(streams) if all_logits else self._logits(streams[-1:])[0]
        self._mtp_prefill(seq, ids, self._final(streams), embeds)
        seq.length += len(ids)
        # the logits as without the MTP layer, bit for bit (the last row's alone)
        return self._logits(streams) if all_logits else self._logits(streams[-1:])[0]

    def _mtp_prefill(self, seq: Sequence, ids: list[int], hidden: torch.Tensor, embeds: Embeds | None) -> None:
        """The MTP layer's rows of a prompt chunk: position q from token q and the main hidden row at q-1 (the row
        before the chunk is the one the sequence carries; zeros before position 0)."""
        assert self.mtp is not None
        if seq.hidden is None:
            seq.hidden = hidden.new_zeros(1, hidden.shape[-1])
        before = seq.hidden[:1] if seq.length > 0 else torch.zeros_like(seq.hidden[:1])
        tokens = torch.tensor(ids, dtype=torch.long, device=hidden.device)
        mtp = self.mtp
        mtp.forward(
            self._inputs(tokens, embeds), torch.cat([before, hidden[:-1]]), lambda h: mtp.attn.prefill(h, seq, {})
        )
        seq.hidden[0] = hidden[-1]

    @torch.no_grad()
    def decode(self, seqs: list[Sequence], ids: list[int]) -> torch.Tensor:
        """One token for each stream; fp32 logits [B, vocab]."""
        for seq in seqs:
            if seq.num_slots < seq.length + 1:
                seq.grow(1)
        selection: dict = {}
        streams = self._run(ids, lambda layer, h: layer.attn.decode(h, seqs, selection))
        for seq in seqs:
            seq.length += 1
        return self._logits(streams)

    @torch.no_grad()
    def decode_step(self, lanes: LaneState, inputs: torch.Tensor, span: int, width: int = 1) -> torch.Tensor:
        """The static decode step: inputs [4, R] long on the device (lane, token, position, new slot of each row);
        every row reads `span` entries of its lane's slot-table row. No host sync, no shape that depends on the data,
        so it can be captured in a CUDA graph. fp32 logits [R, vocab]. The caller advances the sequences' lengths.

        `width` > 1 is a verify step: each lane has `width` consecutive rows (its pending token, its drafts, padding
        rows on the scratch lane), every row's logits come back, and the KDA states after each row are kept for
        `LaneState.commit`. A row's logits have the same bits whatever the width and whatever other lanes share
        the step (row-invariant products, a selection of fixed size), which is what makes drafting exact."""
        lane_ids, tokens, positions, new_slots = inputs
        lanes.slots[lane_ids, positions] = new_slots
        step = LaneStep(lanes, lane_ids, positions, new_slots, lanes.slots[lane_ids, :span], width)
        streams = self._run(tokens, lambda layer, h: layer.attn.decode_lanes(h, step))
        hidden = self._final(streams)
        if self.mtp is not None and lanes.hidden is not None:  # what the next step's MTP absorb reads
            row = torch.arange(hidden.shape[0], device=hidden.device) % width
            lanes.hidden[lane_ids, row] = hidden
        return self._head(hidden)

    @torch.no_grad()
    def mtp_draft(
        self,
        lanes: LaneState,
        inputs: torch.Tensor,
        span: int,
        width: int,
        chain: int,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Drafts [B, 1 + chain] from the MTP layer, with every shape fixed by (batch, width, span, chain) and no
        host read (capturable like `decode_step`). inputs [5, B * width + chain * B] long on the device: first the
        absorb rows, `width` a lane, right-aligned (lane, token, position, slot, the lane's hidden row the token
        follows; the rows before a lane's first are padding on the scratch lane), whose last row per lane gives
        draft 1; then `chain` blocks of B rows (lane, -, position, slot, -) where draft j+1 is made from draft j.
        `mask` [lanes + 1, ceil(vocab / 32)] int32: the tokens each lane's draft 1 may be (bit j of word w is token
        32w + j; all bits set: any), a structured output's next-token mask (`LaneDecoder.verify`'s masks)."""
        mtp = self.mtp
        if mtp is None or lanes.hidden is None:
            raise RuntimeError("mtp_draft needs the model loaded with mtp=True and lanes that keep hidden rows")
        batch = (inputs.shape[1]) // (width + chain)
        absorb = inputs[:, : batch * width]
        lane_ids, tokens, positions, slots, rows = absorb
        lanes.slots[lane_ids, positions] = slots
        step = LaneStep(lanes, lane_ids, positions, slots, lanes.slots[lane_ids, :span], width)
        out = mtp.forward(self._embed(tokens), lanes.hidden[lane_ids, rows], lambda h: mtp.attn.decode_lanes(h, step))
        last = out.view(batch, width, -1)[:, -1]
        logits = self._head(mtp.head_input(last))
        if mask is not None:
            logits = _allowed_only(logits, mask[lane_ids.view(batch, width)[:, -1]])
        draft = logits.argmax(dim=-1)
        drafts = [draft]
        for j in range(chain):
            lane_j, _, pos_j, slot_j, _ = inputs[:, batch * (width + j) : batch * (width + j + 1)]
            lanes.slots[lane_j, pos_j] = slot_j
            chained = LaneStep(lanes, lane_j, pos_j, slot_j, lanes.slots[lane_j, :span])
            last = mtp.forward(self._embed(draft), last, functools.partial(mtp.attn.decode_lanes, step=chained))
            draft = self._head(mtp.head_input(last)).argmax(dim=-1)
            drafts.append(draft)
        return torch.stack(drafts, dim=1)
