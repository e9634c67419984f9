"""A head and workers on one machine: each node a network namespace with its own sshd (and dockerd), joined by a
bridge that lives in a namespace of its own, on a private subnet with no default route anywhere.

Safety: the root namespace has a route out of this machine, so nothing here ever addresses a node from it. Every
client runs inside the head's namespace (`TestBed.on_head`), and `up` asserts that no test namespace has a default
route before anything is sent. Every wait is bounded; `down` ends only the processes this test bed started, by
PID, and deletes only its own namespaces.

Per node, a mount namespace gives it a private /run (sshd needs /run/sshd; docker's socket lands there) and a
private data folder at `<bed>/node` (its checkpoint copy and its stand-in sysfs): the namespaces share one
filesystem, and without this a "copy to the worker" would silently be a copy onto itself.

RoCE cannot exist here (no RDMA in this kernel), so each node's `<bed>/node/sys` is a stand-in tree that maps its
eth0 address to a RoCE v2 GID (tests/fixtures/sysfs_tree.py); the recipe reads it through SPARKS_SYSFS_ROOT.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from sysfs_tree import Port, write_tree  # noqa: E402

TOOLS = ("ip", "unshare", "nsenter", "ssh", "ssh-keygen", "/usr/sbin/sshd", "rsync")
WAIT_S = 10


def missing_prerequisites(docker: bool) -> str:
    """Why the test bed cannot run here ("" when it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, mounts)"
    tools = TOOLS + (("/usr/sbin/dockerd", "docker") if docker else ())
    missing = [t for t in tools if not (shutil.which(t) or os.access(t, os.X_OK))]
    if missing:
        return f"missing {', '.join(missing)} (scripts/testbed-deps.sh installs them)"
    probe = f"sparks-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


@dataclass
class Node:
    name: str
    address: str
    netns: str
    dir: Path
    pids: dict[str, int] = field(default_factory=dict)  # what we started for it: "sshd", "dockerd"


class TestBed:
    __test__ = False

    def __init__(self, workers: int = 2, docker: bool = True, subnet: str = "10.77.0") -> None:
        self.root = Path(tempfile.mkdtemp(prefix="sparks-tb-"))  # short: ssh control sockets live under it
        self.tag = f"sptb{os.getpid() % 100000}"
        self.subnet = subnet
        self.docker = docker
        names = ["head"] + [f"w{i}" for i in range(1, workers + 1)]
        self.nodes = {
            n: Node(n, f"{subnet}.{i}", f"{self.tag}-{n}", self.root / "nodes" / n)
            for i, n in enumerate(names, start=1)
        }
        self.switch = f"{self.tag}-sw"
        self.timings: dict[str, float] = {}
        self._made_netns: list[str] = []

    # ------------------------------------------------------------ up

    def up(self) -> TestBed:
        started = time.monotonic()
        try:
            self._network()
            self._keys()
            for node in self.nodes.values():
                self._node_dirs(node)
            self.timings["network+keys"] = time.monotonic() - started
            for node in self.workers:
                self._start_sshd(node)
            self.timings["sshd"] = time.monotonic() - started - self.timings["network+keys"]
            if self.docker:
                for node in self.nodes.values():
                    self._start_dockerd(node)
            self.timings["up"] = time.monotonic() - started
        except BaseException:
            self.down()
            raise
        return self

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.name != "head"]

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=WAIT_S)

    def _network(self) -> None:
        self._ip("netns", "add", self.switch)
        self._made_netns.append(self.switch)
        self._ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.switch, "link", "set", "br0", "up")
        for node in self.nodes.values():
            self._ip("netns", "add", node.netns)
            self._made_netns.append(node.netns)
            # The veth is made inside the switch namespace with its peer moved straight into the node's: the root
            # namespace never holds either end.
            self._ip(
                "-n",
                self.switch,
                "link",
                "add",
                f"v-{node.name}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                node.netns,
            )
            self._ip("-n", self.switch, "link", "set", f"v-{node.name}", "master", "br0", "up")
            self._ip("-n", node.netns, "link", "set", "lo", "up")
            self._ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
            self._ip("-n", node.netns, "link", "set", "eth0", "up")
        self.assert_no_default_route()

    def assert_no_default_route(self) -> None:
        for netns in self._made_netns:
            routes = subprocess.run(
                ["ip", "-n", netns, "route", "show", "default"],
                capture_output=True,
                text=True,
                timeout=WAIT_S,
                check=True,
            ).stdout
            if routes.strip():
                raise RuntimeError(
                    f"test namespace {netns} has a default route ({routes.strip()}): refusing to send anything"
                )

    def _keys(self) -> None:
        keys = self.root / "keys"
        keys.mkdir()
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "id_ed25519"), "-C", "sparks-testbed"],
            check=True,
            timeout=WAIT_S,
        )
        shutil.copy(keys / "id_ed25519.pub", keys / "authorized_keys")
        known = []
        for node in self.nodes.values():
            node.dir.mkdir(parents=True)
            host_key = node.dir / "ssh_host_ed25519_key"
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True, timeout=WAIT_S
            )
            # Host keys are known in advance: ssh checks them strictly, as it should on real Sparks.
            known.append(
                f"{node.address} {(node.dir / 'ssh_host_ed25519_key.pub').read_text().split(' ', 2)[0]} "
                f"{(node.dir / 'ssh_host_ed25519_key.pub').read_text().split()[1]}"
            )
        (keys / "known_hosts").write_text("\n".join(known) + "\n")
        (self.root / "ssh_config").write_text(
            "Host *\n  User root\n"
            f"  IdentityFile {keys / 'id_ed25519'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {keys / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n"
        )
        bin_dir = self.root / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "ssh"  # so rsync's and the recipe's `ssh` read the test bed's client config
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {self.root / "ssh_config"} "$@"\n')
        wrapper.chmod(0o755)
        (self.root / "ctl").mkdir(mode=0o700)
        (self.root / "node").mkdir()  # each node's own folder is mounted here, in its mount namespace

    def _node_dirs(self, node: Node) -> None:
        for sub in ("run/sshd", "data", "docker"):
            (node.dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(node.dir / "run", 0o755)
        os.chmod(node.dir / "run/sshd", 0o755)
        write_tree(node.dir / "sys", [Port("eth0", node.address, "rocep1s0f1")])

    def _mounts(self, node: Node) -> str:
        """Shell that gives the current (fresh) mount namespace this node's private folders."""
        return (
            f"mount --bind {node.dir} {self.root / 'node'} && mount --bind {node.dir / 'run'} /run && "
            f"hostname {node.name} 2>/dev/null; "
        )

    def _start_sshd(self, node: Node) -> None:
        config = node.dir / "sshd_config"
        config.write_text(
            f"ListenAddress {node.address}\nPort 22\nHostKey {node.dir / 'ssh_host_ed25519_key'}\n"
            f"PidFile {node.dir / 'sshd.pid'}\nAuthorizedKeysFile {self.root / 'keys' / 'authorized_keys'}\n"
            "StrictModes no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\nUseDNS no\n"
            "PrintMotd no\nPrintLastLog no\nMaxStartups 100:30:200\nSubsystem sftp /usr/lib/openssh/sftp-server\n"
        )
        log = open(node.dir / "sshd.log", "ab")
        proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                node.netns,
                "unshare",
                "--mount",
                "--uts",
                "sh",
                "-c",
                self._mounts(node) + f"exec /usr/sbin/sshd -D -e -f {config}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        node.pids["sshd"] = proc.pid  # ip, unshare and sh exec in turn: this PID is sshd's
        self._wait_listening(node, 22, proc)

    def _wait_listening(self, node: Node, port: int, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{node.name}'s daemon exited: {(node.dir / 'sshd.log').read_text()[-500:]}")
            listening = subprocess.run(
                ["ip", "netns", "exec", node.netns, "ss", "-Hltn", f"sport = :{port}"],
                capture_output=True,
                text=True,
                timeout=WAIT_S,
            ).stdout
            if listening.strip():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{node.name} is not listening on {port} after {WAIT_S}s")

    def _start_dockerd(self, node: Node) -> None:
        # nsenter, not `ip netns exec`: the latter mounts a fresh /sys, hiding the cgroup mounts dockerd needs.
        d = node.dir / "docker"
        (d / "etc").mkdir(exist_ok=True)
        (d / "etc" / "daemon.json").write_text("{}\n")
        log = open(d / "dockerd.log", "ab")
        proc = subprocess.Popen(
            [
                "nsenter",
                f"--net=/run/netns/{node.netns}",
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "slave",
                "sh",
                "-c",
                self._mounts(node) + f"mount --bind {d / 'etc'} /etc/docker && exec /usr/sbin/dockerd "
                f"--config-file /etc/docker/daemon.json --data-root {d / 'root'} --exec-root /run/docker "
                "--pidfile /run/docker.pid --host unix:///run/docker.sock --storage-driver overlay2 "
                "--iptables=false --ip-masq=false --bridge=none",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        node.pids["dockerd"] = proc.pid
        deadline = time.monotonic() + 20
        while not (node.dir / "run" / "docker.sock").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{node.name}'s dockerd did not start: {(d / 'dockerd.log').read_text()[-800:]}")
            time.sleep(0.1)

    # ------------------------------------------------------------ use

    def environ(self, **settings: str) -> dict[str, str]:
        """The head's environment for the recipe: the test bed's ssh, its stand-in sysfs, private folders."""
        from recipe.settings.schema import load_specs

        env = {k: v for k, v in os.environ.items() if k not in load_specs() and not k.startswith("SPARKS_")}
        (self.root / "config" / "scripts").mkdir(parents=True, exist_ok=True)
        node = self.root / "node"
        env.update(
            {
                "PATH": f"{self.root / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
                "SPARKS_CONFIG_ROOT": str(self.root / "config"),
                "SPARKS_SYSFS_ROOT": str(node / "sys"),
                "SPARKS_SSH_CONTROL_DIR": str(self.root / "ctl"),
                "LOG_DIR": str(node / "logs"),
                "CACHE_DIR": str(node / "cache"),
                "HF_CACHE": str(node / "hf"),
                "CHECKPOINT": str(node / "data" / "ckpt"),
                "WORKER": f"root@{self.nodes['w1'].address}",
                "TP": "2",
                **settings,
            }
        )
        return env

    def on_head(
        self, argv: list[str], env: dict[str, str], timeout_s: float = 120, wait: bool = True
    ) -> subprocess.CompletedProcess | subprocess.Popen:
        """Run a command in the head's namespace (with its private folders); never from the root namespace."""
        head = self.nodes["head"]
        wrapped = [
            "ip",
            "netns",
            "exec",
            head.netns,
            "unshare",
            "--mount",
            "--uts",
            "sh",
            "-c",
            self._mounts(head) + 'exec "$@"',
            "head",
            *argv,
        ]
        if not wait:
            return subprocess.Popen(
                wrapped,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return subprocess.run(
            wrapped, env=env, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )

    def path_on(self, node: str, relative: str) -> Path:
        """Where `<bed>/node/<relative>` of that node lies in the shared filesystem (for the test to inspect)."""
        return self.nodes[node].dir / relative

    def _close_ssh_masters(self) -> None:
        """The recipe's shared ssh connections (ControlPersist) would outlive the test bed: end them."""
        if not (self.root / "ctl").exists() or "head" not in self.nodes or not self._made_netns:
            return
        for node in self.workers:
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.nodes["head"].netns,
                    str(self.root / "bin" / "ssh"),
                    "-o",
                    f"ControlPath={self.root / 'ctl'}/%C",
                    "-O",
                    "exit",
                    f"root@{node.address}",
                ],
                capture_output=True,
                timeout=WAIT_S,
            )

    def in_node(self, node: str, *args: str) -> None:
        """A command inside a node's network namespace (fault injection: firewall rules)."""
        subprocess.run(
            ["ip", "netns", "exec", self.nodes[node].netns, *args], check=True, capture_output=True, timeout=WAIT_S
        )

    def in_switch(self, *args: str) -> None:
        """Fault injection on the bridge side of a node's cable (link down, rate limits)."""
        subprocess.run(["ip", "netns", "exec", self.switch, *args], check=True, capture_output=True, timeout=WAIT_S)

    # ------------------------------------------------------------ down

    def down(self) -> None:
        self._close_ssh_masters()
        for node in self.nodes.values():
            for what in ("dockerd", "sshd"):
                pid = node.pids.pop(what, None)
                if pid:
                    sessions = _children(pid) if what == "sshd" else []
                    _end(pid, 20 if what == "dockerd" else 5)
                    for child in sessions:  # a session sshd outlives its listener while its client is connected
                        _end(child, 2)
        for netns in reversed(self._made_netns):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=WAIT_S)
        self._made_netns.clear()
        for controller in Path("/sys/fs/cgroup").glob("*/docker"):
            try:
                controller.rmdir()  # dockerd leaves empty cgroup folders; rmdir fails harmlessly when in use
            except OSError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _end(pid: int, grace_s: float) -> None:
    """SIGTERM one process we started, wait, then SIGKILL it."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (a session sshd): watch /proc instead
            done = not Path(f"/proc/{pid}").exists()
        if done:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
