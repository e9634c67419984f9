"""`engine serve`'s configuration: one frozen `EngineConfig`, built once from the command line.

The flags are the one channel from the recipe (config/settings.yaml names each setting's flag); no setting reaches
the engine through the environment. The scheduler, the executor, pool sizing, the lanes and the ranks' settings
fingerprint all read this object. Exit codes and the machine-readable refusal line a rank prints when the window
does not fit live here too, so the recipe and the engine share one definition.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

EXIT_USAGE = 2  # a flag the engine cannot use (named on stderr)
EXIT_REFUSED = 3  # the ranks were started with different settings
EXIT_WINDOW = 4  # the window does not fit; stderr holds a WINDOW_LINE with the largest that does
WINDOW_LINE = "window-does-not-fit: "  # followed by JSON: {"context": asked, "largest_window": fits, ...}
DEFAULT_RESERVE_GIB = {"cpu": 1.0, "cuda": 4.0}  # memory left to the system when --memory-reserve-gib is not given
# mtp: the checkpoint's multi-token-prediction layer; mtp+copy: per lane and step, a copy match filling the window
# wins, else the MTP layer (copy alone when the checkpoint has no MTP layer)
DRAFTERS = ("none", "copy", "mtp", "mtp+copy")
DENSE_MODES = ("bf16", "q4", "fp8")  # how the dense weights are kept (engine/quant/dense.py)
# the cached attention row type (engine/cache.py `KV_DTYPES`), and the words `engine info` names it with
KV_ROW_TYPES = {"bf16": "bf16", "fp8": "fp8 e4m3 and an fp32 scale per row", "fp32": "fp32"}
KV_MODES = tuple(KV_ROW_TYPES)
MAX_DRAFT_TOKENS = 7  # a verify window holds at most 8 rows a lane
# rows of a step whose bits stay each row's own: lanes × verify window (engine/ops/reference.py ROW_INVARIANT_ROWS)
MAX_STEP_ROWS = 64


def switch(text: str) -> bool:
    if text not in ("0", "1", "on", "off"):
        raise argparse.ArgumentTypeError(f"{text!r} is not 0/1 (or on/off)")
    return text in ("1", "on")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`engine serve`'s flags: every field of EngineConfig, nothing else."""
    p.add_argument("checkpoint", help="checkpoint directory (config.json, safetensors, tokenizer.json)")
    p.add_argument("--tp", type=int, default=1, help="ranks in all (tensor-parallel world size)")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--master", default="127.0.0.1:29551", help="ADDR[:PORT] where rank 0 meets the others")
    p.add_argument("--host", default="127.0.0.1", help="API bind address (rank 0)")
    p.add_argument("--port", type=int, default=8888, help="API port (rank 0)")
    p.add_argument("--name", default="GLM-5.3-Flash", help="model id the API reports and requests name")
    p.add_argument("--parallel", type=int, default=4, help="requests decoded at once (lanes)")
    p.add_argument("--context", type=int, default=8192, help="prompt + reply window per request; 0 = largest fit")
    p.add_argument("--max-tokens", type=int, default=1024, help="reply budget when a request sets none")
    p.add_argument("--kv", choices=KV_MODES, default="bf16", help="cached attention row type")
    p.add_argument(
        "--dense",
        choices=DENSE_MODES,
        default="bf16",
        help="how the dense (non-expert) weights are kept: bf16 as loaded, q4 or fp8 quantised at load",
    )
    p.add_argument("--kv-pool-gib", type=float, default=0.0, help="cap of the cache pool in GiB per rank (0 = none)")
    p.add_argument(
        "--memory-reserve-gib",
        type=float,
        default=None,
        help="memory left free for the system (default: 1 GiB on the CPU, 4 GiB on a GPU)",
    )
    p.add_argument(
        "--max-queued", type=int, default=16, help="requests that may wait beyond the lanes; more get 429 + Retry-After"
    )
    p.add_argument("--prefill-chunk", type=int, default=128, help="prompt tokens per prefill step")
    p.add_argument("--thinking", type=switch, default=True, help="replies think first unless a request says (1/0)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--keepalive-s", type=float, default=15.0, help="SSE keep-alive comment after this silence")
    p.add_argument(
        "--peer-timeout-s",
        type=float,
        default=30.0,
        help="a rank silent this long (no heartbeat) ends the run; /health is 503 after 3 s of silence",
    )
    p.add_argument(
        "--cuda-graphs",
        type=switch,
        default=True,
        help="replay decode steps (and rank 0's sampling passes) from CUDA graphs on a GPU (1/0; every rank must agree)",
    )
    p.add_argument(
        "--kda-chunked",
        type=switch,
        default=True,
        help="KDA prompt chunks in chunked form (fla-core on a GPU); 0: token by token (every rank agrees)",
    )
    p.add_argument(
        "--drafter",
        choices=DRAFTERS,
        default="none",
        help="speculative drafts, verified exactly: mtp (the checkpoint's MTP layer), copy (prompt lookup), "
        "mtp+copy (either, per lane and step), or none",
    )
    p.add_argument("--draft-tokens", type=int, default=3, help="most drafts a lane verifies per step (0-7)")
    p.add_argument(
        "--prompt-reuse",
        type=switch,
        default=True,
        help="resume requests from kept prompt states (same reply, fewer tokens prefilled) (1/0)",
    )
    p.add_argument(
        "--prompt-reuse-gib",
        type=float,
        default=4.0,
        help="cap of the kept prompt states' KDA snapshots in GiB per rank (their rows live in the pool)",
    )
    p.add_argument(
        "--vision",
        type=switch,
        default=False,
        help="take images in chat requests through the checkpoint's vision tower (rank 0 runs it) (1/0)",
    )
    p.add_argument(
        "--vision-urls",
        type=switch,
        default=False,
        help="fetch https image URLs (public addresses only, no redirects) as well as data: URLs (1/0)",
    )
    p.add_argument("--vision-max-images", type=int, default=8, help="images one request may hold")
    p.add_argument("--vision-max-mb", type=float, default=20.0, help="bytes of one image as sent, in MiB")
    p.add_argument(
        "--vision-max-pixels", type=int, default=40_000_000, help="pixels (width x height) of one image as sent"
    )
    p.add_argument("--vision-max-videos", type=int, default=4, help="videos one request may hold (0: none)")
    p.add_argument("--vision-max-frames", type=int, default=128, help="frames sampled from one video at most")
    p.add_argument(
        "--vision-video-tokens", type=int, default=16384, help="prompt tokens one video's frames may take together"
    )
    p.add_argument("--api-key-file", default=None, help="file holding the API key (or set SPARKS_API_KEY)")


@dataclass(frozen=True)
class EngineConfig:
    checkpoint: str
    tp: int = 1
    rank: int = 0
    master: str = "127.0.0.1:29551"
    host: str = "127.0.0.1"
    port: int = 8888
    name: str = "GLM-5.3-Flash"
    parallel: int = 4
    context: int = 8192
    max_tokens: int = 1024
    kv: str = "bf16"
    dense: str = "bf16"
    kv_pool_gib: float = 0.0
    memory_reserve_gib: float | None = None
    max_queued: int = 16
    prefill_chunk: int = 128
    thinking: bool = True
    device: str = "auto"
    keepalive_s: float = 15.0
    peer_timeout_s: float = 30.0
    cuda_graphs: bool = True
    kda_chunked: bool = True
    drafter: str = "none"
    draft_tokens: int = 3
    prompt_reuse: bool = True
    prompt_reuse_gib: float = 4.0
    vision: bool = False
    vision_urls: bool = False
    vision_max_images: int = 8
    vision_max_mb: float = 20.0
    vision_max_pixels: int = 40_000_000
    vision_max_videos: int = 4
    vision_max_frames: int = 128
    vision_video_tokens: int = 16384
    api_key_file: str | None = None

    # What every rank must share (the others are per rank: its address, port, device, secrets, local timeouts).
    SHARED = (
        "tp",
        "parallel",
        "context",
        "max_tokens",
        "kv",
        "dense",
        "kv_pool_gib",
        "prefill_chunk",
        "name",
        "thinking",
        "cuda_graphs",
        "kda_chunked",
        "drafter",
        "draft_tokens",
        "prompt_reuse",
        "prompt_reuse_gib",
    )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineConfig:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    @classmethod
    def parse(cls, argv: list[str]) -> EngineConfig:
        parser = argparse.ArgumentParser(prog="python -m engine serve")
        add_arguments(parser)
        return cls.from_args(parser.parse_args(argv))

    def problems(self) -> list[str]:
        """Values no rank can run with, each as one line naming the flag."""
        out = [
            f"{flag} must be at least 1 (got {value})"
            for flag, value in (
                ("--tp", self.tp),
                ("--parallel", self.parallel),
                ("--max-tokens", self.max_tokens),
                ("--prefill-chunk", self.prefill_chunk),
            )
            if value < 1
        ]
        if not 0 <= self.rank < max(self.tp, 1):
            out.append(f"--rank {self.rank} is outside 0..{self.tp - 1}")
        if not 0 <= self.draft_tokens <= MAX_DRAFT_TOKENS:
            out.append(f"--draft-tokens must be 0..{MAX_DRAFT_TOKENS} (got {self.draft_tokens})")
        if self.drafter not in DRAFTERS:
            out.append(f"--drafter must be one of {', '.join(DRAFTERS)} (got {self.drafter})")
        elif self.drafting and self.parallel * self.verify_window > MAX_STEP_ROWS:
            out.append(
                f"--parallel {self.parallel} with --draft-tokens {self.draft_tokens} verifies up to "
                f"{self.parallel * self.verify_window} rows a step, more than the {MAX_STEP_ROWS} whose bits stay "
                "each row's own (drafted replies would not equal serial ones): lower --draft-tokens to "
                f"{max(MAX_STEP_ROWS // self.parallel - 1, 0)} or --parallel to {MAX_STEP_ROWS // self.verify_window}, "
                "or pass --drafter none"
            )
        if not 0 <= self.prompt_reuse_gib <= 1024:
            out.append(f"--prompt-reuse-gib must be 0..1024 (got {self.prompt_reuse_gib:g})")
        if self.vision_urls and not self.vision:
            out.append("--vision-urls 1 fetches images, but --vision 0 takes none (pass --vision 1 too)")
        if self.vision_max_images < 1 or self.vision_max_pixels < 1:
            out.append(
                f"--vision-max-images and --vision-max-pixels must be at least 1 (got {self.vision_max_images}, "
                f"{self.vision_max_pixels})"
            )
        if self.vision_max_videos < 0 or self.vision_max_frames < 2 or not 16 <= self.vision_video_tokens <= 240_000:
            out.append(
                "--vision-max-videos must be at least 0, --vision-max-frames at least 2 and --vision-video-tokens "
                f"in [16, 240000] (got {self.vision_max_videos}, {self.vision_max_frames}, {self.vision_video_tokens})"
            )
        elif self.vision_video_tokens < (self.vision_max_frames + 1) // 2:
            out.append(
                f"--vision-video-tokens {self.vision_video_tokens} cannot give each of the "
                f"{(self.vision_max_frames + 1) // 2} frame pairs of --vision-max-frames {self.vision_max_frames} "
                "one token (raise it, or lower --vision-max-frames)"
            )
        if not 0 < self.vision_max_mb <= 1024:
            out.append(f"--vision-max-mb must be in (0, 1024] (got {self.vision_max_mb:g})")
        if self.context < 0:
            out.append(f"--context must be 0 (the largest that fits) or a positive window (got {self.context})")
        return out

    @property
    def drafting(self) -> bool:
        return self.drafter != "none" and self.draft_tokens > 0

    @property
    def drafts_with_mtp(self) -> bool:
        """Whether the MTP layer is loaded to draft (DRAFTER mtp or mtp+copy)."""
        return self.drafting and "mtp" in self.drafter

    @property
    def verify_window(self) -> int:
        """Rows a lane may have in one step: its pending token and up to --draft-tokens drafts."""
        return 1 + self.draft_tokens if self.drafting else 1

    @property
    def master_addr(self) -> str:
        return self.master.partition(":")[0]

    @property
    def master_port(self) -> int:
        return int(self.master.partition(":")[2] or 29551)

    def reserve_gib(self, device: str) -> float:
        if self.memory_reserve_gib is not None:
            return self.memory_reserve_gib
        return DEFAULT_RESERVE_GIB["cpu" if device == "cpu" else "cuda"]

    def fingerprint(self) -> dict[str, Any]:
        """What the ranks compare before loading (parallel.check_same_settings): the shared fields and the
        checkpoint's config.json digest."""
        config = Path(self.checkpoint, "config.json")
        digest = hashlib.sha256(config.read_bytes()).hexdigest()[:16] if config.exists() else "missing"
        mine = asdict(self)
        return {"checkpoint_config": digest, **{key: mine[key] for key in self.SHARED}}


def window_refusal(context: int, largest: int, **detail: Any) -> str:
    """The line a rank prints (then exits EXIT_WINDOW) when `context` does not fit; the recipe reads it back with
    `read_window_refusal` and starts again with the largest window from its settings."""
    return WINDOW_LINE + json.dumps({"context": context, "largest_window": largest, **detail})


def read_window_refusal(text: str) -> int | None:
    """The largest window named by a WINDOW_LINE in a rank's output, or None."""
    for line in text.splitlines():
        if WINDOW_LINE in line:
            try:
                return int(json.loads(line.split(WINDOW_LINE, 1)[1])["largest_window"])
            except (ValueError, KeyError, TypeError):
                return None
    return None
