"""The EXL3 CPU decoder: exact against exllamav3's own CUDA decode (tests/fixtures/exl3), and the format's rules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.quant import exl3

FIXTURES = Path(__file__).parents[1] / "fixtures" / "exl3"


@pytest.fixture(scope="module")
def tiles() -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURES / "tiles.safetensors"))


@pytest.fixture(scope="module")
def layers() -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURES / "layers.safetensors"))


def _codebook(case: str) -> str:
    return case.split("_", 1)[1]


def test_every_width_and_codebook_decodes_bit_for_bit_like_exllamav3(tiles: dict[str, torch.Tensor]) -> None:
    cases = sorted(name[: -len(".trellis")] for name in tiles if name.endswith(".trellis"))
    assert len(cases) == 27  # 1..8 bits x 3 codebooks + 1.5 / 2.5 / 3.5 with mul1
    for case in cases:
        ours = exl3.unpack(tiles[case + ".trellis"], _codebook(case))
        theirs = tiles[case + ".wq"]
        differ = (ours.view(torch.int16) != theirs.view(torch.int16)).sum().item()
        assert differ == 0, f"{case}: {differ} of {ours.numel()} values differ from exllamav3's"


@pytest.mark.parametrize("case", ["l4_mcg", "l3_3inst", "l2.5_mul1"])
def test_full_weight_matches_exllamav3_up_to_its_fp16_rotations(layers: dict[str, torch.Tensor], case: str) -> None:
    linear = exl3.Exl3Linear(layers[case + ".trellis"], layers[case + ".suh"], layers[case + ".svh"], _codebook(case))
    ours, theirs = linear.dequantize(torch.float64), layers[case + ".w_had"].double()
    scale = theirs.abs().max()
    assert (ours - theirs).abs().max() <= 3e-3 * scale  # see tests/fixtures/exl3/README.md (1.4e-3 seen)
    assert (ours - theirs).abs().mean() <= 3e-4 * scale
    swapped = exl3.Exl3Linear(
        linear.trellis, layers[case + ".svh"][:1].expand(linear.in_features).contiguous(), linear.svh, linear.codebook
    ).dequantize(torch.float64)
    assert (swapped - theirs).abs().max() > 0.1 * scale  # the comparison does see a wrong scale


def test_forward_equals_x_times_the_dequantized_weight_plus_bias(layers: dict[str, torch.Tensor]) -> None:
    bias = torch.linspace(-1, 1, 128).half()
    linear = exl3.Exl3Linear(layers["l4_mcg.trellis"], layers["l4_mcg.suh"], layers["l4_mcg.svh"], "mcg", bias)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    expected = x @ linear.dequantize(torch.float64) + bias.double()
    assert torch.allclose(linear.forward(x), expected, rtol=0, atol=1e-9)


def test_codebooks_have_the_formats_value_range_and_spread() -> None:
    for name, std in (("3inst", 1.2437), ("mcg", 1.2437), ("mul1", 1.0)):
        values = exl3.codebook(name).float()
        assert values.shape == (65536,) and values.abs().max() < 4
        assert abs(values.std().item() - std) < 2e-3, name  # exllamav3's codebook_scale is 1.24371088


def test_window_ends_follow_the_width() -> None:
    assert exl3.window_ends(4)[:3].tolist() == [4, 8, 12] and exl3.window_ends(4)[-1] == 256 * 4
    # 2.5 bits: positions alternate 2 and 3 new bits, the odd ones taking the extra bit
    assert exl3.window_ends(2.5)[:5].tolist() == [2, 5, 7, 10, 12] and exl3.window_ends(2.5)[-1] == 640


def test_tile_cells_are_a_permutation_of_the_tile() -> None:
    assert sorted(exl3.tile_cells().tolist()) == list(range(256))


def test_packed_signs_unpack_least_significant_bit_first() -> None:
    signs = exl3.unpack_signs(torch.tensor([0b101, -32768], dtype=torch.int16))
    assert signs[:4].tolist() == [-1, 1, -1, 1] and signs[16:31].tolist() == [1] * 15 and signs[31] == -1


def test_malformed_trellis_is_refused_naming_what_was_found() -> None:
    with pytest.raises(exl3.Exl3FormatError, match="int16"):
        exl3.unpack(torch.zeros(1, 1, 64, dtype=torch.int32), "mcg")
    with pytest.raises(exl3.Exl3FormatError, match="last dimension 72"):
        exl3.unpack(torch.zeros(1, 1, 72, dtype=torch.int16), "mcg")
    with pytest.raises(exl3.Exl3FormatError, match="mul1"):
        exl3.unpack(torch.zeros(1, 1, 40, dtype=torch.int16), "mcg")
    with pytest.raises(exl3.Exl3FormatError, match="unknown EXL3 codebook 'q4'"):
        exl3.codebook("q4")
