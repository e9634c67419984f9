"""Liveness of the other ranks, independent of the step loop.

A collective only notices a rank that stopped answering (SIGSTOP, a frozen machine, a cable pulled without a reset)
when its timeout runs out, and a step can legitimately take long (a first kernel compile), so the collective
timeout cannot be short. Instead every rank beats a counter in the rendezvous store from its own thread every
`interval_s` (`store.add` on `alive/<rank>`, through its own client with a short timeout), and watches the
counters of the ranks it depends on: rank 0 watches every other rank, the others watch rank 0 (whose process hosts
the store: when it stops, their store calls time out, which counts as silence too).

- silent for `silent_s` (a few seconds): `describe()` names the rank and how long; rank 0's /health turns 503 and
  recovers if the beats come back;
- silent for `lost_s` (the PEER_TIMEOUT_S setting): `on_lost(rank, seconds)` is called once; serve then fails every
  request with a clean error and ends the process, so no rank waits out the collective timeout.

The thread only needs the GIL for a moment per beat (store calls release it), so a busy but healthy rank beats on.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("engine.peer_watch")


class PeerWatch:
    def __init__(
        self,
        store: Any,
        rank: int,
        world: int,
        *,
        on_lost: Callable[[int, float], None],
        interval_s: float = 0.5,
        silent_s: float = 3.0,
        lost_s: float = 30.0,
    ) -> None:
        self.store, self.rank = store, rank
        self.peers = [r for r in range(world) if r != rank] if rank == 0 else [0]
        self.on_lost = on_lost
        self.interval_s, self.silent_s, self.lost_s = interval_s, silent_s, max(lost_s, silent_s)
        now = time.monotonic()
        self._seen: dict[int, int] = {peer: -1 for peer in self.peers}
        self._heard: dict[int, float] = {peer: now for peer in self.peers}
        self._stop = threading.Event()
        self._fired = False

    @classmethod
    def connect(cls, addr: str, port: int, rank: int, world: int, **kwargs: Any) -> PeerWatch:
        """A watch with its own store client (short timeout: a frozen rank 0 makes beats fail fast, not hang)."""
        import torch.distributed as dist

        client = dist.TCPStore(addr, port, world, False, datetime.timedelta(seconds=2), wait_for_workers=False)
        return cls(client, rank, world, **kwargs)

    def start(self) -> PeerWatch:
        for name, step in (("peer-beat", self.beat), ("peer-check", self.check)):
            threading.Thread(target=self._loop, args=(step,), name=name, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def silence(self) -> dict[int, float]:
        """Seconds since each watched rank's counter last moved."""
        now = time.monotonic()
        return {peer: now - heard for peer, heard in self._heard.items()}

    def describe(self) -> str | None:
        """'rank N has not answered for S s' for the longest-silent rank past `silent_s`, else None."""
        silent = {peer: s for peer, s in self.silence().items() if s >= self.silent_s}
        if not silent:
            return None
        peer = max(silent, key=lambda p: silent[p])
        return f"rank {peer} has not answered for {silent[peer]:.0f} s"

    def beat(self) -> None:
        """One beat and one look at the peers' counters (store I/O: may block while rank 0 is frozen)."""
        now = time.monotonic()
        try:
            self.store.add(f"alive/{self.rank}", 1)
            for peer in self.peers:
                count = int(self.store.add(f"alive/{peer}", 0))
                if count != self._seen[peer]:
                    self._seen[peer], self._heard[peer] = count, now
        except Exception as exc:  # the store's host (rank 0) does not answer: the silence grows
            log.debug("heartbeat: store did not answer (%s)", exc)

    def check(self) -> None:
        """Call `on_lost` (once) when a watched rank has been silent for `lost_s`. Runs in its own thread, apart
        from the beats: a store call to a frozen rank 0 can block for good, and must not hide the silence."""
        lost = {peer: s for peer, s in self.silence().items() if s >= self.lost_s}
        if lost and not self._fired:
            self._fired = True
            peer = max(lost, key=lambda p: lost[p])
            self.on_lost(peer, lost[peer])

    def _loop(self, step: Callable[[], None]) -> None:
        while not self._stop.is_set():
            step()
            self._stop.wait(self.interval_s)
