"""The vision tower's time per image (and the processor's, on the CPU): `python bench/vision_bench.py --config real
--device cuda` (GLM-5.3-Flash's tower at its real width, random bf16 weights) or `--config demo --device cpu` (the
trained demo's tower, as the embedded default runs it). Prints a table and writes JSON with --out.

`--videos`: also clips (H.264 MP4 made here with PyAV, smooth moving gradients) through the whole video path:
decoding, sampling at 2 frames a second, fitting the frames to the canvas (CPU: `decode_ms`), then the tower over all
frame pairs in one call (`ms`), under VISION_VIDEO_TOKENS' default budget (16,384).

Each size is the image as sent; the processor resizes it to its canvas (≤ 8,000 tokens), so the patches and the
rows follow from the size alone (engine/vision/preprocess.py `image_grid`). Times: median of --repeat calls after
two warm-up calls, synchronised.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from engine.checkpoint.layout import vision_tensors
from engine.models.glm5_next.vision import VisionConfig, VisionTower
from engine.vision.preprocess import ProcessorSpec, image_grid

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "real": ROOT / "engine/checkpoint/glm53_flash_config.json",
    "demo": ROOT / "engine/checkpoint/trained_demo/config.json",
}
SIZES = [(448, 448), (1024, 768), (1920, 1080), (3840, 2160)]


class RandomWeights:
    """A stand-in for the checkpoint reader: seeded random tensors of the tower's shapes (norms at one)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], device: torch.device, dtype: torch.dtype) -> None:
        self.shapes, self.device, self.dtype = shapes, device, dtype
        self.gen = torch.Generator().manual_seed(0)

    def get(self, name: str) -> torch.Tensor:
        shape = self.shapes[name]
        if "norm" in name and name.endswith(".weight"):
            value = torch.ones(shape)
        else:
            value = torch.randn(shape, generator=self.gen) / max(1, shape[-1]) ** 0.5
        return value.to(self.device, self.dtype)


def prepare_ms(width: int, height: int, spec: ProcessorSpec, repeat: int) -> float:
    """The processor's median time for a noise image of this size (resize, normalise, patchify; no decoding)."""
    import numpy as np
    from PIL import Image

    from engine.vision.preprocess import prepare_image

    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGB")
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        prepare_image(image, spec)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


CLIPS = [(10, 30, 1280, 720), (30, 30, 1280, 720), (60, 25, 640, 360)]  # seconds, fps, width, height


def make_clip(seconds: int, fps: int, width: int, height: int) -> bytes:
    """An H.264 MP4 of smooth gradients that move each frame (encoded here, in memory)."""
    import io

    import av
    import numpy as np

    ys, xs = np.mgrid[0:height, 0:width]
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as file:
        stream = file.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for k in range(seconds * fps):
            frame = np.stack([(xs + 3 * k) % 256, (ys + 2 * k) % 256, ((xs + ys) // 2 + k) % 256], axis=-1)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame.astype(np.uint8), format="rgb24")):
                file.mux(packet)
        for packet in stream.encode():
            file.mux(packet)
    return out.getvalue()


def video_rows(tower: VisionTower, spec: ProcessorSpec, device: torch.device, repeat: int) -> list[dict]:
    """Each clip decoded and prepared (CPU), then its frame pairs through the tower in one call."""
    import dataclasses

    from engine.vision.video import decode_video

    budget = dataclasses.replace(spec, max_tokens=16384)
    rows = []
    for seconds, fps, width, height in CLIPS:
        data = make_clip(seconds, fps, width, height)
        decode_times = []
        for _ in range(max(1, repeat // 2)):
            start = time.perf_counter()
            video = decode_video(data, 10**8, 128, budget)
            decode_times.append(time.perf_counter() - start)
        patches = torch.cat([pair.patches for pair in video.pairs]).to(device)
        grids = [pair.grid for pair in video.pairs]
        times = []
        for i in range(repeat + 2):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            tower.forward(patches, grids)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= 2:
                times.append(time.perf_counter() - start)
        row = dict(
            clip=f"{seconds}s {fps}fps {width}x{height}",
            bytes=len(data),
            frames=len(video.indices),
            pairs=len(video.pairs),
            grid=list(grids[0]),
            tokens=video.tokens,
            decode_ms=round(statistics.median(decode_times) * 1e3, 1),
            ms=round(statistics.median(times) * 1e3, 2),
        )
        rows.append(row)
        print(f"video {row}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", choices=sorted(CONFIGS), default="real")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--prepare", action="store_true", help="also time the processor (decoded image -> patches)")
    parser.add_argument("--videos", action="store_true", help="also time clips: decoding (CPU) and the tower")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = json.loads(CONFIGS[args.config].read_text())["vision_config"]
    cfg = VisionConfig.from_dict(config)
    shapes = {spec.name: tuple(spec.shape) for spec in vision_tensors({"vision_config": config})}
    tower = VisionTower(cfg, RandomWeights(shapes, device, dtype))  # type: ignore[arg-type]
    spec = ProcessorSpec.from_config(config)
    rows = []
    for width, height in SIZES:
        grid = image_grid(width, height, spec)
        patches = torch.randn(grid[1] * grid[2], cfg.patch_width).to(device)
        times = []
        for i in range(args.repeat + 2):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            tower.forward(patches, [grid])
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= 2:
                times.append(time.perf_counter() - start)
        tokens = grid[1] * grid[2] // spec.merge_size**2
        ms = statistics.median(times) * 1e3
        row = dict(size=f"{width}x{height}", patches=grid[1] * grid[2], tokens=tokens, ms=round(ms, 2))
        if args.prepare:
            row["prepare_ms"] = round(prepare_ms(width, height, spec, args.repeat), 2)
        rows.append(row)
        print(f"{width}x{height}: {grid[1] * grid[2]} patches -> {tokens} tokens: {ms:.1f} ms {row}", flush=True)
    videos = video_rows(tower, spec, device, args.repeat) if args.videos else []
    result = dict(
        config=args.config,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        dtype=str(dtype).replace("torch.", ""),
        tower_bytes=tower.nbytes,
        threads=torch.get_num_threads(),
        rows=rows,
        videos=videos,
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
