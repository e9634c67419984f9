"""Which main-model hidden row to feed the MTP layer: the final normed row (what the engine feeds, vLLM's choice) or
the streams' mean before the final norm. Both start from the demo's seeded MTP layer, train the same steps on the
same batches over the committed trained demo (frozen), and are scored on held-out conversations: how often the
layer's top token at a completion position equals the token that follows (teacher-forced draft-1 agreement).

    python bench/mtp_feed.py [--steps 400] [--out mtp_feed.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.checkpoint.demo import TRAINED, write_demo  # noqa: E402
from engine.models.glm5_next.config import TextConfig  # noqa: E402
from engine.train import synthetic, trainer  # noqa: E402
from engine.train.mtp import mtp_forward, train_mtp  # noqa: E402


def seeded_mtp(cfg: TextConfig) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from engine.checkpoint.layout import PREFIX

    prefix = f"{PREFIX}layers.{cfg.num_hidden_layers}."
    with tempfile.TemporaryDirectory() as tmp:
        write_demo(tmp, seed=0, size="chat")
        out = {}
        for path in sorted(Path(tmp).glob("*.safetensors")):
            out.update(
                {n[len(prefix) :]: t.float().clone() for n, t in load_file(str(path)).items() if n.startswith(prefix)}
            )
    return out


class PreNorm:
    """The trained model with its final norm's input (the streams' mean) as `last_hidden_state`."""

    def __init__(self, model) -> None:
        self.model = model
        text = model.model.language_model
        self.seen: list[torch.Tensor] = []
        text.norm.register_forward_hook(lambda mod, args, out: self.seen.append(args[0]))

    def hidden(self, ids: torch.Tensor, pre_norm: bool) -> torch.Tensor:
        self.seen.clear()
        normed = self.model.model.language_model(input_ids=ids, use_cache=False).last_hidden_state
        return self.seen[-1] if pre_norm else normed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = TextConfig.from_file(TRAINED)
    model = trainer.load_start(TRAINED).eval()
    hook = PreNorm(model)
    text = model.model.language_model
    result = {}
    tokenizer = trainer.build_tokenizer()
    held_out = [trainer.encode(e, tokenizer) for e in synthetic.examples("eval", 3, 48)]
    for name, pre_norm in (("final_normed", False), ("pre_norm_mean", True)):
        weights = seeded_mtp(cfg)
        original = text.forward

        def forward(*a, pre_norm=pre_norm, **k):
            out = original(*a, **k)
            if pre_norm:
                out.last_hidden_state = hook.seen[-1]
            return out

        text.forward = forward
        settings = trainer.TrainSettings(seed=1)
        with trainer._kda_chunk(trainer.KDA_CHUNK):
            losses, seconds = train_mtp(model, weights, cfg, trainer.batches(settings), args.steps, 3e-3)
            right = total = 0
            with torch.no_grad():
                for prompt, completion in held_out:
                    ids = torch.tensor([prompt + completion])
                    hidden = text(input_ids=ids, use_cache=False).last_hidden_state
                    before = torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)
                    embedded = F.embedding(ids, text.embed_tokens.weight)
                    top = mtp_forward(weights, cfg, embedded, before, model.lm_head.weight)[0, :-1].argmax(-1)
                    start = len(prompt)  # rows whose own token is a completion token, predicting the next one
                    right += int((top[start:] == ids[0, start + 1 :]).sum())
                    total += len(completion) - 1
        text.forward = original
        result[name] = {
            "steps": args.steps,
            "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
            "agreement": round(right / total, 4),
            "positions": total,
            "seconds": round(seconds),
        }
        print(name, result[name], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
