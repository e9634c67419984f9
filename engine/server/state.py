"""What every route needs: the tokenizer, the template, the scheduler, the served limits and defaults."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.scheduler import Scheduler
from engine.server.metrics import Metrics
from engine.structured import Grammars


@dataclass
class ServerState:
    name: str
    tokenizer: Any  # tokenizers.Tokenizer
    template: str  # chat template source (jinja)
    scheduler: Scheduler
    context: int  # window per request: prompt + reply tokens
    max_tokens: int  # reply limit when a request names none
    eos_ids: frozenset[int]
    thinking: bool = True  # default for chat requests
    temperature: float = 1.0  # generation_config.json defaults
    top_p: float = 1.0
    top_k: int = 0
    api_key: str | None = None
    keepalive_s: float = 15.0
    body_limit: int = 32 * 2**20
    metrics: Metrics = field(default_factory=Metrics)
    started: float = field(default_factory=time.time)
    stopped_reason: str | None = None  # set when the engine can no longer serve (a rank died)
    peers: Any = None  # engine.peer_watch.PeerWatch with several ranks: silent ranks
    weights: str = "fp32"  # element type the dense weights are held in (fp32 on the CPU, bf16 on GPUs)
    memory: dict[str, Any] = field(default_factory=dict)  # rank 0's bytes by kind (engine/footprint.py)
    vision: Any = None  # engine.server.images.VisionService with --vision 1 (None: image parts get a 400)
    grammars: Grammars = field(init=False)  # structured outputs' compiler (built on the first request with a format)

    def __post_init__(self) -> None:
        self.grammars = Grammars(self.tokenizer)

    def trouble(self) -> str | None:
        """Why the engine cannot serve right now (None when it can): stopped, or a rank silent for seconds."""
        stopped = self.stopped_reason or self.scheduler.stats().get("broken")
        if stopped:
            return stopped if stopped.startswith("the engine") else f"the engine stopped: {stopped}"
        return self.peers.describe() if self.peers is not None else None

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def token_id(self, text: str) -> int | None:
        found = self.tokenizer.token_to_id(text)
        return None if found is None else int(found)
