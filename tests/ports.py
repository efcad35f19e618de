"""Free ports for the processes a test starts: one helper for the whole suite.

A port found by ``bind(port 0)`` and closed again is a number from the kernel's ephemeral
range (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), which is also
where every outgoing TCP connection and every other ``bind(0)`` on the machine gets its
local port. Between the pick and the moment the process under test binds it, anything on
the box may take that number: CI saw ``appliance relay: cannot listen on TCP
127.0.0.1:51154 (ICE-TCP): Address already in use`` for a ``--udp`` port picked that way
(and SIPp's ``-mp`` base+2 before it). So ports are picked at random *below* the ephemeral
range, where the kernel never assigns one, and checked free for every socket kind the
process will bind on them (``up`` listens for ICE-TCP on its UDP port number).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

UDP = (socket.SOCK_DGRAM,)
TCP = (socket.SOCK_STREAM,)
BOTH = (socket.SOCK_DGRAM, socket.SOCK_STREAM)
LOWEST = 10_000
_rng = random.Random()


def _ephemeral_low() -> int:
    try:
        low, _ = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
                  .split())
        return low
    except (OSError, ValueError):
        return 32768


def free_port(kinds: tuple[int, ...] | int = BOTH, host: str = "127.0.0.1", *,
              count: int = 1, step: int = 1) -> int:
    """A port (the base of ``count`` consecutive ones) free for each of ``kinds`` on
    ``host``, below the ephemeral range; ``step=2`` for an even base (RTP)."""
    if isinstance(kinds, int):
        kinds = (kinds,)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    high = max(LOWEST + count + step, _ephemeral_low() - count)
    for _ in range(500):
        base = _rng.randrange(LOWEST, high, step)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                for kind in kinds:
                    sock = socket.socket(family, kind)
                    socks.append(sock)
                    sock.bind((host, port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return base
    raise OSError(f"no {count} consecutive port(s) free for {kinds} on {host}")
