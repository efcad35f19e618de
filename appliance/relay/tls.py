"""TURN over TLS on the media port's TCP listener, and the split that finds it (issue 40
items 1 and 4; RFC 8656 §3.1, RFC 7443 ALPN ``stun.turn``).

A TLS connection reaching the media port is either a browser's (or curl's) HTTPS to
signaling or a TURN client's ``turns:``. The listener reads the ClientHello without
terminating TLS (:func:`~appliance.proto.dtls.tlspeek.peek_client_hello_untrusted`) and
:func:`route` decides, in this order:

1. ALPN offers ``stun.turn`` → TURN;
2. SNI is one of the TURN names (``--turn-tls-name``) → TURN;
3. ALPN offers ``h2`` or ``http/1.1``, or SNI is one of the HTTPS names → HTTPS;
4. no ALPN at all → TURN when TURN/TLS is on (Chromium's and coturn's ``turns:`` clients
   send no ALPN; every browser and curl send ``h2``/``http/1.1`` for HTTPS), else HTTPS;
5. ALPN offering only protocols we do not speak → closed and counted (``tcp-tls-alpn``).

HTTPS connections are spliced, bytes as they are, to signaling (tcp.py); TURN connections
are terminated here with the standard library's ``ssl`` over memory BIOs
(:class:`TlsSession`), so the relay's shell keeps the socket and its non-blocking,
back-pressured writes: what TLS decrypts is the TURN-over-TCP stream (STUN messages and
ChannelData back to back, RFC 8656 §12.5) and goes through the same TURN path as TURN/TCP.
TLS 1.2 and 1.3 (RFC 8656 §3.1: TLS 1.2 or later); ALPN ``stun.turn`` is selected when
offered. The certificate is the operator's (``--tls-cert/--tls-key``) or signaling's
self-signed one.
"""

from __future__ import annotations

import enum
import ssl
from dataclasses import dataclass

from ..proto.dtls.tlspeek import HelloPeek

#: RFC 7443 §3: the ALPN protocol ID of TURN (and STUN) over (D)TLS.
STUN_TURN = b"stun.turn"
HTTP_ALPN = frozenset({b"h2", b"http/1.1"})


class Route(enum.Enum):
    TURN = "turn"
    HTTPS = "https"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class TurnTls:
    """``--turn-tls-*``: the certificate TURN/TLS presents and the names that pick it."""

    cert: str
    key: str
    #: SNI host names that mean TURN (``--turn-tls-name``), lower case
    names: tuple[str, ...] = ()
    #: SNI host names that mean HTTPS signaling (``--tls-host``), lower case
    https_names: tuple[str, ...] = ()

    def context(self) -> ssl.SSLContext:
        """A server context: TLS 1.2 or 1.3, ALPN ``stun.turn``, the operator's chain."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        ctx.set_alpn_protocols([STUN_TURN.decode()])
        # No session tickets: a TURN connection is long-lived and resumption buys nothing.
        ctx.options |= ssl.OP_NO_TICKET
        return ctx


def route(peek: HelloPeek, tls: TurnTls | None, https: bool) -> Route:
    """Where a TLS connection with this ClientHello goes (module docstring's order)."""
    name = peek.server_name
    alpn = peek.alpn
    if tls is not None:
        if STUN_TURN in alpn or (name is not None and name in tls.names):
            return Route.TURN
    if https and (HTTP_ALPN.intersection(alpn)
                  or (tls is not None and name is not None and name in tls.https_names)):
        return Route.HTTPS
    if not alpn:
        if tls is not None:
            return Route.TURN
        if https:
            return Route.HTTPS
    return Route.REFUSE


class TlsSession:
    """One TURN/TLS connection's TLS state: ciphertext in, plaintext out, and back."""

    __slots__ = ("established", "incoming", "obj", "outgoing")

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.established = False

    def receive(self, data: bytes | memoryview) -> bytes:
        """Feed ciphertext; returns the plaintext it completes (may be empty). The handshake
        runs here too. Raises :class:`ssl.SSLError` when the peer broke TLS;
        :meth:`pending` then holds any alert to send."""
        if data:
            self.incoming.write(data)
        if not self.established:
            try:
                self.obj.do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return b""
            self.established = True
        out = bytearray()
        while True:
            try:
                chunk = self.obj.read(65536)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except ssl.SSLZeroReturnError:
                break  # close_notify: the reader sees EOF next
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def send(self, plaintext: bytes | memoryview) -> bytes:
        """Encrypt; returns the records to write (with anything the handshake left)."""
        self.obj.write(plaintext)
        return self.outgoing.read()

    def pending(self) -> bytes:
        """Ciphertext TLS wants sent now (handshake flights, alerts, tickets)."""
        return self.outgoing.read()
