"""Kimi Delta Attention (the `linear_attention` layers).

Per token: q/k/v projections through one short causal depthwise conv (+SiLU), q and k L2-normalised (q also scaled
by d^-1/2), a per-channel log-decay g = lower_bound · sigmoid(e^A_log · (f_b(f_a(x)) + dt_bias)) (the bound scales,
it does not clamp), a per-head write strength beta = sigmoid(b(x)); the delta rule updates each head's dk×dv fp32
state; the output is RMS-normalised per head, gated by sigmoid(g_b(g_a(x))), and projected back.

Tensor parallel: heads are split across ranks (projections column-wise, o_proj row-wise); f_a and g_a are replicated.

A prompt chunk's delta rule takes one of three forms (`prompt_form`, fixed at load): "fla" — fla-core's chunk_kda
on a GPU (engine/ops/fla_kda.py); "chunked" — the torch chunked form (the CPU, or a GPU without fla-core);
"steps" — token by token, the same arithmetic as a decode step on the CPU (--kda-chunked 0, KDA_CHUNKED=0; slow).
"""

from __future__ import annotations

import torch

from engine import ops
from engine.cache import Sequence
from engine.checkpoint.loader import CheckpointReader
from engine.models.glm5_next.config import TextConfig
from engine.ops import fla_kda
from engine.parallel import ParallelGroup
from engine.quant.dense import Store, Weight, keep


def state_shapes(heads: int, head_dim: int, conv_kernel: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """One stream's delta-rule state [heads, d, d] and q|k|v conv window [3·heads·d, K − 1] for `heads` heads."""
    return (heads, head_dim, head_dim), (3 * heads * head_dim, conv_kernel - 1)


def log_decay(
    raw: torch.Tensor, dt_bias: torch.Tensor, a_decay: torch.Tensor, lower_bound: float | None
) -> torch.Tensor:
    """The log-decay [N, H, d] from f_b's output `raw` [N, H·d], dt_bias [H·d] and e^A_log [H]:
    lower_bound · sigmoid(e^A_log · (raw + dt_bias)), or -e^A_log · softplus(raw + dt_bias) without a bound (what
    fla-core's gate kernel makes in the kernel, `fla_kda.kda_gated`)."""
    heads = a_decay.shape[0]
    raw = (raw + dt_bias).view(raw.shape[0], heads, -1)
    if lower_bound is not None:
        return lower_bound * ops.sigmoid(a_decay[:, None] * raw)
    return -a_decay[:, None] * ops.softplus(raw, threshold=20.0)


def prompt_form(device: torch.device, head_dim: int, chunked: bool = True) -> str:
    """How prompt chunks run the delta rule on this device: "steps" unless `chunked` (--kda-chunked 0), else "fla"
    where fla-core can take it, else "chunked"."""
    if not chunked:
        return "steps"
    return "fla" if fla_kda.usable(device, head_dim) else "chunked"


def kda_steps(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ops.kda_chunked`'s contract, one `ops.kda_step` per token."""
    state, outputs = state[None], []
    for t in range(q.shape[0]):
        out, state = ops.kda_step(state, q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1])
        outputs.append(out)
    return torch.cat(outputs), state[0]


PROMPT_FORMS = {"steps": kda_steps, "chunked": ops.kda_chunked, "fla": fla_kda.kda_chunked}


class KimiDeltaAttention:
    def __init__(
        self,
        cfg: TextConfig,
        reader: CheckpointReader,
        prefix: str,
        group: ParallelGroup,
        layer: int,
        chunked: bool = True,
        store: Store = keep,
    ) -> None:
        self.layer, self.group = layer, group
        self.head_dim = cfg.linear_head_dim
        self.lower_bound = cfg.linear_lower_bound
        self.eps = cfg.rms_norm_eps
        heads = cfg.linear_num_heads
        p = prefix + "self_attn."

        def column(name: str) -> torch.Tensor:
            return reader.get(p + name, dim=0, units=heads)

        # every projection of x in one matrix (a decode token reads them in one launch): q|k|v, f_a, g_a, b; the
        # named weights are views into it (nothing is held twice)
        parts = [column(f"{n}_proj.weight") for n in "qkv"] + [
            reader.get(p + "f_a_proj.weight"),
            reader.get(p + "g_a_proj.weight"),
            column("b_proj.weight"),
        ]
        self.in_proj = store(torch.cat(parts))  # [3*Hl*d + 2*d + Hl, hidden]
        self.qkv_proj: Weight
        self.f_a: Weight
        self.g_a: Weight
        self.b_proj: Weight
        self.qkv_proj, self.f_a, self.g_a, self.b_proj = self.in_proj.split(
            [sum(t.shape[0] for t in parts[:3]), parts[3].shape[0], parts[4].shape[0], parts[5].shape[0]]
        )
        del parts
        low_b = [store(column("f_b_proj.weight")), store(column("g_b_proj.weight"))]  # [Hl*d, d] each
        # stacked [2, Hl*d, d] for one batched product when kept as loaded; a pair of reduced weights otherwise
        tensors = [w for w in low_b if isinstance(w, torch.Tensor)]
        self.low_b: torch.Tensor | tuple[Weight, ...] = torch.stack(tensors) if len(tensors) == 2 else tuple(low_b)
        self.f_b, self.g_b = self.low_b[0], self.low_b[1]
        self.conv = torch.cat([column(f"{n}_conv1d.weight") for n in "qkv"]).squeeze(1).float()  # [3*Hl*d, K]
        self.dt_bias = column("dt_bias").float()
        self.a_log = column("A_log").float()  # [Hl]
        self.a_decay = self.a_log.exp()
        self.o_norm = reader.get(p + "o_norm.weight").float()
        self.o_proj = store(reader.get(p + "o_proj.weight", dim=1, units=heads))
        self.local_heads = self.b_proj.shape[0]
        self.width = self.local_heads * self.head_dim
        self.prompt_form = prompt_form(self.conv.device, self.head_dim, chunked)

    def _gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-decay [N, Hl, d], beta [N, Hl], output gate [N, Hl, d] for tokens x [N, hidden]."""
        shape = (x.shape[0], self.local_heads, self.head_dim)
        g = self._decay(ops.linear(ops.linear(x, self.f_a), self.f_b))
        beta = ops.sigmoid(ops.linear(x, self.b_proj))
        gate = ops.linear(ops.linear(x, self.g_a), self.g_b).view(shape)
        return g, beta, gate

    def _decay(self, raw: torch.Tensor) -> torch.Tensor:
        """The log-decay [N, Hl, d] from f_b's output `raw` [N, Hl·d] (dt_bias not yet added)."""
        return log_decay(raw, self.dt_bias, self.a_decay, self.lower_bound)

    def _output(self, core: torch.Tensor, gate: torch.Tensor, prompt: bool = False) -> torch.Tensor:
        normed = ops.gated_norm(core, gate, self.o_norm, self.eps, self.o_proj, prompt)
        return self.group.sum_partials(ops.linear(normed, self.o_proj))

    @property
    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of one stream's delta-rule state and conv window on this rank."""
        return state_shapes(self.local_heads, self.head_dim, self.conv.shape[1])

    def _fresh_state(self, seq: Sequence) -> None:
        if self.layer not in seq.kda_state:
            state, conv = self.state_shapes
            seq.kda_state[self.layer] = torch.zeros(state, device=self.conv.device)
            seq.conv_state[self.layer] = torch.zeros(conv, device=self.conv.device)

    def prefill(self, x: torch.Tensor, seq: Sequence, selection: dict | None = None) -> torch.Tensor:
        """x: [T, hidden] — a chunk of one stream; its state advances."""
        self._fresh_state(seq)
        in_kernel = x.is_cuda and self.prompt_form == "fla" and fla_kda.GATE_IN_KERNEL  # fla-core makes the decay
        if x.is_cuda:  # every projection of x in one product, f_b and g_b in one more (as a GPU decode step)
            mixed, f, gate = self._fused_project(x)
            qkv, d = 3 * self.width, self.f_a.shape[0]
            projected, beta = mixed[:, :qkv], ops.sigmoid(mixed[:, qkv + 2 * d :])
            del mixed  # held on only through `projected`, a view, until the conv has read it
            g = f.view(x.shape[0], self.local_heads, self.head_dim) if in_kernel else self._decay(f)
        else:
            projected = ops.linear(x, self.qkv_proj)
            g, beta, gate = self._gates(x)
        q, k, v, conv = ops.conv_qkv(projected, seq.conv_state[self.layer], self.conv, self.head_dim)
        del projected  # on a GPU every projection of x ([T, 3·Hl·d + 2·d + Hl] fp32): not held past the conv
        if in_kernel:  # g is f_b's output
            args = (g, beta, self.a_log, self.dt_bias, self.lower_bound)
            core, state = fla_kda.kda_gated(seq.kda_state[self.layer], q, k, v, *args)
        else:
            core, state = PROMPT_FORMS[self.prompt_form](seq.kda_state[self.layer], q, k, v, g, beta)
        seq.store_state(self.layer, state, conv)
        return self._output(core, gate, prompt=True)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What a token's recurrence needs from x [N, hidden] alone: the q|k|v projection, log-decay, beta and
        output gate."""
        return (ops.linear(x, self.qkv_proj), *self._gates(x))

    def _recur(
        self, projected: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, windows: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One token per stream: conv over the window, delta rule -> core output [B, Hl, d], new windows, new
        state (row-invariant: a stream's bits do not depend on the other streams)."""
        seqs_in = torch.cat([windows, projected.unsqueeze(-1)], dim=-1)  # [B, C, K]
        mixed = ops.silu((seqs_in * self.conv).sum(-1))
        q, k, v = ops.split_qkv(mixed, self.head_dim)
        core, state = ops.kda_step(state, q, k, v, g, beta)
        return core, seqs_in[:, :, 1:], state

    def _step(
        self, x: torch.Tensor, windows: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One token per stream: x [B, hidden], windows [B, C, K-1], state [B, Hl, d, d] -> output [B, hidden],
        new windows, new state."""
        projected, g, beta, gate = self._project(x)
        core, windows, state = self._recur(projected, g, beta, windows, state)
        return self._output(core, gate), windows, state

    def decode(self, x: torch.Tensor, seqs: list[Sequence], selection: dict | None = None) -> torch.Tensor:
        """x: [B, hidden] — one token for each stream."""
        for seq in seqs:
            self._fresh_state(seq)
        windows = torch.stack([s.conv_state[self.layer] for s in seqs])
        out, windows, state = self._step(x, windows, torch.stack([s.kda_state[self.layer] for s in seqs]))
        for i, seq in enumerate(seqs):
            seq.store_state(self.layer, state[i], windows[i].clone())
        return out

    def decode_lanes(self, x: torch.Tensor, step) -> torch.Tensor:
        """The static decode step (`step.LaneStep`): on a GPU one fused kernel updates the lane tensors in place;
        elsewhere the state is gathered from them and scattered back. A verify step (`step.width` rows a lane) runs
        the lanes' rows in order and keeps the state after each row (`LaneState.kda_rows`) instead."""
        lanes, width = step.lanes, step.width
        kda, conv = lanes.kda[self.layer], lanes.conv[self.layer]
        lane_ids = step.lane_ids if width == 1 else step.lane_ids.view(-1, width)[:, 0].contiguous()
        if ops.kda_decode_applies(x):
            if width == 1:
                return self._fused_step(x, lane_ids, conv, kda)
            # every projection for all rows at once; the fused kernel then runs the rows in order, row t reading the
            # state kept after row t-1 (the lane's own for row 0) and writing its own into the kept rows: the lane's
            # state is not touched (LaneState.commit picks one) and nothing is copied
            parts = self._fused_project(x)
            kda_rows, conv_rows = lanes.kda_rows[self.layer], lanes.conv_rows[self.layer]
            mixed, f, gate = (part.reshape(-1, width, *part.shape[1:]) for part in parts)
            cores = []
            for t in range(width):
                row_t = (mixed[:, t], f[:, t], gate[:, t])  # strided rows, read where they are (no copies)
                source = (conv, kda) if t == 0 else (conv_rows[:, t - 1], kda_rows[:, t - 1])
                cores.append(self._fused_core(*row_t, lane_ids, *source, conv_rows[:, t], kda_rows[:, t]))
            core = torch.stack(cores, 1).flatten(0, 1)
            return self.group.sum_partials(ops.linear(core, self.o_proj))
        projected, g, beta, gate = self._project(x)
        windows, state = conv[lane_ids], kda[lane_ids]
        if width == 1:
            core, windows, state = self._recur(projected, g, beta, windows, state)
            kda[lane_ids], conv[lane_ids] = state, windows
            return self._output(core, gate)
        rows_p, rows_g, rows_b = (t.view(-1, width, *t.shape[1:]) for t in (projected, g, beta))
        cores = []
        for t in range(width):
            core, windows, state = self._recur(rows_p[:, t], rows_g[:, t], rows_b[:, t], windows, state)
            cores.append(core)
            lanes.kda_rows[self.layer][lane_ids, t] = state
            lanes.conv_rows[self.layer][lane_ids, t] = windows
        return self._output(torch.stack(cores, 1).flatten(0, 1), gate)

    def _fused_step(
        self, x: torch.Tensor, lane_ids: torch.Tensor, windows: torch.Tensor, states: torch.Tensor
    ) -> torch.Tensor:
        """`decode_lanes` on a GPU: one matmul for every projection of x, f_b and g_b (one batched matmul, or a
        product each for reduced weights), then the conv, gates, delta rule and gated norm in one kernel
        (engine/ops/triton_kda.py) that updates the lanes' windows and states in place."""
        core = self._fused_core(*self._fused_project(x), lane_ids, windows, states)
        return self.group.sum_partials(ops.linear(core, self.o_proj))

    def _fused_project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows x [N, hidden] -> every projection of x [N, 3*Hl*d + 2*d + Hl] and f, gate [N, Hl*d] (f_b, g_b)."""
        mixed = ops.linear(x, self.in_proj)
        qkv, d = 3 * self.width, self.f_a.shape[0]
        low = mixed[:, qkv : qkv + 2 * d].reshape(-1, 2, d).transpose(0, 1)  # [2, N, d]: f_a | g_a
        f, gate = ops.linear_pairs(low, self.low_b)  # [N, Hl*d] each
        return mixed, f, gate

    def _fused_core(
        self,
        mixed: torch.Tensor,
        f: torch.Tensor,
        gate: torch.Tensor,
        lane_ids: torch.Tensor,
        windows: torch.Tensor,
        states: torch.Tensor,
        windows_out: torch.Tensor | None = None,
        states_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One token per lane through engine/ops/triton_kda.py: the gated, normalised core output [B, Hl*d]; the new
        windows and states in place, or into `windows_out` / `states_out`."""
        qkv, d = 3 * self.width, self.f_a.shape[0]
        return ops.kda_decode(
            mixed,
            f,
            mixed[:, qkv + 2 * d :],
            gate,
            self.conv,
            self.dt_bias,
            self.a_decay,
            self.o_norm,
            lane_ids,
            windows,
            states,
            self.lower_bound,
            self.eps,
            windows_out,
            states_out,
        )
