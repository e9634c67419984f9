"""Free TCP ports for test servers, chosen BELOW the kernel's ephemeral range.

A port from bind(0) lies inside the ephemeral range, where any outgoing connection (a gloo peer, an HTTP client)
may be handed the same number as its local port after the test has let go of it; a restart that re-binds the port
then fails with "address in use". Ports below the range are never handed out that way.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_GIVEN: set[int] = set()  # ports already handed out in this process: two calls never return the same port


def free_port() -> int:
    floor = _ephemeral_floor()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, max(20001, floor))
        if port in _GIVEN:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            _GIVEN.add(port)
            return port
    raise RuntimeError("no free port found below the ephemeral range")
