"""RoCE link detection on stand-in sysfs trees (tests/fixtures/sysfs): no machine here has RDMA hardware or kernel
support, so each node's RDMA facts come from a fixture tree and its `ip` answers are canned. The inventory script
itself runs for real (sh) against the tree."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from recipe.net.link import LinkError, detect_link, parse_route
from recipe.net.nodes import NodeError
from recipe.plan.docker import docker_env
from recipe.settings import load_settings

PING_ARGS = ["ping", "-n", "-q", "-c", "2", "-i", "0.2", "-W", "2", "-w", "4"]
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"


def addr_lines(*entries: tuple[str, str]) -> str:
    return (
        "\n".join(
            f"{i + 2}: {ifname}    inet {cidr} brd 0.0.0.0 scope global {ifname}\\       valid_lft forever"
            for i, (ifname, cidr) in enumerate(entries)
        )
        + "\n"
    )


class FakeNode:
    """A node whose `ip` and `ping` answers are written down and whose sysfs is a fixture tree (MTUs included).
    `silent` lists the (netdev, destination) pairs whose pings get no answer."""

    def __init__(self, name: str, tree: str, addrs: str, routes: dict[str, str]) -> None:
        self.name, self.tree, self.addrs, self.routes = name, FIXTURES / tree, addrs, routes
        self.silent: set[tuple[str, str]] = set()
        self.pings: list[list[str]] = []

    def output(self, argv: Sequence[str], timeout_s: float = 20) -> str:
        if argv[:3] == ["ip", "-o", "-4"] and argv[3] == "addr":
            return self.addrs
        if argv[:5] == ["ip", "-o", "-4", "route", "get"]:
            return self.routes[argv[5]]
        if argv[:5] == ["ip", "-o", "link", "show", "dev"]:
            mtu = (self.tree / "class/net" / argv[5] / "mtu").read_text().strip()
            return f"4: {argv[5]}: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu {mtu} qdisc mq state UP mode DEFAULT\n"
        if argv[0] == "ping":
            self.pings.append(list(argv))
            if (argv[argv.index("-I") + 1], argv[-1]) in self.silent:
                raise NodeError(f"`ping` failed on {self.name}: 2 packets transmitted, 0 received")
            return "2 packets transmitted, 2 received, 0% packet loss\n"
        if argv[0] == "sh":  # the inventory script, run for real against this node's tree
            return subprocess.run([*argv[:-1], str(self.tree)], capture_output=True, text=True, check=True).stdout
        raise AssertionError(f"unexpected command {argv}")


SPARK_ADDRS = {
    n: addr_lines(
        ("enp1s0f1np1", f"192.168.100.{n}/24"),
        ("enP2p1s0f1np1", f"192.168.101.{n}/24"),
        ("enP7s7", f"10.0.0.{10 + n}/24"),
    )
    for n in (1, 2)
}


def route(dest: str, dev: str, src: str, via: str = "") -> str:
    return f"{dest} {'via ' + via + ' ' if via else ''}dev {dev} src {src} uid 0 \\    cache \n"


def spark_pair(head_routes: dict[str, str]) -> tuple[FakeNode, FakeNode]:
    head = FakeNode("local", "spark-head", SPARK_ADDRS[1], head_routes)
    worker = FakeNode(
        "me@spark2",
        "spark-worker",
        SPARK_ADDRS[2],
        {"192.168.100.1": route("192.168.100.1", "enp1s0f1np1", "192.168.100.2")},
    )
    return head, worker


def test_spark_with_two_rails_pairs_both_and_feeds_nccl() -> None:
    head, worker = spark_pair({"192.168.100.2": route("192.168.100.2", "enp1s0f1np1", "192.168.100.1")})
    link = detect_link(head, worker, "192.168.100.2", peer_is_explicit=True, sysfs_root="/unused")
    assert [(r.head_hca, r.worker_hca) for r in link.rails] == [
        ("rocep1s0f1", "rocep1s0f1"),
        ("roceP2p1s0f1", "roceP2p1s0f1"),
    ]
    assert link.master_addr == "192.168.100.1" and link.primary.gid_index == 3 and link.notes == ()
    assert "2 rail(s)" in link.summary()
    # The second rail was probed both ways with full-size unfragmented packets (MTU 9000 - 28).
    assert head.pings == [[*PING_ARGS, "-M", "do", "-s", "8972", "-I", "enP2p1s0f1np1", "192.168.101.2"]]
    assert worker.pings == [[*PING_ARGS, "-M", "do", "-s", "8972", "-I", "enP2p1s0f1np1", "192.168.101.1"]]
    from recipe.plan.host import LinkFacts

    facts = LinkFacts.from_link(link)
    env = docker_env(_settings(), facts.for_rank(0))
    assert env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"
    assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1" and env["NCCL_IB_GID_INDEX"] == "3"
    assert facts.master_addr == "192.168.100.1"


def test_route_over_the_lan_finds_the_workers_roce_address_and_says_so() -> None:
    head, worker = spark_pair(
        {
            "10.0.0.12": route("10.0.0.12", "enP7s7", "10.0.0.11"),
            "192.168.100.2": route("192.168.100.2", "enp1s0f1np1", "192.168.100.1"),
        }
    )
    link = detect_link(head, worker, "10.0.0.12", peer_is_explicit=False, sysfs_root="/unused")
    assert link.primary.worker_ip == "192.168.100.2" and link.master_addr == "192.168.100.1"
    assert any("10.0.0.12 is reached over enP7s7" in n and "FABRIC_PEER=192.168.100.2" in n for n in link.notes)


def test_an_explicit_fabric_peer_over_the_lan_is_refused_with_the_fix() -> None:
    head, worker = spark_pair({"10.0.0.12": route("10.0.0.12", "enP7s7", "10.0.0.11")})
    with pytest.raises(LinkError) as refused:
        detect_link(head, worker, "10.0.0.12", peer_is_explicit=True, sysfs_root="/unused")
    assert "FABRIC_PEER 10.0.0.12 is reached over enP7s7" in refused.value.message
    assert "ConnectX-7" in refused.value.fix


def test_a_peer_behind_a_gateway_is_not_a_direct_link() -> None:
    head, worker = spark_pair(
        {"192.168.100.2": route("192.168.100.2", "enp1s0f1np1", "192.168.100.1", via="192.168.100.254")}
    )
    with pytest.raises(LinkError, match="via 192.168.100.254"):
        detect_link(head, worker, "192.168.100.2", peer_is_explicit=True, sysfs_root="/unused")


def test_a_node_without_roce_is_refused_naming_what_to_connect() -> None:
    head = FakeNode(
        "local",
        "no-roce",
        addr_lines(("enP7s7", "10.0.0.11/24"), ("wlP9s9", "10.0.1.11/24")),
        {"10.0.0.12": route("10.0.0.12", "enP7s7", "10.0.0.11")},
    )
    _, worker = spark_pair({})
    with pytest.raises(LinkError) as refused:
        detect_link(head, worker, "10.0.0.12", peer_is_explicit=False, sysfs_root="/unused")
    assert "no RoCE port" in refused.value.message and "ConnectX-7" in refused.value.fix


def test_worker_without_a_route_back_over_its_roce_port_is_refused() -> None:
    head, worker = spark_pair({"192.168.100.2": route("192.168.100.2", "enp1s0f1np1", "192.168.100.1")})
    worker.routes["192.168.100.1"] = route("192.168.100.1", "enP7s7", "10.0.0.12", via="10.0.0.1")
    with pytest.raises(LinkError, match="reaches the head's link address 192.168.100.1 over enP7s7"):
        detect_link(head, worker, "192.168.100.2", peer_is_explicit=True, sysfs_root="/unused")


def test_a_second_rail_without_a_partner_is_left_out_and_named() -> None:
    head, worker = spark_pair({"192.168.100.2": route("192.168.100.2", "enp1s0f1np1", "192.168.100.1")})
    worker.addrs = addr_lines(("enp1s0f1np1", "192.168.100.2/24"), ("enP2p1s0f1np1", "192.168.102.2/24"))
    link = detect_link(head, worker, "192.168.100.2", peer_is_explicit=True, sysfs_root="/unused")
    assert len(link.rails) == 1
    assert any("enP2p1s0f1np1 (192.168.101.1) has no partner" in n for n in link.all_notes())


def test_a_second_rail_that_does_not_answer_is_left_out_and_named() -> None:
    head, worker = spark_pair({"192.168.100.2": route("192.168.100.2", "enp1s0f1np1", "192.168.100.1")})
    worker.silent.add(("enP2p1s0f1np1", "192.168.101.1"))  # the head's twin port answers, the way back not
    link = detect_link(head, worker, "192.168.100.2", peer_is_explicit=True, sysfs_root="/unused")
    assert [r.head_ifname for r in link.rails] == ["enp1s0f1np1"]
    assert any(
        "enP2p1s0f1np1 (192.168.101.1)" in n
        and "from me@spark2 (enP2p1s0f1np1) to 192.168.101.1" in n
        and "not used" in n
        for n in link.notes
    ), link.notes


def test_route_parsing() -> None:
    parsed = parse_route("8.8.8.8", "8.8.8.8 via 10.0.0.1 dev eth0 src 10.0.0.5 uid 0 \\    cache")
    assert (parsed.ifname, parsed.src, parsed.via) == ("eth0", "10.0.0.5", "10.0.0.1")
    with pytest.raises(LinkError, match="no route to 10.9.9.9"):
        parse_route("10.9.9.9", "RTNETLINK answers: Network is unreachable")


def _settings():
    return load_settings(Path("/nonexistent"), {"TP": "2", "WORKER": "me@spark2"})


def mesh(tmp: Path, moved: tuple[str, ...] = ()) -> tuple[FakeNode, FakeNode, FakeNode]:
    """Three Sparks, each pair on its own cable and subnet: head-w1 10.0.1.0/24, head-w2 10.0.2.0/24,
    w1-w2 10.0.3.0/24 (port p0 / p1 on each); every node also has a LAN port with a default route."""
    sys.path.insert(0, str(FIXTURES.parent))
    from sysfs_tree import Port, write_tree

    plan = {
        "head": [("p0", "10.0.1.1"), ("p1", "10.0.2.1")],
        "w1": [("p0", "10.0.1.2"), ("p1", "10.0.3.2")],
        "w2": [("p0", "10.0.2.3"), ("p1", "10.0.3.3")],
    }
    nodes = {}
    for name, ports in plan.items():
        tree = write_tree(tmp / name, [Port(ifname, ip, f"roce{ifname}") for ifname, ip in ports])
        addrs = addr_lines(*[(ifname, ip + "/24") for ifname, ip in ports], ("lan0", f"192.168.1.{len(nodes) + 1}/24"))
        nodes[name] = FakeNode(name if name == "head" else f"me@{ports[0][1]}", str(tree), addrs, {})
    nodes["head"].name = "local"
    direct = {
        "10.0.1.1": ("w1", "p0"),
        "10.0.1.2": ("head", "p0"),
        "10.0.2.1": ("w2", "p0"),
        "10.0.2.3": ("head", "p1"),
        "10.0.3.2": ("w2", "p1"),
        "10.0.3.3": ("w1", "p1"),
    }
    for dest, (name, ifname) in direct.items():
        src = dict(plan[name])[ifname]
        nodes[name].routes[dest] = route(dest, ifname, src)
    for name, node in nodes.items():  # anything else leaves over the LAN
        for dest in direct:
            node.routes.setdefault(dest, route(dest, "lan0", "192.168.1.9", via="192.168.1.254"))
    for name in moved:  # its port to the other worker got its address later: GID index 5, not 3
        gids = tmp / name / "class/infiniband/rocep1/ports/1"
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (gids / sub / "3").rename(gids / sub / "5")
    return nodes["head"], nodes["w1"], nodes["w2"]


def test_three_sparks_each_pair_on_its_own_cable_pair_without_warnings(tmp_path: Path) -> None:
    """Each link has one rail; a node's port to the third Spark is not reported as an unpaired rail; the workers'
    own link is found (w1 -> w2's address on their cable) and each worker's NCCL devices cover both its cables."""
    from recipe.plan.host import LinkFacts
    from recipe.preflight.preflight import Context, check_links

    head, w1, w2 = mesh(tmp_path)
    settings = load_settings(Path("/nonexistent"), {"TP": "3", "WORKER": w1.name, "WORKER2": w2.name})
    ctx = Context(settings=settings, head=head, workers=[w1, w2], sysfs_root="/unused")
    checks = list(check_links(ctx))
    assert [(c.node, c.status) for c in checks] == [
        (w1.name, "ok"),
        (w2.name, "ok"),
        (f"{w1.name} <-> {w2.name}", "ok"),
    ], checks
    assert "10.0.3.2 (p1) <-> 10.0.3.3 (p1)" in checks[2].message
    assert all("1 rail(s)" in c.message and "no partner" not in c.message for c in checks)
    facts = LinkFacts.from_links(ctx.links, ctx.worker_links)
    assert [facts.for_rank(r).hcas for r in (0, 1, 2)] == ["rocep0,rocep1", "rocep0,rocep1", "rocep0,rocep1"]
    assert facts.for_rank(2).master_addr == "10.0.2.1" and facts.for_rank(2).ifname == "p0"


@pytest.mark.parametrize(
    "moved, found",
    [
        (("w2",), "GID index differs: 3 on me@10.0.1.2 (p1), 5 on me@10.0.2.3 (p1)"),
        (("w1", "w2"), "GID 5, 1 rail(s), but GID 3 towards the head"),
    ],
    ids=["one-end", "both-ends"],
)
def test_three_sparks_with_another_gid_index_between_workers_is_refused(tmp_path: Path, moved, found) -> None:
    from recipe.preflight.preflight import Context, check_links

    head, w1, w2 = mesh(tmp_path, moved)
    settings = load_settings(Path("/nonexistent"), {"TP": "3", "WORKER": w1.name, "WORKER2": w2.name})
    checks = list(check_links(Context(settings=settings, head=head, workers=[w1, w2], sysfs_root="/unused")))
    assert [c.status for c in checks] == ["ok", "ok", "fail"] and found in checks[-1].message, checks[-1]
