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
are terminated here: the handshake with the standard library's ``ssl`` over memory BIOs
(:class:`TlsSession`), the records after it by our own layer
(:mod:`appliance.proto.dtls.tlsrecord`, keys from OpenSSL's key log: :class:`TlsServer`),
whose state a successor can take over after a worker kill or a roll (:class:`TlsLink`,
relay/keeper.py). The relay's shell keeps the socket and its non-blocking,
back-pressured writes: what TLS decrypts is the TURN-over-TCP stream (STUN messages and
ChannelData back to back, RFC 8656 §12.5) and goes through the same TURN path as TURN/TCP.
TLS 1.2 and 1.3 (RFC 8656 §3.1: TLS 1.2 or later; 1.2 with the AEAD suites only — ECDHE or
DHE with AES-GCM or ChaCha20-Poly1305, what our record layer speaks); ALPN ``stun.turn`` is
selected when offered. The certificate is the operator's (``--tls-cert/--tls-key``) or signaling's
self-signed one.
"""

from __future__ import annotations

import enum
import os
import ssl
from dataclasses import dataclass

from ..proto.dtls.tlspeek import HelloPeek
from ..proto.dtls.tlsrecord import (
    TLS12,
    TLS12_CIPHERS,
    KeyLog,
    RecordLayer,
    server_random_untrusted,
    session_keys,
)
from ..proto.turn import StreamFramer
from .board import NOT_RESUMABLE, PARTIAL, Board, ReadState

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
        # No session tickets: a TURN connection is long-lived and resumption buys nothing;
        # and no records of OpenSSL's after the handshake (a TLS 1.3 ticket would be one),
        # nor renegotiation: from then on the records are ours (TlsServer).
        ctx.options |= ssl.OP_NO_TICKET | ssl.OP_NO_RENEGOTIATION
        ctx.num_tickets = 0
        # TLS 1.2: the AEAD suites our record layer speaks (TLS 1.3's three all are).
        ctx.set_ciphers(TLS12_CIPHERS)
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


class TlsServer:
    """A listener's TURN/TLS server side: the context, and OpenSSL's key log read back (a
    memfd the context appends to) so that each finished handshake's keys are known and its
    records can be done by :class:`~appliance.proto.dtls.tlsrecord.RecordLayer` from then
    on — whose state, unlike OpenSSL's, a successor can take over (tcp.py, keeper.py).
    The key log is memory of this process, like OpenSSL's own; it is never written to disk
    or logged, and it is emptied as it is read."""

    def __init__(self, tls: TurnTls) -> None:
        self.context = tls.context()
        self._fd = os.memfd_create("appliance-turn-tls-keylog")  # close-on-exec
        try:
            self.context.keylog_filename = f"/proc/self/fd/{self._fd}"
        except BaseException:
            os.close(self._fd)
            raise
        # Entries live from a hello's ServerHello to its take-over or end (:meth:`done`):
        # at most one per connection in a handshake; the bound is a backstop.
        self.log = KeyLog(limit=65536)
        self._off = 0
        #: the client randoms of the handshakes under way: the key log names a connection
        #: by it, so a second hello with the same random (a replay, or an attacker copying
        #: one off the wire) is refused while the first is in its handshake
        self.inflight: set[bytes] = set()

    def session(self, hello: HelloPeek) -> TlsSession | None:
        """The handshake of a connection with this hello; None: its random is already in
        a handshake here (or missing). Call :meth:`done` when it ends, taken over or not."""
        if len(hello.random) != 32 or hello.random in self.inflight:
            return None
        self.inflight.add(hello.random)
        return TlsSession(self, hello.random)

    def done(self, session: TlsSession) -> None:
        """A handshake ended (taken over, failed, or its connection gone): its key log
        entries go, whatever is left of them."""
        self.inflight.discard(session.random)
        self.keys(session.random)

    def keys(self, client_random: bytes) -> dict[str, bytes]:
        """The key log's lines for the hello with this random (taken: read once)."""
        while True:
            data = os.pread(self._fd, 1 << 16, self._off)
            if not data:
                break
            self._off += len(data)
            self.log.feed(data)
        if self._off > 1 << 20:  # read whole (OpenSSL writes only inside our handshakes)
            os.ftruncate(self._fd, 0)
            self._off = 0
        return self.log.take(client_random)

    def close(self) -> None:
        os.close(self._fd)


class TlsSession:
    """One TURN/TLS connection's handshake, by OpenSSL over memory BIOs; then
    :meth:`take_over` hands its records to our own record layer."""

    __slots__ = ("_first", "_server", "established", "incoming", "obj", "outgoing", "random")

    def __init__(self, server: TlsServer, client_random: bytes) -> None:
        self._server = server
        self.random = client_random
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = server.context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.established = False
        self._first = b""  # the start of our first flight: TLS 1.2's ServerHello random

    def receive(self, data: bytes | memoryview) -> None:
        """Feed ciphertext of the handshake. Raises :class:`ssl.SSLError` when the peer broke
        TLS; :meth:`pending` then holds any alert to send."""
        if data:
            self.incoming.write(data)
        if not self.established:
            try:
                self.obj.do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            self.established = True

    def pending(self) -> bytes:
        """Ciphertext TLS wants sent now (handshake flights, alerts)."""
        out = self.outgoing.read()
        if out and not self._first:
            self._first = out[:64]
        return out

    def take_over(self) -> tuple[RecordLayer, bytes] | None:
        """Once established (and :meth:`pending` sent): the record layer that carries on
        the connection, and any ciphertext OpenSSL was given but did not read (records
        after the handshake's last). None: the keys are not in the key log, or the suite
        is not one the layer speaks (the context allows only those)."""
        version = self.obj.version() or ""
        cipher = self.obj.cipher()
        keys = session_keys(self._server.keys(self.random), version,
                            cipher[0] if cipher else "", self.random,
                            server_random_untrusted(self._first))
        if keys is None:
            return None
        # TLS 1.2: each side's Finished was its first record under these keys (seq 0);
        # TLS 1.3: the application keys start at 0 (no tickets are sent: num_tickets = 0).
        first = 1 if keys.version == TLS12 else 0
        leftover = self.incoming.read()
        self.obj = None  # type: ignore[assignment]  # OpenSSL's part is over
        return RecordLayer(keys, 0, first, 0, first), leftover


class TlsLink:
    """A TURN/TLS connection's records in the relay's shell (tcp.py): its
    :class:`~appliance.proto.dtls.tlsrecord.RecordLayer`, the framer of the TURN stream
    inside, and — when the connection is kept — its read state on the worker's board
    (relay/board.py "Reads"), published before each take of whole records out of the
    socket: the state before the take and after it, each with the part of a TURN message
    it leaves half read. (Its write state travels with the bytes it is in: board.py's
    :class:`~.board.Outgoing`.)"""

    __slots__ = ("board", "framer", "layer", "rcommit", "roff", "slot")

    def __init__(self, layer: RecordLayer, framer: StreamFramer, read: int) -> None:
        self.layer = layer
        self.framer = framer
        #: the stream offset of the bytes taken out of the socket so far
        self.roff = read
        self.rcommit: ReadState = (layer.rgen, layer.rseq, read, framer.held)
        self.board: Board | None = None
        self.slot = -1

    def attach(self, board: Board, slot: int) -> None:
        """Publish the read state on ``board`` from now on (the connection's slot)."""
        self.board, self.slot = board, slot
        self.rcommit = (self.layer.rgen, self.layer.rseq, self.roff, self.framer.held)
        if len(self.rcommit[3]) > PARTIAL:  # (a framer allowed longer messages than ours)
            self.rcommit = (0, 0, NOT_RESUMABLE, b"")
        board.write_read(slot, self.rcommit, self.rcommit)

    def detach(self) -> None:
        self.board, self.slot = None, -1

    def taking(self, n: int) -> None:
        """About to take ``n`` bytes of whole records (opened, their messages handed on)."""
        if self.board is not None:
            held = self.framer.held
            pending = self.rcommit
            if len(held) <= PARTIAL:
                pending = (self.layer.rgen, self.layer.rseq, self.roff + n, held)
            self.board.write_read(self.slot, self.rcommit, pending)

    def took(self, n: int) -> None:
        """Taken. Not published: the board's pending state (from :meth:`taking`) is the one
        now, and the next :meth:`taking` makes it the committed one."""
        self.roff += n
        if self.board is not None:
            held = self.framer.held
            self.rcommit = (self.layer.rgen, self.layer.rseq, self.roff, held) \
                if len(held) <= PARTIAL else (0, 0, NOT_RESUMABLE, b"")
