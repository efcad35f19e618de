"""appliance.netio.sockets: the one UDP socket set-up of the relay and the transceiver."""

from __future__ import annotations

import socket

import pytest

from appliance.netio.sockets import (
    family_of,
    format_addr,
    socket_buffers,
    sockname,
    udp_socket,
)


def test_bound_non_blocking_with_big_buffers() -> None:
    with udp_socket(("127.0.0.1", 0), buffer=1 << 20) as s:
        assert not s.getblocking() and s.type == socket.SOCK_DGRAM
        host, port = sockname(s)
        assert host == "127.0.0.1" and port > 0
        granted = socket_buffers(s)
        assert granted["rcvbuf"] > 0 and granted["sndbuf"] > 0


def test_reuseport_shares_a_port_and_v6only_separates_families() -> None:
    with udp_socket(("127.0.0.1", 0), reuseport=True) as a:
        port = sockname(a)[1]
        with udp_socket(("127.0.0.1", port), reuseport=True) as b:  # a second worker
            assert sockname(b)[1] == port
        with pytest.raises(OSError, match="in use"):
            udp_socket(("127.0.0.1", port)).close()  # without SO_REUSEPORT: refused
    with udp_socket(("0.0.0.0", 0)) as v4:
        port = sockname(v4)[1]
        # IPV6_V6ONLY: [::]:P is a socket of its own beside 0.0.0.0:P (RFC 3493 §5.3).
        with udp_socket(("::", port)) as v6:
            assert v6.family == socket.AF_INET6 and sockname(v6) == ("::", port)
            assert v6.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1


def test_prepare_runs_before_bind_and_failures_close_the_socket() -> None:
    seen: list[socket.socket] = []

    def prepare(sock: socket.socket) -> None:
        assert sock.getsockname()[1] == 0  # not bound yet
        seen.append(sock)

    udp_socket(("127.0.0.1", 0), prepare=prepare).close()
    assert len(seen) == 1

    def refuse(sock: socket.socket) -> None:
        seen.append(sock)
        raise OSError("refused")

    with pytest.raises(OSError, match="refused"):
        udp_socket(("127.0.0.1", 0), prepare=refuse)
    assert seen[-1].fileno() == -1  # closed, not leaked


def test_helpers() -> None:
    assert family_of("::1") == socket.AF_INET6 and family_of("10.0.0.1") == socket.AF_INET
    assert format_addr(("::1", 5)) == "[::1]:5" and format_addr(("1.2.3.4", 5)) == "1.2.3.4:5"
