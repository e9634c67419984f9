"""Write a trained model in the demo checkpoint's layout, and hash a checkpoint's weights.

The layout (file names, shards, tensor names, dtypes, tokenizer, template, configs) is exactly `write_demo`'s for
the same preset and seed: the demo is written first, then every tensor transformers trained is put in its place,
cast to the dtype the demo stored; the MTP layer (which transformers does not hold) is put in place from its own
training (engine/train/mtp.py) the same way.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.checkpoint.demo import write_demo


def _trained_tensors(model) -> dict[str, torch.Tensor]:
    """The model's weights under their checkpoint names (transformers' own save mapping, e.g. per-expert tensors)."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        out: dict[str, torch.Tensor] = {}
        for path in sorted(Path(tmp).glob("*.safetensors")):
            out.update(load_file(str(path)))
        return out


def write_trained(
    model, directory: str | Path, seed: int, preset: str, mtp: dict[str, torch.Tensor] | None = None
) -> Path:
    """Write `model` (a trained transformers glm5_next) and `mtp` (the trained MTP layer's tensors by checkpoint
    name) as the `preset` demo checkpoint in `directory`."""
    out = write_demo(directory, seed=seed, size=preset)
    trained = {**_trained_tensors(model), **(mtp or {})}
    index = json.loads((out / "model.safetensors.index.json").read_text())
    missing = sorted(n for n in trained if n not in index["weight_map"])
    if missing:
        raise RuntimeError(f"trained tensors the demo layout does not have: {missing[:5]}")
    for filename in sorted(set(index["weight_map"].values())):
        tensors = load_file(str(out / filename))
        for name, value in tensors.items():
            if name in trained:
                if trained[name].shape != value.shape:
                    raise RuntimeError(f"{name}: trained shape {tuple(trained[name].shape)} vs {tuple(value.shape)}")
                tensors[name] = trained[name].to(value.dtype).contiguous()
        save_file(tensors, str(out / filename), metadata={"format": "pt"})
        (out / filename).chmod(0o644)
    return out


def weights_hash(directory: str | Path) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order (independent of sharding)."""
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
