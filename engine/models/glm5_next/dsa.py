"""DeepSeek Sparse Attention (the `indexed_attention` layers): MLA without RoPE plus a lightning indexer.

MLA: q = q_b(rmsnorm(q_a(x))) per head; the key/value source is one normalised latent per token,
c = rmsnorm(kv_a(x)) (kv_lora_rank wide), which is all the cache keeps. Heads read it through kv_b, applied in
absorbed form: scores = (q·W_k)·c and out = W_v·(probs·c), identical in value to expanding K and V per head.

Indexer ("KPool"): each token also caches an index key k = LayerNorm(wk(x)) and a gate score s = G·x. Every
`index_kpool` consecutive tokens, once all present, form a pool whose key is the per-channel softmax(s + ape)
weighted mean of their keys. That key is made once, when the pool's last token is written (`_store`), from its
tokens' rows as the pool holds them, and takes the last token's own index key's place in its row (nothing reads a
token's own key once its pool is complete); a query's indexer uses just those rows' key columns — a kpool-th of
the tokens, half of each one's index columns; the static decode step reads only them — and pools nothing.

A query scores each pool with Σ_h w_h(x)·ReLU(q_h·k_pool / √d) (w scaled by H^-1/2), may only pick pools whose last
token it can see, keeps the best index_topk / kpool of them, and always keeps its own unfinished pool (the visible
tokens past the last complete pool). Attention then runs over exactly the tokens of the chosen pools plus that tail.
When a query sees no more pools than it may pick, every pool is chosen and the layer is plain causal attention (the
"dense" regime).

Defined behaviour. A query's selection is a function of the tokens it can see and nothing else, so a whole prompt,
the same prompt cut in chunks, and token-by-token decoding must select alike. transformers breaks that in one place:
pool scores tie EXACTLY whenever every head's ReLU is zero for several pools (frequent with few index heads), and
`topk` then picks among the tied pools by an order that depends on the candidate tensor's length — the whole-prompt
forward (all pools of the prompt, the invisible ones masked) and the cached decode (only the pools cached so far)
break the same tie differently, which is the ~0.05..2 logit gap between the two. We define ties: the earlier pool
wins (the first of a stable sort by score; `ops.top_pools` takes them without sorting the span). Away from exact
ties our selection equals both of the reference's paths, and the parity tests compare against the reference only
where its selection is tie-free.

Static decode (`decode_lanes`): every stream reads a fixed `span` of its slot-table row (padded past its length);
the same selection is computed with per-stream lengths as tensors: pools past a stream's length score as invisible,
the dense regime is a per-stream flag rather than a branch, so nothing waits for the host. The indexer reads only
the pool keys of the span (the key columns of every kpool-th row); the selection comes out as a fixed number of
slots (the chosen pools' tokens' and the tail's, each with a flag whether it counts; one launch on a GPU,
`ops.pool_tokens`), and attention reads just those latents: a step's DSA cost grows with the span only through the
pool keys. A span of no more pools than may be picked (a step's span is fixed by the host) chooses them all,
whatever their scores, so it scores none.

Tensor parallel: MLA heads split across ranks (q_b and kv_b column-wise, o_proj row-wise); q_a, kv_a and the
whole indexer are replicated so every rank selects the same tokens bit for bit.
"""

from __future__ import annotations

import dataclasses

import torch

from engine import ops
from engine.cache import KVPool, Sequence
from engine.checkpoint.loader import CheckpointReader
from engine.models.glm5_next.config import TextConfig
from engine.parallel import ParallelGroup
from engine.quant.dense import Store, Weight, keep


def pool_keys(members: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """The keys [..., d] of pools given their tokens' index columns [..., kpool, 2d] (index key | gate score) and the
    gate's position bias ape [kpool, d]: per channel, the softmax(gate + ape) weighted mean of the keys,
    Σ e_i k_i / Σ e_i with e = exp(s - max s). Elementwise steps only, the sums over the pool's tokens in their
    order: a pool's key has the same bits however many rows share the call (torch's softmax and sums over a middle
    axis need not: on the CPU a 16-channel softmax of one row differs in its last bit from the same row among
    others)."""
    dim = ape.shape[-1]
    keys = members[..., :dim].unbind(-2)
    gates = members[..., dim:] + ape
    weights = torch.exp(gates - gates.amax(dim=-2, keepdim=True)).unbind(-2)  # a max is exact in any order
    total, weighted = weights[0], weights[0] * keys[0]
    for weight, key in zip(weights[1:], keys[1:]):
        total, weighted = total + weight, weighted + weight * key
    return weighted / total


class SparseMLA:
    GATHER_ELEMENTS = 1 << 26  # latents gathered at once for a block of prompt queries (256 MiB fp32)
    # fp32 values the indexer holds at once for a block of a prompt chunk's queries: the block's queries times each
    # query's values (ops.index_scores_form) — 64 MiB, ~2-4x that with top_pools' masks and running counts and the
    # CPU form's temporaries
    SELECT_SCORES = 1 << 24
    # views into `x_proj`, one per projection of x (set in __init__ by name)
    q_a: Weight
    kv_a: Weight
    wk: Weight
    pool_gate: Weight
    head_weights: Weight

    def __init__(
        self,
        cfg: TextConfig,
        reader: CheckpointReader,
        prefix: str,
        group: ParallelGroup,
        pool_layer: int,
        runs_indexer: bool,
        store: Store = keep,
    ) -> None:
        self.group, self.pool_layer, self.runs_indexer = group, pool_layer, runs_indexer
        self.eps = cfg.rms_norm_eps
        self.rank_dim, self.nope, self.v_dim = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim
        self.scaling = cfg.qk_head_dim**-0.5
        heads = cfg.num_attention_heads
        p = prefix + "self_attn."
        x_proj = {"q_a": reader.get(p + "q_a_proj.weight"), "kv_a": reader.get(p + "kv_a_proj_with_mqa.weight")}
        self.q_a_norm = reader.get(p + "q_a_layernorm.weight").float()
        self.q_b = store(reader.get(p + "q_b_proj.weight", dim=0, units=heads))
        self.kv_a_norm = reader.get(p + "kv_a_layernorm.weight").float()
        # absorbed (used in fp32 products), kept as read where that is bf16 (a GPU's load): every product takes the
        # values their fp32 copy would hold (`_split`, the einsums' `ops.widened`, `ops.head_products`), and a decode
        # step reads half the bytes
        kv_b = reader.get(p + "kv_b_proj.weight", dim=0, units=heads)
        kv_b = kv_b if kv_b.dtype == torch.bfloat16 else kv_b.float()
        self.local_heads = kv_b.shape[0] // (self.nope + self.v_dim)
        kv_b = kv_b.view(self.local_heads, self.nope + self.v_dim, self.rank_dim)
        self.w_k, self.w_v = kv_b[:, : self.nope], kv_b[:, self.nope :]
        self.o_proj = store(reader.get(p + "o_proj.weight", dim=1, units=heads))
        self.kpool, self.pick = cfg.index_kpool, cfg.index_topk // cfg.index_kpool
        self.keep_tail = cfg.index_kpool_always_select_tail
        self.idx_heads, self.idx_dim = cfg.index_n_heads, cfg.index_head_dim
        if runs_indexer:
            i = p + "indexer."
            self.wq_b = store(reader.get(i + "wq_b.weight"))
            x_proj.update(
                wk=reader.get(i + "wk.weight"),
                pool_gate=reader.get(i + "index_kpool_compress_gate"),
                head_weights=reader.get(i + "weights_proj.weight"),
            )
            self.k_norm_w = reader.get(i + "k_norm.weight").float()
            self.k_norm_b = reader.get(i + "k_norm.bias").float()
            self.ape = reader.get(i + "index_kpool_compress_ape").float()
        # every projection of x in one matrix (a decode token reads them in one launch); the named weights (q_a,
        # kv_a, and the indexer's wk, pool_gate, head_weights) are views into it
        self.x_names, self.x_widths = list(x_proj), [t.shape[0] for t in x_proj.values()]
        self.x_proj = store(torch.cat(list(x_proj.values())))
        for name, view in zip(self.x_names, self.x_proj.split(self.x_widths)):
            setattr(self, name, view)
        del x_proj

    @property
    def row_width(self) -> int:
        return self.rank_dim + 2 * self.idx_dim

    def _rows(self, x: torch.Tensor, parts: dict | None = None) -> torch.Tensor:
        """Cache rows [N, row_width] for tokens x [N, hidden]: latent | index key | pool gate score (`parts`: x's
        projections already made, by name)."""

        def project(name: str) -> torch.Tensor:
            return parts[name] if parts else ops.linear(x, getattr(self, name))

        latent = ops.rms_norm(project("kv_a"), self.kv_a_norm, self.eps)
        if not self.runs_indexer:
            return torch.cat([latent, x.new_zeros(x.shape[0], 2 * self.idx_dim)], dim=-1)
        key = ops.layer_norm(project("wk"), self.k_norm_w, self.k_norm_b, 1e-6)
        return torch.cat([latent, key, project("pool_gate")], dim=-1)

    def _select(
        self,
        x: torch.Tensor,
        q_low: torch.Tensor,
        pool: KVPool,
        slots: torch.Tensor,
        positions: torch.Tensor,
        parts: dict | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """What the queries at `positions` (one stream; the last at the span's last row, L - 1) attend to among the
        L cached rows at `slots` [L]: in the dense regime a causal mask [T, L]; beyond it the selected tokens as
        `_select_tokens` gives them, from the pool keys alone (the key columns of each pool's last row; `parts`:
        x's projections already made, by name). Nothing here reads the GPU: the regime follows from L."""
        length = slots.shape[0]
        n_pools = length // self.kpool
        if n_pools <= self.pick:  # the last query sits at the span's last row: it sees every complete pool
            return torch.arange(length, device=slots.device)[None, :] <= positions[:, None]  # dense regime
        keys = ops.PoolKeys(pool, self.pool_layer, slice(self.rank_dim, self.key_end), self._pool_ends(slots)[None])
        head_logits = parts["head_weights"] if parts else ops.linear(x, self.head_weights)
        return self._select_tokens(head_logits, q_low, keys, positions)

    def _attend(
        self, q: torch.Tensor, latents: torch.Tensor, mask: torch.Tensor, bf16_latents: bool = False
    ) -> torch.Tensor:
        """q [T, Hl, nope], latents [L, r], mask [T, L] -> [T, Hl * v] (`bf16_latents`: they came from a bf16 cache,
        which the tensor-core path uses as they are)."""
        if self._on_tensor_cores(q):
            return self._attend_split(q, latents, mask, bf16_latents)
        q_abs = torch.einsum("thd,hdr->thr", q, ops.widened(self.w_k))
        scores = torch.einsum("thr,lr->thl", q_abs, latents) * self.scaling
        scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        ctx = torch.einsum("thl,lr->thr", torch.softmax(scores, dim=-1), latents)
        return torch.einsum("thr,hvr->thv", ctx, ops.widened(self.w_v)).flatten(1)

    @staticmethod
    def _split(weight: torch.Tensor) -> ops.Split:
        """A kv_b part as a split product's operand: a bf16-kept one is its own bf16 head, with no remainder (the
        product it would add is exactly zero), an fp32 one split in two (`ops.split_bf16`)."""
        return (weight, None) if weight.dtype == torch.bfloat16 else ops.split_bf16(weight)

    def _on_tensor_cores(self, q: torch.Tensor) -> bool:
        """Whether these queries' attention takes the split products: a prompt chunk on CUDA (measured on the H200:
        docs/BENCHMARKS.md, session 16); a few rows - decode, verify windows - stay on the fp32 products."""
        return q.is_cuda and q.shape[0] > ops.ROW_INVARIANT_ROWS

    def _attend_split(
        self, q: torch.Tensor, latents: torch.Tensor, mask: torch.Tensor, bf16_latents: bool = False
    ) -> torch.Tensor:
        """`_attend` on the tensor cores (CUDA prompt chunks): the same products, each an `ops.split_product`
        (three bf16 products summed in fp32 - two against bf16 latents -, ~1e-5 from the fp32 path), laid out
        head-major so each is one call."""
        heads, t = self.local_heads, q.shape[0]
        lat_hi, lat_lo = ops.split_bf16(latents, bf16_latents)
        q_abs = ops.split_product(q.transpose(0, 1), self._split(self.w_k)) * self.scaling  # [Hl, T, r]: r < L
        lat_t = lat_hi.t(), None if lat_lo is None else lat_lo.t()
        scores = ops.split_product(q_abs.view(heads * t, -1), lat_t)
        scores = torch.softmax(scores.view(heads, t, -1).masked_fill_(~mask[None], float("-inf")), dim=-1)
        ctx = ops.split_product(scores.view(heads * t, -1), (lat_hi, lat_lo))
        out = ops.split_product(ctx.view(heads, t, -1), self._split(self.w_v.transpose(1, 2)))  # [Hl, T, v]
        return out.transpose(0, 1).reshape(t, -1)

    def _attend_selected(
        self,
        q: torch.Tensor,
        latents: torch.Tensor | ops.PoolLatents,
        tokens: torch.Tensor,
        counts: torch.Tensor,
        bf16_latents: bool = False,
    ) -> torch.Tensor:
        """q [T, Hl, nope] over the latents [L, r] of each query's own selected tokens [T, N] (`counts` [T, N]) ->
        [T, Hl * v] (`bf16_latents`: as `_attend`'s; the tensor-core path then takes them in bf16, half the bytes).
        A CUDA prompt chunk: the head products as split products around one kernel that reads each query's latents
        by index (`ops.selected_attention`; 6.7× the gathered form at 8k on the H200, docs/BENCHMARKS.md session
        21); otherwise the latents gathered a block of queries at a time (≤ GATHER_ELEMENTS latent values).
        `ops.PoolLatents` (a prompt chunk's): the latents read from the pool only as those need them."""
        block = max(1, self.GATHER_ELEMENTS // (tokens.shape[1] * latents.shape[1]))
        if self._on_tensor_cores(q):
            weights = self._split(self.w_k), self._split(self.w_v.transpose(1, 2))  # once, not per block
            if ops.selected_attention_applies(q, self.local_heads, self.rank_dim):  # one launch, nothing gathered
                # a pool's latents (bf16 and fp8 rows read in place, by slot), or split here
                lat = latents if isinstance(latents, ops.PoolLatents) else ops.split_bf16(latents, bf16_latents)
                q_abs = ops.split_product(q.transpose(0, 1), weights[0])  # [Hl, T, r], scaled as it is split
                ctx = ops.selected_attention(q_abs, lat, tokens, counts, scale=self.scaling, split_out=True)
                return ops.split_product(ctx, weights[1]).transpose(0, 1).reshape(q.shape[0], -1)
            if isinstance(latents, ops.PoolLatents):
                lat_hi, lat_lo = latents.split()
            else:
                lat_hi, lat_lo = ops.split_bf16(latents, bf16_latents)
            outs = []
            for i in range(0, q.shape[0], block):
                rows = tokens[i : i + block].clamp(max=latents.shape[0] - 1)  # padding: gathered, not counted
                lat = lat_hi[rows], None if lat_lo is None else lat_lo[rows]
                outs.append(self._attend_gathered_split(q[i : i + block], lat, counts[i : i + block], *weights))
            return torch.cat(outs)
        picked = tokens.clamp(max=latents.shape[0] - 1)
        gather = latents.gather if isinstance(latents, ops.PoolLatents) else latents.__getitem__
        return torch.cat(
            [
                self._attend_lanes(q[i : i + block], gather(picked[i : i + block]), counts[i : i + block])
                for i in range(0, q.shape[0], block)
            ]
        )

    def _stream(
        self,
        x: torch.Tensor,
        q_low: torch.Tensor,
        seq: Sequence,
        positions: torch.Tensor,
        shared: torch.Tensor | tuple | None,
        parts: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | tuple]:
        slots = seq.slots[: seq.length + x.shape[0]]  # through the last query's row
        chosen = self._select(x, q_low, seq.pool, slots, positions, parts) if self.runs_indexer else shared
        if chosen is None:
            raise RuntimeError(f"pool layer {self.pool_layer} shares an indexer that has not run for this chunk")
        q = ops.linear(q_low, self.q_b).view(x.shape[0], self.local_heads, self.nope)
        latents = ops.PoolLatents(seq.pool, self.pool_layer, slice(0, self.rank_dim), slots)
        if isinstance(chosen, torch.Tensor):  # the dense regime: every row up to ~index_topk + kpool of them
            return self._attend(q, latents.gather(slice(None)), chosen, seq.pool.kv == "bf16"), chosen
        tokens, counts = chosen
        return self._attend_selected(q, latents, tokens, counts), chosen

    def _store_at(self, seq: Sequence, start: int, rows: torch.Tensor) -> None:
        """`_store` for the rows [T, row_width] of positions start .. start+T-1 of one sequence (their slots
        allocated): a prompt chunk's, or the plain decode's token."""
        positions = torch.arange(start, start + rows.shape[0], device=rows.device)
        self._store(seq.pool, rows, seq.slots[start : start + rows.shape[0]], positions, seq.slots[None])

    def _store(
        self, pool: KVPool, rows: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, table: torch.Tensor
    ) -> None:
        """Write the cache rows [n, row_width] (fp32, each with its token's own index key) of `positions` [n] at
        `slots` [n]; then each row that completes a pool gets the pool's key in its key columns, made from the pool's
        rows as the pool holds them (the row's own included: written first), their slots read from `table` [n or 1,
        span] by position. A pool's key so depends only on its tokens' stored rows, whichever step writes it: a
        prompt chunk, a decode step, a verify window's row or an MTP draft. On CUDA one launch
        (`ops.complete_pools`); elsewhere every row's key is made (fixed shapes, as a graphed step needs) and the
        rows written again, each with the pool's key where it completes one, else its own."""
        pool.write(self.pool_layer, slots, rows)
        if not self.runs_indexer:
            return
        scales = None if pool.scales is None else pool.scales[self.pool_layer]
        if ops.complete_pools_applies(rows, self.idx_dim, scales is not None):
            layer_rows = pool.rows[self.pool_layer]
            ops.complete_pools(layer_rows, scales, rows, slots, positions, table, self.ape, self.rank_dim, self.kpool)
            return
        kpool = self.kpool
        first = positions - positions % kpool
        at = (first[:, None] + torch.arange(kpool, device=rows.device)).clamp(max=table.shape[1] - 1)
        members = table.expand(rows.shape[0], -1).gather(1, at)  # [n, kpool]: the slots of each row's pool
        keys = self._pool_keys(pool.read(self.pool_layer, members, columns=slice(self.rank_dim, None)))
        completes = (positions % kpool == kpool - 1)[:, None]
        keys = torch.where(completes, keys, rows[:, self.rank_dim : self.key_end])
        pool.write(self.pool_layer, slots, self._with_key(rows, keys))

    def _with_key(self, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Cache rows [n, row_width] with `keys` [n, d] in their index key columns."""
        return torch.cat([rows[:, : self.rank_dim], keys, rows[:, self.key_end :]], dim=-1)

    @property
    def key_end(self) -> int:
        """Where a cache row's index key columns end (they start at rank_dim; the gate score's follow)."""
        return self.rank_dim + self.idx_dim

    def prefill(self, x: torch.Tensor, seq: Sequence, selection: dict) -> torch.Tensor:
        """x: [T, hidden] for positions seq.length .. seq.length+T-1 (their pool slots already allocated)."""
        start = seq.length
        # on a GPU every projection of x in one product (as a decode step), x cast to bf16 once
        parts = dict(zip(self.x_names, ops.linear(x, self.x_proj).split(self.x_widths, dim=-1))) if x.is_cuda else {}
        self._store_at(seq, start, self._rows(x, parts))
        q_low = ops.rms_norm(parts["q_a"] if parts else ops.linear(x, self.q_a), self.q_a_norm, self.eps)
        positions = torch.arange(start, start + x.shape[0], device=x.device)
        out, selection[id(seq)] = self._stream(x, q_low, seq, positions, selection.get(id(seq)), parts)
        return self.group.sum_partials(ops.linear(out, self.o_proj))

    def decode(self, x: torch.Tensor, seqs: list[Sequence], selection: dict) -> torch.Tensor:
        rows = self._rows(x)
        q_low = ops.rms_norm(ops.linear(x, self.q_a), self.q_a_norm, self.eps)
        outs = []
        for i, seq in enumerate(seqs):
            self._store_at(seq, seq.length, rows[i : i + 1])
            positions = torch.tensor([seq.length], device=x.device)
            out, selection[id(seq)] = self._stream(
                x[i : i + 1], q_low[i : i + 1], seq, positions, selection.get(id(seq))
            )
            outs.append(out)
        return self.group.sum_partials(ops.linear(torch.cat(outs), self.o_proj))

    # -- the static decode step (engine/runner/lanes.py) ---------------------------------------------------
    def _pool_ends(self, slots: torch.Tensor) -> torch.Tensor:
        """The slot of each complete pool's last row [..., P], from slots by position [..., L] (P = L // kpool):
        where the pool keys are."""
        return slots[..., self.kpool - 1 : (slots.shape[-1] // self.kpool) * self.kpool : self.kpool]

    def _pool_keys(self, members: torch.Tensor) -> torch.Tensor:
        return pool_keys(members, self.ape)

    def _select_lanes(
        self,
        head_logits: torch.Tensor,
        q_low: torch.Tensor,
        keys: torch.Tensor | ops.PoolKeys,
        positions: torch.Tensor,
        table: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`_select_tokens` for one query per row at `positions` [B], given the pool keys of each row's padded span
        [B, P, d] (pools past a row's position are invisible to it; `ops.PoolKeys`: where the pool holds them), of a
        fixed size: N = pick · kpool + kpool whatever P is (pools past P pad the choice, not counted), and every
        pool's score computed alone (an elementwise product and sum on the CPU; `ops.head_products`,
        `ops.row_blocks`): a query's attention then reads the same tokens in the same order with the same
        arithmetic whatever the span, the width of a verify window or the other rows of the step. A span of no more
        pools than may be picked chooses every pool, whatever the scores: nothing is scored (the same choice, and
        an indexer's products and selection less a layer). `table` [B, span]: the tokens' slots (`ops.pool_tokens`)
        rather than their positions."""
        n_pools = keys.shape[-2]
        chosen = None
        if n_pools > self.pick:

            def choose(head: torch.Tensor, q: torch.Tensor, block: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
                pool_keys = dataclasses.replace(keys, slots=block) if isinstance(keys, ops.PoolKeys) else block
                return self._choose_pools(head, q, pool_keys, where, alone=True)

            rows = keys.slots if isinstance(keys, ops.PoolKeys) else keys  # what row_blocks cuts into blocks
            chosen = ops.row_blocks(choose, head_logits, q_low, rows, positions, kind="dsa_select")
        return self._pool_tokens(chosen, positions, n_pools, self.pick, table)

    def _select_tokens(
        self,
        head_logits: torch.Tensor,
        q_low: torch.Tensor,
        pool_keys: torch.Tensor | ops.PoolKeys,
        positions: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens each query at `positions` [T] attends to, given the pooled index keys [T or 1, P, d] of the
        pools before it (head_logits: x's head_weights projection): positions [T, N] and whether each counts
        [T, N], N = min(pick, P) · kpool + kpool — the chosen pools' tokens (`_choose_pools`), then the unfinished
        pool's (the tail; `ops.pool_tokens`). The count is fixed by P, so attention reads N latents, not all of
        them, and a graph can hold it. In the dense regime (no more visible pools than may be picked) every visible
        pool is chosen, and the tail counts with or without keep_tail."""
        chosen = self._choose_pools(head_logits, q_low, pool_keys, positions)
        return self._pool_tokens(chosen, positions, pool_keys.shape[-2], chosen.shape[1])

    def _choose_pools(
        self,
        head_logits: torch.Tensor,
        q_low: torch.Tensor,
        pool_keys: torch.Tensor | ops.PoolKeys,
        positions: torch.Tensor,
        alone: bool = False,
    ) -> torch.Tensor:
        """The min(pick, P) best pools of each query at `positions` [T] by score, in position order [T, C]
        (`ops.top_pools`: the earlier pool wins a tie; pools not yet complete at a query's position, padding
        included, score below every visible one). `alone`: every pool's score computed alone (`ops.index_scores`)."""
        batch, n_pools = positions.shape[0], pool_keys.shape[-2]
        q = ops.linear(q_low, self.wq_b).view(batch, self.idx_heads, self.idx_dim)
        head_w = head_logits * self.idx_heads**-0.5
        # keys shared by every query (a prompt chunk's): the scores a block of queries at a time
        pool_keys, width = ops.index_scores_form(q, pool_keys)
        width = max(1, width)
        block = max(1, batch if pool_keys.shape[0] != 1 else self.SELECT_SCORES // width)

        def choose(rows: slice) -> torch.Tensor:
            index = ops.index_scores(
                q[rows], pool_keys, head_w[rows], positions[rows], self.kpool, self.idx_dim**-0.5, alone=alone
            )
            return ops.top_pools(index, min(self.pick, n_pools))

        blocks = [choose(slice(i, i + block)) for i in range(0, max(batch, 1), block)]
        return blocks[0] if len(blocks) == 1 else torch.cat(blocks)

    def _pool_tokens(
        self,
        chosen: torch.Tensor | None,
        positions: torch.Tensor,
        n_pools: int,
        pools: int,
        table: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens (or slots, by `table`) and counts [T, pools · kpool + kpool] of the chosen pools (None: every
        pool) and each query's tail; the tail counts only in the dense regime unless keep_tail."""
        cap = None if self.keep_tail else self.pick
        return ops.pool_tokens(chosen, positions, self.kpool, pools, n_pools, cap, table)

    def _attend_lanes(
        self, q: torch.Tensor, latents: torch.Tensor | ops.PoolColumns, counts: torch.Tensor
    ) -> torch.Tensor:
        """q [B, Hl, nope], latents [B, N, r] of the selected tokens (or where the cache pool holds them), counts
        [B, N] -> [B, Hl * v]; row-invariant (`ops.head_products`, `ops.lane_attention`)."""
        w_k, w_v = self.w_k, self.w_v
        q_abs = ops.head_products(
            q, w_k.transpose(1, 2), lambda rows: torch.einsum("bhd,hdr->bhr", rows, ops.widened(w_k))
        )
        ctx = ops.lane_attention(q_abs, latents, counts, self.scaling, self._attend_rows)
        return ops.head_products(ctx, w_v, lambda rows: torch.einsum("bhr,hvr->bhv", rows, ops.widened(w_v))).flatten(1)

    def _attend_gathered_split(
        self, q: torch.Tensor, latents: ops.Split, counts: torch.Tensor, w_k: ops.Split, w_v_t: ops.Split
    ) -> torch.Tensor:
        """`_attend_lanes` for a block of prompt queries on the tensor cores: q [B, Hl, nope], each query's selected
        latents already split [B, N, r] (bf16 hi, lo or None), counts [B, N], w_k and w_vᵀ [Hl, r, v] split ->
        [B, Hl * v]. No row blocks: a prompt chunk's rows need not match a decode step's bits."""
        lat_hi, lat_lo = latents
        q_abs = (ops.split_product(q.transpose(0, 1), w_k) * self.scaling).transpose(0, 1)  # [B, Hl, r], r < N
        lat_t = lat_hi.transpose(1, 2), None if lat_lo is None else lat_lo.transpose(1, 2)
        scores = ops.split_product(q_abs, lat_t)
        scores = scores.masked_fill_(~counts[:, None, :], float("-inf"))
        ctx = ops.split_product(torch.softmax(scores, dim=-1), latents)  # [B, Hl, r]
        out = ops.split_product(ctx.transpose(0, 1), w_v_t)  # [Hl, B, v]
        return out.transpose(0, 1).reshape(q.shape[0], -1)

    def _attend_rows(self, q_abs: torch.Tensor, latents: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        scores = torch.bmm(q_abs, latents.transpose(1, 2)) * self.scaling
        scores = scores.masked_fill(~counts[:, None, :], float("-inf"))
        return torch.bmm(torch.softmax(scores, dim=-1), latents)

    def decode_lanes(self, x: torch.Tensor, step) -> torch.Tensor:
        """One token per stream with every shape fixed by (batch, span): the new rows go to `step.new_slots` (a row
        that completes a pool with the pool's key, `_store`); the indexer reads the pool keys of the streams'
        slot-table rows `step.table` [B, span], attention only the latents of the selected tokens."""
        pool, table = step.lanes.pool, step.table
        parts = dict(zip(self.x_names, ops.linear(x, self.x_proj).split(self.x_widths, dim=-1)))
        self._store(pool, self._rows(x, parts), step.new_slots, step.positions, table)
        q_low = ops.rms_norm(parts["q_a"], self.q_a_norm, self.eps)
        if self.runs_indexer:
            keys = ops.PoolKeys(pool, self.pool_layer, slice(self.rank_dim, self.key_end), self._pool_ends(table))
            step.selected = self._select_lanes(parts["head_weights"], q_low, keys, step.positions, table)
        slots, counts = step.selected
        latents = ops.PoolColumns(pool, self.pool_layer, slice(0, self.rank_dim), slots)  # [B, N, r], read in place
        q = ops.linear(q_low, self.q_b).view(x.shape[0], self.local_heads, self.nope)
        out = self._attend_lanes(q, latents, counts)
        return self.group.sum_partials(ops.linear(out, self.o_proj))
