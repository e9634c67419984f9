"""Train the demo's multi-token-prediction layer on top of the trained (frozen) main model.

transformers' glm5_next has no MTP layer, so its training forward is written here, differentiable, in the form the
engine serves (engine/models/glm5_next/mtp.py): row q mixes enorm(embed(t_q)) and hnorm(h_{q-1}) (h: the main
model's final normed hidden row, zeros before position 0) through eh_proj, then one pre-norm block — MLA over the
cached latents (in the dense regime: every training conversation is shorter than the demo's index_topk, so the
indexer picks every pool and its weights stay as drawn) and the routed MoE with its shared expert — and predicts
t_{q+1} through shared_head.norm and the main LM head (frozen, as are the embeddings). Objective: cross-entropy on
the completion's tokens two ahead of the main model's input (the next-next token of h_{q-1}).

The engine's own MTP forward is checked against this one (tests/engine/test_mtp.py), so what is trained here is
what drafts when served.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

TRAINED = (  # the MTP layer's tensors this trains (the indexer's stay as drawn: the dense regime never reads them)
    "enorm.weight",
    "hnorm.weight",
    "eh_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "shared_head.norm.weight",
    "self_attn.q_a_proj.weight",
    "self_attn.q_a_layernorm.weight",
    "self_attn.q_b_proj.weight",
    "self_attn.kv_a_proj_with_mqa.weight",
    "self_attn.kv_a_layernorm.weight",
    "self_attn.kv_b_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate.weight",
)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _swiglu(x: torch.Tensor, w: dict[str, torch.Tensor], prefix: str, limit: float) -> torch.Tensor:
    gate = F.linear(x, w[prefix + "gate_proj.weight"]).clamp(max=limit)
    up = F.linear(x, w[prefix + "up_proj.weight"]).clamp(-limit, limit)
    return F.linear(gate * torch.sigmoid(gate) * up, w[prefix + "down_proj.weight"])


def mtp_forward(
    w: dict[str, torch.Tensor], cfg, embedded: torch.Tensor, before: torch.Tensor, head: torch.Tensor
) -> torch.Tensor:
    """Logits [B, T, vocab]: row q from `embedded` [B, T, H] (token q) and `before` [B, T, H] (the main hidden row
    at q-1); causal attention over the rows themselves. `w`: the layer's tensors by their names under the layer."""
    eps = cfg.rms_norm_eps
    x = F.linear(
        torch.cat([_rms(embedded, w["enorm.weight"], eps), _rms(before, w["hnorm.weight"], eps)], -1),
        w["eh_proj.weight"],
    )
    batch, length, _ = x.shape
    heads, nope, v_dim = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    a = "self_attn."
    h = _rms(x, w["input_layernorm.weight"], eps)
    q_low = _rms(F.linear(h, w[a + "q_a_proj.weight"]), w[a + "q_a_layernorm.weight"], eps)
    q = F.linear(q_low, w[a + "q_b_proj.weight"]).view(batch, length, heads, nope)
    latent = _rms(F.linear(h, w[a + "kv_a_proj_with_mqa.weight"]), w[a + "kv_a_layernorm.weight"], eps)
    kv = F.linear(latent, w[a + "kv_b_proj.weight"]).view(batch, length, heads, nope + v_dim)
    k, v = kv[..., :nope], kv[..., nope:]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * cfg.qk_head_dim**-0.5
    causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
    probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    ctx = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, heads * v_dim)
    x = x + F.linear(ctx, w[a + "o_proj.weight"])
    h = _rms(x, w["post_attention_layernorm.weight"], eps).reshape(batch * length, -1)
    x = x + _moe(h, w, cfg).view(batch, length, -1)
    return F.linear(_rms(x, w["shared_head.norm.weight"], eps), head)


def _moe(x: torch.Tensor, w: dict[str, torch.Tensor], cfg) -> torch.Tensor:
    scores = torch.sigmoid(F.linear(x, w["mlp.gate.weight"]))
    chosen = torch.topk(scores.detach() + w["mlp.gate.e_score_correction_bias"], cfg.num_experts_per_tok).indices
    weights = scores.gather(-1, chosen)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    weights = weights * cfg.routed_scaling_factor
    out = _swiglu(x, w, "mlp.shared_experts.", cfg.swiglu_limit)
    for expert in range(cfg.n_routed_experts):
        token, slot = (chosen == expert).nonzero(as_tuple=True)
        if token.numel():
            routed = _swiglu(x[token], w, f"mlp.experts.{expert}.", cfg.swiglu_limit) * weights[token, slot, None]
            out = out.index_add(0, token, routed)
    return out


def trainable(name: str) -> bool:
    return name in TRAINED or ".experts." in name or name.startswith("mlp.shared_experts.")


def train_mtp(
    model,
    weights: dict[str, torch.Tensor],
    cfg,
    batches,
    steps: int,
    lr: float,
    progress: Callable[[int, float], None] | None = None,
) -> tuple[list[float], float]:
    """Train `weights` (the MTP layer's fp32 tensors by name under the layer, updated in place) on `batches`
    (ids [B, T], completion mask [B, T]) with `model` (transformers glm5_next, trained) frozen. (losses, seconds)"""
    text = model.model.language_model
    embed, head = text.embed_tokens.weight.detach(), model.lm_head.weight.detach()
    params = {n: t.requires_grad_(True) for n, t in weights.items() if trainable(n)}
    optimizer = torch.optim.AdamW(list(params.values()), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    losses, began = [], time.perf_counter()
    for step, (ids, mask) in enumerate(itertools.islice(batches, steps)):
        for group in optimizer.param_groups:  # linear warm-up over 20 steps, then cosine to a tenth
            warm = min(1.0, (step + 1) / 20)
            group["lr"] = lr * warm * (0.1 + 0.45 * (1 + torch.cos(torch.tensor(torch.pi * step / steps)).item()))
        with torch.no_grad():
            hidden = text(input_ids=ids, use_cache=False).last_hidden_state
        before = torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)
        logits = mtp_forward(weights, cfg, F.embedding(ids, embed), before, head)[:, :-1]
        target = mask[:, 1:] & mask[:, :-1]  # row q predicts t_{q+1}: a completion token the main model also wrote
        loss = F.cross_entropy(logits[target], ids[:, 1:][target])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if progress:
            progress(step, losses[-1])
    for t in weights.values():
        t.requires_grad_(False)
    return losses, time.perf_counter() - began
