"""The Docker side of a plan: one container per rank, named per rank, on the host network and IPC namespace, with
the NCCL settings of the link. Only builds values; running them (over ssh for workers) is recipe/launch/docker.py's job.

GPU and RDMA flags come from host facts, not from a fixed list: a Spark gets `--gpus all` and `/dev/infiniband`; a
machine without them (the namespaced test bed, a laptop) runs the same plan without those flags. The head's facts
stand for every node: Sparks in one cluster are alike.

Two values are only known on the node itself when the rank starts, so the plan holds placeholders that the launcher
fills per node: the image's identity there (the kernel cache folder is one per image, since compiled kernels are
only valid for the build that made them) and the node's user (containers run as that user, so nothing they write
into a mounted folder ends up owned by root).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping

from recipe.plan.host import HostFacts, LinkEnd
from recipe.plan.parts import Mount, SecretFile
from recipe.settings import Settings

CONTAINER_HF = "/hf"  # not under /root: the container runs as the node's user, who cannot enter /root
CONTAINER_CHECKPOINT = "/checkpoint"
CONTAINER_KERNELS = "/cache"
NCCL_CHANNELS = 4
IMAGE_ID = "<image id>"  # filled per node at launch: the first 12 hex digits of the image's id there
NODE_USER = "<uid:gid>"  # filled per node at launch: `id -u`:`id -g` of the ssh user there


def container_name(settings: Settings, rank: int) -> str:
    return f"{settings.container_name}-rank{rank}"


def docker_checkpoint(settings: Settings) -> str:
    """The checkpoint folder as the container sees it."""
    if settings.checkpoint:
        return CONTAINER_CHECKPOINT
    org, name = settings.model_id.split("/", 1)
    revision = settings.model_revision or "<revision resolved at download>"
    return f"{CONTAINER_HF}/hub/models--{org}--{name}/snapshots/{revision}"


def kernel_cache(settings: Settings) -> str:
    """This node's kernel cache for the image it runs (the placeholder is filled at launch)."""
    return os.path.join(settings.cache_dir, "kernels", IMAGE_ID)


def docker_mounts(settings: Settings, secret_files: tuple[SecretFile, ...], rank: int) -> tuple[Mount, ...]:
    """Read-only checkpoint (or HF cache), the writable kernel cache, and on rank 0 the secret files."""
    mounts = [
        Mount(settings.checkpoint, CONTAINER_CHECKPOINT)
        if settings.checkpoint
        else Mount(settings.hf_cache, CONTAINER_HF),
        Mount(kernel_cache(settings), CONTAINER_KERNELS, read_only=False),
    ]
    if rank == 0:  # only rank 0 serves HTTP; the files exist only on the head
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


def container_env(settings: Settings, host: HostFacts, link: LinkEnd) -> dict[str, str]:
    """What a rank's container adds: the link's NCCL settings, gloo on the same netdev (the CPU path), caches."""
    env = {
        **docker_env(settings, link),
        "GLOO_SOCKET_IFNAME": link.ifname,
        "PYTHONUNBUFFERED": "1",
        "HOME": "/tmp",
        "HF_HOME": CONTAINER_HF,
        "TRITON_CACHE_DIR": f"{CONTAINER_KERNELS}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{CONTAINER_KERNELS}/inductor",
    }
    if not host.gpu:
        # Without GPUs the ranks compute on the CPU; on one machine (the test bed) they share its cores.
        env["OMP_NUM_THREADS"] = str(max(1, host.cpu_count // settings.tp))
    return env


def device_flags(host: HostFacts) -> list[str]:
    """GPUs and the RDMA devices when this kind of machine has them; nothing otherwise (without RDMA, raising the
    locked-memory limit is pointless, and a machine whose own hard limit is lower refuses to start the container)."""
    flags = ["--gpus", "all"] if host.gpu else []
    if host.rdma:  # RDMA registers (pins) memory: unlimited locked memory, and the right to lock it
        flags += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1"]
    return flags


def docker_argv(
    settings: Settings,
    host: HostFacts,
    rank: int,
    env: Mapping[str, str],
    mounts: tuple[Mount, ...],
    serve: tuple[str, ...],
) -> tuple[str, ...]:
    # --init: the engine is not PID 1, so `docker stop`'s SIGTERM reaches it (PID 1 ignores signals it has no
    # handler for, and ranks > 0 have none: they would sit out STOP_TIMEOUT and be killed).
    argv = [
        "docker",
        "run",
        "-d",
        "--init",
        "--name",
        container_name(settings, rank),
        "--user",
        NODE_USER,
        "--network",
        "host",
        "--ipc",
        "host",
        "--shm-size",
        "16g",
        "--ulimit",
        "stack=67108864",
        *device_flags(host),
    ]
    for name, value in env.items():
        argv += ["-e", f"{name}={value}"]
    for mount in mounts:
        argv += ["-v", f"{mount.source}:{mount.target}{':ro' if mount.read_only else ''}"]
    return (*argv, *extra_docker_args(settings), settings.image, *serve)


def extra_docker_args(settings: Settings) -> list[str]:
    return shlex.split(settings.docker_args)  # checked when the settings were read (type args)
