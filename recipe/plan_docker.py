"""The Docker side of a plan: one container per Spark, host network, GPUs, RDMA devices and the NCCL settings of
the link. Only builds values; running them (over ssh for workers) is the launcher's job."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping

from recipe.host import LinkEnd
from recipe.settings import Settings

if TYPE_CHECKING:
    from recipe.plan import Mount, SecretFile

CONTAINER_HF = "/root/.cache/huggingface"
CONTAINER_CHECKPOINT = "/checkpoint"
NCCL_CHANNELS = 4


def docker_checkpoint(settings: Settings) -> str:
    """The checkpoint folder as the container sees it."""
    if settings.checkpoint:
        return CONTAINER_CHECKPOINT
    org, name = settings.model_id.split("/", 1)
    revision = settings.model_revision or "<revision resolved at download>"
    return f"{CONTAINER_HF}/hub/models--{org}--{name}/snapshots/{revision}"


def docker_mounts(settings: Settings, secret_files: "tuple[SecretFile, ...]") -> "tuple[Mount, ...]":
    from recipe.plan import Mount

    mounts = [Mount(settings.checkpoint, CONTAINER_CHECKPOINT) if settings.checkpoint
              else Mount(settings.hf_cache, CONTAINER_HF)]
    mounts += [Mount(f.path, "/run/secrets/" + os.path.basename(f.path)) for f in secret_files]
    return tuple(mounts)


def docker_env(settings: Settings, link: LinkEnd) -> dict[str, str]:
    """NCCL over the RoCE link: its netdev for bootstrap, its RDMA devices and RoCE v2 GID for data."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "NCCL_SOCKET_IFNAME": link.ifname,
        "NCCL_IB_HCA": link.hcas,
        "NCCL_IB_GID_INDEX": link.gid_index,
        "NCCL_MIN_NCHANNELS": str(NCCL_CHANNELS),
        "NCCL_MAX_NCHANNELS": str(NCCL_CHANNELS),
    }
    if settings.tp > 2:
        # Three Sparks: every pair has its own cable and subnet, so NCCL must route by subnet and may cross NICs.
        env.update({"NCCL_CROSS_NIC": "1", "NCCL_IB_SUBNET_AWARE_ROUTING": "1"})
    return env


def docker_argv(settings: Settings, env: Mapping[str, str], mounts: "tuple[Mount, ...]",
                serve: tuple[str, ...]) -> tuple[str, ...]:
    argv = ["docker", "run", "-d", "--name", settings.container_name,
            "--gpus", "all", "--network", "host", "--ipc", "host", "--shm-size", "16g",
            "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
            "--device", "/dev/infiniband", "--cap-add", "IPC_LOCK"]
    for name, value in env.items():
        argv += ["-e", f"{name}={value}"]
    for mount in mounts:
        argv += ["-v", f"{mount.source}:{mount.target}{':ro' if mount.read_only else ''}"]
    return (*argv, settings.image, *serve)
