"""Video bytes -> frame pairs for the vision tower, prepared as transformers' glm5_next video processor prepares them.

The numerical reference is `Glm5NextVideoProcessor` given the decoded frames and their metadata (fps, frame count):
for the same frames, `decode_video` (or `prepare_frames`) gives the same `pixel_values_videos` (the pairs' patches, in order) and grid,
bit for bit, and the prompt markup its processor writes. Step by step:

1. Decode (PyAV, which bundles FFmpeg: MP4, WebM, MOV, MKV, ... whatever it reads). The first video stream; its
   frame count and average rate are the metadata (the duration is count / rate, as the reference's loaders give it).
2. Sample (`sample_indices`): about 2 frames a second, at most `max_frames` (VISION_MAX_FRAMES), by the reference's
   rule: a frame each time the clock passes the next half second, spread evenly over the clip when that gives too
   few or too many, duplicates dropped, the last repeated when the count is odd (the tower takes frames in pairs).
3. Canvas: the reference's smart_resize over all sampled frames at once: the video's whole token budget
   (VISION_VIDEO_TOKENS) is shared by its frame pairs, so a longer clip gets smaller frames.
4. Resize each frame (torch's bicubic, antialiased, on the 8-bit frame — what torchvision does on the CPU), zero-pad
   right and bottom, then per frame pair: normalise (the video processor's own float steps, preprocess.py) and
   patchify. Each pair is one `PreparedImage` with a 4-D canvas: the tower encodes it like an image of grid
   (1, h, w), as the reference's `get_video_features` does.
5. Markup (engine/server/images.py): the chat template writes `<|begin_of_video|><|video|><|end_of_video|>`; the
   `<|video|>` becomes, per pair, `<|begin_of_image|>` + one `<|image|>` per row + `<|end_of_image|>` and the pair's
   first frame's time, "{seconds:.1f} seconds".

Frames are resized as they are decoded, so a request holds its sampled frames at canvas size, never the whole clip.
The engine never imports transformers; the tests compare against it (where torchvision, which its video processor
needs, is installed).
"""

from __future__ import annotations

import functools
import hashlib
import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.vision.preprocess import (
    ImageError,
    PreparedImage,
    ProcessorSpec,
    _canvas_size,
    _content_size,
    _digest,
    _one_line,
)

__all__ = [
    "SAMPLE_FPS",
    "PreparedVideo",
    "VideoError",
    "decode_video",
    "prepare_frames",
    "sample_indices",
    "video_canvas",
]

SAMPLE_FPS = 2.0  # frames sampled per second of video (the reference processor's default)


class VideoError(ImageError):
    """A video the server refuses or cannot read; str(exc) is a one-line message fit for an HTTP 400 body."""


@dataclass(frozen=True)
class PreparedVideo:
    """One video, ready for the tower: its frame pairs (each a PreparedImage of grid (1, h, w)) and the time in
    seconds of each pair's first frame."""

    pairs: list[PreparedImage]
    seconds: list[float]
    indices: list[int]  # the sampled frames' indices in the clip (the last repeated when their count was odd)

    @property
    def tokens(self) -> int:
        """LM rows of its frames (the markup around them not counted)."""
        return sum(pair.tokens for pair in self.pairs)

    @functools.cached_property
    def digest(self) -> bytes:
        """The whole video's identity: every pair's pixels and time."""
        hasher = hashlib.blake2b(digest_size=16)
        for pair, seconds in zip(self.pairs, self.seconds):
            hasher.update(pair.digest + repr(seconds).encode())
        return hasher.digest()

    def pair_digest(self, index: int) -> bytes:
        """Pair `index`'s identity for kept states and seeds: of the whole video and the pair's place in it, since
        the tower encodes a video's pairs together."""
        return hashlib.blake2b(self.digest + index.to_bytes(4, "little"), digest_size=16).digest()


def sample_indices(total: int, fps: float, max_frames: int, per_second: float = SAMPLE_FPS) -> list[int]:
    """Which frames of a clip of `total` frames at `fps` the tower sees: the reference processor's sampling rule
    (module docstring, step 2), with its float arithmetic, so the same frames are chosen."""
    if total < 1 or not fps > 0:
        raise VideoError(f"video has no frames to sample ({total} frames at {fps:g} fps)")
    duration = total / fps
    whole_seconds = int(duration)
    want = min(int(duration * per_second), max_frames)
    if want < 1:
        raise VideoError(
            f"video lasts {duration:.2f} s: at {per_second:g} frames a second that samples no frame; "
            f"send a clip of at least {1 / per_second:g} s, or a still image as an image part"
        )
    if total < want:
        chosen = np.linspace(0, total - 1, want, dtype=int).tolist()
    else:
        chosen = []
        frame_time, next_time, step = 1 / fps, 0.0, 1 / per_second
        for index in range(total):
            if index * frame_time >= next_time:
                next_time += step
                chosen.append(index)
                if next_time >= whole_seconds:
                    break
    if len(chosen) < want:
        first, last = (chosen[0], chosen[-1]) if chosen else (0, total - 1)
        chosen = np.linspace(first, last, want, dtype=int).tolist()
    elif len(chosen) > want:
        chosen = np.linspace(0, total - 1, want, dtype=int).tolist()
    unique = list(dict.fromkeys(int(i) for i in chosen))
    if len(unique) % 2:
        unique.append(unique[-1])
    return unique


def video_canvas(frames: int, height: int, width: int, spec: ProcessorSpec) -> tuple[int, int, int, int]:
    """(canvas height, canvas width, content height, content width) for `frames` sampled frames of this size under
    the spec's (whole-video) token budget."""
    canvas_h, canvas_w = _canvas_size(height, width, spec, frames)
    content_h, content_w = _content_size(height, width, canvas_h, canvas_w, spec, frames)
    return canvas_h, canvas_w, content_h, content_w


def _fit(frame: np.ndarray, canvas: tuple[int, int, int, int]) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [3, canvas_h, canvas_w]: resized to the content size (bicubic, antialiased, on the
    8-bit values, as torchvision resizes a uint8 tensor on the CPU), zero-padded right and bottom."""
    canvas_h, canvas_w, content_h, content_w = canvas
    pixels = torch.from_numpy(frame).permute(2, 0, 1).unsqueeze(0).contiguous()
    if pixels.shape[-2:] != (content_h, content_w):
        pixels = torch.nn.functional.interpolate(
            pixels, size=[content_h, content_w], mode="bicubic", align_corners=False, antialias=True
        )
    out = np.zeros((3, canvas_h, canvas_w), dtype=np.uint8)
    out[:, :content_h, :content_w] = pixels[0].numpy()
    return out


def prepare_frames(frames: list[np.ndarray], indices: list[int], fps: float, spec: ProcessorSpec) -> PreparedVideo:
    """Sampled frames (uint8 [H, W, 3] each, one per entry of `indices`, all one size) -> frame pairs for the
    tower (`decode_video` does the same while decoding, a frame at a time)."""
    height, width = frames[0].shape[:2]
    canvas = video_canvas(len(frames), height, width, spec)
    return _pairs([_fit(frame, canvas) for frame in frames], indices, fps, spec)


def _pairs(fitted: list[np.ndarray], indices: list[int], fps: float, spec: ProcessorSpec) -> PreparedVideo:
    t = spec.temporal_patch_size
    if len(fitted) % t or len(fitted) != len(indices):
        raise ValueError(f"{len(fitted)} frames for {len(indices)} indices: pairs need a multiple of {t}")
    pairs: list[PreparedImage] = []
    for start in range(0, len(fitted), t):
        canvas = np.stack(fitted[start : start + t])  # [t, 3, H, W]
        grid = (1, canvas.shape[2] // spec.patch_size, canvas.shape[3] // spec.patch_size)
        tokens = grid[1] * grid[2] // spec.merge_size**2
        pairs.append(PreparedImage(torch.from_numpy(canvas), grid, tokens, _digest(canvas, grid), spec))
    seconds = [index / fps for index in indices][::t]
    return PreparedVideo(pairs, seconds, list(indices))


def decode_video(data: bytes, max_pixels: int, max_frames: int, spec: ProcessorSpec) -> PreparedVideo:
    """Decode a video's bytes (anything FFmpeg reads), sample its frames, and prepare them for the tower. Refused
    (VideoError, a one-line reason): no video stream, frames over `max_pixels` (width * height, from the stream's
    header, before decoding), no frame rate, a clip too short to sample, data FFmpeg cannot read."""
    import av  # PyAV: loaded with the first video, so a server that never sees one never loads FFmpeg

    if not data:
        raise VideoError("video data is empty")
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except Exception as exc:  # av.error.* (InvalidDataError, ...), and anything else the probe raises
        raise VideoError(f"video is not in a format this server reads: {_one_line(exc)}") from None
    with container:
        if not container.streams.video:
            raise VideoError("the file holds no video stream")
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        if width < 1 or height < 1:
            raise VideoError(f"video frames have no pixels ({width}x{height})")
        if width * height > max_pixels:
            raise VideoError(
                f"video frames are {width}x{height} = {width * height} pixels, over the limit of {max_pixels}"
            )
        rate = stream.average_rate
        fps = float(rate) if rate else 0.0
        if not fps > 0 or not math.isfinite(fps):
            raise VideoError("video stream states no frame rate")
        try:
            total = stream.frames or _count_frames(container, stream)
            indices = sample_indices(total, fps, max_frames)
            canvas = video_canvas(len(indices), height, width, spec)
            fitted = _decode_fitted(container, stream, indices, canvas, (height, width))
        except VideoError:
            raise
        except Exception as exc:  # corrupt or truncated streams: av errors, ValueError, ...
            raise VideoError(f"video cannot be decoded: {_one_line(exc)}") from None
    return _pairs(fitted, indices, fps, spec)


def _count_frames(container: Any, stream: Any) -> int:
    """Frames in a stream whose header does not say (WebM, some MKV): its packets, counted without decoding."""
    count = sum(1 for packet in container.demux(stream) if packet.size)
    container.seek(0)
    return count


def _decode_fitted(
    container: Any, stream: Any, indices: list[int], canvas: tuple[int, int, int, int], size: tuple[int, int]
) -> list[np.ndarray]:
    """The frames at `indices` (in order, repeats kept), each fitted to the canvas as it is decoded."""
    wanted = set(indices)
    fitted: dict[int, np.ndarray] = {}
    for index, frame in enumerate(container.decode(stream)):
        if index > indices[-1]:
            break
        if index in wanted:
            rgb = frame.to_ndarray(format="rgb24")
            if rgb.shape[:2] != size:
                raise VideoError(f"video frame {index} is {rgb.shape[1]}x{rgb.shape[0]}, not {size[1]}x{size[0]}")
            fitted[index] = _fit(rgb, canvas)
    missing = [i for i in indices if i not in fitted]
    if missing:
        raise VideoError(f"video ended before frame {missing[0]} (its header promised more frames)")
    return [fitted[i] for i in indices]
