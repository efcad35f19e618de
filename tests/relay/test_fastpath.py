"""The hot path decides nothing of its own: its shortcuts are the core's tables, and its two
syscall adapters (python, mmsg) do the same thing to the same bytes.

* FAST_FIRST / RelayCore.no_flow_first give, for every first byte and flow state, exactly
  the answer RelayCore.handle_datagram would give (the drain only skips the call).
* PythonIO and MmsgIO, fed the same datagrams and the same queues, receive the same
  (length, source) lists into the same slots and put the same datagrams on the wire.
* A flow's internal-leg header carries its transport (PROXY v2 DGRAM or STREAM nibble).
"""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st
from relay.support import SECRET, check, ufrag

from appliance.proto.proxy import encode_header, parse_untrusted
from appliance.relay.core import FAST_FIRST, IS_STUN, SLOW_FIRST, CoreConfig, Flow, RelayCore
from appliance.relay.io import MmsgIO, PythonIO, mmsg_available
from appliance.relay.transport import Transport, UdpSink, encode_flow_header

PUBLIC = ("198.51.100.1", 3478)
CLIENT = ("203.0.113.7", 40000)
T = {0: ("127.0.0.1", 4000)}


def core(**kw: object) -> RelayCore:
    cfg: dict[str, object] = {"secrets": (SECRET,), "transceivers": T}
    cfg.update(kw)
    return RelayCore(CoreConfig(**cfg))  # type: ignore[arg-type]


def test_fast_first_is_the_complement_of_slow_first() -> None:
    assert all(FAST_FIRST[b] + SLOW_FIRST[b] == 1 for b in range(256))
    assert not any(FAST_FIRST[b] for b in range(256) if IS_STUN[b])
    assert not FAST_FIRST[22]  # DTLS handshake records spend the dtls budget


@given(st.integers(0, 255), st.binary(max_size=40))
def test_known_flow_shortcut_agrees_with_the_core(first: int, rest: bytes) -> None:
    """Where the drain forwards a known flow's datagram itself, the core returns that flow."""
    r = core()
    flow = r.handle_datagram(0.0, CLIENT, check(ufrag()), PUBLIC)
    assert isinstance(flow, Flow)
    if FAST_FIRST[first]:
        drops = dict(r.counters.drops)
        assert r.handle_datagram(1.0, CLIENT, bytes([first]) + rest, PUBLIC) is flow
        assert flow.last_seen == 1.0 and r.counters.drops == drops


@given(st.integers(0, 255), st.binary(max_size=40), st.booleans())
def test_unknown_flow_shortcut_agrees_with_the_core(first: int, rest: bytes,
                                                    redis: bool) -> None:
    """Where the drain drops an unknown flow's datagram as no-flow, so would the core."""
    r = core(redis=redis)
    if redis:
        assert not any(r.no_flow_first)  # everything may be in Redis: ask the core
    if r.no_flow_first[first]:
        assert r.handle_datagram(0.0, CLIENT, bytes([first]) + rest, PUBLIC) is None
        assert r.counters.drops == {"no-flow": 1}
    else:
        assert IS_STUN[first] or redis


def test_flows_know_their_transport_and_sink() -> None:
    r = core()
    sink = UdpSink(PUBLIC, lambda buf, pending: (0, 0, 0))
    r.sinks[(Transport.UDP, PUBLIC)] = sink
    udp = r.handle_datagram(0.0, CLIENT, check(ufrag()), PUBLIC)
    assert isinstance(udp, Flow)
    assert udp.transport is Transport.UDP and udp.sink is sink
    assert udp.header[13] == 0x12  # DGRAM over IPv4
    tcp_client = ("203.0.113.8", 50000)
    tcp = r.handle_datagram(0.0, tcp_client, check(ufrag()), PUBLIC, transport=Transport.TCP)
    assert isinstance(tcp, Flow)
    assert tcp.transport is Transport.TCP and tcp.sink is None  # no TCP sink registered
    assert tcp.header[13] == 0x11  # STREAM over IPv4 (DESIGN.md: ICE-TCP frames)


@pytest.mark.parametrize(("client", "public", "family"), [
    (CLIENT, PUBLIC, 0x1), (("2001:db8::1", 5), ("2001:db8::2", 3478), 0x2),
])
def test_stream_header_differs_only_in_the_transport_nibble(
    client: tuple[str, int], public: tuple[str, int], family: int
) -> None:
    udp = encode_flow_header(Transport.UDP, client, public, b"\xe0\x00\x01r")
    tcp = encode_flow_header(Transport.TCP, client, public, b"\xe0\x00\x01r")
    assert udp == encode_header(client, public, b"\xe0\x00\x01r")
    assert parse_untrusted(udp)[:2] == (client, public)
    assert (udp[13], tcp[13]) == (family << 4 | 2, family << 4 | 1)
    assert udp[:13] == tcp[:13] and udp[14:] == tcp[14:]


# -- the two adapters -----------------------------------------------------------------------

SLOT, HEAD, CAP, COUNT = 512, 128, 256, 8


def adapters() -> list[object]:
    out: list[object] = [PythonIO()]
    if mmsg_available():
        out.append(MmsgIO())
    return out


@pytest.fixture(params=["ipv4", "ipv6"])
def family(request: pytest.FixtureRequest) -> int:
    return socket.AF_INET6 if request.param == "ipv6" else socket.AF_INET


def _pair(family: int) -> tuple[socket.socket, socket.socket]:
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    rx, tx = socket.socket(family, socket.SOCK_DGRAM), socket.socket(family, socket.SOCK_DGRAM)
    rx.bind((host, 0))
    tx.bind((host, 0))
    rx.setblocking(False)
    return rx, tx


def test_mmsg_is_built() -> None:
    assert mmsg_available(), "appliance.netio._mmsg is not built: run .venv/bin/pip install -e ."


def test_adapters_receive_the_same_batches(family: int) -> None:
    datagrams = [b"", b"a", bytes(range(200)), b"\x80" * CAP, b"\x01" * 1000]
    results = []
    for io in adapters():
        rx, tx = _pair(family)
        with rx, tx:
            buf = bytearray(SLOT * COUNT)
            recv = io.receiver(rx, buf, SLOT, HEAD, CAP, COUNT)  # type: ignore[attr-defined]
            assert recv() == []  # nothing waiting: an empty (short) batch
            for d in datagrams:
                tx.sendto(d, rx.getsockname())
            got = recv()
            src = tx.getsockname()[:2]
            assert got == [(len(d), src) for d in datagrams]  # real lengths (MSG_TRUNC)
            results.append(bytes(buf))
            assert recv() == []
    assert all(r == results[0] for r in results)  # the same bytes in the same slots


def test_adapters_send_the_same_datagrams(family: int) -> None:
    for io in adapters():
        rx, tx = _pair(family)
        with rx, tx:
            dest = rx.getsockname()[:2]
            # Entries in slots of their own, as the drains queue them: the python adapter
            # writes a header into the headroom in front of its payload.
            buf = bytearray(2 * SLOT)
            buf[HEAD : HEAD + 10] = buf[SLOT + HEAD : SLOT + HEAD + 10] = b"0123456789"
            flush = io.flusher(tx)  # type: ignore[attr-defined]
            pending = [(b"HDR:", HEAD + 2, 3, dest), (b"", SLOT + HEAD, 10, dest),
                       (b"only-header", 0, 0, dest)]
            assert flush(buf, pending) == (3, 7 + 10 + 11, 0)
            rx.setblocking(True)
            rx.settimeout(2)
            assert [rx.recv(100) for _ in pending] == [b"HDR:234", b"0123456789",
                                                       b"only-header"]
            other = ("127.0.0.1", 9) if family == socket.AF_INET6 else ("::1", 9)
            assert flush(buf, [(b"x", 0, 0, other), (b"y", 0, 0, dest)]) == (1, 1, 1)
            assert rx.recv(100) == b"y"
