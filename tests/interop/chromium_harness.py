"""A minimal media server for the Chromium DTLS interop test: ICE-lite + our DTLS server +
SRTP on one loopback UDP socket, plus a tiny HTTP endpoint for the offer/answer exchange.

This is test scaffolding, not product code, and it bends STYLE.md rule 9 on purpose:
Playwright's sync API runs its own event loop in the test's thread and cannot share it with
trio, so the trio UDP loop runs in a background thread (``trio.run`` inside a
``threading.Thread``) and the HTTP endpoint in another (``http.server``). Both are started
and joined by :meth:`ChromiumHarness.open`, a context manager, so nothing outlives the test.
The HTTP thread reaches into the trio thread only through ``trio.from_thread.run_sync``.

What the UDP loop does (a cut-down transceiver, compare ``MiniServer`` in
``tests/client/test_peer.py``):

* STUN -> :class:`IceLiteAgent`; DTLS is accepted only from an address that has passed an
  authenticated ICE check (the transceiver's rule), and the :class:`DtlsConnection` is made
  on its first record, so the cookie can be bound to that address (RFC 6347 §4.2.1);
* on ``HandshakeComplete``: RFC 5764 §4.2 key export into an :class:`SrtpSession`;
* SRTP from the browser is decrypted, counted, rewritten to the SSRC and payload type our
  answer announced, re-protected and sent back (an echo), so the browser's inbound-rtp
  stats prove it decrypts what we protect;
* every DTLS datagram in either direction is summarised in :attr:`ServerState.dtls_log`
  (content type, epoch, sequence, handshake type), which the test prints on failure.
"""

from __future__ import annotations

import dataclasses
import http.server
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import trio

from appliance.proto.dtls import (
    DEFAULT_CIPHER_SUITES,
    Certificate,
    CipherSuite,
    ConnectionClosed,
    DtlsConnection,
    HandshakeComplete,
    Role,
)
from appliance.proto.dtls.record import is_client_hello
from appliance.proto.ice import IceLiteAgent
from appliance.proto.ice.events import CheckReceived, Nominated
from appliance.proto.mux import Kind, classify
from appliance.proto.rtp import RtpError, RtpPacket
from appliance.proto.sdp import build_answer, parse_offer_untrusted
from appliance.proto.srtp import (
    DEFAULT_SRTP_PROFILES,
    SrtpError,
    SrtpProfile,
    SrtpSession,
)

Addr = tuple[str, int]

ICE_UFRAG = "chromiumtest"
ICE_PWD = "chromiumtestpasswordxyz0"
SERVER_SSRC = 0x5EC0DE01

_CONTENT = {20: "CCS", 21: "alert", 22: "handshake", 23: "appdata"}
_HANDSHAKE = {
    1: "ClientHello",
    2: "ServerHello",
    3: "HelloVerifyRequest",
    11: "Certificate",
    12: "ServerKeyExchange",
    13: "CertificateRequest",
    14: "ServerHelloDone",
    15: "CertificateVerify",
    16: "ClientKeyExchange",
    20: "Finished",
}


def describe_dtls(data: bytes) -> str:
    """One line per datagram: the DTLS record headers in it (RFC 6347 §4.1), and for
    plaintext handshake records the message type and fragment range (§4.2.2)."""
    parts = []
    pos = 0
    while pos + 13 <= len(data):
        ctype, _ver, epoch, seq_hi, seq_lo, length = struct.unpack_from("!BHHHIH", data, pos)
        seq = seq_hi << 32 | seq_lo
        what = _CONTENT.get(ctype, str(ctype))
        body = data[pos + 13 : pos + 13 + length]
        if ctype == 22 and epoch == 0 and len(body) >= 12:
            msg_type = body[0]
            total = int.from_bytes(body[1:4], "big")
            frag_off = int.from_bytes(body[6:9], "big")
            frag_len = int.from_bytes(body[9:12], "big")
            what = f"{_HANDSHAKE.get(msg_type, msg_type)}[{frag_off}+{frag_len}/{total}]"
        elif ctype == 21 and epoch == 0 and len(body) == 2:
            what = f"alert(level={body[0]}, desc={body[1]})"
        parts.append(f"e{epoch}/s{seq} {what} ({length}B)")
        pos += 13 + length
    return "; ".join(parts) if parts else f"<{len(data)} unparsed bytes>"


@dataclasses.dataclass
class ServerState:
    """What the server saw; written by the trio thread, read by the test under ``cond``."""

    udp_port: int = 0
    offer: str = ""
    answer: str = ""
    opus_pt: int = 0
    checked_addrs: list[Addr] = dataclasses.field(default_factory=list)
    nominated: Addr | None = None
    dtls_peer: Addr | None = None
    complete: HandshakeComplete | None = None
    closed: ConnectionClosed | None = None
    hello_verify_requests: int = 0
    rtp_decrypted: int = 0
    rtp_echoed: int = 0
    rtcp_decrypted: int = 0
    srtp_errors: int = 0
    dtls_log: list[str] = dataclasses.field(default_factory=list)
    error: BaseException | None = None

    @property
    def client_hellos(self) -> int:
        """ClientHellos received (first fragments only, retransmissions included)."""
        return sum(line.startswith("<- ") and "ClientHello[0+" in line for line in self.dtls_log)

    def log_text(self) -> str:
        return "\n".join(self.dtls_log)


class ChromiumHarness:
    """ICE-lite + DTLS server + SRTP echo on ``127.0.0.1:<udp_port>``; HTTP on ``http_url``.

    ``srtp_profiles`` and ``cipher_suites`` force the server's preference (the DTLS server
    picks the first of its own list the client offers); ``cookies`` turns on stateless
    HelloVerifyRequest cookies bound to the client's address; ``dtls_versions`` the versions
    the server negotiates (``cipher_suites`` then restricts the 1.2 suites only).
    """

    def __init__(
        self,
        page_html: str,
        *,
        srtp_profiles: Sequence[SrtpProfile] = DEFAULT_SRTP_PROFILES,
        cipher_suites: Sequence[CipherSuite] = DEFAULT_CIPHER_SUITES,
        cookies: bool = False,
        dtls_versions: frozenset[str] = frozenset({"1.2"}),
    ) -> None:
        self._dtls_versions = frozenset(dtls_versions)
        self._page_html = page_html.encode()
        self._srtp_profiles = tuple(srtp_profiles)
        self._cipher_suites = tuple(cipher_suites)
        self._cookie_secret = b"chromium-interop-cookie-secret!!" if cookies else None
        self.certificate = Certificate.generate(time.time())
        self.state = ServerState()
        self.cond = threading.Condition()
        self.http_url = ""
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel: trio.CancelScope | None = None
        self._ready = threading.Event()
        # Owned by the trio thread only.
        self._ice: IceLiteAgent | None = None
        self._remote_fingerprints: list[str] = []
        self._dtls: DtlsConnection | None = None
        self._srtp: SrtpSession | None = None
        self._out: list[tuple[bytes, Addr]] = []

    # --- lifetime -----------------------------------------------------------------------

    @classmethod
    @contextmanager
    def open(cls, page_html: str, **kwargs: Any) -> Iterator[ChromiumHarness]:
        harness = cls(page_html, **kwargs)
        udp = threading.Thread(target=harness._run_trio, name="chromium-harness-udp")
        udp.start()
        http_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(harness))
        web = threading.Thread(target=http_server.serve_forever, name="chromium-harness-http")
        web.start()
        try:
            if not harness._ready.wait(10):
                raise RuntimeError("trio harness did not start")
            if harness.state.error is not None:
                raise harness.state.error
            harness.http_url = f"http://127.0.0.1:{http_server.server_address[1]}/"
            yield harness
        finally:
            http_server.shutdown()
            http_server.server_close()
            web.join(10)
            if harness._token is not None and harness._cancel is not None:
                try:
                    trio.from_thread.run_sync(harness._cancel.cancel, trio_token=harness._token)
                except trio.RunFinishedError:
                    pass
            udp.join(10)
        if harness.state.error is not None:
            raise AssertionError("harness thread failed") from harness.state.error

    def wait_until(self, predicate: Callable[[ServerState], bool], timeout: float) -> bool:
        """Block the test thread until ``predicate(state)`` holds or ``timeout`` passes."""
        with self.cond:
            return (
                self.cond.wait_for(
                    lambda: predicate(self.state) or self.state.error is not None, timeout
                )
                and self.state.error is None
            )

    # --- the trio thread ----------------------------------------------------------------

    def _run_trio(self) -> None:
        try:
            trio.run(self._serve_udp)
        except BaseException as exc:  # reported by open() in the test thread
            self.state.error = exc
        finally:
            self._ready.set()
            with self.cond:
                self.cond.notify_all()

    async def _serve_udp(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        with (
            trio.CancelScope() as self._cancel,
            trio.socket.socket(type=trio.socket.SOCK_DGRAM) as sock,
        ):
            await sock.bind(("127.0.0.1", 0))
            self.state.udp_port = sock.getsockname()[1]
            self._ready.set()
            while True:
                deadline = self._next_deadline()
                with trio.move_on_at(deadline):
                    data, addr = await sock.recvfrom(65536)
                    self._handle(trio.current_time(), data, (addr[0], addr[1]))
                self._handle_timeouts(trio.current_time())
                for datagram, to in self._out:
                    await sock.sendto(datagram, to)
                self._out.clear()
                with self.cond:
                    self.cond.notify_all()

    def _next_deadline(self) -> float:
        deadlines = [
            t
            for t in (
                self._dtls.poll_timeout() if self._dtls else None,
                self._ice.poll_timeout() if self._ice else None,
            )
            if t is not None
        ]
        return min(deadlines, default=float("inf"))

    def _handle_timeouts(self, now: float) -> None:
        if self._ice is not None:
            self._ice.handle_timeout(now)
        if self._dtls is not None:
            self._dtls.handle_timeout(now)
        self._pump()

    def _accept_offer(self, offer_text: str) -> str:
        """Runs in the trio thread (via ``trio.from_thread``): parse, answer, arm ICE."""
        offer = parse_offer_untrusted(offer_text)
        answer = build_answer(
            offer,
            ice_ufrag=ICE_UFRAG,
            ice_pwd=ICE_PWD,
            fingerprint=self.certificate.fingerprint,
            candidates=[("127.0.0.1", self.state.udp_port)],
            ssrc=SERVER_SSRC,
            cname="appliance-interop",
            session_id=1,
            prefer_active=False,  # this harness is our DTLS *server* under test
        )
        audio = answer.transport.section
        self._remote_fingerprints = [str(f) for f in audio.fingerprints]
        self._ice = IceLiteAgent(ICE_UFRAG, ICE_PWD, audio.ice_ufrag, audio.ice_pwd)
        with self.cond:
            self.state.offer = offer_text
            self.state.answer = answer.text
            self.state.opus_pt = answer.opus_pt or 0  # audio is always offered here
        return answer.text

    def _handle(self, now: float, data: bytes, addr: Addr) -> None:
        kind = classify(data)
        if kind is Kind.STUN and self._ice is not None:
            self._ice.handle_datagram(now, data, addr)
        elif kind is Kind.DTLS and addr in self.state.checked_addrs:
            # As the transceiver does (transceiver/call.py): DTLS is accepted from any
            # address whose check succeeded, not only the first. Chromium may begin the
            # handshake on one pair and nominate another (on a host with a second
            # interface it checks from both), and its later flights come from the new one.
            self.state.dtls_log.append(f"<- {addr[0]} {describe_dtls(data)}")
            if self._dtls is None:
                self._dtls = self._new_dtls()
            if self.state.nominated is None:
                self.state.dtls_peer = addr  # until nomination, answer where it came from
            if self._cookie_secret is not None and self._dtls.awaiting_client_hello \
                    and is_client_hello(data):
                # RFC 6347 §4.2.1: the cookie binds the address this ClientHello came from.
                self._dtls.require_cookies(self._cookie_secret,
                                           f"{addr[0]}:{addr[1]}".encode())
            self._dtls.handle_datagram(now, data)
        elif kind is Kind.RTP and self._srtp is not None:
            self._echo_rtp(data, addr)
        elif kind is Kind.RTCP and self._srtp is not None:
            try:
                self._srtp.unprotect_rtcp_untrusted(data)
                self.state.rtcp_decrypted += 1
            except SrtpError:
                self.state.srtp_errors += 1
        self._pump()

    def _new_dtls(self) -> DtlsConnection:
        return DtlsConnection(
            Role.SERVER,
            self.certificate,
            remote_fingerprints=self._remote_fingerprints,
            srtp_profiles=self._srtp_profiles,
            cipher_suites=self._cipher_suites,
            cookie_secret=self._cookie_secret,
            # Chromium retransmits from ~60 ms on; a 1 s first timer only slows lossy runs.
            initial_retransmit=0.1,
            versions=self._dtls_versions,
        )

    def _echo_rtp(self, data: bytes, addr: Addr) -> None:
        assert self._srtp is not None
        try:
            pkt = RtpPacket.parse_untrusted(self._srtp.unprotect_untrusted(data))
        except (SrtpError, RtpError):
            self.state.srtp_errors += 1
            return
        self.state.rtp_decrypted += 1
        # Our answer announced SERVER_SSRC; the browser's receiver is keyed on it.
        echo = dataclasses.replace(pkt, ssrc=SERVER_SSRC, payload_type=self.state.opus_pt)
        self._out.append((self._srtp.protect(bytes(echo)), self.state.nominated or addr))
        self.state.rtp_echoed += 1

    def _pump(self) -> None:
        ice, dtls = self._ice, self._dtls
        if ice is not None:
            while (t := ice.poll_transmit()) is not None:
                self._out.append(t)
            while (ice_ev := ice.poll_event()) is not None:
                if isinstance(ice_ev, CheckReceived):
                    if ice_ev.addr not in self.state.checked_addrs:
                        self.state.checked_addrs.append(ice_ev.addr)
                elif isinstance(ice_ev, Nominated):
                    # The transceiver's media_flow: DTLS and SRTP go to the nominated pair.
                    self.state.nominated = self.state.dtls_peer = ice_ev.addr
        if dtls is None or self.state.dtls_peer is None:
            return
        while (d := dtls.poll_transmit()) is not None:
            self.state.dtls_log.append(f"-> {self.state.dtls_peer[0]} {describe_dtls(d)}")
            if d[13:14] == b"\x03" and d[0] == 22:
                self.state.hello_verify_requests += 1
            self._out.append((d, self.state.dtls_peer))
        while (ev := dtls.poll_event()) is not None:
            if isinstance(ev, HandshakeComplete):
                assert ev.srtp_profile is not None
                self._srtp = SrtpSession.from_exporter(
                    dtls.export_keying_material, ev.srtp_profile, "server")
                self.state.complete = ev
            elif isinstance(ev, ConnectionClosed):
                self.state.closed = ev


def _handler_for(harness: ChromiumHarness) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._reply(200, "text/html; charset=utf-8", harness._page_html)

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/offer" or harness._token is None:
                self._reply(404, "text/plain", b"not found")
                return
            offer = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
            try:
                answer = trio.from_thread.run_sync(
                    harness._accept_offer, offer, trio_token=harness._token
                )
            except Exception as exc:  # the page shows it; the test fails on the state
                self._reply(500, "text/plain", repr(exc).encode())
                return
            self._reply(200, "application/sdp", answer.encode())

        def _reply(self, status: int, ctype: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            # No keep-alive: a handler thread parked on an idle connection would outlive
            # the harness (ThreadingHTTPServer does not join daemon handler threads).
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # keep pytest output clean

    return Handler
