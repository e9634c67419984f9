"""The plan: what `start` will run, as a value. DRY_RUN and `sparks plan` print it; `start` executes it.

One `RankPlan` per rank in start order (workers first, rank 0 last), each with its node, runtime, full command,
the environment it adds, mounts, ports and log. Secrets never enter a command or the environment: the API key
reaches the engine as a file (`--api-key-file`), and the printed form masks anything that looks secret.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_hex
from typing import Any

from recipe.checkpoint.checkpoint import head_checkpoint_dir
from recipe.errors import RecipeError
from recipe.plan.docker import container_env, container_name, docker_argv, docker_checkpoint, docker_env, docker_mounts
from recipe.plan.host import HostFacts
from recipe.plan.parts import PrepareStep, RankPlan, SecretFile
from recipe.settings import Settings
from recipe.settings.schema import load_specs

DEMO_SEED = 0
DEMO_SIZE = "trained"  # the committed demo model that follows GLM's chat format (engine/checkpoint/trained_demo)
SECRET_ENV_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


@dataclass(frozen=True)
class Plan:
    runtime: str
    tp: int
    device: str
    checkpoint: str  # as the ranks see it (inside the container with RUNTIME=docker)
    served_name: str
    api_url: str  # what clients use
    health_url: str  # what the recipe polls (rank 0, from this machine)
    run_dir: str  # live logs and the state file
    ranks: tuple[RankPlan, ...]  # start order
    prepare: tuple[PrepareStep, ...] = ()
    secret_files: tuple[SecretFile, ...] = ()
    summary: Mapping[str, Any] = field(default_factory=dict)
    host_checkpoint: str = ""  # the folder on the nodes (the same path on each): compared and copied to workers
    host: HostFacts | None = field(default=None, compare=False, repr=False)  # what it was planned from (`rebuilt`)
    extra: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def rank0(self) -> RankPlan:
        return next(r for r in self.ranks if r.rank == 0)

    def rebuilt(self, settings: Settings) -> Plan:
        """The plan for other settings on the same host facts and start arguments (the refit: the settings with the
        window rank 0 named, planned again — never an edited command line)."""
        if self.host is None:  # only a plan build_plan made carries its host facts
            raise RuntimeError("Plan.rebuilt needs the host facts build_plan records; this plan was made without them")
        return build_plan(settings, self.host, self.extra)

    def to_dict(self) -> dict[str, Any]:
        """The printable form: secret-looking environment values masked."""
        return {
            "runtime": self.runtime,
            "tp": self.tp,
            "device": self.device,
            "checkpoint": self.checkpoint,
            "host_checkpoint": self.host_checkpoint,
            "served_name": self.served_name,
            "api_url": self.api_url,
            "health_url": self.health_url,
            "run_dir": self.run_dir,
            "summary": dict(self.summary),
            "prepare": [
                {"description": p.description, "command": list(p.argv), "output": p.final, "done": p.done}
                for p in self.prepare
            ],
            "secret_files": [{"path": f.path, "holds": f.setting} for f in self.secret_files],
            "ranks": [_rank_dict(r) for r in self.ranks],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _rank_dict(rank: RankPlan) -> dict[str, Any]:
    return {
        "rank": rank.rank,
        "node": rank.node,
        "runtime": rank.runtime,
        "command": list(rank.argv),
        "env": {k: mask_env(k, v) for k, v in rank.env.items()},
        "mounts": [f"{m.source}:{m.target}{':ro' if m.read_only else ''}" for m in rank.mounts],
        "ports": list(rank.ports),
        "log": rank.log,
    }


def mask_env(name: str, value: str) -> str:
    return "***" if any(word in name.upper() for word in SECRET_ENV_WORDS) else value


def build_plan(settings: Settings, host: HostFacts, extra_args: tuple[str, ...] = ()) -> Plan:
    """Every rank's launch, derived from settings and host facts only (no side effects)."""
    _check_extra_args(settings, extra_args)
    settings = prefill_for_device(settings, host.gpu)
    plan = _build(settings, host, extra_args)
    _check_no_secret_leaks(settings, host, extra_args)
    return plan


GPU_PREFILL_CHUNK = 2048


def prefill_for_device(settings: Settings, gpu: bool) -> Settings:
    """PREFILL_CHUNK as the ranks' device makes it pay: on a GPU a prompt step's time is mostly one pass over the
    weights (every expert is touched), so the default takes 2048 tokens a step there (~10x the prompt speed of 128
    on the H200, docs/BENCHMARKS.md); the CPU keeps 128 (its steps cost by the token). A value written out wins."""
    if gpu and settings.origins.get("PREFILL_CHUNK", "default") in ("default", "derived"):
        return dataclasses.replace(settings, prefill_chunk=GPU_PREFILL_CHUNK)
    return settings


def _build(settings: Settings, host: HostFacts, extra_args: tuple[str, ...]) -> Plan:
    runtime = settings.effective_runtime
    run_dir = settings.run_dir
    secret_files = (SecretFile(os.path.join(run_dir, "api_key"), "API_KEY"),) if settings.api_key else ()
    if runtime == "process":
        checkpoint, prepare = _local_checkpoint(settings, host)
        host_checkpoint = checkpoint
        ranks = tuple(
            _process_rank(settings, host, r, checkpoint, run_dir, secret_files, extra_args)
            for r in _start_order(settings.tp)
        )
    else:
        checkpoint, prepare = docker_checkpoint(settings), ()
        host_checkpoint = head_checkpoint_dir(settings) or ""
        ranks = tuple(
            _docker_rank(settings, host, r, checkpoint, secret_files, extra_args) for r in _start_order(settings.tp)
        )
    return Plan(
        runtime=runtime,
        tp=settings.tp,
        device=host.device,
        checkpoint=checkpoint,
        served_name=settings.served_name,
        api_url=_api_url(settings) + "/v1",
        health_url=_local_url(settings) + "/health",
        run_dir=run_dir,
        ranks=ranks,
        prepare=prepare,
        secret_files=secret_files,
        summary=_summary(settings),
        host_checkpoint=host_checkpoint,
        host=host,
        extra=tuple(extra_args),
    )


def _start_order(tp: int) -> list[int]:
    return list(range(tp - 1, 0, -1)) + [0]


def _local_checkpoint(settings: Settings, host: HostFacts) -> tuple[str, tuple[PrepareStep, ...]]:
    if settings.checkpoint:
        return settings.checkpoint, ()
    final = os.path.join(settings.cache_dir, f"demo-{DEMO_SIZE}-{DEMO_SEED}")
    partial = final + ".partial"
    step = PrepareStep(
        description=f"make the engine's {DEMO_SIZE} demo checkpoint (a small model of this architecture)",
        argv=(host.python, "-m", "engine", "make-demo", partial, "--size", DEMO_SIZE, "--seed", str(DEMO_SEED)),
        output=partial,
        final=final,
        done=Path(final, "config.json").is_file(),
    )
    return final, (step,)


# Settings whose flag the recipe writes itself: the checkpoint is the positional argument (a path on the ranks), the
# rendezvous is MASTER_PORT with the head's address, the API key travels in a file (never on a command line).
SPECIAL_FLAGS = {"CHECKPOINT", "MASTER_PORT", "API_KEY"}


def serve_flags(settings: Settings, rank: int, master: str, api_key_file: str | None) -> list[str]:
    """`engine serve` flags after the checkpoint, the same on every rank but `--rank`: one per setting whose consumer
    in config/settings.yaml is `engine flag --NAME` (the only channel from the recipe to the engine), in the YAML's
    order; a setting left empty passes no flag (the engine's own default)."""
    flags = ["--rank", str(rank), "--master", master]
    for name, spec in load_specs().items():
        if spec.consumer.startswith("engine flag ") and name not in SPECIAL_FLAGS:
            shown = settings.shown(name)
            if shown != "":
                flags += [spec.consumer.split()[-1], shown]
    if api_key_file:
        flags += ["--api-key-file", api_key_file]
    return flags


def _process_rank(
    settings: Settings,
    host: HostFacts,
    rank: int,
    checkpoint: str,
    run_dir: str,
    secret_files: tuple[SecretFile, ...],
    extra: tuple[str, ...],
) -> RankPlan:
    """A rank as a plain process: here, or on its worker over ssh with the same interpreter path, checkpoint path
    (after the copy) and log path, and the head's link address as the rendezvous."""
    node = "local" if rank == 0 or not settings.workers else settings.workers[rank - 1]
    key_file = secret_files[0].path if secret_files and node == "local" else None  # the key file stays here
    master = f"{host.link.master_addr if settings.workers else '127.0.0.1'}:{settings.master_port}"
    argv = (host.python, "-m", "engine", "serve", checkpoint, *serve_flags(settings, rank, master, key_file), *extra)
    env = {"PYTHONUNBUFFERED": "1"}
    if settings.workers:
        link = host.link.for_rank(rank)
        # gloo (CPU) and NCCL (GPU) both bind to the link's netdev, never to whatever the hostname resolves to.
        env.update({**docker_env(settings, link), "GLOO_SOCKET_IFNAME": link.ifname})
        env.pop("HF_HUB_OFFLINE", None)
    if not host.gpu:
        # Ranks may share this machine's cores; without a cap each would start one thread per core.
        env["OMP_NUM_THREADS"] = str(max(1, host.cpu_count // settings.tp))
    ports = (settings.port, settings.master_port) if rank == 0 else ()
    return RankPlan(
        rank=rank,
        node=node,
        runtime="process",
        argv=argv,
        env=env,
        ports=ports,
        log=os.path.join(run_dir, f"rank{rank}.log"),
    )


def _docker_rank(
    settings: Settings,
    host: HostFacts,
    rank: int,
    checkpoint: str,
    secret_files: tuple[SecretFile, ...],
    extra: tuple[str, ...],
) -> RankPlan:
    """A rank as a container on its node (rank 0 here); the rendezvous is the head's address on this rank's link."""
    node = "local" if rank == 0 else settings.workers[rank - 1]
    mounts = docker_mounts(settings, secret_files, rank)
    key_file = "/run/secrets/api_key" if secret_files and rank == 0 else None
    link = host.link.for_rank(rank)
    serve = (
        "python3",
        "-m",
        "engine",
        "serve",
        checkpoint,
        *serve_flags(settings, rank, f"{link.master_addr}:{settings.master_port}", key_file),
        *extra,
    )
    env = container_env(settings, host, link)
    argv = docker_argv(settings, host, rank, env, mounts, serve)
    ports = (settings.port, settings.master_port) if rank == 0 else ()
    return RankPlan(
        rank=rank,
        node=node,
        runtime="docker",
        argv=argv,
        env=env,
        mounts=mounts,
        ports=ports,
        log=f"docker logs -f {container_name(settings, rank)}",
    )


def _local_url(settings: Settings) -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    return f"http://{_bracket(host)}:{settings.port}"


def _api_url(settings: Settings) -> str:
    return _local_url(settings)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _summary(settings: Settings) -> dict[str, Any]:
    return {
        "model": settings.served_name,
        "context": settings.context,
        "parallel": settings.parallel,
        "max_tokens": settings.max_tokens,
        "kv": settings.kv,
        "dense": settings.dense,
        "drafter": settings.drafter,
        "draft_tokens": settings.draft_tokens,
        "thinking": settings.thinking,
        "port": settings.port,
    }


def _check_no_secret_leaks(settings: Settings, host: HostFacts, extra: tuple[str, ...]) -> None:
    """A defect guard: no secret may reach a command line or an environment. The plan is built once more with each
    secret replaced by a long random stand-in that no other setting holds; a word holding a stand-in came from a
    secret. (Searching the real plan for the real values would fire whenever a secret merely equals another
    setting's value — API_KEY=demo with SERVED_NAME=demo —, which leaks nothing the other setting does not show.)"""
    stand_ins = {name: f"secret-{token_hex(16)}" for name in ("api_key", "hf_token") if getattr(settings, name)}
    if not stand_ins:
        return
    probe_settings = dataclasses.replace(
        settings,
        api_key=stand_ins.get("api_key", settings.api_key),
        hf_token=stand_ins.get("hf_token", settings.hf_token),
    )
    probe = _build(probe_settings, host, extra)
    for rank in probe.ranks:
        words = [*rank.argv, *rank.env.values()]
        if any(stand_in in word for stand_in in stand_ins.values() for word in words):
            raise RecipeError(
                f"internal error: a secret reached rank {rank.rank}'s command or environment",
                "report this; nothing was started",
            )


def _check_extra_args(settings: Settings, extra: tuple[str, ...]) -> None:
    """Arguments given to ./start.sh go to every rank's command line, where every node's process list shows them."""
    for name in ("API_KEY", "HF_TOKEN"):
        secret = settings.value(name)
        if secret and any(secret == word or (len(secret) >= 8 and secret in word) for word in extra):
            raise RecipeError(
                f"an argument given to start holds {name}'s value, which every node's process list would show",
                f"leave it out: {name} reaches where it is needed without it",
            )
