"""The media port's TLS split (relay/tls.py, issue 40 item 4): one TCP listener, four kinds
of first bytes. A ClientHello offering ``h2``/``http/1.1`` (or an HTTPS SNI name) is spliced
to the HTTPS backend behind a PROXY v2 header; one offering ``stun.turn`` (or a TURN SNI
name, or no ALPN) is TURN/TLS, terminated by the relay; one offering only protocols we do
not speak, or a malformed hello, is closed and counted. RFC 4571-framed STUN stays ICE-TCP
(tests/relay/test_tcp.py) — checked here on the same listener as the TLS cases.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from pathlib import Path

import pytest
import trio
from relay.conftest import StartRelay
from relay.support import eventually

from appliance.proto.dtls.tlspeek import HelloPeek
from appliance.proto.proxy import STREAM, parse_transport_untrusted
from appliance.proto.stun.message import COOKIE_BYTES
from appliance.relay import RelayHandle
from appliance.relay.tcp import TcpLimits
from appliance.relay.tls import Route, TurnTls, route
from appliance.relay.turn import TurnSettings
from appliance.signaling.tls import ensure_self_signed

Address = tuple[str, int]
TLS = TurnTls(cert="-", key="-", names=("turn.example.com",),
              https_names=("app.example.com",))


@pytest.mark.parametrize(("name", "alpn", "tls", "https", "want"), [
    (None, (b"stun.turn",), TLS, True, Route.TURN),
    (None, (b"h2", b"stun.turn"), TLS, True, Route.TURN),
    ("turn.example.com", (b"h2",), TLS, True, Route.TURN),
    ("app.example.com", (), TLS, True, Route.HTTPS),
    (None, (b"h2", b"http/1.1"), TLS, True, Route.HTTPS),
    ("other.example.com", (b"http/1.1",), TLS, True, Route.HTTPS),
    (None, (), TLS, True, Route.TURN),  # Chromium's and coturn's turns: offer no ALPN
    (None, (), None, True, Route.HTTPS),  # no TURN/TLS: today's splice, unchanged
    (None, (b"stun.turn",), None, True, Route.REFUSE),
    (None, (b"h2",), TLS, False, Route.REFUSE),
    (None, (b"imap",), TLS, True, Route.REFUSE),
    (None, (b"acme-tls/1",), None, True, Route.REFUSE),
])
def test_route_table(name: str | None, alpn: tuple[bytes, ...], tls: TurnTls | None,
                     https: bool, want: Route) -> None:
    assert route(HelloPeek(name, alpn), tls, https) is want


class Backend:
    """A stand-in for signaling's PROXY-aware HTTPS backend: records what each connection
    sent first."""

    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.address: Address = ("127.0.0.1", 0)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        sockname = listeners[0].socket.getsockname()
        self.address = (sockname[0], sockname[1])
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            with trio.move_on_after(5):
                while len(data) < 64:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        break
                    data += chunk
            self.got.append(data)


async def _relay(start_relay: StartRelay, nursery: trio.Nursery, tmp: Path
                 ) -> tuple[RelayHandle, Backend, str]:
    backend = Backend()
    await nursery.start(backend.serve)
    cert, key, _ = ensure_self_signed(tmp, ["127.0.0.1"])
    relay = await start_relay(
        tcp=(("127.0.0.1", 0),), tcp_https=backend.address,
        turn=TurnSettings(secrets=(b"split-test-secret",)),
        turn_tls=TurnTls(cert=cert, key=key, names=("turn.example.com",)))
    return relay, backend, cert


def _client_context(alpn: list[str]) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


async def _handshake(client: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO,
                     stream: trio.SocketStream) -> None:
    """Finish a memory-BIO client's handshake over ``stream`` (its last flight sent)."""
    while True:
        try:
            client.do_handshake()
            break
        except ssl.SSLWantReadError:
            await stream.send_all(outgoing.read())
            incoming.write(await stream.receive_some(65536))
    await stream.send_all(outgoing.read())


def _allocate() -> bytes:
    """RFC 8656 §7.1: an Allocate request with REQUESTED-TRANSPORT UDP and nothing else."""
    return (b"\x00\x03\x00\x08" + COOKIE_BYTES + os.urandom(12)
            + b"\x00\x19\x00\x04\x11\x00\x00\x00")


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2],
                         ids=["tls1.3", "tls1.2"])
@pytest.mark.parametrize(("alpn", "sni"), [(["stun.turn"], None), ([], None),
                                           (["h2"], "turn.example.com")],
                         ids=["alpn", "no-alpn", "sni"])
async def test_turn_over_tls_is_terminated_here(
        nursery: trio.Nursery, start_relay: StartRelay, tmp_path: Path,
        alpn: list[str], sni: str | None, version: ssl.TLSVersion) -> None:
    """OpenSSL does the handshake; the records after it are the relay's own (relay/tls.py):
    the client's ``ssl`` reads them, several each way, in TLS 1.3 and 1.2."""
    relay, backend, _ = await _relay(start_relay, nursery, tmp_path)
    stream = await trio.open_tcp_stream(*relay.tcp[0])
    ctx = _client_context(alpn)
    ctx.maximum_version = version
    tls = trio.SSLStream(stream, ctx, server_hostname=sni)
    async with tls:
        with trio.fail_after(10):
            await tls.do_handshake()
            # RFC 7443 §3: the server selects stun.turn when the client offers it.
            assert tls.selected_alpn_protocol() == ("stun.turn" if alpn == ["stun.turn"]
                                                    else None)
            answers = []
            for _ in range(3):
                await tls.send_all(_allocate())
                answers.append(await tls.receive_some(65536))
    # An Allocate error response (0x0113): the 401 challenge of RFC 8656 §7.2 / 8489 §9.2.
    for answer in answers:
        assert answer[:2] == b"\x01\x13" and answer[4:8] == COOKIE_BYTES
    counters = relay.stats()["counters"]
    assert counters["tcp_turn_tls"] == 1 and counters["tcp_https"] == 0
    assert counters["turn_challenges"] >= 3
    assert "tcp-tls-record" not in counters["drops"]
    assert backend.got == []


async def test_a_tampered_record_is_answered_with_an_alert_and_closed(
        nursery: trio.Nursery, start_relay: StartRelay, tmp_path: Path) -> None:
    """A record that does not authenticate after the handshake (our record layer's check,
    proto/dtls/tlsrecord.py): the relay sends bad_record_mac, closes and counts it."""
    relay, backend, _ = await _relay(start_relay, nursery, tmp_path)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = _client_context(["stun.turn"]).wrap_bio(incoming, outgoing)
    stream = await trio.open_tcp_stream(*relay.tcp[0])
    async with stream:
        with trio.fail_after(10):
            await _handshake(client, incoming, outgoing, stream)
            client.write(_allocate())
            record = bytearray(outgoing.read())
            record[-1] ^= 1  # the tag's last bit
            await stream.send_all(bytes(record))
            rest = b""
            with contextlib.suppress(trio.BrokenResourceError):
                while chunk := await stream.receive_some(65536):
                    rest += chunk
        incoming.write(rest)
        with pytest.raises(ssl.SSLError, match="BAD_RECORD_MAC"):
            client.read(100)
    await eventually(lambda: "tcp-tls-record" in relay.stats()["counters"]["drops"])
    assert relay.stats()["counters"].get("turn_challenges", 0) == 0 and backend.got == []


async def test_https_is_spliced_with_the_client_named(
        nursery: trio.Nursery, start_relay: StartRelay, tmp_path: Path) -> None:
    relay, backend, _ = await _relay(start_relay, nursery, tmp_path)
    stream = await trio.open_tcp_stream(*relay.tcp[0])
    tls = trio.SSLStream(stream, _client_context(["h2", "http/1.1"]))
    me = stream.socket.getsockname()[:2]
    async with stream:
        # The fake backend speaks no TLS and hangs up: only the hello it got matters.
        with trio.move_on_after(1), contextlib.suppress(trio.BrokenResourceError):
            await tls.do_handshake()
        with trio.fail_after(10):
            await eventually(lambda: bool(backend.got))
    client, _, off, transport = parse_transport_untrusted(backend.got[0])
    assert transport == STREAM and client == me
    assert backend.got[0][off] == 0x16  # the ClientHello, as it was
    counters = relay.stats()["counters"]
    assert counters["tcp_https"] == 1 and counters["tcp_turn_tls"] == 0


@pytest.mark.parametrize(("first", "reason"), [
    (None, "tcp-tls-alpn"),
    (b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00", "tcp-tls-hello"),
], ids=["unknown-alpn", "not-a-client-hello"])
async def test_other_tls_is_closed_and_counted(
        nursery: trio.Nursery, start_relay: StartRelay, tmp_path: Path,
        first: bytes | None, reason: str) -> None:
    relay, backend, _ = await _relay(start_relay, nursery, tmp_path)
    stream = await trio.open_tcp_stream(*relay.tcp[0])
    async with stream:
        with trio.fail_after(10):
            if first is None:
                tls = trio.SSLStream(stream, _client_context(["imap"]))
                with pytest.raises(trio.BrokenResourceError):
                    await tls.do_handshake()
            else:
                await stream.send_all(first)
                assert await stream.receive_some(100) == b""  # closed, nothing said
            await eventually(lambda: reason in relay.stats()["counters"]["drops"])
    assert backend.got == []


async def test_a_hello_that_never_ends_times_out(
        nursery: trio.Nursery, start_relay: StartRelay, tmp_path: Path) -> None:
    """Slowloris on the split: a record header promising a 2000-byte ClientHello, then
    silence. The connection is closed at the first-frame timeout, not held."""
    backend = Backend()
    await nursery.start(backend.serve)
    cert, key, _ = ensure_self_signed(tmp_path, ["127.0.0.1"])
    relay = await start_relay(
        tcp=(("127.0.0.1", 0),), tcp_https=backend.address,
        tcp_limits=TcpLimits(first_frame_timeout=0.3),
        turn=TurnSettings(secrets=(b"split-test-secret",)),
        turn_tls=TurnTls(cert=cert, key=key))
    stream = await trio.open_tcp_stream(*relay.tcp[0])
    async with stream:
        await stream.send_all(b"\x16\x03\x01\x07\xd0\x01\x00\x07\xcc\x03\x03")
        with trio.fail_after(10):
            assert await stream.receive_some(100) == b""
        await eventually(lambda: "tcp-first-timeout" in relay.stats()["counters"]["drops"])
    assert backend.got == []


async def test_a_failed_handshake_is_counted(
        nursery: trio.Nursery, start_relay: StartRelay, tmp_path: Path) -> None:
    """A TURN/TLS client that breaks TLS after its hello (a handshake message of no known
    type where its second flight belongs) is closed and counted, nothing else."""
    relay, backend, _ = await _relay(start_relay, nursery, tmp_path)
    out = ssl.MemoryBIO()
    hello = _client_context(["stun.turn"]).wrap_bio(ssl.MemoryBIO(), out)
    with pytest.raises(ssl.SSLWantReadError):
        hello.do_handshake()
    stream = await trio.open_tcp_stream(*relay.tcp[0])
    async with stream:
        await stream.send_all(out.read() + b"\x16\x03\x03\x00\x04\x63\x00\x00\x00")
        # The server's flight, then EOF (or a reset, should our bytes still be unread).
        with trio.fail_after(10), contextlib.suppress(trio.BrokenResourceError):
            while await stream.receive_some(65536):
                pass
        await eventually(lambda: "tcp-tls-handshake" in relay.stats()["counters"]["drops"])
    assert relay.stats()["counters"]["tcp_turn_tls"] == 1 and backend.got == []


async def test_a_second_hello_with_the_same_random_is_refused(
        nursery: trio.Nursery, start_relay: StartRelay, tmp_path: Path) -> None:
    """OpenSSL's key log names a handshake by its ClientHello's random (relay/tls.py): a
    hello copied off the wire, sent while the first is in its handshake, is closed and
    counted (``tcp-tls-random``); the first handshake goes on and completes."""
    relay, backend, _ = await _relay(start_relay, nursery, tmp_path)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = _client_context(["stun.turn"]).wrap_bio(incoming, outgoing)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    hello = outgoing.read()
    first = await trio.open_tcp_stream(*relay.tcp[0])
    copy = await trio.open_tcp_stream(*relay.tcp[0])
    async with first, copy:
        with trio.fail_after(10):
            await first.send_all(hello)
            incoming.write(await first.receive_some(65536))  # its flight: in its handshake
            await copy.send_all(hello)
            with contextlib.suppress(trio.BrokenResourceError):
                assert await copy.receive_some(65536) == b""
            await _handshake(client, incoming, outgoing, first)
            client.write(_allocate())
            await first.send_all(outgoing.read())
            incoming.write(await first.receive_some(65536))
        assert client.read(100)[:2] == b"\x01\x13"  # the 401 through the relay's records
    assert relay.stats()["counters"]["drops"].get("tcp-tls-random") == 1
    assert backend.got == []
