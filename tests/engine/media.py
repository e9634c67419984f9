"""Small videos made with PyAV (FFmpeg's encoders) for the video tests: moving colour patterns, seeded."""

from __future__ import annotations

import io

import av
import numpy as np


def frames(count: int, width: int, height: int, seed: int = 0, noise: bool = True) -> list[np.ndarray]:
    """uint8 [height, width, 3] frames: gradients that shift a little each frame, plus seeded noise (without it, a
    big frame makes a small file)."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width]
    out = []
    for k in range(count):
        frame = np.stack(
            [(xs * 3 + k * 11 + seed * 40) % 256, (ys * 5 + k * 7) % 256, ((xs + ys) * 2 + k * 13) % 256], axis=-1
        )
        if noise:
            frame = frame + rng.integers(0, 24, size=frame.shape)
        out.append(np.clip(frame, 0, 255).astype(np.uint8))
    return out


def encode(
    pictures: list[np.ndarray], fps: int = 10, codec: str = "libx264", container: str = "mp4", audio: bool = False
) -> bytes:
    """The frames as a video file's bytes (yuv420p; even sizes for the H.264/VP9 encoders)."""
    height, width = pictures[0].shape[:2]
    out = io.BytesIO()
    with av.open(out, "w", format=container) as file:
        stream = file.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for picture in pictures:
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
                file.mux(packet)
        for packet in stream.encode():
            file.mux(packet)
    return out.getvalue()


def audio_only() -> bytes:
    """A file holding one short audio stream and no video."""
    out = io.BytesIO()
    with av.open(out, "w", format="wav") as file:
        stream = file.add_stream("pcm_s16le", rate=8000)
        samples = (np.sin(np.arange(8000) / 10.0) * 8000).astype(np.int16)[None, :]
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in stream.encode(frame):
            file.mux(packet)
        for packet in stream.encode():
            file.mux(packet)
    return out.getvalue()


def decode_all(data: bytes) -> tuple[np.ndarray, float]:
    """Every frame (uint8 [n, H, W, 3], as PyAV gives RGB) and the stream's average rate: what the reference
    processor is handed."""
    with av.open(io.BytesIO(data)) as file:
        stream = file.streams.video[0]
        pictures = [f.to_ndarray(format="rgb24") for f in file.decode(stream)]
        return np.stack(pictures), float(stream.average_rate)
