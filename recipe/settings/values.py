"""`Settings`: the effective value of every setting of config/settings.yaml, frozen, with where each came from.

Loading them is loader.py's job; the rules between them are validate.py's (which reads this type).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from recipe.settings.schema import REPO_ROOT, load_specs


def checkout_key(root: Path = REPO_ROOT) -> str:
    """A checkout's name among others on this machine: its folder's name and a hash of its path."""
    return f"{root.name}-{hashlib.sha256(str(root).encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class Settings:
    tp: int
    worker: str
    worker2: str
    fabric_peer: str
    fabric_peer2: str
    master_port: int
    model_id: str
    model_revision: str
    hf_cache: str
    hf_token: str = field(repr=False)
    served_name: str
    host: str
    port: int
    parallel: int
    context: int
    max_tokens: int
    kv: str
    dense: str
    drafter: str
    draft_tokens: int
    prefill_chunk: int
    prompt_reuse: bool
    prompt_reuse_gib: float
    thinking: bool
    vision: bool
    vision_urls: bool
    vision_max_images: int
    vision_max_mb: float
    vision_max_pixels: int
    vision_max_videos: int
    vision_max_frames: int
    vision_video_tokens: int
    kv_pool_gib: float
    memory_reserve_gib: float | None
    memory_warn_gib: float
    kda_chunked: bool
    cuda_graphs: bool
    image: str
    base_image: str
    image_offline: bool
    container_name: str
    docker_args: str
    runtime: str
    checkpoint: str
    cache_dir: str
    dry_run: bool
    wait_timeout: int
    log_dir: str
    log_keep: int
    peer_timeout_s: int
    stop_timeout: int
    foreground: bool
    api_key: str = field(repr=False)
    # Where each value came from ("default", "derived", ".env line 3", "scripts/local.sh line 7", "environment").
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)
    # Lines in .env / local.sh that set no known setting (probably typos); reported, then ignored.
    warnings: tuple[str, ...] = ()

    @property
    def effective_runtime(self) -> str:
        """`auto` resolved: Docker on Sparks (a worker is given), local processes otherwise."""
        if self.runtime != "auto":
            return self.runtime
        return "docker" if self.worker else "process"

    @property
    def workers(self) -> tuple[str, ...]:
        """ssh targets of ranks 1.. in rank order."""
        return tuple(w for w in (self.worker, self.worker2) if w)

    @property
    def run_dir(self) -> str:
        """Where this checkout's run is recorded (state, rank records, live logs, the API key file):
        LOG_DIR/run/<checkout>, so two checkouts sharing a LOG_DIR never act on each other's run."""
        return os.path.join(self.log_dir, "run", checkout_key())

    @property
    def legacy_run_dir(self) -> str:
        """Where runs were recorded before they were kept per checkout (LOG_DIR/run): still found by stop/status."""
        return os.path.join(self.log_dir, "run")

    @property
    def embedded(self) -> bool:
        """The embedded default: every rank a local process on this machine."""
        return self.effective_runtime == "process"

    def value(self, name: str) -> Any:
        return getattr(self, name.lower())

    def shown(self, name: str) -> str:
        """The value as printed: secrets masked."""
        spec = load_specs()[name]
        value = self.value(name)
        if spec.is_secret:
            return "(set, hidden)" if value else "(empty)"
        if isinstance(value, bool):
            return "1" if value else "0"
        return "" if value is None else str(value)


def field_names() -> list[str]:
    """Settings' value fields, upper-cased: must equal the names in config/settings.yaml."""
    return [f.name.upper() for f in fields(Settings) if f.name not in ("origins", "warnings")]
