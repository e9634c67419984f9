"""The TP plan is written in two places: the model's modules decide which slice of each tensor a rank reads, and
`checkpoint.layout.split_of` states the plan (used by `make-demo` and `info` for per-rank bytes). This loads demo
checkpoints as rank 1 of 2 and of 3 (no group is joined: loading makes no collective call) and checks that every
tensor read agrees with `split_of`: replicated tensors whole, split ones along the same dim in the same units."""

from __future__ import annotations

import json

import pytest

from engine.checkpoint import loader
from engine.checkpoint.demo import write_demo
from engine.checkpoint.layout import split_of
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup


@pytest.mark.parametrize("size, fmt, world", [("tiny", "bf16", 2), ("small", "bf16", 3), ("exl3", "exl3", 2)])
def test_every_tensor_read_follows_split_of(tmp_path, monkeypatch, size, fmt, world) -> None:
    checkpoint = write_demo(tmp_path / "demo", size=size, fmt=fmt)
    raw = json.loads((checkpoint / "config.json").read_text())
    reads: dict[str, tuple[int | None, int | None, tuple[int, ...]]] = {}
    original = loader.CheckpointReader.get

    def recording_get(self, name, dim=None, units=None):
        shape = tuple(self._slice(name).get_shape())
        reads[name] = (dim, units, shape)
        return original(self, name, dim, units)

    monkeypatch.setattr(loader.CheckpointReader, "get", recording_get)
    Glm5NextForCausalLM.load(checkpoint, ParallelGroup(rank=1, world=world))
    assert len(reads) > 20
    wrong = []
    for name, (dim, units, shape) in sorted(reads.items()):
        plan = split_of(name, raw)
        if plan.dim is None:
            if dim is not None:
                wrong.append(f"{name}: read split along {dim}, split_of says replicated")
            continue
        want_units = shape[plan.dim] // plan.unit
        got_units = units if units is not None else (shape[dim] if dim is not None else None)
        if (dim, got_units) != (plan.dim, want_units):
            wrong.append(
                f"{name}: read (dim {dim}, {got_units} units), split_of says (dim {plan.dim}, "
                f"{want_units} units of {plan.unit})"
            )
    assert wrong == []
