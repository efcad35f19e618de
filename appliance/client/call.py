"""The trio shell around :class:`ClientPeer`: one call through a WHIP-style endpoint.

::

    async with open_call("http://127.0.0.1:8080") as call:   # returns once media can flow
        call.send_rtp(opus_packet, timestamp)
        pkt = await call.receive()

``open_call`` POSTs the offer to ``{base}/v1/sessions``, runs the peer on its own UDP socket
inside a nursery, waits until ICE + DTLS are up (raising :class:`CallFailed` with the reason
otherwise), and on exit sends DTLS close_notify and DELETEs the session.

Data channels (``open_call(..., datachannel=True)``, or ``audio=False`` for a data-only
call): the peer's ``sctp`` slot (the transceiver's own SCTP core, in the DTLS client role)
is driven by the same loop; the call object has a small channel API::

    cid = call.open_channel("chat")          # DCEP; await call.channel_open(cid)
    await call.send_message(cid, "hi")       # waits while bufferedAmount > high_water
    msg = await call.receive_message()       # dc.ChannelMessage (channel_id, data)
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from appliance.proto.dtls import Certificate
from appliance.proto.errors import ProtocolError
from appliance.proto.rtp import RtpPacket
from appliance.proto.sctp import datachannel as dc
from appliance.proto.srtp import SrtpProfile

from .http import HttpError, request
from .peer import ChannelEvent, ClientPeer, Connected, Failed, RtcpReceived, RtpReceived
from .stamps import ANCILLARY, arrival, enable_rx_timestamps, kernel_stamp

#: A sender waits while more than this is queued on its channel (W3C bufferedAmount).
HIGH_WATER = 1024 * 1024

def read_ready(sock: socket.socket, buf: bytearray, now: float, offset: float, stamped: bool,
               not_before: float = -math.inf) -> list[tuple[bytes, tuple[str, int], float]]:
    """Every datagram ready on ``sock``: ``(data, (host, port), arrival)`` with the arrival
    on trio's clock. ``offset`` is trio's clock minus the wall clock, read at ``now``.

    With kernel stamps (``stamped``), the arrival is when the datagram reached the socket,
    not when this process got round to reading it: the load generator's RTT figures then
    exclude its own scheduling delays and garbage-collection pauses (docs/performance.md).
    Arrivals are clamped to ``[max(not_before, now - 1 s), now]`` so a wall-clock step cannot
    move time backwards or into the future."""
    out: list[tuple[bytes, tuple[str, int], float]] = []
    floor = max(not_before, now - 1.0)
    while True:
        try:
            if stamped:
                n, anc, _flags, addr = sock.recvmsg_into([buf], ANCILLARY)
            else:
                n, addr = sock.recvfrom_into(buf)
                anc = []
        except (BlockingIOError, InterruptedError):
            break
        except OSError:
            break  # e.g. ICMP port unreachable surfaced as ECONNREFUSED
        at = arrival(kernel_stamp(anc), now, offset, floor)
        out.append((bytes(buf[:n]), (addr[0], addr[1]), at))
    return out


class CallFailed(Exception):
    """The call could not be set up; the message says which step failed. A refused POST
    also carries its ``Retry-After`` (None: none was sent, or it failed otherwise) and
    ``answered_in``: seconds from the request leaving to the answer arriving, on the
    kernel's stamps where it has them (:class:`~.http.Response`; None if unknown)."""

    def __init__(self, message: str, *, retry_after: str | None = None,
                 answered_in: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.answered_in = answered_in


@dataclass
class Timeline:
    """Seconds on trio's clock, relative to the moment the offer was POSTed."""

    answer: float | None = None
    connected: float | None = None
    first_rtp_in: float | None = None


@dataclass
class Call:
    peer: ClientPeer
    sock: socket.socket
    session_url: str
    answer: str
    started_at: float
    #: The 201's ETag: send it as If-Match on PATCH (RFC 9725 §4.4.1).
    etag: str | None = None
    timeline: Timeline = field(default_factory=Timeline)
    _send: trio.MemorySendChannel[RtpReceived] | None = None
    _recv: trio.MemoryReceiveChannel[RtpReceived] | None = None
    _wake: trio.Event = field(default_factory=trio.Event)
    rtcp: list[bytes] = field(default_factory=list)
    failure: str | None = None
    _msg_send: trio.MemorySendChannel[dc.ChannelMessage] | None = None
    _msg_recv: trio.MemoryReceiveChannel[dc.ChannelMessage] | None = None
    #: Channels open now, and every other channel event seen (opened, closed), in order.
    open_channels: set[int] = field(default_factory=set)
    channel_events: list[dc.EndpointEvent] = field(default_factory=list)
    messages_dropped: int = 0  # the reader fell behind a whole queue
    _turn: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)
    _wait_scope: trio.CancelScope | None = None

    def send_rtp(self, payload: bytes, timestamp: int, *, marker: bool = False) -> None:
        """Queue one RTP packet; it leaves on the next loop turn (at once if idle)."""
        self.peer.send_rtp(payload, timestamp, marker=marker)
        self._flush()

    def send_rtcp(self, plain: bytes) -> None:
        self.peer.send_rtcp(plain)
        self._flush()

    async def receive(self) -> RtpReceived:
        assert self._recv is not None
        return await self._recv.receive()

    def receive_nowait(self) -> RtpReceived | None:
        assert self._recv is not None
        try:
            return self._recv.receive_nowait()
        except trio.WouldBlock:
            return None

    # -- data channels -------------------------------------------------------------------

    def open_channel(self, label: str = "", **options: object) -> int:
        """Open a data channel (options as ``ClientPeer.open_channel``); its stream id."""
        cid = self.peer.open_channel(trio.current_time(), label, **options)
        self._flush()
        return cid

    async def channel_open(self, channel_id: int) -> None:
        """Return once the channel is open (DCEP ACKed, or the association up)."""
        while channel_id not in self.open_channels:
            if self.peer.closed:
                raise CallFailed(self.failure or "call ended")
            await self._turn.park()

    async def send_message(self, channel_id: int, data: bytes | str, *,
                           high_water: int = HIGH_WATER) -> None:
        """Send one message, first waiting while the channel has more than ``high_water``
        bytes queued (back-pressure from the peer's SACKs and windows)."""
        while self.peer.buffered_amount(channel_id) > high_water:
            await self._turn.park()
        self.send_message_nowait(channel_id, data)

    def send_message_nowait(self, channel_id: int, data: bytes | str) -> None:
        self.peer.send_message(trio.current_time(), channel_id, data)
        self._flush()

    def close_channel(self, channel_id: int) -> None:
        self.peer.close_channel(trio.current_time(), channel_id)
        self._flush()

    async def receive_message(self) -> dc.ChannelMessage:
        assert self._msg_recv is not None
        return await self._msg_recv.receive()

    def _flush(self) -> None:
        # Something may have armed an earlier timer (SCTP T3-rtx for a message just sent):
        # wake the loop so it re-reads poll_timeout.
        if self._wait_scope is not None:
            self._wait_scope.cancel()
        while (out := self.peer.poll_transmit()) is not None:
            try:
                self.sock.sendto(out[0], out[1])
            except (BlockingIOError, OSError):
                pass  # UDP: a full buffer is loss, as on the wire


async def _run_peer(call: Call, connected: trio.Event) -> None:
    """Feed the socket and the clock to the peer until it closes."""
    peer, sock = call.peer, call.sock
    assert call._send is not None
    buf = bytearray(2048)
    stamped = enable_rx_timestamps(sock)
    last = -math.inf
    while not peer.closed:
        deadline = peer.poll_timeout()
        timeout = math.inf if deadline is None else max(0.0, deadline - trio.current_time())
        with trio.move_on_after(timeout) as scope:
            call._wait_scope = scope
            await trio.lowlevel.wait_readable(sock)
        call._wait_scope = None
        now = trio.current_time()
        offset = now - time.time()
        # Drain what is ready before yielding again (one await per datagram is the slow way).
        for data, addr, at in read_ready(sock, buf, now, offset, stamped, last):
            peer.handle_datagram(at, data, addr)
        last = now
        peer.handle_timeout(now)
        while (ev := peer.poll_event()) is not None:
            if isinstance(ev, Connected):
                call.timeline.connected = now - call.started_at
                connected.set()
            elif isinstance(ev, RtpReceived):
                if call.timeline.first_rtp_in is None:
                    call.timeline.first_rtp_in = now - call.started_at
                try:
                    call._send.send_nowait(ev)
                except trio.WouldBlock:
                    pass  # the reader is behind: drop, as a jitter buffer would
            elif isinstance(ev, RtcpReceived):
                if len(call.rtcp) < 1000:
                    call.rtcp.append(ev.data)
            elif isinstance(ev, ChannelEvent):
                _on_channel_event(call, ev.event)
            elif isinstance(ev, Failed):
                call.failure = ev.reason
                connected.set()
        call._flush()
        call._wait_scope = None  # (_flush cancels it; nothing is waiting on it here)
        call._turn.unpark_all()


def _on_channel_event(call: Call, ev: dc.EndpointEvent) -> None:
    if isinstance(ev, dc.ChannelMessage):
        assert call._msg_send is not None
        try:
            call._msg_send.send_nowait(ev)
        except trio.WouldBlock:
            call.messages_dropped += 1
        return
    if isinstance(ev, dc.ChannelOpened):
        call.open_channels.add(ev.channel_id)
    elif isinstance(ev, dc.ChannelClosed):
        call.open_channels.discard(ev.channel_id)
    if not isinstance(ev, dc.ChannelBufferedAmountLow) and len(call.channel_events) < 10000:
        call.channel_events.append(ev)


@asynccontextmanager
async def open_call(
    base_url: str,
    *,
    agent: str | None = None,
    token: str | None = None,
    srtp_profiles: tuple[SrtpProfile, ...] | None = None,
    certificate: Certificate | None = None,
    verify_tls: bool = True,
    connect_timeout: float = 10.0,
    queue: int = 500,
    false_start: bool = False,
    dtls_versions: frozenset[str] = frozenset({"1.2"}),
    audio: bool = True,
    datachannel: bool = False,
    message_queue: int = 100_000,
) -> AsyncIterator[Call]:
    started = trio.current_time()
    cert = certificate or Certificate.generate(trio.current_time())
    peer = ClientPeer(cert, srtp_profiles=srtp_profiles, false_start=false_start,
                      dtls_versions=dtls_versions, audio=audio, datachannel=datachannel)
    headers = {"Content-Type": "application/sdp"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = base_url.rstrip("/") + "/v1/sessions" + (f"?agent={agent}" if agent else "")
    try:
        resp = await request("POST", url, body=peer.offer().encode(), headers=headers,
                             verify_tls=verify_tls)
    except HttpError as exc:
        raise CallFailed(f"signaling unreachable: {exc}") from exc
    if resp.status != 201:
        raise CallFailed(f"POST /v1/sessions → {resp.status}: {resp.body[:300]!r}",
                         retry_after=resp.header("retry-after"),
                         answered_in=None if resp.sent_at is None or resp.answered_at is None
                         else resp.answered_at - resp.sent_at)
    location = resp.header("location") or ""
    session_url = location if location.startswith("http") else base_url.rstrip("/") + location
    answer = resp.body.decode()
    etag = resp.header("etag")
    auth = {"Authorization": f"Bearer {token}"} if token else {}

    async def hang_up() -> None:
        # Every path after the 201 ends here, failures included: a session the server
        # created must not linger until its setup timeout reaps it.
        with trio.move_on_after(2, shield=True):
            try:
                await request("DELETE", session_url, headers=auth, verify_tls=verify_tls)
            except HttpError:
                pass

    try:
        peer.accept_answer(answer, trio.current_time())
    except ProtocolError as exc:
        await hang_up()
        raise CallFailed(f"bad answer: {exc}") from exc
    assert peer.remote is not None
    family = socket.AF_INET6 if ":" in peer.remote[0] else socket.AF_INET
    # A plain non-blocking socket: the loop drains it synchronously after wait_readable.
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.setblocking(False)
    sock.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0)
              if peer.remote[0] in ("127.0.0.1", "::1") else ("", 0))
    send, recv = trio.open_memory_channel[RtpReceived](queue)
    msg_send, msg_recv = trio.open_memory_channel[dc.ChannelMessage](message_queue)
    call = Call(peer, sock, session_url, answer, started, etag=etag, _send=send, _recv=recv,
                _msg_send=msg_send, _msg_recv=msg_recv)
    call.timeline.answer = trio.current_time() - started
    call._flush()
    connected = trio.Event()
    # CallFailed is raised *outside* the nursery: raised inside, trio's strict exception
    # groups would wrap it in an ExceptionGroup and `except CallFailed` would never match.
    failure: str | None = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_run_peer, call, connected)
            with trio.move_on_after(connect_timeout) as scope:
                await connected.wait()
            if scope.cancelled_caught:
                failure = f"no ICE/DTLS connection within {connect_timeout} s"
            elif call.failure is not None:
                failure = call.failure
            if failure is not None:
                nursery.cancel_scope.cancel()
            else:
                try:
                    yield call
                finally:
                    peer.close()
                    call._flush()
                    await hang_up()
                    nursery.cancel_scope.cancel()
    finally:
        sock.close()
    if failure is not None:
        await hang_up()
        raise CallFailed(failure)


__all__ = ["Call", "CallFailed", "RtpPacket", "Timeline", "open_call"]
