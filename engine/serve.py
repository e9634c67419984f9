"""`python -m engine serve CHECKPOINT --tp N --rank R --master ADDR[:PORT] …`: one rank of the serving engine.

Every rank builds its `EngineConfig` (engine/config.py) from the flags, joins the group, compares its settings with
the others (refusing to start, naming the setting, when they differ), loads its shard (printing `loading: …`
lines), sizes the shared cache pool from the memory left after loading, and then either serves the API with the
scheduler (rank 0) or follows rank 0's step plans (others). Rank 0 prints `ready: …` once the API accepts
connections. The API key comes from --api-key-file or the SPARKS_API_KEY environment variable, never from argv.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from engine.config import EXIT_REFUSED, EXIT_USAGE, EXIT_WINDOW, EngineConfig, add_arguments, window_refusal

GIB = 2**30
SILENT_S = 3.0  # a rank silent this long makes /health 503 (and recovers when it beats again)
COLLECTIVE_TIMEOUT_S = 600  # a backstop only: the peer watch ends a run with a silent rank long before this
log = logging.getLogger("engine.serve")

__all__ = ["add_arguments", "run", "size_pool"]


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def available_bytes(device: str) -> int:
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 4 * GIB


def size_pool(
    cfg: EngineConfig, bytes_per_token: int, device: str, group: Any, lanes: tuple[int, int] = (0, 0)
) -> tuple[int, int]:
    """(context, pool tokens) for this run, the same on every rank, or SystemExit(EXIT_WINDOW) after a
    `window_refusal` line naming the largest window that fits. The pool is shared by every stream: it must hold one
    whole window; beyond that it takes what memory (and --kv-pool-gib) allow, up to a window per stream — streams
    that do not fit yet wait. `lanes`: what the lane states will take besides (cache.lane_state_bytes: fixed bytes,
    bytes per pool token), out of the same memory. Nothing is allocated before this check."""
    fixed, per_token = lanes
    if cfg.prompt_reuse:  # kept prompt states' KDA snapshots (their rows are pool rows)
        fixed += int(cfg.prompt_reuse_gib * GIB)
    room = max(0, available_bytes(device) - int(cfg.reserve_gib(device) * GIB) - fixed)
    budget = room * bytes_per_token // max(1, bytes_per_token + per_token)  # the pool's share of the room
    if cfg.kv_pool_gib > 0:
        budget = min(budget, int(cfg.kv_pool_gib * GIB))
    budget = min(group.all_gather_object(budget))  # the tightest rank decides for all
    fit_tokens = budget // max(1, bytes_per_token)
    context = cfg.context if cfg.context > 0 else min(fit_tokens, 1_048_576)
    if context < 1 or context > fit_tokens:
        say(
            f"refused: a {context}-token window needs {context * bytes_per_token / GIB:.2f} GiB of cache per rank "
            f"and {budget / GIB:.2f} GiB is available; the largest window that fits is {fit_tokens} tokens "
            f"(restart with --context {fit_tokens}, a larger --kv-pool-gib, or more memory)"
        )
        say(window_refusal(context, fit_tokens, bytes_per_token=bytes_per_token, budget_bytes=budget))
        raise SystemExit(EXIT_WINDOW)
    return context, min(fit_tokens, context * cfg.parallel)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = EngineConfig.from_args(args)
    for problem in cfg.problems():
        say(f"error: {problem}")
        return EXIT_USAGE
    api_key = None
    if cfg.rank == 0:  # only rank 0 serves HTTP; the other ranks never need (or see) the key
        try:
            api_key = _read_api_key(cfg.api_key_file)
        except OSError as exc:
            say(f"error: cannot read the API key file {cfg.api_key_file}: {exc.strerror}")
            return EXIT_USAGE
    if cfg.rank == 0 and api_key is None and cfg.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without an API key: anyone who reaches this port can use the model", cfg.host)

    import torch

    from engine.models.glm5_next.model import Glm5NextForCausalLM
    from engine.parallel import ParallelGroup, exit_process
    from engine.runner.executor import StepExecutor, follow_plans

    device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
    if device == "cuda" and torch.cuda.device_count() > 1:  # several ranks on one host: one GPU each
        device = f"cuda:{cfg.rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    if device == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.tp))
    say(f"rank {cfg.rank}/{cfg.tp}: joining the group at {cfg.master_addr}:{cfg.master_port} ({device})")
    try:
        group = ParallelGroup.init(
            cfg.tp,
            cfg.rank,
            cfg.master_addr,
            cfg.master_port,
            device,
            timeout_s=max(COLLECTIVE_TIMEOUT_S, cfg.peer_timeout_s),
        )
    except OSError as exc:
        say(
            f"error: {exc.strerror or exc} (is another run using --master {cfg.master}? MASTER_PORT picks another port)"
        )
        return EXIT_USAGE
    watch = _watch_peers(cfg)
    try:
        group.check_same_settings(cfg.fingerprint())
    except RuntimeError as exc:
        say(f"refused: {exc}")
        return EXIT_REFUSED
    from engine.models.glm5_next.vision import VisionTower, has_tower

    if cfg.vision and not has_tower(cfg.checkpoint):  # the same checkpoint on every rank: they all refuse alike
        say(f"error: --vision 1: {cfg.checkpoint} has no vision tower (model.visual.*); write VISION=0")
        return EXIT_USAGE
    started = time.monotonic()
    model = Glm5NextForCausalLM.load(
        cfg.checkpoint,
        group,
        progress=lambda m: say(f"loading: {m}"),
        kda_chunked=cfg.kda_chunked,
        mtp=cfg.drafts_with_mtp,
        dense=cfg.dense,
    )
    say(f"loading: done in {time.monotonic() - started:.1f} s (KDA prompts: {model.kda_prompt_form or 'none'})")
    if cfg.drafts_with_mtp and model.mtp is None:  # the same checkpoint on every rank: they all decide alike
        if cfg.drafter == "mtp":
            say(f"error: --drafter mtp: {cfg.checkpoint} has no MTP layer (write DRAFTER=copy or mtp+copy)")
            return EXIT_USAGE
        say("drafts: the checkpoint has no MTP layer; mtp+copy drafts with copy alone")
        cfg = dataclasses.replace(cfg, drafter="copy")
    tower = None
    if cfg.vision and cfg.rank == 0:  # before the pool is sized: the pool takes what the tower leaves
        tower = VisionTower.load(cfg.checkpoint, torch.device(device))
        say(f"loading: vision tower {tower.nbytes / 2**20:.1f} MiB on rank 0 ({tower.dtype})".replace("torch.", ""))
    from engine.cache import lane_state_bytes

    lanes = lane_state_bytes(model.kda_state_shapes(), cfg.parallel, cfg.verify_window, model.mtp_hidden_size)
    context, pool_tokens = size_pool(cfg, model.cache_bytes_per_token(cfg.kv), device, group, lanes)
    executor = StepExecutor.for_config(model, model.make_pool(pool_tokens, cfg.kv), cfg)
    say(
        f"pool: {pool_tokens} tokens ({context} x {cfg.parallel} streams, kv {cfg.kv}); lane states "
        f"{(lanes[0] + lanes[1] * pool_tokens) / 2**20:.1f} MiB"
    )
    if cfg.rank > 0:
        say(f"rank {cfg.rank}: following rank 0's step plans")
        code = follow_plans(group, executor)
        say(f"rank {cfg.rank}: exiting ({'shutdown' if code == 0 else 'peer lost'})")
        exit_process(code)  # rank 0 may already be gone (always, once it has sent the shutdown plan)
    return _serve(cfg, group, executor, context, api_key, watch, tower)


def _watch_peers(cfg: EngineConfig) -> Any:
    """Start the heartbeat (engine/peer_watch.py) with several ranks. Until rank 0 serves, a rank that goes
    silent for --peer-timeout-s ends this process; `_serve` then takes over the reaction."""
    if cfg.tp == 1:
        return None
    from engine.parallel import exit_process
    from engine.peer_watch import PeerWatch

    def lost(peer: int, seconds: float) -> None:
        say(
            f"rank {cfg.rank}: rank {peer} has not answered for {seconds:.0f} s (--peer-timeout-s "
            f"{cfg.peer_timeout_s:g}); exiting"
        )
        exit_process(1)

    return PeerWatch.connect(
        cfg.master_addr, cfg.master_port, cfg.rank, cfg.tp, on_lost=lost, silent_s=SILENT_S, lost_s=cfg.peer_timeout_s
    ).start()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _exit_now(code: int) -> None:
    from engine.parallel import exit_process

    say("rank 0: exiting now")
    exit_process(code)


def _read_api_key(path: str | None) -> str | None:
    if path:
        key = Path(path).read_text().strip()
        return key or None
    return os.environ.get("SPARKS_API_KEY") or None


def _generation_defaults(checkpoint: str) -> dict[str, Any]:
    gen_path, cfg_path = Path(checkpoint, "generation_config.json"), Path(checkpoint, "config.json")
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    cfg = json.loads(cfg_path.read_text())
    eos = gen.get("eos_token_id", cfg.get("eos_token_id", (cfg.get("text_config") or {}).get("eos_token_id")))
    eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
    return {
        "eos_ids": frozenset(int(e) for e in eos),
        "temperature": float(gen.get("temperature", 1.0)),
        "top_p": float(gen.get("top_p", 1.0)),
        "top_k": int(gen.get("top_k", 0) or 0),
    }


def _vision_service(cfg: EngineConfig) -> Any:
    """What the routes need to take images (--vision 1): the processor's settings and the limits."""
    import dataclasses

    from engine.models.glm5_next.vision import ImageTokens, read_config
    from engine.server.images import VisionService
    from engine.vision.fetch import FetchPolicy
    from engine.vision.preprocess import ProcessorSpec

    config = read_config(cfg.checkpoint)
    max_bytes = int(cfg.vision_max_mb * 2**20)
    spec = ProcessorSpec.from_config(config["vision_config"])
    return VisionService(
        spec=spec,
        tokens=ImageTokens.from_config(config),
        video_spec=dataclasses.replace(spec, max_tokens=cfg.vision_video_tokens),
        max_images=cfg.vision_max_images,
        max_videos=cfg.vision_max_videos,
        max_frames=cfg.vision_max_frames,
        max_bytes=max_bytes,
        max_pixels=cfg.vision_max_pixels,
        urls=cfg.vision_urls,
        fetch=FetchPolicy(max_bytes=max_bytes),
    )


def _serve(
    cfg: EngineConfig,
    group: Any,
    executor: Any,
    context: int,
    api_key: str | None,
    watch: Any,
    tower: Any = None,
) -> int:
    import uvicorn
    from tokenizers import Tokenizer

    from engine import footprint
    from engine.reuse import ROLE_TOKENS
    from engine.scheduler import Scheduler
    from engine.server.app import create_app
    from engine.server.state import ServerState
    from engine.server.template import load_chat_template

    defaults = _generation_defaults(cfg.checkpoint)
    tokenizer = Tokenizer.from_file(str(Path(cfg.checkpoint, "tokenizer.json")))
    marks = frozenset(i for i in map(tokenizer.token_to_id, ROLE_TOKENS) if i is not None)
    encode = None
    if tower is not None:

        def encode(images: list[Any]) -> list[Any]:
            """A request's images through the tower, a call per media item (engine/vision/prompt.py)."""
            from engine.vision.prompt import encode_items

            return encode_items(tower.forward, images)

    scheduler = Scheduler.for_config(executor, group, cfg, marks, encode)
    decoder = getattr(executor, "decoder", None)
    lane_bytes = footprint.held_bytes(decoder.state) if decoder else 0
    memory = footprint.report(executor.model, executor.pool, lane_bytes, tower.nbytes if tower is not None else 0)
    say(
        "memory: weights "
        + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in memory["weights_bytes"].items())
        + f" (dense {memory['dense_dtype']}, head {memory['head_dtype']})"
        + f"; pool {memory['pool_bytes'] / 2**20:.1f} MiB ({memory['pool_rows']} rows); lane states "
        f"{memory['lane_state_bytes'] / 2**20:.1f} MiB"
    )
    state = ServerState(
        name=cfg.name,
        tokenizer=tokenizer,
        template=load_chat_template(cfg.checkpoint),
        scheduler=scheduler,
        context=context,
        max_tokens=min(cfg.max_tokens, context),
        thinking=cfg.thinking,
        api_key=api_key,
        keepalive_s=cfg.keepalive_s,
        peers=watch,
        weights=footprint.dense_dtype(executor.model),
        memory=memory,
        vision=_vision_service(cfg) if cfg.vision else None,
        **defaults,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(state), host=cfg.host, port=cfg.port, log_level="warning", timeout_graceful_shutdown=5
        )
    )
    exit_code = 0

    def on_broken(reason: str) -> None:  # a peer died: /health says why for a few seconds, then this rank exits
        nonlocal exit_code
        exit_code = 1
        state.stopped_reason = f"the engine stopped: {reason}"
        say(f"rank 0: {state.stopped_reason}; exiting")
        threading.Timer(3.0, lambda: setattr(server, "should_exit", True)).start()

    def on_lost(peer: int, seconds: float) -> None:  # the scheduler may be stuck in a collective with that rank
        say(f"rank 0: rank {peer} has not answered for {seconds:.0f} s (--peer-timeout-s {cfg.peer_timeout_s:g})")
        scheduler.abandon(f"rank {peer} stopped answering")
        threading.Timer(10.0, lambda: _exit_now(1)).start()  # if uvicorn's shutdown waits on a stuck stream

    scheduler.on_broken = on_broken
    if watch is not None:
        watch.on_lost = on_lost
    scheduler.start()

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            say(
                f"ready: serving {cfg.name} on http://{cfg.host}:{cfg.port}/v1 (tp {cfg.tp}, parallel "
                f"{cfg.parallel}, context {context}, pool {executor.pool.num_tokens} tokens)"
            )

    threading.Thread(target=announce, daemon=True).start()
    # uvicorn re-raises SIGTERM once it has shut down; with the default handler that would kill this process
    # before the scheduler tells the other ranks to stop. As an exception it passes through `finally` below.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        server.run()
    finally:
        if scheduler.broken is None:
            scheduler.stop()
    if not server.started and exit_code == 0:
        say(f"error: the API could not listen on {cfg.host}:{cfg.port}")
        return 1
    return exit_code
