"""UDP socket set-up, written once for the relay and the transceiver.

Both shells want the same things from a datagram socket: big kernel buffers (bursts are
absorbed while the task is busy elsewhere; the kernel caps a request at
``net.core.rmem_max``/``wmem_max`` and reports twice what it accepted), non-blocking mode
(the hot loops drain until ``EAGAIN``), and — for the relay's public port —
``SO_REUSEPORT`` so M worker processes share one port and the kernel spreads clients over
them by 4-tuple hash. ``IPV6_V6ONLY`` lets ``0.0.0.0:P`` and ``[::]:P`` be two sockets
(one per listen address) instead of the IPv6 one also claiming IPv4 (RFC 3493 §5.3).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

Address = tuple[str, int]

#: The relay's default request for SO_RCVBUF / SO_SNDBUF (docs/reliability.md).
SOCKET_BUFFER = 16 << 20


def family_of(host: str) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 literal (it has a colon), else AF_INET."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def udp_socket(
    addr: Address,
    *,
    reuseport: bool = False,
    buffer: int = SOCKET_BUFFER,
    v6only: bool | None = True,
    prepare: Callable[[socket.socket], object] | None = None,
) -> socket.socket:
    """A bound, non-blocking UDP socket on ``addr`` (an IP literal).

    ``buffer`` is asked for both directions (0 keeps the kernel default; a refused request
    is never fatal). ``v6only`` applies to IPv6 sockets (None keeps the system default).
    ``prepare`` runs on the socket before ``bind`` (say, to attach a BPF filter so no
    datagram is queued unfiltered). The socket is closed if anything fails.
    """
    family = family_of(addr[0])
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if family == socket.AF_INET6 and v6only is not None:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if buffer:
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, opt, buffer)
                except OSError:  # pragma: no cover - capped by the kernel, never fatal
                    pass
        if prepare is not None:
            prepare(sock)
        sock.bind(addr)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise bind_error(exc, f"cannot bind UDP {format_addr(addr)}") from None
    except BaseException:
        sock.close()
        raise
    return sock


def socket_buffers(sock: socket.socket) -> dict[str, int]:
    """What the kernel granted (Linux reports twice the accepted request)."""
    return {
        "rcvbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
        "sndbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
    }


def sockname(sock: socket.socket) -> Address:
    """The bound (host, port), without IPv6 flow info and scope id."""
    name = sock.getsockname()
    return (str(name[0]), int(name[1]))


def bind_error(exc: OSError, what: str) -> OSError:
    """``exc`` restated with the address that failed (the kernel's says none), errno kept."""
    err = OSError(f"{what}: {exc.strerror or exc}")
    err.errno = exc.errno
    return err


def format_addr(addr: Address) -> str:
    """``host:port``, with brackets around an IPv6 host."""
    return f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}"
