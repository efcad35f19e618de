"""Servers for the load generator's tests, each behind a real ``POST /v1/sessions``.

* :func:`serve_http` — a one-request-per-connection HTTP server whose handler maps
  ``(method, path, body)`` to ``(status, headers, body)``;
* :class:`PassthroughEcho` — ICE-lite + DTLS server + SRTP from ``appliance.proto`` on a
  loopback UDP socket, echoing RTP payloads untouched (what a passthrough server does);
* :func:`start_aiortc` — ``bench/aiortc_echo_server.py`` in a child process.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from appliance.proto.dtls import Certificate, DtlsConnection, HandshakeComplete, Role
from appliance.proto.errors import RemoteProtocolError
from appliance.proto.ice import IceLiteAgent
from appliance.proto.mux import Kind, classify
from appliance.proto.rtp import RtpPacket
from appliance.proto.sdp import build_answer, parse_offer_untrusted
from appliance.proto.srtp import SrtpSession

REPO = Path(__file__).resolve().parents[2]
Handler = Callable[[str, str, bytes], Awaitable[tuple[int, dict[str, str], bytes]]]


async def serve_http(handler: Handler, *,
                     task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled; ``task_status.started`` gets the base URL."""

    async def one(stream: trio.SocketStream) -> None:
        async with stream:
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                buf += chunk
            head, _, body = buf.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            while len(body) < length:
                body += await stream.receive_some(65536)
            status, headers, out = await handler(method, target.split("?")[0], body)
            hdrs = {"Content-Length": str(len(out)), "Connection": "close", **headers}
            await stream.send_all(
                f"HTTP/1.1 {status} X\r\n".encode()
                + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()).encode() + b"\r\n" + out)

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, one, listeners)
        task_status.started(f"http://127.0.0.1:{port}")


class PassthroughEcho:
    """Sessions on one UDP socket, found by the client's address once ICE has seen it."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.cert = Certificate.generate(trio.current_time())
        self.pending: list[tuple[IceLiteAgent, DtlsConnection]] = []
        self.by_addr: dict[tuple[str, int], tuple[IceLiteAgent, DtlsConnection, list[SrtpSession]]] = {}
        self.echoed = 0

    def offer(self, body: bytes) -> bytes:
        offer = parse_offer_untrusted(body.decode())
        audio = offer.media[0]
        ufrag, pwd = secrets.token_hex(4), secrets.token_hex(12)
        answer = build_answer(offer, ice_ufrag=ufrag, ice_pwd=pwd,
                              fingerprint=self.cert.fingerprint,
                              candidates=[self.sock.getsockname()], ssrc=4242, cname="echo",
                              session_id=1, prefer_active=False)  # a DTLS server
        ice = IceLiteAgent(ufrag, pwd, audio.ice_ufrag, audio.ice_pwd)
        dtls = DtlsConnection(Role.SERVER, self.cert,
                              remote_fingerprints=[str(f) for f in audio.fingerprints])
        self.pending.append((ice, dtls))
        return answer.text.encode()

    async def serve(self) -> None:
        while True:
            data, addr = await self.sock.recvfrom(2048)
            now = trio.current_time()
            state = self.by_addr.get(addr)
            if state is None and classify(data) is Kind.STUN:
                for ice, dtls in self.pending:  # the ufrag check picks the right one
                    before = ice.checks_ok
                    ice.handle_input(now, data, addr)
                    if ice.checks_ok > before:
                        self.pending.remove((ice, dtls))
                        state = self.by_addr[addr] = (ice, dtls, [])
                        break
                else:
                    continue
            elif state is None:
                continue
            ice, dtls, srtp = state
            kind = classify(data)
            if kind is Kind.STUN:
                ice.handle_input(now, data, addr)
            elif kind is Kind.DTLS:
                dtls.handle_datagram(now, data)
            elif kind is Kind.RTP and srtp:
                try:
                    pkt = RtpPacket.parse_untrusted(srtp[0].unprotect_untrusted(data))
                except RemoteProtocolError:
                    continue
                self.echoed += 1
                await self.sock.sendto(srtp[0].protect(bytes(pkt)), addr)
            while (t := ice.poll_transmit()) is not None:
                await self.sock.sendto(t[0], t[1])
            while (d := dtls.poll_transmit()) is not None:
                await self.sock.sendto(d, addr)
            while (ev := dtls.poll_event()) is not None:
                if isinstance(ev, HandshakeComplete) and ev.srtp_profile is not None:
                    srtp.append(SrtpSession.from_exporter(
                        dtls.export_keying_material, ev.srtp_profile, "server"))


async def serve_passthrough(*, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
                            ) -> None:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sock.bind(("127.0.0.1", 0))
    echo = PassthroughEcho(sock)

    async def handler(method: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if method == "POST":
            return 201, {"Location": "/v1/sessions/1", "Content-Type": "application/sdp"}, \
                echo.offer(body)
        return 204, {}, b""

    with sock:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(echo.serve)
            url = await nursery.start(serve_http, handler)
            task_status.started(url)


@contextmanager
def start_aiortc() -> Iterator[str]:
    """Run the bench aiortc echo server on a free port; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "aiortc_echo_server.py"), "--port", "0"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening "), line
        yield line.split()[1]
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
