"""`python -m engine serve CHECKPOINT --tp N --rank R --master ADDR[:PORT] …`: one rank of the serving engine.

Every rank joins the group, compares its settings with the others (refusing to start, naming the setting, when
they differ), loads its shard (printing `loading: …` lines), sizes the shared cache pool from the memory left
after loading, and then either serves the API with the scheduler (rank 0) or follows rank 0's step plans (others).
Rank 0 prints `ready: …` once the API accepts connections. The API key comes from --api-key-file or the
SPARKS_API_KEY environment variable, never from argv.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

GIB = 2**30
SILENT_S = 3.0              # a rank silent this long makes /health 503 (and recovers when it beats again)
COLLECTIVE_TIMEOUT_S = 600  # a backstop only: the peer watch ends a run with a silent rank long before this
log = logging.getLogger("engine.serve")


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--kv", choices=("bf16", "fp8", "fp32"), default="bf16", help="cached attention row type")
    p.add_argument("--kv-pool-gib", type=float, default=float(_env("GLM_KV_POOL_GIB", "0") or 0),
                   help="cap of the cache pool in GiB per rank (0 = no cap)")
    p.add_argument("--memory-reserve-gib", type=float, default=None,
                   help="memory left free for the system (default: GLM_MEMORY_RESERVE_GIB, else 1 CPU / 4 GPU)")
    p.add_argument("--max-queued", type=int, default=int(_env("GLM_MAX_QUEUED", "16") or 16),
                   help="requests that may wait beyond the lanes; more get 429 + Retry-After")
    p.add_argument("--prefill-chunk", type=int, default=128, help="prompt tokens per prefill step")
    p.add_argument("--api-key-file", default=None, help="file holding the API key (or set SPARKS_API_KEY)")
    p.add_argument("--thinking", choices=("on", "off"),
                   default="off" if _env("GLM_THINKING", "1") in ("0", "off", "false") else "on")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--keepalive-s", type=float, default=15.0, help="SSE keep-alive comment after this silence")
    p.add_argument("--peer-timeout-s", type=float, default=30.0,
                   help="a rank silent this long (no heartbeat) ends the run (peer watch); /health is 503 after "
                        f"{SILENT_S:.0f} s of silence")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def fingerprint(args: argparse.Namespace) -> dict[str, Any]:
    """Settings every rank must share; host, port, rank, device and secrets are per-rank and left out."""
    config = Path(args.checkpoint, "config.json")
    digest = hashlib.sha256(config.read_bytes()).hexdigest()[:16] if config.exists() else "missing"
    keys = ("tp", "parallel", "context", "max_tokens", "kv", "kv_pool_gib", "prefill_chunk", "name", "thinking")
    graphs = (_env("GLM_CUDA_GRAPHS", "1") or "1") != "0"  # graphs hold collectives: all ranks or none
    chunked = (_env("GLM_KDA_CHUNKED", "1") or "1") != "0"  # one prompt form on every rank
    return {"checkpoint_config": digest, "cuda_graphs": graphs, "kda_chunked": chunked,
            **{k: getattr(args, k) for k in keys}}


def available_bytes(device: str) -> int:
    if device.startswith("cuda"):
        import torch
        return int(torch.cuda.mem_get_info(device)[0])
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 4 * GIB


def size_pool(args: argparse.Namespace, bytes_per_token: int, device: str, group: Any) -> tuple[int, int]:
    """(context, pool tokens) for this run, the same on every rank, or SystemExit naming the largest window that
    fits. The pool is shared by every stream: it must hold one whole window; beyond that it takes what memory
    (and --kv-pool-gib) allow, up to a window per stream — streams that do not fit yet wait. Nothing is allocated
    before this check."""
    reserve = args.memory_reserve_gib
    if reserve is None:
        reserve = float(_env("GLM_MEMORY_RESERVE_GIB", "1" if device == "cpu" else "4") or 1)
    budget = max(0, available_bytes(device) - int(reserve * GIB))
    if args.kv_pool_gib > 0:
        budget = min(budget, int(args.kv_pool_gib * GIB))
    budget = min(group.all_gather_object(budget))  # the tightest rank decides for all
    fit_tokens = budget // max(1, bytes_per_token)
    context = args.context if args.context > 0 else min(fit_tokens, 1_048_576)
    if context < 1 or context > fit_tokens:
        say(f"refused: a {context}-token window needs {context * bytes_per_token / GIB:.2f} GiB of cache per rank "
            f"and {budget / GIB:.2f} GiB is available; the largest window that fits is {fit_tokens} tokens "
            f"(restart with --context {fit_tokens}, a larger --kv-pool-gib, or more memory)")
        raise SystemExit(3)
    return context, min(fit_tokens, context * args.parallel)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name, value in (("--tp", args.tp), ("--parallel", args.parallel), ("--max-tokens", args.max_tokens),
                        ("--prefill-chunk", args.prefill_chunk)):
        if value < 1:
            say(f"error: {name} must be at least 1 (got {value})")
            return 2
    if not 0 <= args.rank < args.tp:
        say(f"error: --rank {args.rank} is outside 0..{args.tp - 1}")
        return 2
    api_key = None
    if args.rank == 0:  # only rank 0 serves HTTP; the other ranks never need (or see) the key
        try:
            api_key = _read_api_key(args.api_key_file)
        except OSError as exc:
            say(f"error: cannot read the API key file {args.api_key_file}: {exc.strerror}")
            return 2
    if args.rank == 0 and api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without an API key: anyone who reaches this port can use the model", args.host)

    import torch

    from engine.models.glm5_next.model import Glm5NextForCausalLM
    from engine.parallel import ParallelGroup, exit_process
    from engine.worker import StepExecutor, follow_plans

    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    if device == "cuda" and torch.cuda.device_count() > 1:  # several ranks on one host: one GPU each
        device = f"cuda:{args.rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    if device == "cpu" and not _env("OMP_NUM_THREADS"):
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.tp))
    addr, _, port = args.master.partition(":")
    say(f"rank {args.rank}/{args.tp}: joining the group at {addr}:{port or 29551} ({device})")
    try:
        group = ParallelGroup.init(args.tp, args.rank, addr, int(port or 29551), device,
                                   timeout_s=max(COLLECTIVE_TIMEOUT_S, args.peer_timeout_s))
    except OSError as exc:
        say(f"error: {exc.strerror or exc} (is another run using --master {args.master}? MASTER_PORT picks "
            "another port)")
        return 2
    watch = _watch_peers(args, addr, int(port or 29551))
    try:
        group.check_same_settings(fingerprint(args))
    except RuntimeError as exc:
        say(f"refused: {exc}")
        return 3
    started = time.monotonic()
    model = Glm5NextForCausalLM.load(args.checkpoint, group, progress=lambda m: say(f"loading: {m}"))
    say(f"loading: done in {time.monotonic() - started:.1f} s (KDA prompts: {model.kda_prompt_form or 'none'})")
    context, pool_tokens = size_pool(args, model.cache_bytes_per_token(args.kv), device, group)
    executor = StepExecutor(model, model.make_pool(pool_tokens, args.kv), lanes=args.parallel)
    say(f"pool: {pool_tokens} tokens ({context} x {args.parallel} streams, kv {args.kv})")
    if args.rank > 0:
        say(f"rank {args.rank}: following rank 0's step plans")
        code = follow_plans(group, executor)
        say(f"rank {args.rank}: exiting ({'shutdown' if code == 0 else 'peer lost'})")
        exit_process(code)   # rank 0 may already be gone (always, once it has sent the shutdown plan)
    return _serve(args, group, executor, context, api_key, watch)


def _watch_peers(args: argparse.Namespace, addr: str, port: int) -> Any:
    """Start the heartbeat (engine/peer_watch.py) with several ranks. Until rank 0 serves, a rank that goes
    silent for --peer-timeout-s ends this process; `_serve` then takes over the reaction."""
    if args.tp == 1:
        return None
    from engine.parallel import exit_process
    from engine.peer_watch import PeerWatch

    def lost(peer: int, seconds: float) -> None:
        say(f"rank {args.rank}: rank {peer} has not answered for {seconds:.0f} s (--peer-timeout-s "
            f"{args.peer_timeout_s:g}); exiting")
        exit_process(1)

    return PeerWatch.connect(addr, port, args.rank, args.tp, on_lost=lost, silent_s=SILENT_S,
                             lost_s=args.peer_timeout_s).start()


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
    return _env("SPARKS_API_KEY")


def _generation_defaults(checkpoint: str) -> dict[str, Any]:
    gen_path, cfg_path = Path(checkpoint, "generation_config.json"), Path(checkpoint, "config.json")
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    cfg = json.loads(cfg_path.read_text())
    eos = gen.get("eos_token_id", cfg.get("eos_token_id", (cfg.get("text_config") or {}).get("eos_token_id")))
    eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
    return {"eos_ids": frozenset(int(e) for e in eos), "temperature": float(gen.get("temperature", 1.0)),
            "top_p": float(gen.get("top_p", 1.0)), "top_k": int(gen.get("top_k", 0) or 0)}


def _serve(args: argparse.Namespace, group: Any, executor: Any, context: int, api_key: str | None,
           watch: Any) -> int:
    import uvicorn
    from tokenizers import Tokenizer

    from engine.checkpoint.tokenizer_template import load_chat_template
    from engine.scheduler import Scheduler
    from engine.server.app import create_app
    from engine.server.state import ServerState

    defaults = _generation_defaults(args.checkpoint)
    scheduler = Scheduler(executor, group, parallel=args.parallel, max_queued=args.max_queued,
                          prefill_chunk=args.prefill_chunk)
    state = ServerState(name=args.name, tokenizer=Tokenizer.from_file(str(Path(args.checkpoint, "tokenizer.json"))),
                        template=load_chat_template(args.checkpoint), scheduler=scheduler, context=context,
                        max_tokens=min(args.max_tokens, context), thinking=args.thinking == "on", api_key=api_key,
                        keepalive_s=args.keepalive_s, peers=watch, **defaults)
    server = uvicorn.Server(uvicorn.Config(create_app(state), host=args.host, port=args.port, log_level="warning",
                                           timeout_graceful_shutdown=5))
    exit_code = 0

    def on_broken(reason: str) -> None:  # a peer died: /health says why for a few seconds, then this rank exits
        nonlocal exit_code
        exit_code = 1
        state.stopped_reason = f"the engine stopped: {reason}"
        say(f"rank 0: {state.stopped_reason}; exiting")
        threading.Timer(3.0, lambda: setattr(server, "should_exit", True)).start()

    def on_lost(peer: int, seconds: float) -> None:  # the scheduler may be stuck in a collective with that rank
        say(f"rank 0: rank {peer} has not answered for {seconds:.0f} s (--peer-timeout-s {args.peer_timeout_s:g})")
        scheduler.abandon(f"rank {peer} stopped answering")
        threading.Timer(10.0, lambda: _exit_now(1)).start()   # if uvicorn's shutdown waits on a stuck stream

    scheduler.on_broken = on_broken
    if watch is not None:
        watch.on_lost = on_lost
    scheduler.start()

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            say(f"ready: serving {args.name} on http://{args.host}:{args.port}/v1 (tp {args.tp}, parallel "
                f"{args.parallel}, context {context}, pool {executor.pool.num_tokens} tokens)")

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
        say(f"error: the API could not listen on {args.host}:{args.port}")
        return 1
    return exit_code
