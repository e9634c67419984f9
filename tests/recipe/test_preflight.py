"""Preflight checks with nodes whose commands are answered here: memory sizes, docker runtimes and ssh failures of
real Sparks cannot be produced on a test machine, so each node's answers are written down (the cluster tests run
the same checks against real sshd, rsync and docker nodes)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from recipe.checkpoint.checkpoint import CheckpointError
from recipe.net.nodes import Node, Result
from recipe.preflight.preflight import FAIL, OK, WARN, Context, PreflightError, first_failure, run_checks
from recipe.settings import load_settings

GIB_KB = 1024 * 1024


class Answers(Node):
    """A node that answers commands from a table: the first key that starts the command wins."""

    def __init__(self, name: str, local: bool, answers: dict[str, Callable[[Sequence[str]], Result] | tuple]) -> None:
        self.name, self.is_local, self.answers, self.asked = name, local, answers, []

    def run(self, argv: Sequence[str], timeout_s: float = 60, input: str | None = None) -> Result:
        self.asked.append(" ".join(argv))
        for key, answer in self.answers.items():
            if " ".join(argv).startswith(key):
                if callable(answer):
                    return answer(argv)
                code, out, err = answer
                return Result(self.name, tuple(argv), code, out, err)
        return Result(self.name, tuple(argv), 127, "", f"{argv[0]}: not found")


def healthy(name: str, local: bool, mem_gib: int = 120, runtimes: str = '{"nvidia":{},"runc":{}}') -> Answers:
    return Answers(
        name,
        local,
        {
            "true": (0, "", ""),
            "cat /proc/meminfo": (0, f"MemTotal: {128 * GIB_KB} kB\nMemAvailable: {mem_gib * GIB_KB} kB\n", ""),
            "sh -c": (0, "/dev/x 1000000000 1 900000000 1% /\n", ""),  # df (and the other small scripts)
            "rsync --version": (0, "rsync  version 3.2.7  protocol version 31\n", ""),
            "docker info": (0, runtimes + "\n", ""),
        },
    )


def context(tmp: Path, head: Node, workers: list[Node], **env: str) -> Context:
    settings = load_settings(
        tmp,
        {
            "TP": str(len(workers) + 1),
            "WORKER": "me@spark2" if workers else "",
            "HF_CACHE": str(tmp / "hf"),
            "CACHE_DIR": str(tmp / "c"),
            "PORT": "18888",
            "LOG_DIR": str(tmp / "logs"),
            **env,
        },
    )
    return Context(settings=settings, head=head, workers=workers)


def by_name(checks) -> dict[tuple[str, str], object]:
    return {(c.name, c.node): c for c in checks}


def test_unreachable_worker_fails_its_ssh_check_with_the_fix_and_is_checked_no_further(tmp_path: Path) -> None:
    worker = Answers("me@spark2", False, {"true": (255, "", "me@spark2: Permission denied (publickey).\n")})
    checks = list(run_checks(context(tmp_path, healthy("local", True), [worker])))
    ssh = by_name(checks)[("ssh", "me@spark2")]
    assert ssh.status == FAIL and "Permission denied" in ssh.message and "ssh-copy-id me@spark2" in ssh.fix
    assert worker.asked == ["true"]  # no memory/disk/docker/link questions to a node we cannot reach
    assert not any(c.name == "link" for c in checks)


def test_unknown_host_key_is_reported_not_accepted(tmp_path: Path) -> None:
    worker = Answers("me@spark2", False, {"true": (255, "", "Host key verification failed.\n")})
    with pytest.raises(PreflightError) as stopped:
        first_failure(context(tmp_path, healthy("local", True), [worker]))
    assert "ssh (me@spark2)" in stopped.value.message and "fingerprint" in stopped.value.fix


def test_low_memory_warns_on_sparks_and_not_for_the_embedded_default(tmp_path: Path) -> None:
    spark = by_name(
        run_checks(context(tmp_path, healthy("local", True, mem_gib=60), [healthy("me@spark2", False)], FABRIC_PEER=""))
    )
    assert spark[("memory", "head")].status == WARN and "only 60 GiB" in spark[("memory", "head")].message
    assert spark[("memory", "me@spark2")].status == OK
    local = by_name(run_checks(context(tmp_path, healthy("local", True, mem_gib=6), [])))
    assert local[("memory", "head")].status == OK
    lowered = by_name(
        run_checks(
            context(tmp_path, healthy("local", True, mem_gib=60), [healthy("me@spark2", False)], MEMORY_WARN_GIB="50")
        )
    )
    assert lowered[("memory", "head")].status == OK


def test_docker_without_nvidia_runtime_warns_and_a_silent_daemon_fails(tmp_path: Path) -> None:
    worker = healthy("me@spark2", False, runtimes='{"runc":{}}')
    head = healthy("local", True)
    head.answers["docker info"] = (1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n")
    checks = by_name(run_checks(context(tmp_path, head, [worker])))
    assert checks[("docker", "me@spark2")].status == WARN and "nvidia" in checks[("docker", "me@spark2")].fix
    assert checks[("docker", "head")].status == FAIL and "systemctl" in checks[("docker", "head")].fix


def test_docker_that_refuses_this_user_says_to_join_the_docker_group(tmp_path: Path) -> None:
    head = healthy("local", True)
    head.answers["docker info"] = (
        1,
        "",
        "permission denied while trying to connect to the Docker daemon socket at "
        'unix:///var/run/docker.sock: Get "http://%2Fvar%2Frun%2Fdocker.sock/v1.47/info": '
        "dial unix /var/run/docker.sock: connect: permission denied\n",
    )
    docker = by_name(run_checks(context(tmp_path, head, [healthy("me@spark2", False)])))[("docker", "head")]
    assert docker.status == FAIL and "refuses this user" in docker.message
    assert "usermod -aG docker" in docker.fix


def test_api_port_in_use_fails_unless_our_own_server_holds_it(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ctx = context(tmp_path, healthy("local", True), [], PORT=str(port))
        assert by_name(run_checks(ctx))[("port", "head")].status == FAIL
        ctx.api_port_ours = True
        assert by_name(run_checks(ctx))[("port", "head")].status == OK


def test_worker_disk_counts_only_what_it_lacks(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    head = healthy("local", True)
    head.answers = {"sh -c cd": (0, "a.safetensors\t3000000000\nconfig.json\t10\n", ""), **head.answers}
    worker = healthy("me@spark2", False)
    worker.answers = {
        "sh -c cd": (0, "a.safetensors\t1000\nconfig.json\t10\n", ""),
        "sh -c p": (0, "/dev/x 1000 1 2000000 1% /\n", ""),
        **worker.answers,
    }  # 2 GB free
    checks = by_name(run_checks(context(tmp_path, head, [worker], CHECKPOINT=str(ckpt))))
    disk = checks[("disk", "me@spark2")]
    assert disk.status == FAIL and "2.8 GiB of checkpoint still to come" in disk.message
    assert checks[("disk", "head")].status == OK and "0.0 GiB" in checks[("disk", "head")].message


def test_missing_rsync_fails_on_that_node(tmp_path: Path) -> None:
    worker = healthy("me@spark2", False)
    del worker.answers["rsync --version"]
    checks = by_name(run_checks(context(tmp_path, healthy("local", True), [worker])))
    assert checks[("rsync", "me@spark2")].status == FAIL and "apt install rsync" in checks[("rsync", "me@spark2")].fix
    assert checks[("rsync", "head")].status == OK


def test_tp_that_does_not_match_the_workers_stops_before_any_worker_is_asked(tmp_path: Path) -> None:
    worker = healthy("me@spark2", False)
    settings = load_settings(
        tmp_path, {"TP": "3", "WORKER": "me@spark2", "HF_CACHE": str(tmp_path / "hf"), "PORT": "18888"}, rules=False
    )
    with pytest.raises(PreflightError) as stopped:
        first_failure(Context(settings=settings, head=healthy("local", True), workers=[worker]))
    assert "TP=3 needs 2 worker(s), 1 set" in stopped.value.message and worker.asked == []


def test_head_disk_counts_what_the_hub_lists_as_missing_or_estimates_without_it(tmp_path: Path) -> None:
    from recipe.checkpoint.download import HubUnreachable

    head = healthy("local", True)  # df: ~858 GiB free
    ctx = context(tmp_path, head, [healthy("me@spark2", False)])
    ctx.hub_need = lambda settings: 3 * 1024**3
    disk = by_name(run_checks(ctx))[("disk", "head")]
    assert disk.status == OK and "3.0 GiB of checkpoint still to come (the files the Hub lists" in disk.message

    def unreachable(settings):
        raise HubUnreachable("the Hub (huggingface.co:443) did not answer (Network is unreachable)")

    ctx.hub_need, ctx.hub_answer = unreachable, None
    disk = by_name(run_checks(ctx))[("disk", "head")]
    assert (
        "170.0 GiB of checkpoint still to come (estimate: the Hub (huggingface.co:443) did not answer" in disk.message
    )


class AsNobody(Node):
    """This machine, every command run as the unprivileged user `nobody` (real permission checks, no root
    override): how a cache left owned by root by a container looks to the user the recipe runs as."""

    def __init__(self, local: bool) -> None:
        self.name, self.is_local = ("local" if local else "nobody@here"), local

    def _wrap(self, argv: Sequence[str]) -> list[str]:
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", *argv]


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to run the check as another user"
)
@pytest.mark.parametrize("local", [False, True], ids=["worker", "head"])
def test_cache_left_owned_by_root_is_refused_with_the_chown_fix(tmp_path: Path, local: bool) -> None:
    from recipe.preflight.preflight import check_cache_writable

    base = Path(tempfile.mkdtemp(prefix="sparks-cache-"))  # pytest's own folders are private to root
    try:
        base.chmod(0o755)
        hub = base / "hf" / "hub" / "models--org--model"
        (hub / "blobs").mkdir(parents=True)
        node = AsNobody(local)
        ctx = context(
            tmp_path,
            healthy("local", True),
            [healthy("me@spark2", False)],
            MODEL_ID="org/model",
            HF_CACHE=str(base / "hf"),
            MODEL_REVISION="078455ffe6472f9a52fbc1139f58b9db2881b25c",
        )
        check = check_cache_writable(ctx, node)
        assert check.status == FAIL and str(hub / "blobs") in check.message
        assert f"chown -R $USER {hub / 'blobs'}" in check.fix
        for folder in (hub, hub / "blobs"):
            shutil.chown(folder, "nobody")
        assert check_cache_writable(ctx, node).status == OK
        if local:  # a complete snapshot is only read: nothing to write, whoever owns it
            shutil.chown(hub, "root")
            snap = hub / "snapshots" / "078455ffe6472f9a52fbc1139f58b9db2881b25c"
            snap.mkdir(parents=True)
            (snap / "config.json").write_text("{}")
            assert check_cache_writable(ctx, node).status == OK
    finally:
        shutil.rmtree(base)


def test_head_snapshot_that_the_hub_cannot_complete_stops_start_before_anything(tmp_path: Path) -> None:
    from recipe.checkpoint.download import HubUnreachable

    asked = []

    def offline(settings):
        asked.append(settings.model_id)
        raise HubUnreachable("HF_HUB_OFFLINE is set: the Hub is not asked")

    worker = healthy("me@spark2", False)
    ctx = context(tmp_path, healthy("local", True), [worker])
    ctx.hub_need = offline
    with pytest.raises(PreflightError) as stopped:
        first_failure(ctx)
    assert stopped.value.message.startswith("checkpoint (head): ") and "is not complete here" in stopped.value.message
    assert "HF_HUB_OFFLINE is set" in stopped.value.message and "HF_CACHE" in stopped.value.fix
    assert asked == ["Mia-AiLab/GLM-5.3-Flash-EXL3-4bpw-TensorFold"]  # the disk check's answer was reused

    def no_such_revision(settings):
        raise CheckpointError("the Hub has no revision 'x' of org/model", "check MODEL_REVISION (a commit)")

    ctx = context(tmp_path, healthy("local", True), [worker])
    ctx.hub_need = no_such_revision
    check = by_name(run_checks(ctx))[("checkpoint", "head")]
    assert check.status == FAIL and "the Hub has no revision" in check.message and "MODEL_REVISION" in check.fix

    ctx = context(tmp_path, healthy("local", True), [worker])
    ctx.hub_need = lambda settings: 2 * 1024**3
    check = by_name(run_checks(ctx))[("checkpoint", "head")]
    assert check.status == OK and "2.0 GiB still to download" in check.message
