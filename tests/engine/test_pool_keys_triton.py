"""engine/ops/triton_dsa.py `complete_pools` (DSA's pool keys made and written in one launch on CUDA) in Triton's
interpreter, on the CPU, against the torch form (engine/models/glm5_next/dsa.py `pool_keys` over the members' rows as
the pool holds them, the row written again): for fp32, bf16 and fp8 rows, rows that complete a pool and rows that do
not, a decode step's table (a row of slots a row) and a prompt chunk's (one row for all), a row's bits alone and
among others. The kernel runs in a child process (tests/engine/interpreter.py); on the GPU, through the serving
path: tests/gpu (bench/gpu_session28_call1.sh)."""

from __future__ import annotations

import json

import pytest
import torch
from interpreter import figures_of

KVS = ("fp32", "bf16", "fp8")
RANK, DIM, KPOOL = 24, 16, 4  # a 56-wide row: the fp8 row's last block masked
POSITIONS = [3, 5, 7, 8, 11, 2, 15]  # 3, 7, 11, 15 complete their pools


def _case(kv: str, prompt_table: bool, device: str = "cpu"):
    """A pool whose rows hold 20 positions' tokens (slots scattered), the new rows at POSITIONS already written;
    -> pool, rows, slots, positions, table, ape (on `device`; drawn on the CPU)."""
    from engine.cache import KVPool

    gen = torch.Generator().manual_seed(KVS.index(kv))
    width = RANK + 2 * DIM
    pool = KVPool(1, 40, width, kv)
    order = torch.randperm(40, generator=gen)[:20]  # slot of each position
    pool_rows = torch.randn(20, width, generator=gen) * 3
    pool.write(0, order, pool_rows)
    positions = torch.tensor(POSITIONS)
    rows = torch.randn(len(POSITIONS), width, generator=gen) * 3
    if prompt_table:  # a prompt chunk's rows: consecutive positions, the sequence's one row of slots
        positions = torch.arange(5, 5 + len(POSITIONS))  # 7 and 11 complete theirs
        table = order[None]
    else:
        table = order[None].expand(len(POSITIONS), -1).contiguous()
    slots = order[positions]
    ape = torch.randn(KPOOL, DIM, generator=gen)
    if device != "cpu":
        pool = KVPool(1, 40, width, kv, device)
        pool.write(0, order.to(device), pool_rows.to(device))
        rows, slots, positions, table, ape = (t.to(device) for t in (rows, slots, positions, table, ape))
    pool.write(0, slots, rows)
    return pool, rows, slots, positions, table, ape


def _torch_form(pool, rows, slots, positions, table, ape) -> None:
    from engine.models.glm5_next.dsa import pool_keys

    for i, p in enumerate(positions.tolist()):
        if p % KPOOL == KPOOL - 1:
            t = table[i if table.shape[0] > 1 else 0]
            members = pool.read(0, t[p - KPOOL + 1 : p + 1], columns=slice(RANK, None))
            row = rows[i].clone()
            row[RANK : RANK + DIM] = pool_keys(members, ape)
            pool.write(0, slots[i : i + 1], row[None])


def kernel_figures_on(device: str = "cpu") -> dict:
    """The kernel on `device` (the CPU: under Triton's interpreter) against the torch form on the CPU, by case."""
    from engine.ops import triton_dsa

    def kernel(pool, rows, slots, positions, table, ape) -> None:
        scales = None if pool.scales is None else pool.scales[0]
        triton_dsa.complete_pools(pool.rows[0], scales, rows, slots, positions, table, ape, RANK, KPOOL)

    out = {}
    for kv in KVS:
        for prompt_table in (False, True):
            pool, rows, slots, positions, table, ape = _case(kv, prompt_table, device)
            before = pool.read(0, torch.arange(41, device=device)).cpu()
            kernel(pool, rows, slots, positions, table, ape)
            got = pool.read(0, torch.arange(41, device=device)).cpu()
            slots, positions = slots.cpu(), positions.cpu()
            ref, *args = _case(kv, prompt_table)
            _torch_form(ref, *args)
            want = ref.read(0, torch.arange(41))
            done = [int(s) for s, p in zip(slots, positions) if p % KPOOL == KPOOL - 1]
            others = [s for s in range(41) if s not in done]
            keys = slice(RANK, RANK + DIM)
            alone = []
            for i in range(len(POSITIONS)):  # row i by itself on a fresh pool: its bits as among the others
                one, rows1, slots1, positions1, table1, ape1 = _case(kv, prompt_table, device)
                pick = slice(i, i + 1)
                table1 = table1[pick] if table1.shape[0] > 1 else table1
                kernel(one, rows1[pick], slots1[pick], positions1[pick], table1, ape1)
                alone.append(torch.equal(one.read(0, slots1[pick]).cpu(), got[slots1[pick].cpu()]))
            raw_got, raw_want = pool.rows[0][done].float().cpu(), ref.rows[0][done].float()
            step = torch.exp2(torch.floor(torch.log2(raw_want.abs().clamp_min(2**-9))) - 3)  # an e4m3 step there
            carry = (raw_want.abs() == torch.exp2(torch.log2(raw_want.abs()).round())) & (raw_got == raw_want / 2)
            near = (raw_got - raw_want).abs() <= step
            near[:, :RANK], near[:, RANK + DIM :] = False, False  # only a pool key's own rounding may differ
            out[f"{kv}_{'prompt' if prompt_table else 'step'}"] = {
                # fp8 only: stored values neither equal to the torch form's, nor one e4m3 step off in a key column,
                # nor the interpreter's rounding slip (Triton 3.6's interpreter converts fp32 to e4m3 without the
                # carry into the exponent: 124.0 -> 64, not 128; the GPU converts in hardware)
                "fp8_off": int((~((raw_got == raw_want) | carry | near)).sum()) if kv == "fp8" else 0,
                "fp8_slips": int(carry.sum()) if kv == "fp8" else 0,
                "scale_error": 0.0
                if pool.scales is None
                else float(((pool.scales[0][done].cpu() - ref.scales[0][done]).abs() / ref.scales[0][done]).max()),
                "completed": len(done),
                "others_unchanged": torch.equal(got[others], before[others]),
                "key_error": float((got[done][:, keys] - want[done][:, keys]).abs().max()),
                "key_scale": float(want[done][:, keys].abs().max()),
                "rest_error": float(
                    torch.cat([(got[done] - want[done])[:, :RANK], (got[done] - want[done])[:, RANK + DIM :]], 1)
                    .abs()
                    .max()
                ),
                "row_scale": float(want[done].abs().max()),
                "moved": not torch.equal(got[done][:, keys], before[done][:, keys]),
                "alone": all(alone),
            }
    return out


@pytest.fixture(scope="module")
def kernel_figures() -> dict:
    return figures_of(__file__)


@pytest.mark.parametrize("kv", KVS)
@pytest.mark.parametrize("form", ["step", "prompt"])
def test_the_kernel_writes_the_torch_forms_pool_keys(kernel_figures, kv, form):
    check(kernel_figures[f"{kv}_{form}"], kv, form)


def check(f: dict, kv: str, form: str, fp32_tol: float = 1e-6) -> None:
    """One case's figures as they must be (tests/gpu/test_pool_keys_gpu.py checks the GPU's with it too, its fast
    exp within `fp32_tol`)."""
    assert f["completed"] == (4 if form == "step" else 2)
    assert f["others_unchanged"] and f["moved"] and f["alone"]
    assert f["scale_error"] <= 1e-6
    if kv == "fp8":  # stored values as the torch form's, but where the interpreter slips (kernel_figures_on)
        assert f["fp8_off"] == 0
        return
    # the same sums of the same values (exp rounded differently): fp32 within its rounding, bf16 within one step
    assert f["key_error"] <= {"fp32": fp32_tol, "bf16": 2**-7}[kv] * f["key_scale"]
    assert f["rest_error"] == 0.0


if __name__ == "__main__":
    print(json.dumps(kernel_figures_on("cpu")))
