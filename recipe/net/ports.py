"""Whether a TCP port of this machine is free (PORT and MASTER_PORT: doctor, the checks before a start, launch)."""

from __future__ import annotations

import socket


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True
