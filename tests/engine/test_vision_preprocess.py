"""engine/vision/preprocess.py against transformers' glm5_next PIL image processor, plus decoding and digests.

Parity is bit-exact: pixel_values are compared with torch.equal, not a tolerance.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from engine.vision.preprocess import (
    ImageError,
    PreparedImage,
    ProcessorSpec,
    decode_image,
    image_tokens,
    prepare_image,
)

glm5_next = pytest.importorskip("transformers.models.glm5_next.image_processing_pil_glm5_next")
image_transforms = pytest.importorskip("transformers.image_transforms")

REAL = ProcessorSpec()  # patch 14, merge 2, temporal 2, 16..8000 tokens
SERVER = ProcessorSpec(max_tokens=64)  # a server-side per-image limit


def noise(width: int, height: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    shape = (height, width) if channels == 1 else (height, width, channels)
    return np.random.default_rng(seed + 7919 * width + height).integers(0, 256, shape, dtype=np.uint8)


def rgb(width: int, height: int) -> Image.Image:
    return Image.fromarray(noise(width, height))


def rgba(width: int, height: int) -> Image.Image:
    pixels = noise(width, height, 4)
    pixels[: height // 2, :, 3] = 0  # fully transparent top half, random alpha below
    return Image.fromarray(pixels)


def la(width: int, height: int) -> Image.Image:
    pixels = noise(width, height, 2)
    pixels[: height // 2, :, 1] = 0
    return Image.fromarray(pixels)


def gray(width: int, height: int) -> Image.Image:
    return Image.fromarray(noise(width, height, 1))


def palette(width: int, height: int) -> Image.Image:
    return rgb(width, height).quantize(colors=64)


def palette_transparent(width: int, height: int) -> Image.Image:
    image = palette(width, height)
    image.info["transparency"] = 3
    return image


def cmyk(width: int, height: int) -> Image.Image:
    return Image.frombytes("CMYK", (width, height), noise(width, height, 4).tobytes())


def gray16(width: int, height: int) -> Image.Image:
    pixels = noise(width, height, 1).astype(np.uint16)
    return Image.fromarray(pixels)  # values stay under 256, so the plain clip to 8 bits keeps them


# (case id, image factory, width, height, ProcessorSpec overrides for the "real" setting)
CASES: list[tuple[str, Callable[[int, int], Image.Image], int, int, dict[str, int]]] = [
    ("1x1", rgb, 1, 1, {}),
    ("5x7", rgb, 5, 7, {}),
    ("28x28", rgb, 28, 28, {}),
    ("100x37", rgb, 100, 37, {}),
    ("333x517", rgb, 333, 517, {}),
    ("1024x768", rgb, 1024, 768, {}),
    ("30x2000", rgb, 30, 2000, {}),
    ("2000x30", rgb, 2000, 30, {}),
    ("3000x3000-cut", rgb, 3000, 3000, {"max_tokens": 1000}),
    ("60x90-upscaled", rgb, 60, 90, {}),
    ("200x150-no-resize", rgb, 200, 150, {}),
    ("RGBA", rgba, 97, 61, {}),
    ("LA", la, 61, 97, {}),
    ("L", gray, 150, 150, {}),
    ("P", palette, 123, 77, {}),
    ("P-transparency", palette_transparent, 77, 123, {}),
    ("CMYK", cmyk, 90, 140, {}),
    ("I;16", gray16, 70, 45, {}),
]


@pytest.fixture(scope="module")
def reference() -> Any:
    return glm5_next.Glm5NextImageProcessorPil()


def reference_output(reference: Any, image: Image.Image, spec: ProcessorSpec) -> tuple[torch.Tensor, torch.Tensor]:
    out = reference(
        images=[image],
        return_tensors="pt",
        patch_size=spec.patch_size,
        merge_size=spec.merge_size,
        temporal_patch_size=spec.temporal_patch_size,
        min_image_tokens=spec.min_tokens,
        max_image_tokens=spec.max_tokens,
    )
    return out["pixel_values"], out["image_grid_thw"]


def spec_for(setting: str, overrides: dict[str, int]) -> ProcessorSpec:
    return ProcessorSpec(**overrides) if setting == "real" else SERVER


@pytest.mark.parametrize("setting", ["real", "server"])
@pytest.mark.parametrize(("name", "make", "width", "height", "overrides"), CASES, ids=[c[0] for c in CASES])
def test_bit_exact_against_reference(
    reference: Any,
    setting: str,
    name: str,
    make: Callable[[int, int], Image.Image],
    width: int,
    height: int,
    overrides: dict[str, int],
) -> None:
    spec = spec_for(setting, overrides)
    image = make(width, height)
    want_pixels, want_grid = reference_output(reference, image, spec)
    got = prepare_image(image, spec)

    assert got.patches.dtype == torch.float32 and got.patches.is_contiguous()
    assert torch.equal(torch.tensor([got.grid]), want_grid)
    assert got.patches.shape == want_pixels.shape
    assert torch.equal(got.patches, want_pixels)  # bit-exact, no tolerance
    t, gh, gw = got.grid
    assert t == 1 and got.patches.shape == (gh * gw, 3 * spec.temporal_patch_size * spec.patch_size**2)
    assert got.tokens == gh * gw // spec.merge_size**2
    assert spec.min_tokens <= got.tokens <= spec.max_tokens
    assert image_tokens(width, height, spec) == got.tokens


def test_1024x768_is_1036_tokens_at_defaults() -> None:
    assert image_tokens(1024, 768, REAL) == 1036
    prepared = prepare_image(rgb(1024, 768), REAL)
    assert prepared.tokens == 1036 and prepared.grid == (1, 56, 74)


def test_budget_cut_and_upscale_bounds() -> None:
    assert image_tokens(3000, 3000, REAL) <= 8000
    assert image_tokens(3000, 3000, ProcessorSpec(max_tokens=1000)) <= 1000
    assert image_tokens(1, 1, REAL) == 16
    assert image_tokens(60, 90, REAL) >= 16
    assert image_tokens(5000, 5000, SERVER) <= 64


def test_image_tokens_match_reference_over_many_sizes(reference: Any) -> None:
    rng = np.random.default_rng(1)
    sizes = [(int(w), int(h)) for w, h in rng.integers(1, 4000, (300, 2))]
    sizes += [(int(w), 1) for w in rng.integers(1, 20000, 40)] + [(1, int(h)) for h in rng.integers(1, 20000, 40)]
    sizes += [(28 * k, 28 * j) for k in (1, 2, 3, 50, 89, 90) for j in (1, 4, 89, 90, 91)]
    for spec in (REAL, SERVER, ProcessorSpec(max_tokens=1000), ProcessorSpec(min_tokens=64, max_tokens=256)):
        kwargs = {"min_image_tokens": spec.min_tokens, "max_image_tokens": spec.max_tokens}
        for width, height in sizes:
            patches = reference.get_number_of_image_patches(height, width, kwargs)
            assert image_tokens(width, height, spec) == patches // spec.merge_size**2, (width, height, spec)


def test_spec_from_config() -> None:
    config = {"patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3, "depth": 24}
    assert ProcessorSpec.from_config(config) == REAL
    assert ProcessorSpec.from_config(config, max_tokens=64) == SERVER
    assert ProcessorSpec.from_config(config, max_tokens=100_000).max_tokens == 8000  # a limit only lowers
    assert ProcessorSpec.from_config({"patch_size": 16, "spatial_merge_size": 1}).patch_dim == 3 * 2 * 16 * 16
    with pytest.raises(ValueError):
        ProcessorSpec(max_tokens=0)


# --------------------------------------------------------------------------------------------------------------------
# decode_image


def encode(image: Image.Image, fmt: str, **params: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def reference_rgb(data: bytes) -> np.ndarray:
    """What the reference processor's RGB conversion makes of the same file."""
    with Image.open(io.BytesIO(data)) as image:
        converted: np.ndarray = image_transforms.convert_to_rgb(image, return_numpy=True)
    return converted


@pytest.mark.parametrize(
    ("fmt", "params"), [("PNG", {}), ("WEBP", {"lossless": True}), ("BMP", {}), ("TIFF", None)], ids=str
)
def test_lossless_round_trips(fmt: str, params: dict[str, Any] | None) -> None:
    source = rgb(37, 23)
    if params is None:  # not an accepted container
        with pytest.raises(ImageError, match="not a readable"):
            decode_image(encode(source, fmt), max_pixels=10**6)
        return
    decoded = decode_image(encode(source, fmt, **params), max_pixels=10**6)
    assert decoded.mode == "RGB" and decoded.size == (37, 23)
    assert np.array_equal(np.asarray(decoded), np.asarray(source))


def test_jpeg_round_trip() -> None:
    source = Image.new("RGB", (64, 48), (200, 30, 90))
    data = encode(source, "JPEG", quality=95)
    decoded = decode_image(data, max_pixels=10**6)
    assert decoded.mode == "RGB" and decoded.size == (64, 48)
    assert np.abs(np.asarray(decoded).astype(int) - [200, 30, 90]).max() <= 4
    assert np.array_equal(np.asarray(decoded), reference_rgb(data))


def test_gif_first_frame_with_transparency() -> None:
    first = palette_transparent(40, 30)
    second = Image.new("P", (40, 30), 5)
    data = encode(first, "GIF", save_all=True, append_images=[second], transparency=3)
    decoded = decode_image(data, max_pixels=10**6)
    assert decoded.mode == "RGB" and decoded.size == (40, 30)
    assert np.array_equal(np.asarray(decoded), reference_rgb(data))
    assert not np.array_equal(np.asarray(decoded), np.asarray(second.convert("RGB")))


@pytest.mark.parametrize("make", [rgba, la, palette_transparent], ids=["RGBA", "LA", "P-transparency"])
def test_transparency_composited_onto_white(make: Callable[[int, int], Image.Image]) -> None:
    data = encode(make(32, 20), "PNG")
    decoded = np.asarray(decode_image(data, max_pixels=10**6))
    assert np.array_equal(decoded, reference_rgb(data))
    if make is not palette_transparent:
        assert (decoded[:10] == 255).all()  # the fully transparent half is white


def test_exif_orientation_applied() -> None:
    source = Image.new("RGB", (60, 20), (10, 120, 240))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    decoded = decode_image(encode(source, "JPEG", exif=exif), max_pixels=10**6)
    assert decoded.size == (20, 60)


@pytest.mark.parametrize(
    "data", [b"", b"not an image at all", bytes(range(256)) * 8, b"\x89PNG\r\n\x1a\n" + b"\0" * 40]
)
def test_garbage_refused(data: bytes) -> None:
    with pytest.raises(ImageError) as info:
        decode_image(data, max_pixels=10**6)
    assert "\n" not in str(info.value) and str(info.value)


def test_truncated_png_refused() -> None:
    data = encode(rgb(120, 90), "PNG")
    with pytest.raises(ImageError, match="cannot be decoded|cannot be read"):
        decode_image(data[: len(data) // 2], max_pixels=10**6)


def test_too_many_pixels_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode(Image.new("L", (5000, 5000), 128), "PNG")
    assert len(data) < 200_000  # small file, big image

    def must_not_decode(self: Image.Image, *args: Any, **kwargs: Any) -> Any:
        pytest.fail("pixels were decoded before the size check")

    monkeypatch.setattr(ImageFile.ImageFile, "load", must_not_decode)
    monkeypatch.setattr(Image.Image, "load", must_not_decode)
    with pytest.raises(ImageError, match="5000x5000 = 25000000 pixels, over the limit of 16777216"):
        decode_image(data, max_pixels=4096 * 4096)


def test_decompression_bomb_is_an_image_error(monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode(Image.new("L", (100, 100), 1), "PNG")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 10000 px > 2 * limit: Pillow raises
    with pytest.raises(ImageError, match="too large"):
        decode_image(data, max_pixels=10**6)


@pytest.mark.filterwarnings("error::PIL.Image.DecompressionBombWarning")
def test_decompression_bomb_warning_as_error_is_an_image_error(monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode(Image.new("L", (100, 100), 1), "PNG")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 6000)  # limit < 10000 px <= 2 * limit: Pillow warns
    with pytest.raises(ImageError, match="too large"):
        decode_image(data, max_pixels=10**6)


def test_decoded_image_feeds_prepare(reference: Any) -> None:
    data = encode(rgba(150, 90), "PNG")
    decoded = decode_image(data, max_pixels=10**6)
    got = prepare_image(decoded, REAL)
    with Image.open(io.BytesIO(data)) as raw:
        want_pixels, want_grid = reference_output(reference, raw, REAL)
    assert torch.equal(got.patches, want_pixels) and got.grid == tuple(want_grid[0].tolist())


# --------------------------------------------------------------------------------------------------------------------
# digest


def test_digest_tracks_content() -> None:
    pixels = noise(200, 150)
    first: PreparedImage = prepare_image(Image.fromarray(pixels), REAL)
    again = prepare_image(Image.fromarray(pixels.copy()), REAL)
    assert len(first.digest) == 16 and first.digest == again.digest

    changed = pixels.copy()
    changed[75, 100, 1] ^= 1
    assert prepare_image(Image.fromarray(changed), REAL).digest != first.digest
    # same pixels, different geometry: different patches, different digest
    assert prepare_image(Image.fromarray(pixels), ProcessorSpec(max_tokens=20)).digest != first.digest
