"""The RoCE link between the head and a worker: route → netdev → RDMA device → RoCE v2 GID index.

Facts come from two places on each node: `ip -o -4 …` (addresses, the route to the peer) and the RDMA part of
sysfs. Both are read through a node's `run`, so the same code reads this machine, a worker over ssh, or a fixture
tree (`sysfs_root` points anywhere; real Sparks use /sys). A second rail (another RoCE port pair on one subnet) is
probed before it is used: pings both ways through its ports, full-size and unfragmented at the smaller MTU. Nothing
here prints; problems raise `LinkError`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from recipe.errors import RecipeError

ROCE_V2 = "RoCE v2"
PING = ["ping", "-n", "-q", "-c", "2", "-i", "0.2", "-W", "2", "-w", "4"]  # two echoes, at most 4 s in all
IP_ICMP_HEADERS = 28  # a ping of MTU - 28 bytes fills one unfragmented packet

# Prints one line per RoCE GID and one per netdev → RDMA device mapping. Unused GID slots fail to read (EINVAL on
# real sysfs) and are skipped; the GID type goes last because it holds a space.
INVENTORY_SCRIPT = r"""
root="$1"
for g in "$root"/class/infiniband/*/ports/*/gids/*; do
  [ -e "$g" ] || continue
  gid=$(cat "$g" 2>/dev/null) || continue
  port_dir=${g%/gids/*}; n=${g##*/}
  kind=$(cat "$port_dir/gid_attrs/types/$n" 2>/dev/null) || continue
  ndev=$(cat "$port_dir/gid_attrs/ndevs/$n" 2>/dev/null) || ndev=-
  hca=${port_dir%/ports/*}; hca=${hca##*/}; port=${port_dir##*/}
  echo "gid $hca $port $n $gid ${ndev:--} $kind"
done
for d in "$root"/class/net/*/device/infiniband/*; do
  [ -e "$d" ] || continue
  ifname=${d%/device/infiniband/*}; ifname=${ifname##*/}
  echo "dev $ifname ${d##*/}"
done
"""


class LinkError(RecipeError):
    """The link between two Sparks cannot be used as configured."""


class Runs(Protocol):
    """What link detection needs from a node: run a command, get its stdout (nodes.Node provides it)."""

    name: str

    def output(self, argv: Sequence[str], timeout_s: float = 20) -> str: ...


@dataclass(frozen=True)
class Address:
    ifname: str
    interface: ipaddress.IPv4Interface

    @property
    def ip(self) -> str:
        return str(self.interface.ip)


@dataclass(frozen=True)
class Gid:
    hca: str
    port: int
    index: int
    ipv4: str  # the IPv4 address the GID maps, "" for others (link-local, IPv6)
    netdev: str
    kind: str  # "RoCE v2", "RoCE v1", "IB/RoCE v1"


@dataclass(frozen=True)
class NodeNet:
    """One node's IPv4 addresses and RoCE GIDs."""

    name: str
    addresses: tuple[Address, ...]
    gids: tuple[Gid, ...]
    rdma_of: dict[str, tuple[str, ...]] = field(default_factory=dict)  # netdev → RDMA devices

    def v2_gid(self, ifname: str, ip: str) -> Gid | None:
        """The RoCE v2 GID of `ip` on `ifname`, or None when that port is not RoCE (or has no such GID)."""
        hcas = self.rdma_of.get(ifname, ())
        for gid in self.gids:
            if gid.kind == ROCE_V2 and gid.ipv4 == ip and (gid.netdev == ifname or gid.hca in hcas):
                return gid
        return None

    def roce_addresses(self) -> list[tuple[Address, Gid]]:
        """Every IPv4 address with a RoCE v2 GID, lowest address first: the ports a link can use."""
        found = []
        for address in sorted(self.addresses, key=lambda a: (a.interface.ip, a.ifname)):
            gid = self.v2_gid(address.ifname, address.ip)
            if gid:
                found.append((address, gid))
        return found


@dataclass(frozen=True)
class Route:
    dest: str
    ifname: str
    src: str
    via: str  # the gateway, "" when the peer is on a directly attached subnet


@dataclass(frozen=True)
class Rail:
    """One port pair of the link: the head's end and the worker's end."""

    head_ifname: str
    head_ip: str
    head_hca: str
    worker_ifname: str
    worker_ip: str
    worker_hca: str
    gid_index: int


@dataclass(frozen=True)
class Link:
    worker: str  # the worker's ssh target
    rails: tuple[Rail, ...]  # the first carries the rendezvous (master address) and NCCL's socket
    notes: tuple[str, ...] = ()  # what detection chose on its own (another address, a rail left out)
    unpaired: tuple[tuple[str, str], ...] = ()  # head RoCE ports (netdev, address) with no partner on this worker

    def all_notes(self) -> tuple[str, ...]:
        return (
            *self.notes,
            *(
                f"RoCE port {ifname} ({ip}) has no partner on {self.worker} on its subnet: not used"
                for ifname, ip in self.unpaired
            ),
        )

    def sharing(self, other_ports: set[str]) -> Link:
        """This link, not counting as unpaired the head ports that carry another worker's link (three Sparks:
        each pair has its own cable, so the head's port to one worker never has a partner on the other)."""
        return replace(self, unpaired=tuple(u for u in self.unpaired if u[0] not in other_ports))

    @property
    def primary(self) -> Rail:
        return self.rails[0]

    @property
    def master_addr(self) -> str:
        return self.primary.head_ip

    def summary(self) -> str:
        p = self.primary
        head_hcas = ",".join(r.head_hca for r in self.rails)
        worker_hcas = ",".join(r.worker_hca for r in self.rails)
        return (
            f"{p.head_ip} ({p.head_ifname}) <-> {p.worker_ip} ({p.worker_ifname}), RoCE {head_hcas} / "
            f"{worker_hcas}, GID {p.gid_index}, {len(self.rails)} rail(s)"
        )


# ---------------------------------------------------------------- reading one node


def parse_addresses(text: str) -> tuple[Address, ...]:
    """`ip -o -4 addr show` → addresses ("2: eth0    inet 10.77.0.1/24 brd … scope global eth0 …")."""
    found = []
    for line in text.splitlines():
        words = line.split()
        if "inet" in words and len(words) > words.index("inet") + 1:
            ifname = words[1].split("@")[0]
            found.append(Address(ifname, ipaddress.IPv4Interface(words[words.index("inet") + 1])))
    return tuple(found)


def parse_route(dest: str, text: str) -> Route:
    """`ip -o -4 route get DEST` → the netdev, source address and gateway the kernel would use."""
    words = text.split()

    def after(key: str) -> str:
        return words[words.index(key) + 1] if key in words[:-1] else ""

    if not after("dev"):
        raise LinkError(f"no route to {dest}", "check the cable and the addresses (ip -4 addr) on both Sparks")
    return Route(dest=dest, ifname=after("dev"), src=after("src"), via=after("via"))


def parse_inventory(name: str, addresses: tuple[Address, ...], text: str) -> NodeNet:
    gids: list[Gid] = []
    rdma_of: dict[str, tuple[str, ...]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 8 and words[0] == "gid":
            _, hca, port, index, value, ndev, *kind = words
            gids.append(
                Gid(hca, int(port), int(index), _mapped_ipv4(value), "" if ndev == "-" else ndev, " ".join(kind))
            )
        elif len(words) == 3 and words[0] == "dev":
            rdma_of[words[1]] = (*rdma_of.get(words[1], ()), words[2])
    return NodeNet(name, addresses, tuple(gids), rdma_of)


def _mapped_ipv4(gid: str) -> str:
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        return ""
    return str(mapped) if mapped else ""


def read_node(node: Runs, sysfs_root: str) -> NodeNet:
    addresses = parse_addresses(node.output(["ip", "-o", "-4", "addr", "show"]))
    inventory = node.output(["sh", "-c", INVENTORY_SCRIPT, "inventory", sysfs_root])
    return parse_inventory(node.name, addresses, inventory)


def route_to(node: Runs, dest: str) -> Route:
    return parse_route(dest, node.output(["ip", "-o", "-4", "route", "get", dest]))


# ---------------------------------------------------------------- the link


def detect_link(head: Runs, worker: Runs, peer: str, peer_is_explicit: bool, sysfs_root: str = "/sys") -> Link:
    """The link from the head to `worker`, whose address on it is `peer` (FABRIC_PEER, or WORKER's host). With
    `peer` empty (two workers of three Sparks), the worker's RoCE address on a subnet of `head`'s RoCE ports."""
    head_net, worker_net = read_node(head, sysfs_root), read_node(worker, sysfs_root)
    notes: list[str] = []
    if not peer:
        peer = _worker_roce_address(head_net, worker_net) or ""
        if not peer:
            raise LinkError(
                f"{worker.name} has no RoCE address on a subnet of {_label(head.name)}'s RoCE ports",
                f"cable {_label(head.name)} and {worker.name} together and give both ports an address on one subnet",
            )
    route = route_to(head, peer)
    if not head_net.v2_gid(route.ifname, route.src) or route.via:
        if peer_is_explicit:
            raise LinkError(
                f"FABRIC_PEER {peer} is reached over {route.ifname}"
                f"{' via ' + route.via if route.via else ''}, which is not a direct RoCE port here",
                "write the worker's ConnectX-7 address as FABRIC_PEER (ip -4 addr on the worker)",
            )
        better = _worker_roce_address(head_net, worker_net)
        if better is None:
            raise _no_roce(head_net, worker_net, peer, route)
        notes.append(
            f"{peer} is reached over {route.ifname}, not a RoCE port: using the worker's RoCE address "
            f"{better} for the link (write FABRIC_PEER={better} to say so)"
        )
        peer, route = better, route_to(head, better)
        if not head_net.v2_gid(route.ifname, route.src) or route.via:
            raise _no_roce(head_net, worker_net, peer, route)
    primary = _rail(head_net, worker_net, route, peer)
    back = route_to(worker, primary.head_ip)
    if back.ifname != primary.worker_ifname or back.via:
        raise LinkError(
            f"{worker.name} reaches {_label(head.name, 'the head')}'s link address {primary.head_ip} "
            f"over {back.ifname}"
            f"{' via ' + back.via if back.via else ''}, not over its RoCE port {primary.worker_ifname}",
            "give both ends of the cable addresses on one subnet (ip -4 addr on both Sparks)",
        )
    rails, more, unpaired = _more_rails(head_net, worker_net, primary)
    probed = []
    for rail in rails:
        why = probe_rail(head, worker, rail)
        if why is None:
            probed.append(rail)
        else:
            more.append(
                f"second rail {rail.head_ifname} ({rail.head_ip}) <-> {worker.name}'s {rail.worker_ifname} "
                f"({rail.worker_ip}) {why}: not used, running on fewer rails (give both ports an address "
                "on one subnet per rail and the same MTU on both Sparks)"
            )
    return Link(worker=worker.name, rails=(primary, *probed), notes=(*notes, *more), unpaired=tuple(unpaired))


def probe_rail(head: Runs, worker: Runs, rail: Rail) -> str | None:
    """None when both ends reach each other through this rail's ports with full-size unfragmented packets (the
    smaller MTU of the two); otherwise what failed. A rail NCCL cannot use stalls it instead of being skipped."""
    try:
        mtu = min(_mtu(head, rail.head_ifname), _mtu(worker, rail.worker_ifname))
    except RecipeError as error:
        return f"has no readable MTU ({error.message})"
    size = str(mtu - IP_ICMP_HEADERS)
    for node, ifname, dest in ((head, rail.head_ifname, rail.worker_ip), (worker, rail.worker_ifname, rail.head_ip)):
        try:
            node.output([*PING, "-M", "do", "-s", size, "-I", ifname, dest], timeout_s=10)
        except RecipeError:
            return f"does not carry {mtu}-byte packets from {node.name} ({ifname}) to {dest}"
    return None


def _mtu(node: Runs, ifname: str) -> int:
    found = re.search(r"\bmtu (\d+)", node.output(["ip", "-o", "link", "show", "dev", ifname]))
    if not found:
        raise LinkError(f"`ip link` shows no MTU for {ifname} on {node.name}")
    return int(found.group(1))


def _rail(head: NodeNet, worker: NodeNet, route: Route, peer: str) -> Rail:
    head_gid = head.v2_gid(route.ifname, route.src)
    worker_addr = next((a for a in worker.addresses if a.ip == peer), None)
    worker_gid = worker.v2_gid(worker_addr.ifname, peer) if worker_addr else None
    if head_gid is None or worker_addr is None or worker_gid is None:
        where = (
            f"{worker.name} has no address {peer}"
            if worker_addr is None
            else f"{worker.name}'s {worker_addr.ifname} ({peer}) has no RoCE v2 GID"
        )
        raise LinkError(
            f"the link to {peer} is not RoCE at both ends: {where}",
            "set FABRIC_PEER to the worker's ConnectX-7 address",
        )
    if head_gid.index != worker_gid.index:
        raise LinkError(
            f"the RoCE v2 GID index differs: {head_gid.index} on {_label(head.name)} ({route.ifname}), "
            f"{worker_gid.index} on {worker.name} ({worker_addr.ifname})",
            "NCCL takes one GID index for both ends: give both ports their IPv4 address the same way",
        )
    return Rail(route.ifname, route.src, head_gid.hca, worker_addr.ifname, peer, worker_gid.hca, head_gid.index)


def _worker_roce_address(head: NodeNet, worker: NodeNet) -> str | None:
    """A worker RoCE address on a subnet one of the head's RoCE ports is attached to (reached without a gateway)."""
    for head_addr, _ in head.roce_addresses():
        for worker_addr, _ in worker.roce_addresses():
            if worker_addr.interface.ip in head_addr.interface.network:
                return worker_addr.ip
    return None


def _more_rails(head: NodeNet, worker: NodeNet, primary: Rail) -> tuple[list[Rail], list[str], list[tuple[str, str]]]:
    """Further port pairs: a head RoCE port and a worker RoCE port on one subnet, with the primary's GID index;
    the head ports without a partner come back apart."""
    rails, notes, unpaired = [], [], []
    used_head, used_worker = {primary.head_ifname}, {primary.worker_ifname}
    for head_addr, head_gid in head.roce_addresses():
        if head_addr.ifname in used_head:
            continue
        partner = next(
            (
                (a, g)
                for a, g in worker.roce_addresses()
                if a.ifname not in used_worker and a.interface.ip in head_addr.interface.network
            ),
            None,
        )
        if partner is None:
            unpaired.append((head_addr.ifname, head_addr.ip))
            continue
        worker_addr, worker_gid = partner
        if head_gid.index != primary.gid_index or worker_gid.index != primary.gid_index:
            notes.append(
                f"second rail {head_addr.ifname} <-> {worker_addr.ifname} has GID index "
                f"{head_gid.index}/{worker_gid.index}, not {primary.gid_index}: not used"
            )
            continue
        used_head.add(head_addr.ifname)
        used_worker.add(worker_addr.ifname)
        rails.append(
            Rail(
                head_addr.ifname,
                head_addr.ip,
                head_gid.hca,
                worker_addr.ifname,
                worker_addr.ip,
                worker_gid.hca,
                head_gid.index,
            )
        )
    return rails, notes, unpaired


def _label(name: str, local: str = "this machine") -> str:
    return local if name == "local" else name


def _no_roce(head: NodeNet, worker: NodeNet, peer: str, route: Route) -> LinkError:
    if not head.roce_addresses():
        return LinkError(
            f"{_label(head.name)} has no RoCE port with an IPv4 address (the route to {peer} leaves "
            f"over {route.ifname})",
            "connect the ConnectX-7 cable and give its port an address (ip -4 addr; the README's real-Sparks section)",
        )
    if not worker.roce_addresses():
        return LinkError(
            f"{worker.name} has no RoCE port with an IPv4 address",
            "give the worker's ConnectX-7 port an address on the head's link subnet",
        )
    return LinkError(
        f"{peer} is reached over {route.ifname}, and no worker RoCE address shares a subnet with "
        "this machine's RoCE ports",
        "put both ConnectX-7 ports on one subnet, or set FABRIC_PEER",
    )
