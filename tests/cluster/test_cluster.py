"""The recipe across real nodes: namespaces with their own sshd, rsync and dockerd (tests/cluster/testbed.py). The
CLI runs in the head's namespace and reaches the workers only over ssh. RoCE facts come from stand-in sysfs trees
(no RDMA can exist here); everything else is real."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

SPARKS = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "sparks")
MIB = 1024 * 1024


def sparks(bed, *args: str, timeout_s: float = 120, **settings: str) -> subprocess.CompletedProcess:
    done = bed.on_head([SPARKS, *args], bed.environ(COLUMNS="200", **settings), timeout_s=timeout_s)
    print(f"$ sparks {' '.join(args)} → {done.returncode}\n{done.stdout}{done.stderr}")
    return done


def make_checkpoint(bed, files: dict[str, int]) -> Path:
    folder = bed.path_on("head", "data/ckpt")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "glm5_next"}\n')
    for name, size in files.items():
        (folder / name).write_bytes(os.urandom(size))
    return folder


def rows(output: str) -> dict[tuple[str, str], str]:
    """`sparks doctor`'s table as (check, node) → status."""
    found = {}
    for line in output.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)]
        if len(cells) >= 3 and cells[2] in ("ok", "warn", "fail"):
            found[(cells[0], cells[1])] = cells[2]
    return found


def found(output: str, check: str, node: str) -> str:
    """The "found" cell of one row of `sparks doctor`'s table, wrapped lines joined."""
    parts, inside = [], False
    for line in output.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)]
        if len(cells) < 4:
            inside = False
            continue
        if cells[0]:
            inside = (cells[0], cells[1]) == (check, node)
        if inside:
            parts.append(cells[3])
    return " ".join(p for p in parts if p)


def test_doctor_passes_over_ssh_and_detects_the_link(bed) -> None:
    make_checkpoint(bed, {"model.safetensors": 2 * MIB})
    done = sparks(bed, "doctor")
    table = rows(done.stdout)
    assert done.returncode == 0 and "fail" not in table.values(), done.stdout + done.stderr
    w1 = "root@" + bed.nodes["w1"].address
    for check in ("ssh", "memory", "disk", "rsync", "docker", "cache", "link"):
        assert (check, w1) in table, check
    assert table[("ssh", w1)] == "ok" and table[("link", w1)] == "ok"
    assert "10.77.0.1 (eth0) <-> 10.77.0.2 (eth0), RoCE rocep1s0f1 / rocep1s0f1, GID 3" in done.stdout
    assert table[("checkpoint", w1)] == "warn"  # not copied yet


def test_unreachable_worker_is_named_with_a_fix(bed) -> None:
    # w2's firewall refuses ssh (a stopped sshd looks the same from the head).
    w2 = "root@" + bed.nodes["w2"].address
    rule = ["INPUT", "-p", "tcp", "--dport", "22", "-j", "REJECT", "--reject-with", "tcp-reset"]
    bed.in_node("w2", "iptables", "-A", *rule)
    try:
        done = sparks(bed, "doctor", TP="3", WORKER2=w2)
    finally:
        bed.in_node("w2", "iptables", "-D", *rule)
    table = rows(done.stdout)
    assert done.returncode == 1 and table[("ssh", w2)] == "fail"
    assert "Connection refused" in done.stdout and ("memory", w2) not in table


def test_copy_then_interrupted_copy_resumes_then_corruption_is_repaired(bed) -> None:
    folder = make_checkpoint(bed, {"model-00001.safetensors": 3 * MIB, "big.safetensors": 24 * MIB})
    blob = bed.path_on("head", "data/blob-outside")  # an HF-xet-style link out of the folder
    blob.write_bytes(os.urandom(MIB))
    (folder / "linked.safetensors").symlink_to(blob)
    worker_copy = bed.path_on("w1", "data/ckpt")

    # Interrupted: the worker's side of the cable slowed to ~24 Mbit/s, the copy stopped partway by SIGTERM.
    bed.in_switch(
        "tc", "qdisc", "add", "dev", "v-w1", "root", "tbf", "rate", "24mbit", "burst", "32kb", "latency", "400ms"
    )
    try:
        proc = bed.on_head([SPARKS, "copy"], bed.environ(), wait=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _partial_bytes(worker_copy) < 6 * MIB:
            time.sleep(0.2)
        assert _partial_bytes(worker_copy) >= 6 * MIB, "the copy did not get going"
        os.killpg(proc.pid, signal.SIGTERM)  # our own process group: the CLI, rsync, ssh
        proc.communicate(timeout=30)
        assert proc.returncode != 0
    finally:
        bed.in_switch("tc", "qdisc", "del", "dev", "v-w1", "root")
    kept = _partial_bytes(worker_copy)
    assert kept >= 6 * MIB

    done = sparks(bed, "copy")
    assert done.returncode == 0 and "identical to the head's" in done.stdout
    sent_mib = float(re.search(r"\(([0-9.]+) MiB sent this time\)", done.stdout).group(1))
    assert sent_mib < 28 - kept / MIB + 2, f"resumed copy sent {sent_mib} MiB though {kept / MIB:.0f} MiB were there"
    assert (worker_copy / "linked.safetensors").read_bytes() == blob.read_bytes()
    assert not (worker_copy / "linked.safetensors").is_symlink()

    # Corrupted on the worker: a file cut short and another changed in place are found and repaired.
    with open(worker_copy / "big.safetensors", "r+b") as cut:
        cut.truncate(5 * MIB)
    (worker_copy / "model-00001.safetensors").write_bytes(os.urandom(3 * MIB))
    w1 = "root@" + bed.nodes["w1"].address
    doctor = sparks(bed, "doctor")
    assert rows(doctor.stdout)[("checkpoint", w1)] == "warn" and "big.safetensors" in doctor.stdout
    done = sparks(bed, "copy")
    assert done.returncode == 0 and "identical to the head's" in done.stdout
    for name in ("big.safetensors", "model-00001.safetensors", "config.json"):
        assert (worker_copy / name).read_bytes() == (folder / name).read_bytes(), name
    assert rows(sparks(bed, "doctor").stdout)[("checkpoint", w1)] == "ok"


def _partial_bytes(folder: Path, part: str = "big") -> int:
    """Bytes that have reached the worker's folder so far, rsync's hidden temporary files included."""
    if not folder.exists():
        return 0
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and part in p.name)


def test_dry_run_plans_with_the_detected_link(bed) -> None:
    make_checkpoint(bed, {"model.safetensors": MIB})
    done = sparks(bed, "start", DRY_RUN="1")
    assert done.returncode == 0, done.stdout + done.stderr
    rank1 = done.stdout.split("\nrank 1 on root@10.77.0.2", 1)[1].split("\nrank 0 here", 1)[0]
    rank0 = done.stdout.split("\nrank 0 here", 1)[1]
    for text in (rank0, rank1):
        assert "NCCL_SOCKET_IFNAME=eth0" in text and "NCCL_IB_HCA=rocep1s0f1" in text
        assert "NCCL_IB_GID_INDEX=3" in text and "--master 10.77.0.1:" in text
    assert "<link netdev>" not in done.stdout


REV = "078455ffe6472f9a52fbc1139f58b9db2881b25c"
HF = {"MODEL_ID": "org/model", "MODEL_REVISION": REV, "CHECKPOINT": "", "HF_HUB_OFFLINE": "1"}


def make_hf_cache(bed) -> tuple[Path, Path]:
    """The head's HF cache as huggingface_hub leaves it: snapshot links into blobs/, one blob a xet-style link to a
    file outside the cache, refs/main naming the commit."""
    repo = bed.path_on("head", "hf/hub/models--org--model")
    snap = repo / "snapshots" / REV
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    contents = {
        "config.json": b'{"model_type": "glm5_next"}\n',
        "model-00001.safetensors": os.urandom(3 * MIB),
        "model-00002.safetensors": os.urandom(24 * MIB),
    }
    for i, (name, data) in enumerate(contents.items()):
        (repo / "blobs" / f"blob{i}").write_bytes(data)
        (snap / name).symlink_to(f"../../blobs/blob{i}")
    xet = bed.path_on("head", "xet-store/chunk")
    xet.parent.mkdir()
    xet.write_bytes(os.urandom(MIB))
    (repo / "blobs" / "blob-xet").symlink_to(xet)
    (snap / "model-00003.safetensors").symlink_to("../../blobs/blob-xet")
    return repo, snap


def test_hf_cache_copy_sends_blobs_then_links_resumes_and_repairs(bed) -> None:
    repo, snap = make_hf_cache(bed)
    w_repo = bed.path_on("w1", "hf/hub/models--org--model")
    w_snap = w_repo / "snapshots" / REV
    w1 = "root@" + bed.nodes["w1"].address

    # Interrupted while the blobs travel: what arrived stays, and no snapshot link points at half a blob yet.
    bed.in_switch(
        "tc", "qdisc", "add", "dev", "v-w1", "root", "tbf", "rate", "24mbit", "burst", "32kb", "latency", "400ms"
    )
    try:
        proc = bed.on_head([SPARKS, "copy"], bed.environ(**HF), wait=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _partial_bytes(w_repo / "blobs", "blob") < 6 * MIB:
            time.sleep(0.2)
        assert _partial_bytes(w_repo / "blobs", "blob") >= 6 * MIB, "the copy did not get going"
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
        assert proc.returncode != 0
    finally:
        bed.in_switch("tc", "qdisc", "del", "dev", "v-w1", "root")
    kept = _partial_bytes(w_repo / "blobs", "blob")
    assert not w_snap.exists() or not any(w_snap.iterdir())

    done = sparks(bed, "copy", **HF)
    assert done.returncode == 0 and "identical to the head's" in done.stdout
    sent_mib = float(re.search(r"\(([0-9.]+) MiB sent this time\)", done.stdout).group(1))
    assert sent_mib < 29 - kept / MIB + 2, f"resumed copy sent {sent_mib} MiB though {kept / MIB:.0f} MiB were there"
    # The worker's cache is a cache: the snapshot holds links into blobs/, the xet blob arrived as a file.
    for entry in snap.iterdir():
        assert os.readlink(w_snap / entry.name) == os.readlink(entry), entry.name
        assert (w_snap / entry.name).read_bytes() == entry.read_bytes(), entry.name
    assert not (w_repo / "blobs" / "blob-xet").is_symlink()
    assert (w_repo / "refs" / "main").read_text() == REV

    # Corrupted on the worker (a blob cut short, a stray file in the snapshot): found, then repaired.
    with open(w_repo / "blobs" / "blob2", "r+b") as cut:
        cut.truncate(5 * MIB)
    (w_snap / "stray.safetensors").write_bytes(b"not the head's")
    doctor = sparks(bed, "doctor", **HF)
    assert rows(doctor.stdout)[("checkpoint", w1)] == "warn" and "model-00002.safetensors" in doctor.stdout
    done = sparks(bed, "copy", **HF)
    assert done.returncode == 0 and "identical to the head's" in done.stdout
    assert (w_snap / "model-00002.safetensors").read_bytes() == (snap / "model-00002.safetensors").read_bytes()
    assert not (w_snap / "stray.safetensors").exists()
    assert rows(sparks(bed, "doctor", **HF).stdout)[("checkpoint", w1)] == "ok"


@pytest.fixture
def second_rail(bed):
    """A second cable between the head and w1 (eth1 on 10.77.1.0/24 through a bridge of its own), and stand-in
    sysfs trees that give eth1 a RoCE device on both; all undone afterwards (the test bed is shared)."""
    from sysfs_tree import Port, write_tree

    def trees(rails: int) -> None:
        for name, octet in (("head", 1), ("w1", 2)):
            node = bed.nodes[name]
            ports = [Port("eth0", node.address, "rocep1s0f1"), Port("eth1", f"10.77.1.{octet}", "roceP2p1s0f1")]
            write_tree(node.dir / "sys", ports[:rails])

    bed.in_switch("ip", "link", "add", "br1", "type", "bridge")
    bed.in_switch("ip", "link", "set", "br1", "up")
    try:
        for name, octet in (("head", 1), ("w1", 2)):
            bed.in_switch(
                "ip",
                "link",
                "add",
                f"r2-{name}",
                "type",
                "veth",
                "peer",
                "name",
                "eth1",
                "netns",
                bed.nodes[name].netns,
            )
            bed.in_switch("ip", "link", "set", f"r2-{name}", "master", "br1", "up")
            bed.in_node(name, "ip", "addr", "add", f"10.77.1.{octet}/24", "dev", "eth1")
            bed.in_node(name, "ip", "link", "set", "eth1", "up")
        bed.assert_no_default_route()
        trees(2)
        yield
    finally:
        trees(1)
        for name in ("head", "w1"):
            subprocess.run(
                ["ip", "netns", "exec", bed.switch, "ip", "link", "del", f"r2-{name}"], capture_output=True, timeout=10
            )
        subprocess.run(["ip", "netns", "exec", bed.switch, "ip", "link", "del", "br1"], capture_output=True, timeout=10)


def test_second_rail_is_probed_and_left_out_when_it_does_not_carry(bed, second_rail) -> None:
    make_checkpoint(bed, {"model.safetensors": MIB})
    w1 = "root@" + bed.nodes["w1"].address
    done = sparks(bed, "doctor")
    assert rows(done.stdout)[("link", w1)] == "ok", done.stdout
    assert "RoCE rocep1s0f1,roceP2p1s0f1 / rocep1s0f1,roceP2p1s0f1, GID 3, 2 rail(s)" in found(done.stdout, "link", w1)

    bed.in_switch("ip", "link", "set", "r2-w1", "down")  # the second cable pulled at w1's end
    done = sparks(bed, "doctor")
    assert rows(done.stdout)[("link", w1)] == "warn"
    text = found(done.stdout, "link", w1)
    assert "1 rail(s)" in text and "second rail eth1 (10.77.1.1) <-> root@10.77.0.2's eth1 (10.77.1.2)" in text
    assert "not used" in text


NODES_SCRIPT = r"""
import json, subprocess, sys, time
from recipe.net.nodes import SshNode, on_each, ssh_fix

def master(node):
    return subprocess.run(["ssh", *node.ssh_options(), "-O", "check", node.target], capture_output=True,
                          text=True).stderr.strip()

w1, w2 = sys.argv[1:3]
node = SshNode(w1)
first = node.run(["printf", "%s|", "two words", "it's", "$HOME", "a;b"])
before = master(node)
node.run(["true"])
after = master(node)
started = time.monotonic()
group = on_each([SshNode(w1), SshNode(w2), SshNode("ghost@" + w1.split("@")[1])], lambda n: n.run(["hostname"]))
group_s = time.monotonic() - started
node.close()
print(json.dumps({"first": first.stdout, "before": before, "after": after, "group_s": group_s,
                  "group": {k: [r.code, r.stdout.strip(), r.last_error_line(), ssh_fix(k, r)]
                            for k, r in group.items()}}))
"""


def test_nodes_over_ssh_quote_reuse_one_connection_and_report_each_node(bed, tmp_path: Path) -> None:
    """SshNode against real sshd: arguments arrive as given, commands share one master connection, a group call
    returns every node's own result (a blackholed node within ConnectTimeout, a refused key at once)."""
    w1, w2 = (f"root@{bed.nodes[n].address}" for n in ("w1", "w2"))
    control = bed.root / "ctl-nodes"  # a fresh master: none of the other tests' connections
    control.mkdir(mode=0o700, exist_ok=True)
    rule = ["INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP"]  # w2 is switched off, as seen from the head
    bed.in_node("w2", "iptables", "-A", *rule)
    try:
        done = bed.on_head(
            [str(Path(SPARKS).parent / "python"), "-c", NODES_SCRIPT, w1, w2],
            bed.environ(SPARKS_SSH_CONTROL_DIR=str(control)),
            timeout_s=60,
        )
    finally:
        bed.in_node("w2", "iptables", "-D", *rule)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["first"] == "two words|it's|$HOME|a;b|"
    assert "Master running" in result["before"] and result["before"] == result["after"]  # same master PID
    group = result["group"]
    assert group[w1][:2] == [0, "w1"]
    code, _, error, fix = group[w2]
    assert code == 255 and "timed out" in error and "reachable" in fix
    code, _, error, fix = group["ghost@" + bed.nodes["w1"].address]
    assert code == 255 and "Permission denied" in error and "ssh-copy-id" in fix
    assert result["group_s"] < 10 + 5  # the silent node took ConnectTimeout, the others did not wait for it


def test_a_changed_host_key_is_refused_not_accepted(bed, tmp_path: Path) -> None:
    known = bed.root / "keys" / "known_hosts"
    saved = known.read_text()
    w1 = bed.nodes["w1"]
    other_key = (bed.nodes["w2"].dir / "ssh_host_ed25519_key.pub").read_text().split()
    control = bed.root / "ctl-hostkey"
    control.mkdir(mode=0o700, exist_ok=True)
    known.write_text(
        "".join(
            line + "\n" if not line.startswith(w1.address + " ") else f"{w1.address} {other_key[0]} {other_key[1]}\n"
            for line in saved.splitlines()
        )
    )
    try:
        done = sparks(bed, "doctor", SPARKS_SSH_CONTROL_DIR=str(control))
    finally:
        known.write_text(saved)
    assert done.returncode == 1 and rows(done.stdout)[("ssh", "root@" + w1.address)] == "fail"
    assert "fingerprint" in " ".join(done.stdout.split())


def test_three_nodes_doctor_and_copy_reach_both_workers(bed) -> None:
    """./start-tp3.sh's checks and copy: WORKER2 is checked like WORKER (its own link), and the copy goes to both
    workers at once, each reported."""
    folder = make_checkpoint(bed, {"model.safetensors": 2 * MIB})
    w1, w2 = (f"root@{bed.nodes[n].address}" for n in ("w1", "w2"))
    done = sparks(bed, "doctor", TP="3", WORKER2=w2)
    table = rows(done.stdout)
    assert done.returncode == 0 and table[("link", w1)] == "ok" and table[("link", w2)] == "ok", done.stdout
    assert "10.77.0.1 (eth0) <-> 10.77.0.3 (eth0)" in found(done.stdout, "link", w2)
    assert "10.77.0.2 (eth0) <-> 10.77.0.3 (eth0)" in found(done.stdout, "link", f"{w1} <-> {w2}")
    done = sparks(bed, "copy", TP="3", WORKER2=w2)
    assert done.returncode == 0
    for worker, node in ((w1, "w1"), (w2, "w2")):
        assert re.search(rf"^{re.escape(worker)}: \d+ files, .* identical to the head's", done.stdout, re.M), worker
        assert (bed.path_on(node, "data/ckpt/model.safetensors")).read_bytes() == (
            folder / "model.safetensors"
        ).read_bytes()
