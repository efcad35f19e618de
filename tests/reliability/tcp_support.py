"""An ICE-TCP client call for the reliability tests and bench/ice_tcp.py: our ClientPeer
(ICE, DTLS, SRTP) with its datagrams as RFC 4571 frames on one TCP connection to the relay
(RFC 6544: the browser's active side)."""

from __future__ import annotations

import socket as stdsocket
import time

import trio
from reliability.support import Call, Stack

from appliance.client.peer import ClientPeer, Connected, Failed, RtpReceived
from appliance.proto.dtls import Certificate
from appliance.proto.framing import Deframer, encode_frame


class TcpCall(Call):
    """A :class:`Call` whose datagrams travel as RFC 4571 frames on one TCP connection."""

    async def run(self, payload: bytes) -> None:
        peer, sock = self.peer, self.sock
        assert peer.remote is not None
        remote = peer.remote
        deframer = Deframer()
        next_media: float | None = None
        ts = 0
        try:
            while not peer.closed:
                now = trio.current_time()
                deadlines = [d for d in (peer.poll_timeout(), next_media) if d is not None]
                with trio.move_on_at(min(deadlines) if deadlines else now + 0.05):
                    await trio.lowlevel.wait_readable(sock)
                now = trio.current_time()
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    data = None
                if data == b"":
                    self.failed = "relay closed the connection"
                    return
                if data:
                    deframer.handle_input(data)
                    while (frame := deframer.poll_output()) is not None:
                        peer.handle_datagram(now, frame, remote)
                peer.handle_timeout(now)
                if next_media is not None and now >= next_media:
                    if self.sending and not peer.closed:
                        peer.send_rtp(payload, ts)
                        ts += 960
                    next_media = max(next_media + 0.02, now)
                while (ev := peer.poll_event()) is not None:
                    if isinstance(ev, Connected):
                        self.connected.set()
                        next_media = now
                    elif isinstance(ev, RtpReceived):
                        self.rx_times.append(ev.at)
                    elif isinstance(ev, Failed):
                        self.failed = ev.reason
                while (out := peer.poll_transmit()) is not None:
                    sock.sendall(encode_frame(out[0]))  # small frames: never blocks here
                await trio.lowlevel.checkpoint()
        finally:
            sock.close()
            self.done.set()


async def open_tcp_call(nursery: trio.Nursery, stack: Stack, tcp: tuple[str, int], sid: str,
                    payload: bytes) -> TcpCall:
    peer = ClientPeer(Certificate.generate(time.time()))
    resp = await stack.ctl(0, op="create", session_id=sid, offer=peer.offer(), agent=None,
                           candidates=[list(stack.public)], tcp_candidates=[list(tcp)])
    assert resp["ok"], resp
    assert "tcptype passive" in resp["answer"]
    peer.accept_answer(resp["answer"], trio.current_time())
    sock = stdsocket.create_connection(tcp)
    sock.setblocking(False)
    call = TcpCall(sid, 0, peer, sock)
    nursery.start_soon(call.run, payload)
    return call
