"""Preflight check of the RoCE links: each worker's to the head, then (three Sparks) the workers' own."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from typing import cast

from recipe.net.link import Link, LinkError, detect_link
from recipe.net.nodes import NodeError
from recipe.preflight.check import FAIL, OK, WARN, Check, Context
from recipe.settings import Settings


def check_links(ctx: Context) -> Iterator[Check]:
    """Each worker's link, detected first for all of them: with three Sparks the head's port to one worker is
    expected to have no partner on the other, which is then not worth a warning."""
    found: dict[int, Link | Check] = {}
    for rank, worker in enumerate(ctx.workers, start=1):
        try:
            found[rank] = detect_link(
                ctx.head, worker, _peer(ctx.settings, rank), bool(_explicit(ctx.settings, rank)), ctx.sysfs_root
            )
        except (LinkError, NodeError) as error:
            found[rank] = Check("link", worker.name, FAIL, error.message, error.fix)
    links = {rank: link for rank, link in found.items() if isinstance(link, Link)}
    for rank, worker in enumerate(ctx.workers, start=1):
        link = found[rank]
        if isinstance(link, Check):
            yield link
            continue
        other_ports = {r.head_ifname for other, other_link in links.items() if other != rank for r in other_link.rails}
        link = link.sharing(other_ports)
        ctx.links.append(link)
        yield _link_check(worker.name, link)
    if len(links) == len(ctx.workers) >= 2:
        yield from _worker_pair_links(ctx, links)


def _worker_pair_links(ctx: Context, links: dict[int, Link]) -> Iterator[Check]:
    """Three Sparks: ranks 1 and 2 talk to each other too, over their own cable (found from rank 1's side)."""
    for a, b in itertools.combinations(range(1, len(ctx.workers) + 1), 2):
        near, far = ctx.workers[a - 1], ctx.workers[b - 1]
        where = f"{near.name} <-> {far.name}"
        try:
            link = detect_link(near, far, "", False, ctx.sysfs_root)
        except (LinkError, NodeError) as error:
            yield Check("link", where, FAIL, error.message, error.fix)
            continue
        link = link.sharing({r.worker_ifname for r in links[a].rails})  # rank a's ports to the head
        towards_head = {links[a].primary.gid_index, links[b].primary.gid_index}
        if towards_head != {link.primary.gid_index}:
            yield Check(
                "link",
                where,
                FAIL,
                f"{link.summary()}, but GID {'/'.join(map(str, sorted(towards_head)))} towards the head",
                "NCCL takes one RoCE v2 GID index per rank: give every ConnectX-7 port "
                "its IPv4 address the same way on all three Sparks",
            )
            continue
        ctx.worker_links.append((a, b, link))
        yield _link_check(where, link)


def _link_check(where: str, link: Link) -> Check:
    notes = link.all_notes()
    status = WARN if any("not used" in note for note in notes) else OK
    return Check("link", where, status, "; ".join([link.summary(), *notes]))


def _explicit(settings: Settings, rank: int) -> str:
    return settings.fabric_peer if rank == 1 else settings.fabric_peer2


def _peer(settings: Settings, rank: int) -> str:
    return resolve_ipv4(_explicit(settings, rank) or settings.workers[rank - 1].rpartition("@")[2])


def resolve_ipv4(host: str) -> str:
    try:
        # AF_INET: the address is (ip, port) with ip a str; typeshed types every family's sockaddr together
        return cast(str, socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])
    except (socket.gaierror, IndexError):
        raise LinkError(
            f"cannot resolve {host} to an IPv4 address",
            "write the worker's address instead of its name (WORKER, FABRIC_PEER)",
        ) from None
