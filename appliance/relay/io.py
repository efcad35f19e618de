"""The hot path's syscall adapters: how a batch is received and how queued datagrams leave.

:func:`fastpath.make_drain <.fastpath.make_drain>` routes; an adapter only moves bytes, with
one shape for both paths:

* ``receiver(sock, buf, slot, headroom, capacity, count)() -> [(length, (host, port)), ...]``
  fills up to ``count`` slots (datagram ``i`` at ``buf[i*slot + headroom:]``, at most
  ``capacity`` bytes, ``length`` its real size — MSG_TRUNC — so a longer one shows as
  ``length > capacity``); fewer than ``count`` means the socket is drained.
* ``flusher(sock)(buf, pending) -> (sent, bytes, failed)`` sends each ``(header, offset,
  length, dest)`` entry as ``header + buf[offset:offset+length]``; a datagram the kernel
  refuses is counted in ``failed``, never raised. The headroom in front of an entry's
  payload is scratch (the python adapter writes the header there), so entries must not
  share a slot — the drains queue at most one per received datagram.

``python`` does that with one ``recvfrom_into``/``sendto`` per datagram (the header is
copied into the headroom in front of the payload, so one ``sendto`` of one slice carries
both — no concatenation); ``mmsg`` with one ``recvmmsg``/``sendmmsg`` per batch
(:mod:`appliance.netio._mmsg`: header and payload as two iovecs, UDP GSO for runs of
same-size datagrams to one address).

Modes: ``python``, ``mmsg``, ``auto`` (mmsg when the extension is built; the environment
variable ``APPLIANCE_RELAY_IO`` can force either). ``APPLIANCE_RELAY_GSO=0`` turns off UDP
GSO in the batch path's sends (A/B measurements).
"""

from __future__ import annotations

import os
import socket
from functools import partial
from typing import Protocol

from .fastpath import Receive
from .transport import Address, Flush, Out

try:  # optional C extension (setup.py): recvmmsg/sendmmsg batching, Linux only
    from ..netio import _mmsg
except ImportError:  # pragma: no cover - not built (no compiler/headers) or not Linux
    _mmsg = None  # type: ignore[assignment]

IO_MODES = ("auto", "python", "mmsg")
IO_ENV = "APPLIANCE_RELAY_IO"
GSO_ENV = "APPLIANCE_RELAY_GSO"


def mmsg_available() -> bool:
    return _mmsg is not None


def select_io(mode: str = "auto") -> str:
    """The I/O path a worker uses: ``python`` or ``mmsg``. ``auto`` defers to
    ``$APPLIANCE_RELAY_IO`` when set, else picks ``mmsg`` if the extension is built; asking
    for ``mmsg`` without it is an error (ValueError)."""
    if mode == "auto":
        mode = os.environ.get(IO_ENV, "") or "auto"
    if mode not in IO_MODES:
        raise ValueError(f"relay io {mode!r}: expected one of {', '.join(IO_MODES)}")
    if mode == "auto":
        return "mmsg" if _mmsg is not None else "python"
    if mode == "mmsg" and _mmsg is None:
        raise ValueError("relay io 'mmsg': the appliance.netio._mmsg extension is not built "
                         "(pip install -e . needs gcc and the Python headers)")
    return mode


class IoAdapter(Protocol):
    name: str

    def receiver(self, sock: socket.socket, buf: bytearray, slot: int, headroom: int,
                 capacity: int, count: int) -> Receive: ...

    def flusher(self, sock: socket.socket) -> Flush: ...


class PythonIO:
    """One ``recvfrom_into`` / ``sendto`` per datagram."""

    name = "python"

    def receiver(self, sock: socket.socket, buf: bytearray, slot: int, headroom: int,
                 capacity: int, count: int) -> Receive:
        recv = sock.recvfrom_into
        mv = memoryview(buf)
        views = [mv[i * slot + headroom : i * slot + headroom + capacity]
                 for i in range(count)]
        trunc = socket.MSG_TRUNC  # the real length of a longer datagram, as recvmmsg's
        v6 = sock.family == socket.AF_INET6

        def receive() -> list[tuple[int, Address]]:
            out: list[tuple[int, Address]] = []
            append = out.append
            for view in views:  # datagram i goes to slot i
                try:
                    append(recv(view, 0, trunc))
                except BlockingIOError:
                    break
                except OSError:  # pragma: no cover - an ICMP error queued on the socket
                    try:  # it took this call; the slot is still free
                        append(recv(view, 0, trunc))
                    except OSError:
                        break  # a short batch: epoll (level-triggered) reports the rest
            return out

        def receive6() -> list[tuple[int, Address]]:
            # IPv6 sources come as (host, port, flowinfo, scope_id): keep (host, port).
            out: list[tuple[int, Address]] = []
            append = out.append
            for view in views:
                try:
                    n, src = recv(view, 0, trunc)
                except BlockingIOError:
                    break
                except OSError:  # pragma: no cover - as above
                    try:
                        n, src = recv(view, 0, trunc)
                    except OSError:
                        break
                append((n, src[:2]))
            return out

        if v6:
            return receive6
        return receive

    def flusher(self, sock: socket.socket) -> Flush:
        send = sock.sendto

        def flush(buf: bytearray, pending: list[Out]) -> tuple[int, int, int]:
            mv = memoryview(buf)
            sent = nbytes = failed = 0
            for header, p, n, dest in pending:
                try:
                    if header and n:
                        s = p - len(header)  # into the headroom: one slice, one sendto
                        buf[s:p] = header
                        nbytes += send(mv[s : p + n], dest)
                    elif n or not header:
                        nbytes += send(mv[p : p + n], dest)  # bare: return traffic
                    else:
                        nbytes += send(header, dest)  # a reply the core built whole
                except OSError:
                    failed += 1
                    continue
                sent += 1
            return sent, nbytes, failed

        return flush


class MmsgIO:
    """One ``recvmmsg`` / ``sendmmsg`` per batch (:mod:`appliance.netio._mmsg`)."""

    name = "mmsg"

    def __init__(self) -> None:
        assert _mmsg is not None
        if os.environ.get(GSO_ENV) == "0":
            _mmsg.set_gso(False)

    def receiver(self, sock: socket.socket, buf: bytearray, slot: int, headroom: int,
                 capacity: int, count: int) -> Receive:
        assert _mmsg is not None
        return partial(_mmsg.recv_batch, sock.fileno(), buf, slot, headroom, capacity, count)

    def flusher(self, sock: socket.socket) -> Flush:
        assert _mmsg is not None
        return partial(_mmsg.send_batch, sock.fileno())


def adapter(mode: str) -> IoAdapter:
    """The adapter of a mode :func:`select_io` returned."""
    return MmsgIO() if mode == "mmsg" else PythonIO()
