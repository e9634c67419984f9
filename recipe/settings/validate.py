"""Rules between settings (each value alone was already checked against its spec when parsed).

Every rule raises one `SettingError` naming the variables, the values and what to write.
"""

from __future__ import annotations

from recipe.errors import SettingError
from recipe.settings.values import Settings


def validate(settings: Settings) -> None:
    for rule in (_vision_urls, _video_budget, _ports, _workers_for_runtime, _distinct_workers, _fabric_peers):
        rule(settings)


def _origin(settings: Settings, name: str) -> str:
    origin = settings.origins.get(name, "default")
    return "" if origin in ("default", "derived") else f" (from {origin})"


def _vision_urls(s: Settings) -> None:
    if s.vision_urls and not s.vision:
        raise SettingError(
            f"VISION_URLS=1{_origin(s, 'VISION_URLS')} fetches images, but VISION=0 accepts none",
            "write VISION=1 too, or VISION_URLS=0",
        )


def _video_budget(s: Settings) -> None:
    pairs = (s.vision_max_frames + 1) // 2  # frames are read in pairs, an odd count padded by one
    if s.vision_video_tokens < pairs:
        raise SettingError(
            f"VISION_VIDEO_TOKENS={s.vision_video_tokens}{_origin(s, 'VISION_VIDEO_TOKENS')} cannot give each of "
            f"the {pairs} frame pairs VISION_MAX_FRAMES={s.vision_max_frames} allows one token",
            f"write VISION_VIDEO_TOKENS={pairs} or more, or a smaller VISION_MAX_FRAMES",
        )


def _ports(s: Settings) -> None:
    if s.port == s.master_port:
        raise SettingError(
            f"PORT and MASTER_PORT are both {s.port}{_origin(s, 'PORT')}; the API and the rank "
            "rendezvous need a port each",
            "write PORT=8888 and MASTER_PORT=29551 (or two other ports)",
        )


def _workers_for_runtime(s: Settings) -> None:
    if s.worker2 and not s.worker:
        raise SettingError(
            f"WORKER2={s.worker2}{_origin(s, 'WORKER2')} is set but WORKER is not; rank 1 runs on WORKER",
            "write WORKER=user@<second Spark> first",
        )
    if s.effective_runtime == "process" and not s.workers:
        return  # the embedded default: every rank a local process
    needed = s.tp - 1
    if len(s.workers) < needed:
        missing = "WORKER" if not s.worker else "WORKER2"
        raise SettingError(
            f"TP={s.tp}{_origin(s, 'TP')} needs {needed} worker(s), but {missing} is empty",
            f"write {missing}=user@<address of rank {len(s.workers) + 1}> in scripts/local.sh "
            "(see scripts/local.sh.example)",
        )
    if len(s.workers) > needed:
        extra = "WORKER2" if s.worker2 else "WORKER"
        raise SettingError(
            f"TP={s.tp}{_origin(s, 'TP')} uses {needed} worker(s), but {extra} is set too",
            f"write TP={len(s.workers) + 1} (./start-tp3.sh for three Sparks), or remove {extra}",
        )


def _host_of(target: str) -> str:
    return target.rpartition("@")[2].lower()


def _distinct_workers(s: Settings) -> None:
    if s.worker and s.worker2 and _host_of(s.worker) == _host_of(s.worker2):
        raise SettingError(
            f"WORKER and WORKER2 are the same node ({_host_of(s.worker)})", "write a different Spark for each rank"
        )


def _fabric_peers(s: Settings) -> None:
    for peer, worker in (("FABRIC_PEER", "WORKER"), ("FABRIC_PEER2", "WORKER2")):
        if s.value(peer) and not s.value(worker):
            raise SettingError(
                f"{peer}={s.value(peer)}{_origin(s, peer)} is set but {worker} is not",
                f"write {worker}=user@<that Spark> too, or remove {peer}",
            )
    if s.fabric_peer and s.fabric_peer == s.fabric_peer2:
        raise SettingError(
            f"FABRIC_PEER and FABRIC_PEER2 are the same address ({s.fabric_peer})",
            "write each worker's own ConnectX-7 address",
        )
