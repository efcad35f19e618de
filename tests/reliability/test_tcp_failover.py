"""Issue 40 item 2: ICE-TCP and TURN/TCP connections survive a SIGKILL of the relay worker
that accepted them (relay/keeper.py), and a rolling restart (SIGHUP: relay/handover.py),
with no reconnect; a full shutdown still closes them.

A real ``appliance up`` (one relay worker with its warm standby, ``--turn-peer 127.0.0.0/8``)
and, on loopback:

* an ICE-TCP call — our ``ClientPeer`` (ICE, DTLS, SRTP) to the echo agent, its datagrams
  as RFC 4571 frames on one TCP connection to the media port (RFC 6544);
* a TURN/TCP client — an allocation over one TCP connection (RFC 8656 §12.5), ChannelData
  every 20 ms to an echo peer on loopback through the relayed socket;
* a third, ICE-TCP connection that the worker closes just before the kill (it sends a frame
  longer than the relay takes): its client must see the end although the keeper held a
  copy of it, and the successor must not be handed it.

SIGKILL of the worker, twice; after each the **same** two connections carry echoes again
(the client sockets are never replaced, nothing is re-Allocated, no error answer), the
longest gap between two echoes across the kill is at most 250 ms (the bound the UDP calls
have, docs/reliability.md), and the successor took over exactly those two connections.

SIGHUP, twice, with one and with two workers: the same, each worker replaced handing its
connections straight to its successor; then a kill of each worker holding them (the
successor kept them at its new template's keeper). SIGTERM to ``up``: both connections
end at their clients, ``up`` exits 0 within its grace, nothing was handed over.
"""

from __future__ import annotations

import signal
import socket
import ssl
import time

import pytest
import trio
from proto.turn.turn_client import Client
from reliability.failover import Up
from reliability.support import eventually, opus_frame
from reliability.tcp_support import TcpCall

from appliance.client.http import request
from appliance.client.peer import ClientPeer
from appliance.proto.dtls import Certificate
from appliance.proto.stun import AttrType, Class, Message, Method
from appliance.proto.turn import (
    StreamFramer,
    derive_turn_secret,
    encode_channel_data,
    mint_rest_credential,
    parse_channel_data_untrusted,
)
from appliance.proto.ufrag import load_secrets
from appliance.statedir import SECRET_NAME

CHANNEL = 0x4001
KILLS = 2
ROLLS = 2
BOUND = 0.25  # the media gap a worker kill may cost (docs/reliability.md)
BURST = 1200  # the payload of the packets that fill a client's window
#: TURN over TLS on the media port's TCP listener (the self-signed certificate)
TLS = ("--tls", "self-signed", "--https-on-media-port")


async def _ice_tcp_call(nursery: trio.Nursery, up: Up, name: str) -> TcpCall:
    """An ICE-TCP call through ``POST /v1/sessions`` (the echo agent)."""
    peer = ClientPeer(Certificate.generate(time.time()))
    resp = await request("POST", up.base + "/v1/sessions", body=peer.offer().encode(),
                         headers={"Content-Type": "application/sdp"}, verify_tls=False)
    assert resp.status == 201, (resp.status, resp.body[:300])
    answer = resp.body.decode()
    assert "tcptype passive" in answer
    peer.accept_answer(answer, trio.current_time())
    sock = socket.create_connection(("127.0.0.1", up.udp))
    sock.setblocking(False)
    call = TcpCall(name, 0, peer, sock)
    nursery.start_soon(call.run, opus_frame())
    return call


class TurnTcpCall:
    """A TURN client on one TCP (or TLS) connection relaying numbered packets to an echo
    peer."""

    def __init__(self, stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
                 peer: trio.socket.SocketType, client: Client) -> None:
        self.stream = stream
        self.peer = peer
        self.client = client
        self.framer = StreamFramer()
        self.seq = 0
        self.sent: dict[int, float] = {}
        self.rx: list[tuple[float, int]] = []
        self.stun: list[Message] = []
        self.requests: list[Method] = []
        self.closed = False
        #: while set and not yet fired, the client reads nothing (its window fills)
        self.hold: trio.Event | None = None
        self.sending = trio.Lock()  # the paced sender's and a test's bursts take turns

    def close(self) -> None:
        self.peer.close()
        tcp = self.stream.transport_stream if isinstance(self.stream, trio.SSLStream) \
            else self.stream
        tcp.socket.close()

    async def _message(self) -> bytes:
        while (msg := self.framer.poll_output()) is None:
            if self.hold is not None:
                await self.hold.wait()
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:  # TLS: the end without close_notify
                data = b""
            if not data:
                self.closed = True
                raise EOFError("the relay closed the TURN connection")
            self.framer.handle_input(data)
        return msg

    async def ask(self, method: Method, attrs: tuple[tuple[AttrType, object], ...]) -> None:
        for _ in range(2):  # one 401 round, as a client does
            self.requests.append(method)
            await self.stream.send_all(self.client.request(method, attrs))  # type: ignore[arg-type]
            with trio.fail_after(5):
                msg = self.client.learn(await self._message())
            if msg.msg_class == Class.SUCCESS:
                return
        raise AssertionError(msg.error_code)

    async def echo(self) -> None:
        while True:
            data, src = await self.peer.recvfrom(65536)
            await self.peer.sendto(data, src)

    async def send(self) -> None:
        while not self.closed:
            self.seq += 1
            self.sent[self.seq] = trio.current_time()
            try:
                async with self.sending:
                    await self.stream.send_all(encode_channel_data(
                        CHANNEL, self.seq.to_bytes(4, "big") + bytes(156), pad=True))
            except (trio.BrokenResourceError, trio.ClosedResourceError):  # the relay closed
                # it (reset: bytes in flight), or the test's teardown did
                self.closed = True
                return
            await trio.sleep(0.02)  # pacing (50 packets/s, like audio), not a wait

    async def receive(self) -> None:
        try:
            while True:
                data = await self._message()
                if data[0] >> 6 == 1:
                    number, length = parse_channel_data_untrusted(data)
                    assert number == CHANNEL and length in (160, BURST), (number, length)
                    if length == 160:  # (a burst's echo is counted by its bytes only)
                        self.rx.append((trio.current_time(),
                                        int.from_bytes(data[4:8], "big")))
                    else:
                        assert data[4:] == bytes(BURST), "a burst echo damaged"
                else:
                    self.stun.append(Message.parse_untrusted(data))
        except (EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed = True  # (closed: the test's teardown, racing its cancellation)
            return

    @property
    def rx_times(self) -> list[float]:
        return [t for t, _ in self.rx]

    def echoed_after(self, t: float) -> bool:
        return any(self.sent[seq] > t for _, seq in self.rx[-50:])


async def _turn_tcp_call(nursery: trio.Nursery, up: Up, *, tls: bool = False,
                         rcvbuf: int = 0) -> TurnTcpCall:
    """A TURN/TCP client, or with ``tls`` a TURN/TLS one (``turns:``: TLS 1.3 with ALPN
    ``stun.turn``, the self-signed certificate not checked), echoing through its channel."""
    routing = load_secrets((up.state / SECRET_NAME).read_bytes())[0]
    cred = mint_rest_credential(derive_turn_secret(routing), "tcp-failover",
                                int(time.time()) + 3600)
    peer = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await peer.bind(("127.0.0.1", 0))
    if rcvbuf:  # a small receive window, set before the handshake fixes its scale
        raw = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        await raw.connect(("127.0.0.1", up.udp))
        tcp = trio.SocketStream(raw)
    else:
        tcp = await trio.open_tcp_stream("127.0.0.1", up.udp)
    name = tcp.socket.getsockname()
    client = Client(addr=(name[0], name[1]), local=("127.0.0.1", up.udp),
                    username=cred.username, password=cred.password)
    stream: trio.SocketStream | trio.SSLStream[trio.SocketStream] = tcp
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["stun.turn"])
        stream = trio.SSLStream(tcp, ctx, https_compatible=True)
        with trio.fail_after(10):
            await stream.do_handshake()
    call = TurnTcpCall(stream, peer, client)
    nursery.start_soon(call.echo)
    await call.ask(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),))
    pname = peer.getsockname()
    await call.ask(Method.CHANNEL_BIND, ((AttrType.CHANNEL_NUMBER, CHANNEL),
                                         (AttrType.XOR_PEER_ADDRESS, (pname[0], pname[1]))))
    nursery.start_soon(call.receive)
    nursery.start_soon(call.send)
    return call


def _nothing_asked_again(turns: tuple[TurnTcpCall, TurnTcpCall],
                         asked: tuple[list[Method], list[Method]]) -> None:
    """The TURN clients sent no request since ``asked`` (no re-Allocate) and got no error."""
    assert (turns[0].requests, turns[1].requests) == asked
    for t in turns:
        assert not any(m.msg_class == Class.ERROR for m in t.stun), t.stun


def _end(nursery: trio.Nursery, up: Up, *calls: TurnTcpCall | None) -> None:
    """A test's end: the calls' tasks cancelled before their sockets close, ``up`` stopped."""
    nursery.cancel_scope.cancel()
    for t in calls:
        if t is not None:
            t.close()
    up.stop()


def _gap(times: list[float], start: float, end: float) -> float:
    inside = [t for t in times if start <= t <= end]
    return max((b - a for a, b in zip(inside, inside[1:], strict=False)), default=end - start)


async def test_tcp_connections_survive_worker_kills_and_a_closed_one_stays_closed(
        tmp_path: object, nursery: trio.Nursery) -> None:
    up = await Up.start(tmp_path, workers=1, extra=("--turn-peer", "127.0.0.0/8", *TLS))  # type: ignore[arg-type]
    turn = tls = None
    try:
        await up.standbys_ready()
        ice = await _ice_tcp_call(nursery, up, "ice-tcp")
        turn = await _turn_tcp_call(nursery, up)
        tls = await _turn_tcp_call(nursery, up, tls=True)
        doomed = await _ice_tcp_call(nursery, up, "closed-by-the-worker")
        start = trio.current_time()
        for call in (ice, doomed):
            await eventually(lambda c=call: bool(c.rx_after(start)), 20,  # type: ignore[misc]
                             f"{call.sid}'s echo over ICE-TCP")
        for t, what in ((turn, "TCP"), (tls, "TLS")):
            await eventually(lambda t=t: t.echoed_after(start), 10,  # type: ignore[misc]
                             f"echoes through TURN/{what}")

        async def held() -> int:
            """Connections the live worker has at its keeper (its own and adopted ones)."""
            c = await up.counters()
            return int(c.get("tcp_kept", 0)) + int(c.get("tcp_adopted", 0))

        async def all_kept(n: int) -> None:
            with trio.fail_after(10):
                while await held() < n:  # noqa: ASYNC110 - another process's counters
                    await trio.sleep(0.01)

        await all_kept(4)
        # The worker closes one connection (a frame longer than it takes); its client sees
        # the end although the keeper held a copy, and the kill right after does not hand
        # it to the successor (the keeper applied the dead worker's drop first).
        doomed.sock.send(b"\xff\xff")
        await eventually(lambda: doomed.failed == "relay closed the connection", 5,
                         "the closed connection's end at its client")
        asked = list(turn.requests), list(tls.requests)
        measured = start
        for kill in range(KILLS):
            killed, back = await up.kill_worker(0)
            try:
                # A stretch of echoes after the successor is up: the gap is measured across.
                await eventually(lambda b=back: len(ice.rx_after(b)) >= 10, 10,  # type: ignore[misc]
                                 f"ICE-TCP echoes after kill {kill + 1}")
                for t, what in ((turn, "TCP"), (tls, "TLS")):
                    await eventually(lambda b=back, t=t: len([x for x in t.rx_times  # type: ignore[misc]
                                                             if x > b]) >= 10,
                                     10, f"TURN/{what} echoes after kill {kill + 1}")
            except AssertionError:  # what the successor counted, for the reader of a red run
                print("worker 0:", await up.worker_stats(0))
                raise
            end = trio.current_time()
            gaps = (_gap(ice.rx_times, max(killed - 0.2, measured), end),
                    _gap(turn.rx_times, max(killed - 0.2, measured), end),
                    _gap(tls.rx_times, max(killed - 0.2, measured), end))
            measured = end
            counters = await up.counters()
            print(f"SIGKILL {kill + 1}: longest echo gap ICE-TCP {gaps[0] * 1000:.0f} ms, "
                  f"TURN/TCP {gaps[1] * 1000:.0f} ms, TURN/TLS {gaps[2] * 1000:.0f} ms "
                  f"(worker back after "
                  f"{(back - killed) * 1000:.0f} ms); adopted {counters.get('tcp_adopted')}, "
                  f"drops {counters['drops']}")
            # Exactly the three live connections were taken over, the same ones: no
            # client saw its connection end, nor allocated again.
            assert counters.get("tcp_adopted") == 3, counters
            assert "keeper-adopt-failed" not in counters["drops"], counters
            assert counters.get("turn_allocations_created", 0) == 0, counters
            assert ice.failed is None and not turn.closed and not tls.closed
            assert all(g <= BOUND for g in gaps), gaps
            await up.standbys_ready()
        _nothing_asked_again((turn, tls), asked)  # after the kills
    finally:
        _end(nursery, up, turn, tls)


class EndedTcpCall(TcpCall):
    """A :class:`TcpCall` whose connection may end with a reset (the relay closes it while
    the client's bytes are in flight): counted as its end, not raised into the nursery."""

    async def run(self, payload: bytes) -> None:
        try:
            await super().run(payload)
        except ConnectionResetError:
            self.failed = "relay reset the connection"


async def _kept_calls(nursery: trio.Nursery, up: Up, ice_call: type[TcpCall] = TcpCall
                      ) -> tuple[TcpCall, TurnTcpCall, TurnTcpCall, float]:
    """An ICE-TCP call, a TURN/TCP and a TURN/TLS client, all echoing and all at the keeper
    (or, with no template up yet, queued for it: established). Returns them and when they
    started."""
    peer = ClientPeer(Certificate.generate(time.time()))
    resp = await request("POST", up.base + "/v1/sessions", body=peer.offer().encode(),
                         headers={"Content-Type": "application/sdp"}, verify_tls=False)
    assert resp.status == 201, (resp.status, resp.body[:300])
    peer.accept_answer(resp.body.decode(), trio.current_time())
    sock = socket.create_connection(("127.0.0.1", up.udp))
    sock.setblocking(False)
    ice = ice_call("ice-tcp", 0, peer, sock)
    nursery.start_soon(ice.run, opus_frame())
    turn = await _turn_tcp_call(nursery, up)
    tls = await _turn_tcp_call(nursery, up, tls=True)
    start = trio.current_time()
    await eventually(lambda: bool(ice.rx_after(start)), 20, "the echo over ICE-TCP")
    await eventually(lambda: turn.echoed_after(start), 10, "echoes through TURN/TCP")
    await eventually(lambda: tls.echoed_after(start), 10, "echoes through TURN/TLS")
    with trio.fail_after(10):  # all established (kept): what a stop hands over or closes
        while await _established(up) < 3:  # noqa: ASYNC110 - another process's counters
            await trio.sleep(0.01)
    return ice, turn, tls, start


async def _established(up: Up) -> int:
    c = await up.counters()
    return int(c.get("tcp_established", 0)) + int(c.get("tcp_adopted", 0)) + \
        int(c.get("tcp_taken_over", 0))


async def _echoes_after(ice: TcpCall, turns: tuple[TurnTcpCall, ...], t: float,
                        what: str) -> None:
    """A stretch of echoes on every connection after ``t``: a gap is measured across."""
    await eventually(lambda: len(ice.rx_after(t)) >= 10, 10, f"ICE-TCP echoes after {what}")
    for turn in turns:
        kind = "TLS" if isinstance(turn.stream, trio.SSLStream) else "TCP"
        await eventually(lambda turn=turn: len([x for x in turn.rx_times if x > t]) >= 10,  # type: ignore[misc]
                         10, f"TURN/{kind} echoes after {what} (closed: {turn.closed})")


@pytest.mark.parametrize("workers", [1, 2])
async def test_tcp_connections_survive_rolling_restarts(
        tmp_path: object, nursery: trio.Nursery, workers: int) -> None:
    """Issue 40: a rolling restart (SIGHUP) closed every ICE-TCP and TURN/TCP connection —
    the worker being replaced shut them down as it stopped (its keeper, in the template the
    roll stops first, could not help), so their clients had to reconnect or restart ICE.
    Now each worker being replaced hands its established connections straight to its
    successor (relay/handover.py): across two rolls the same connections carry echoes
    again, nothing is re-Allocated, the longest echo gap stays within the kill's bound; and
    the successor kept them at its new template's keeper, so a kill after the rolls is
    survived too."""
    up = await Up.start(tmp_path, workers=workers, extra=("--turn-peer", "127.0.0.0/8", *TLS))  # type: ignore[arg-type]
    turn = tls = None
    try:
        ice, turn, tls, start = await _kept_calls(nursery, up)
        asked = list(turn.requests), list(tls.requests)
        measured = start
        for roll in range(ROLLS):
            began, done = await up.roll()
            try:
                await _echoes_after(ice, (turn, tls), done, f"roll {roll + 1}")
            except AssertionError:
                print("workers:", [await up.worker_stats(w) for w in range(workers)])
                raise
            end = trio.current_time()
            gaps = (_gap(ice.rx_times, max(began, measured), end),
                    _gap(turn.rx_times, max(began, measured), end),
                    _gap(tls.rx_times, max(began, measured), end))
            measured = end
            counters = await up.counters()
            print(f"SIGHUP {roll + 1}, {workers} worker(s): longest echo gap ICE-TCP "
                  f"{gaps[0] * 1000:.0f} ms, TURN/TCP {gaps[1] * 1000:.0f} ms, TURN/TLS "
                  f"{gaps[2] * 1000:.0f} ms (roll took "
                  f"{(done - began) * 1000:.0f} ms); taken over "
                  f"{counters.get('tcp_taken_over')}, drops {counters['drops']}")
            # Exactly the three live connections were handed over, the same ones: no
            # client saw its connection end, nor allocated again.
            assert counters.get("tcp_taken_over") == 3, counters
            assert not any(r.startswith("handover-") for r in counters["drops"]), counters
            assert counters.get("turn_allocations_created", 0) == 0, counters
            assert ice.failed is None and not turn.closed and not tls.closed
            assert all(g <= BOUND for g in gaps), gaps
        # The successors handed their connections to their new keepers: a kill of each
        # worker holding some is survived as before.
        await up.standbys_ready()
        holders = []
        for w in range(workers):
            stats = await up.worker_stats(w)
            assert stats is not None
            if stats["counters"].get("tcp_taken_over"):
                holders.append(w)
                with trio.fail_after(10):
                    while not ((await up.worker_stats(w)) or {}).get(  # noqa: ASYNC110
                            "counters", {}).get("keeper_connects"):
                        await trio.sleep(0.01)  # another process's counters
        for w in holders:
            killed, back = await up.kill_worker(w)
            try:
                await _echoes_after(ice, (turn, tls), back, f"the kill of worker {w}")
            except AssertionError:  # what the workers counted, for the reader of a red run
                print("workers:", [await up.worker_stats(x) for x in range(workers)])
                raise
            now = trio.current_time()
            print(f"SIGKILL of worker {w} after the rolls: longest echo gap ICE-TCP "
                  f"{_gap(ice.rx_times, killed, now) * 1000:.0f} ms, TURN/TCP "
                  f"{_gap(turn.rx_times, killed, now) * 1000:.0f} ms, TURN/TLS "
                  f"{_gap(tls.rx_times, killed, now) * 1000:.0f} ms")
        counters = await up.counters()
        assert counters.get("tcp_adopted") == 3, counters
        assert ice.failed is None and not turn.closed and not tls.closed
        _nothing_asked_again((turn, tls), asked)  # after the rolls
    finally:
        _end(nursery, up, turn, tls)


async def _relay_ends(sock: socket.socket) -> None:
    """Read ``sock`` (a descriptor of a client's connection) until the relay's end of it
    arrives: EOF, or a reset (it closed with the client's bytes unread)."""
    stream = trio.socket.from_stdlib_socket(sock)
    with trio.fail_after(10):
        try:
            while await stream.recv(65536):
                pass
        except ConnectionResetError:
            pass


async def test_a_full_shutdown_still_closes_the_tcp_connections(
        tmp_path: object, nursery: trio.Nursery) -> None:
    """The hand-over must not keep anything alive past the relay: SIGTERM to ``up`` stops
    each worker with no successor, so its established ICE-TCP and TURN/TCP connections are
    shut down as before, the template's copies with it; both clients see the relay end
    their connection, ``up`` exits 0 within its grace, and no worker handed anything over.
    (The ICE-TCP client's own end is watched through a second descriptor: the call stops
    by itself when the transceiver's DTLS close_notify arrives first, and closes its own.)"""
    up = await Up.start(tmp_path, workers=1, extra=("--turn-peer", "127.0.0.0/8", *TLS))  # type: ignore[arg-type]
    turn = tls = None
    try:
        await up.standbys_ready()  # the keeper holds a copy of each: it must go too
        ice, turn, tls, _ = await _kept_calls(nursery, up, EndedTcpCall)
        t, t2 = turn, tls
        watch = ice.sock.dup()
        try:
            up.proc.popen.send_signal(signal.SIGTERM)
            await _relay_ends(watch)
        finally:
            watch.close()
        await eventually(lambda: t.closed, 10, "the TURN/TCP connection's end at its client")
        await eventually(lambda: t2.closed, 10, "the TURN/TLS connection's end at its client")
        await eventually(lambda: up.proc.popen.poll() is not None, 10, "up's exit")
        assert up.proc.popen.returncode == 0
        log = up.proc.log.read_text(errors="replace")
        assert "handed to the successor" not in log
        assert "ignored SIGTERM" not in log
    finally:
        _end(nursery, up, turn, tls)


async def test_a_frame_cut_in_two_by_a_kill_is_finished_by_the_successor(
        tmp_path: object, nursery: trio.Nursery) -> None:
    """A kill while a frame is half in the kernel — the client's receive window full, the
    rest of the frame in the dead worker's backlog — used to break the stream (the client's
    framing lost its place). Now every kept connection's worker publishes on its board
    (relay/board.py) the chunk of whole frames each send hands the kernel, and the
    successor writes what the kernel did not get of it before anything else: the client,
    reading again, finds every message whole and the echoes carrying on.

    A TURN/TCP client with a small receive window stops reading and bursts 1 200-byte
    packets through its channel, so the relay's backlog to it fills (``tcp-write-full``);
    then SIGKILL; then it reads on."""
    up = await Up.start(tmp_path, workers=1, extra=("--turn-peer", "127.0.0.0/8"))  # type: ignore[arg-type]
    turn = None
    try:
        await up.standbys_ready()
        turn = await _turn_tcp_call(nursery, up, rcvbuf=4096)
        start = trio.current_time()
        await eventually(lambda: turn.echoed_after(start), 10, "echoes through TURN/TCP")
        with trio.fail_after(10):
            while not (await up.counters()).get("tcp_kept"):  # noqa: ASYNC110
                await trio.sleep(0.01)  # another process's counters
        turn.hold = trio.Event()
        burst = encode_channel_data(CHANNEL, bytes(BURST), pad=True)
        drops: dict[str, int] = {}
        with trio.fail_after(20):
            while not drops.get("tcp-write-full"):  # the relay's backlog is full
                async with turn.sending:
                    for _ in range(50):
                        await turn.stream.send_all(burst)
                drops = (await up.counters())["drops"]
        killed, back = await up.kill_worker(0)
        turn.hold.set()  # reads on: every message must parse (a TurnError fails the test)
        turn.hold = None
        await eventually(lambda: bool([t for t in turn.rx_times if t > back + 0.2]), 10,
                         "echoes after the kill")
        counters = await up.counters()
        print(f"a kill with the backlog full: adopted {counters.get('tcp_adopted')}, "
              f"frames finished {counters.get('tcp_frames_finished', 0)}, "
              f"drops {counters['drops']}")
        assert counters.get("tcp_adopted") == 1, counters
        assert "tcp-resume" not in counters["drops"], counters
        assert not turn.closed
        assert not any(m.msg_class == Class.ERROR for m in turn.stun), turn.stun
    finally:
        _end(nursery, up, turn)
