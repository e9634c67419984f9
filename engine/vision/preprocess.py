"""Image bytes -> vision-tower input: decode, fit to an aligned canvas, normalise, cut into patches.

The numerical reference is transformers' PIL image processor for glm5_next (`Glm5NextImageProcessorPil`); for the same
PIL image and the same patch / merge / token-budget settings, `prepare_image` returns the same `pixel_values` and
`image_grid_thw`, bit for bit. The pipeline, step by step:

1. RGB: an image with an alpha band (or a `transparency` entry, as palette and tRNS images carry) is composited onto
   opaque white, anything else goes through Pillow's `convert("RGB")` (L, P, CMYK, I;16, ...).
2. Canvas: the smallest multiple of `patch_size * merge_size` on each side that holds the image; an image under the
   minimum token budget is scaled up to it, one over the maximum is cut down by a binary search on its height.
3. Resize (only when the image is too big for the canvas, or below the minimum) with Pillow's bicubic filter, keeping
   the aspect ratio; the rest of the canvas (right and bottom) is zero-filled in 8-bit space, so after the next step
   padding holds (0 - mean) / std, as in the reference.
4. Every 8-bit value becomes `float32(v * (1/255))` (computed in float64, then rounded), then `(x - mean) / std` in
   float32 with the OpenAI CLIP mean / std. Both steps are a 256-entry table per channel, built with the same float
   operations as the reference, so the result is exact.
5. Patches: rows walk merge blocks (block row, block col, then the merge_size x merge_size patches inside one block);
   each row is channel, temporal copy (the single frame repeated `temporal_patch_size` times), patch row, patch col.

The engine never imports transformers; the tests compare against it.
"""

from __future__ import annotations

import hashlib
import io
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps

__all__ = ["ImageError", "PreparedImage", "ProcessorSpec", "decode_image", "image_tokens", "prepare_image"]

# OpenAI CLIP normalisation constants (the values transformers calls OPENAI_CLIP_MEAN / OPENAI_CLIP_STD).
CLIP_MEAN: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)

# Container formats decode_image accepts (Pillow's JPEG opener also yields MPO, as many camera / phone JPEGs are).
ACCEPTED_FORMATS: tuple[str, ...] = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


class ImageError(ValueError):
    """An image the server refuses or cannot read; str(exc) is a one-line message fit for an HTTP 400 body."""


@dataclass(frozen=True)
class ProcessorSpec:
    """The vision tower's patch geometry and the per-image token budget."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    in_channels: int = 3
    min_tokens: int = 16
    max_tokens: int = 8000

    def __post_init__(self) -> None:
        for name in ("patch_size", "temporal_patch_size", "merge_size", "min_tokens", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ProcessorSpec.{name} must be a positive int, got {value!r}")
        if self.in_channels != 3:
            raise ValueError(f"ProcessorSpec.in_channels must be 3 (RGB input), got {self.in_channels!r}")

    @classmethod
    def from_config(cls, vision_config: dict[str, Any], max_tokens: int | None = None) -> ProcessorSpec:
        """From a checkpoint's config.json `vision_config` (patch_size, temporal_patch_size, spatial_merge_size,
        in_channels); `max_tokens` lowers the per-image token budget (a server limit)."""
        base = cls()
        budget = base.max_tokens if max_tokens is None else min(base.max_tokens, int(max_tokens))
        return cls(
            patch_size=int(vision_config.get("patch_size", base.patch_size)),
            temporal_patch_size=int(vision_config.get("temporal_patch_size", base.temporal_patch_size)),
            merge_size=int(vision_config.get("spatial_merge_size", base.merge_size)),
            in_channels=int(vision_config.get("in_channels", base.in_channels)),
            min_tokens=base.min_tokens,
            max_tokens=budget,
        )

    @property
    def factor(self) -> int:
        """Canvas sides are multiples of this: one merge block, in pixels."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Width of one row of `PreparedImage.patches`."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


@dataclass(frozen=True)
class PreparedImage:
    """One image (or one frame pair of a video, engine/vision/video.py), ready for the vision tower: its 8-bit canvas
    (resized and padded), normalised and patchified only when the tower runs — a waiting request holds an eighth of
    the bytes the float patches take."""

    # uint8, the padding zero bytes: [3, grid_h * patch_size, grid_w * patch_size] for a still image (repeated along
    # time), [temporal_patch_size, 3, ...] for a video's frame pair
    canvas: torch.Tensor
    grid: tuple[int, int, int]  # (1, grid_h, grid_w) in patches
    tokens: int  # LM rows this image becomes: grid_h * grid_w // merge_size**2
    digest: bytes  # blake2b (16 bytes) of the canvas's bytes, its shape and the grid
    spec: ProcessorSpec

    @property
    def patches(self) -> torch.Tensor:
        """float32 [grid_h * grid_w, in_channels * temporal_patch_size * patch_size**2]: the tower's input (made on
        each call)."""
        levels = self.canvas.numpy()
        table = _LEVELS if levels.ndim == 3 else _VIDEO_LEVELS  # the two reference processors normalise differently
        normalised = np.empty(levels.shape, dtype=np.float32)
        for channel in range(3):
            normalised[..., channel, :, :] = table[channel][levels[..., channel, :, :]]
        return _patchify(normalised, self.spec)


# --------------------------------------------------------------------------------------------------------------------
# Geometry


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def _canvas_size(height: int, width: int, spec: ProcessorSpec, frames: int | None = None) -> tuple[int, int]:
    """(height, width) of the aligned canvas; the reference's smart_resize with num_frames = temporal_patch_size for
    an image, or a video's sampled frame count `frames` (always a multiple of temporal_patch_size here), the token
    budget then being the whole video's.

    Integer rounding stands in for the reference's float ceil/floor where the two provably agree (quotients of
    integers far below 2**53); the upscale for small images keeps the reference's float expression as written.
    """
    step = spec.factor
    frames = spec.temporal_patch_size if frames is None else frames  # a still image counts as one temporal patch
    if frames % spec.temporal_patch_size:
        raise ValueError(f"{frames} frames: a video's frame count must be a multiple of {spec.temporal_patch_size}")
    per_token = spec.temporal_patch_size * step * step  # pixels of one prompt token
    floor_pixels = spec.min_tokens * per_token
    ceiling_pixels = spec.max_tokens * per_token

    canvas_h = _round_up(height, step)
    canvas_w = _round_up(width, step)
    if frames * canvas_h * canvas_w < floor_pixels:
        grow = math.sqrt(floor_pixels / (frames * height * width))
        canvas_h = _round_up(max(1, math.ceil(height * grow)), step)
        canvas_w = _round_up(max(1, math.ceil(width * grow)), step)
    if frames * canvas_h * canvas_w <= ceiling_pixels:
        return canvas_h, canvas_w

    # Over budget: binary-search the tallest content height whose aligned canvas fits (a budget under one block per
    # frame cannot; the reference raises then too).
    if ceiling_pixels < frames * step * step:
        raise ImageError(
            f"{frames} frames need at least {frames // spec.temporal_patch_size} prompt tokens, over the budget of "
            f"{spec.max_tokens}"
        )
    best_h, best_w = step, step
    low, high = 1, height
    while low <= high:
        trial_h = (low + high) // 2
        trial_w = max(1, (width * trial_h) // height)
        aligned_h, aligned_w = _round_up(trial_h, step), _round_up(trial_w, step)
        if frames * aligned_h * aligned_w <= ceiling_pixels:
            best_h, best_w = aligned_h, aligned_w
            low = trial_h + 1
        else:
            high = trial_h - 1
    return best_h, best_w


def _content_size(
    height: int, width: int, canvas_h: int, canvas_w: int, spec: ProcessorSpec, frames: int | None = None
) -> tuple[int, int]:
    """(height, width) the image (each frame of a video of `frames` frames) is resized to inside its canvas (the rest
    is padding).

    Float arithmetic on purpose: `height * (canvas_h / height)` may land a hair under canvas_h, and the reference
    floors that, so this must too.
    """
    scale = min(canvas_h / height, canvas_w / width)
    step = spec.factor
    per_token = spec.temporal_patch_size * step * step
    frames = spec.temporal_patch_size if frames is None else frames
    if frames * height * width >= per_token * spec.min_tokens:
        scale = min(1.0, scale)  # never enlarge an image that already meets the minimum budget
    content_h = max(1, min(canvas_h, math.floor(height * scale)))
    content_w = max(1, min(canvas_w, math.floor(width * scale)))
    return content_h, content_w


def image_grid(width: int, height: int, spec: ProcessorSpec) -> tuple[int, int, int]:
    """(1, rows, columns) of patches an image of this size becomes (no pixels needed)."""
    if width < 1 or height < 1:
        raise ImageError(f"image has no pixels ({width}x{height})")
    canvas_h, canvas_w = _canvas_size(height, width, spec)
    return 1, canvas_h // spec.patch_size, canvas_w // spec.patch_size


def image_tokens(width: int, height: int, spec: ProcessorSpec) -> int:
    """LM rows an image of this size becomes (no pixels needed)."""
    _, rows, columns = image_grid(width, height, spec)
    return rows * columns // spec.merge_size**2


# --------------------------------------------------------------------------------------------------------------------
# Pixels


def _rgb(image: Image.Image) -> Image.Image:
    """RGB the reference's way: transparent pixels are composited onto white, everything else is plainly converted."""
    transparent = "A" in image.getbands() or image.info.get("transparency") is not None
    if not transparent:
        return image if image.mode == "RGB" else image.convert("RGB")
    rgba = image.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def _level_table() -> np.ndarray:
    """float32 [3, 256]: the normalised value of each 8-bit level, per channel, with the reference's float steps."""
    scaled = (np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32)
    mean = np.asarray(CLIP_MEAN, dtype=np.float32)[:, None]
    std = np.asarray(CLIP_STD, dtype=np.float32)[:, None]
    table: np.ndarray = (scaled[None, :] - mean) / std
    assert table.dtype == np.float32
    return table


_LEVELS = _level_table()


def _video_level_table() -> torch.Tensor:
    """float32 [3, 256] for video frames: the reference video processor folds the 1/255 rescale into the mean and std
    (each times 255 in float32) and normalises the 8-bit values as floats; the same operations, in torch."""
    mean = torch.tensor(CLIP_MEAN) * (1.0 / (1 / 255.0))
    std = torch.tensor(CLIP_STD) * (1.0 / (1 / 255.0))
    return (torch.arange(256, dtype=torch.float32)[None, :] - mean[:, None]) / std[:, None]


_VIDEO_LEVELS = _video_level_table().numpy()


def _patchify(canvas: np.ndarray, spec: ProcessorSpec) -> torch.Tensor:
    """[C, H, W] (a still frame, repeated along time) or [T, C, H, W] (a frame pair) float32 -> [grid_h * grid_w,
    C * T * P * P] in merge-block order (see the module docstring)."""
    p, m, t = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    frames = torch.from_numpy(canvas)
    if frames.dim() == 3:
        frames = frames.unsqueeze(0).expand(t, -1, -1, -1)
    _, channels, height, width = frames.shape
    grid_h, grid_w = height // p, width // p
    blocks = frames.reshape(t, channels, grid_h // m, m, p, grid_w // m, m, p)
    # -> (block row, block col, row in block, col in block, channel, time, patch row, patch col)
    blocks = blocks.permute(2, 5, 3, 6, 1, 0, 4, 7)
    return blocks.reshape(grid_h * grid_w, channels * t * p * p).contiguous()


def _digest(canvas: np.ndarray, grid: tuple[int, int, int]) -> bytes:
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(struct.pack(f"<{canvas.ndim + 3}q", *canvas.shape, *grid))
    hasher.update(canvas.tobytes())
    return hasher.digest()


def prepare_image(image: Image.Image, spec: ProcessorSpec) -> PreparedImage:
    """Resize to the aligned canvas (same arithmetic as smart_resize with num_frames = temporal_patch_size and
    factor = patch_size * merge_size), PIL bicubic, zero-pad right/bottom, rescale, normalise with the CLIP mean/std,
    patchify in the reference's order. Equal, bit for bit, to the reference's pixel_values and image_grid_thw for the
    same PIL image and the same patch/merge/min/max settings."""
    try:
        rgb = _rgb(image)
    except (OSError, ValueError) as exc:
        raise ImageError(f"cannot convert a {image.mode} image to RGB: {_one_line(exc)}") from None
    width, height = rgb.size
    if width < 1 or height < 1:
        raise ImageError(f"image has no pixels ({width}x{height})")

    canvas_h, canvas_w = _canvas_size(height, width, spec)
    content_h, content_w = _content_size(height, width, canvas_h, canvas_w, spec)
    if (content_h, content_w) != (height, width):
        rgb = rgb.resize((content_w, content_h), resample=Image.Resampling.BICUBIC)
    pixels = np.asarray(rgb, dtype=np.uint8)  # [content_h, content_w, 3]

    canvas = np.zeros((3, canvas_h, canvas_w), dtype=np.uint8)  # padding: zero bytes, normalised like any other
    canvas[:, :content_h, :content_w] = pixels.transpose(2, 0, 1)
    grid = (1, canvas_h // spec.patch_size, canvas_w // spec.patch_size)
    tokens = grid[1] * grid[2] // spec.merge_size**2
    return PreparedImage(torch.from_numpy(canvas), grid, tokens, _digest(canvas, grid), spec)


# --------------------------------------------------------------------------------------------------------------------
# Decoding


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] if text else type(exc).__name__


def decode_image(data: bytes, max_pixels: int) -> Image.Image:
    """Decode PNG / JPEG / WebP / GIF (first frame) / BMP bytes into an RGB image.

    The size is checked from the header, before any pixel is decoded: an image over `max_pixels` (width * height) is
    refused, as is anything Pillow cannot identify or decode (including its own decompression-bomb error, or its
    warning where warnings are errors). The EXIF orientation is applied (as transformers' `load_image` does), then
    the image is converted to RGB the reference processor's way (transparency composited onto white).
    """
    if not data:
        raise ImageError("image data is empty")
    try:
        image = Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"image is too large: {_one_line(exc)}") from None
    except Image.UnidentifiedImageError:
        raise ImageError("image is not a readable PNG, JPEG, WebP, GIF or BMP file") from None
    except Exception as exc:  # malformed headers raise all sorts (SyntaxError, struct.error, ...)
        raise ImageError(f"image header cannot be read: {_one_line(exc)}") from None

    with image:
        kind = image.format or "image"
        width, height = image.size
        if width < 1 or height < 1:
            raise ImageError(f"{kind} image has no pixels ({width}x{height})")
        if width * height > max_pixels:
            raise ImageError(
                f"{kind} image is {width}x{height} = {width * height} pixels, over the limit of {max_pixels}"
            )
        try:
            image.load()  # the first frame, for animations
            ImageOps.exif_transpose(image, in_place=True)
            rgb = _rgb(image)
            return rgb.copy() if rgb is image else rgb  # a copy, as closing the file releases the original's pixels
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise ImageError(f"image is too large: {_one_line(exc)}") from None
        except Exception as exc:  # truncated or corrupt data: OSError, ValueError, SyntaxError, EOFError, ...
            raise ImageError(f"{kind} image cannot be decoded: {_one_line(exc)}") from None
