"""Kernel receive timestamps (``SO_TIMESTAMPNS``) for the client's sockets, UDP and TCP.

A load generator that shares its CPUs with what it measures reads its sockets late; the
kernel's stamp says when a datagram or segment *arrived*, so a round trip or a 503's
latency excludes the reader's own wait (docs/performance.md, issue 41 item 1).
"""

from __future__ import annotations

import socket
import struct
import sys
from collections.abc import Iterable
from typing import Any

# Python 3.11's socket module lacks the constant; 35 is SO_TIMESTAMPNS (= SCM_TIMESTAMPNS) on
# Linux for x86, ARM and most other architectures.
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS",
                                     35 if sys.platform.startswith("linux") else None)
_TIMESPEC = struct.Struct("@qq")  # struct timespec (64-bit Linux)
#: The ancillary buffer size for ``recvmsg`` that holds one stamp.
ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)


def enable_rx_timestamps(sock: Any) -> bool:
    """Ask the kernel to stamp what arrives on ``sock`` (a socket or a trio socket) with its
    arrival time; False where the platform has no such option (then arrival = when the
    reader woke)."""
    if SO_TIMESTAMPNS is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def kernel_stamp(ancillary: Iterable[tuple[int, int, bytes]]) -> float | None:
    """The arrival time (wall clock, seconds) in a ``recvmsg`` result's ancillary data;
    None if it holds none."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return float(sec + nsec * 1e-9)
    return None


def arrival(stamp: float | None, now: float, offset: float, floor: float) -> float:
    """A kernel ``stamp`` (wall clock; None: none) as an arrival on trio's clock, ``offset``
    being trio's clock minus the wall clock at ``now``: clamped to ``[floor, now]`` so a
    wall-clock step cannot move it backwards or into the future (``now`` without a stamp)."""
    return now if stamp is None else min(now, max(floor, stamp + offset))
