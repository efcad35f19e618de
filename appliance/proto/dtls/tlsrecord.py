"""TLS 1.2 and 1.3 records over TCP once OpenSSL has done the handshake (issue 40 item 2).

The relay terminates TURN over TLS with the standard library's ``ssl`` for the handshake
only; from the first application record on, the connection's records are protected and
checked here, with the session's keys read from OpenSSL's key log (relay/tls.py). Why: the
state a TLS connection needs to go on — its keys, and the read and write **sequence
numbers** — then lives in plain values the relay can hand to the keeper in its fork
template and to a successor (relay/keeper.py, relay/board.py), so a TURN/TLS connection
outlives a SIGKILL of the worker that terminated it, as TURN/TCP does. OpenSSL's state
cannot be carried out of a process (and kTLS, which would hold it in the socket, is not in
every kernel).

What this speaks, sans-IO (records in, plaintext out; plaintext in, records out):

* TLS 1.3 (RFC 8446 §5.2-5.4): AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305; nonce = iv XOR
  the 64-bit sequence number; additional data = the record header; the inner content type
  after the plaintext, zero padding stripped. Post-handshake, a client may send only
  KeyUpdate (§4.6.3: the read key moves to the next generation; ``update_requested`` is
  answered with ours, and our write key moves) and alerts; anything else is an error.
* TLS 1.2 (RFC 5246 §6.2.3.3) with the AEAD suites the relay's context allows (RFC 5288
  AES-GCM: 4-byte salt, 8-byte explicit nonce; RFC 7905 ChaCha20-Poly1305: iv XOR seq);
  additional data = seq ‖ type ‖ version ‖ length. Renegotiation is refused (the context
  forbids it too).
* ``close_notify`` ends the stream (:attr:`RecordLayer.closed`); any other alert from the
  peer, a record that does not authenticate or does not parse raises :class:`DtlsError`
  (its ``hint`` is the alert to send back, :meth:`RecordLayer.alert`).

The keys (:class:`SessionKeys`) are the *first* generation's; a connection's state is
those and four integers (read generation, read sequence, write generation, write sequence),
so a successor re-derives the current keys from them (:meth:`RecordLayer.state`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from ._wire import AlertDescription, DtlsError
from .crypto import RecordCipher, SuiteParams, prf
from .keyschedule13 import expand_label

TLS12 = 0x0303
TLS13 = 0x0304
CHANGE_CIPHER_SPEC = 20
ALERT = 21
HANDSHAKE = 22
APPLICATION_DATA = 23
KEY_UPDATE = 24
#: RFC 8446 §5.1: a record's plaintext is at most 2^14 bytes
MAX_PLAINTEXT = 1 << 14
#: RFC 5246 §6.2.3: a TLS 1.2 ciphertext fragment is at most 2^14 + 2048 bytes (TLS 1.3's
#: bound, 2^14 + 256, is smaller: checked per version)
MAX_FRAGMENT = MAX_PLAINTEXT + 2048
HEADER = 5
TAG = 16
LABEL13 = b"tls13 "
_SEQ_LIMIT = 1 << 48  # TLS 1.2 records go through the DTLS cipher (epoch 0 ‖ 48-bit seq)


@dataclass(frozen=True, slots=True)
class _Suite:
    version: int
    hash_name: str
    key_len: int
    chacha: bool

    @property
    def hash_len(self) -> int:
        return 48 if self.hash_name == "sha384" else 32

    @property
    def params12(self) -> SuiteParams:
        return SuiteParams(self.hash_name, self.key_len, 12 if self.chacha else 4,
                           0 if self.chacha else 8, self.chacha)


#: The suites a connection may have, by the names OpenSSL gives them (``SSLObject.cipher``).
SUITES: dict[str, _Suite] = {
    "TLS_AES_128_GCM_SHA256": _Suite(TLS13, "sha256", 16, False),
    "TLS_AES_256_GCM_SHA384": _Suite(TLS13, "sha384", 32, False),
    "TLS_CHACHA20_POLY1305_SHA256": _Suite(TLS13, "sha256", 32, True),
}
for _kx in ("ECDHE-ECDSA", "ECDHE-RSA", "DHE-RSA"):
    SUITES[f"{_kx}-AES128-GCM-SHA256"] = _Suite(TLS12, "sha256", 16, False)
    SUITES[f"{_kx}-AES256-GCM-SHA384"] = _Suite(TLS12, "sha384", 32, False)
    SUITES[f"{_kx}-CHACHA20-POLY1305"] = _Suite(TLS12, "sha256", 32, True)
#: The TLS 1.2 cipher string that allows exactly the TLS 1.2 suites above (OpenSSL syntax).
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20:!aNULL"


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """What protects a connection's records: its version, suite and the first generation's
    keys of each direction, as the server sees them (read = the client's).

    TLS 1.3: the application traffic secrets (``CLIENT_TRAFFIC_SECRET_0``/``SERVER_…``);
    TLS 1.2: the write key ‖ fixed IV of each side from the key block. Secrets: never
    logged (``repr`` hides them)."""

    suite: str
    read: bytes
    write: bytes

    def __repr__(self) -> str:
        return f"SessionKeys({self.suite}, <secret>)"

    @property
    def version(self) -> int:
        return SUITES[self.suite].version

    def to_record(self) -> dict[str, Any]:
        return {"s": self.suite, "r": self.read.hex(), "w": self.write.hex()}

    @classmethod
    def from_record_untrusted(cls, obj: object) -> SessionKeys:
        """Raises only :class:`DtlsError`."""
        if not isinstance(obj, dict):
            raise DtlsError("TLS keys: not an object")
        suite = obj.get("s")
        read, write = obj.get("r"), obj.get("w")
        if not isinstance(suite, str) or suite not in SUITES:
            raise DtlsError("TLS keys: unknown suite")
        if not isinstance(read, str) or not isinstance(write, str) or len(read) > 256 \
                or len(write) > 256:
            raise DtlsError("TLS keys: not hex")
        try:
            keys = cls(suite, bytes.fromhex(read), bytes.fromhex(write))
        except ValueError:
            raise DtlsError("TLS keys: not hex") from None
        if len(keys.read) != keys.key_size or len(keys.write) != keys.key_size:
            raise DtlsError("TLS keys: wrong length")
        return keys

    @property
    def key_size(self) -> int:
        s = SUITES[self.suite]
        if s.version == TLS13:
            return s.hash_len
        return s.key_len + s.params12.fixed_iv_len


def keys12(suite: str, master: bytes, client_random: bytes, server_random: bytes) -> SessionKeys:
    """RFC 5246 §6.3: the key block of a TLS 1.2 session, as :class:`SessionKeys`."""
    s = SUITES[suite]
    p = s.params12
    k, i = p.key_len, p.fixed_iv_len
    block = prf(p.hash_name, master, b"key expansion", server_random + client_random,
                2 * k + 2 * i)
    return SessionKeys(suite, block[:k] + block[2 * k : 2 * k + i],
                       block[k : 2 * k] + block[2 * k + i : 2 * k + 2 * i])


def record_spans_untrusted(data: bytes | bytearray | memoryview
                           ) -> tuple[list[tuple[int, int]], int, int]:
    """The whole records at the start of ``data``: ``(spans, end, want)`` — each span is
    (offset, length) of one record with its header, ``end`` where the last whole one ends,
    ``want`` the bytes the next one needs in all (0: its header is not in yet). Raises only
    :class:`DtlsError` (a length past the TLS bound)."""
    spans: list[tuple[int, int]] = []
    off = 0
    n = len(data)
    while n - off >= HEADER:
        length = (data[off + 3] << 8) | data[off + 4]
        if length > MAX_FRAGMENT:
            raise DtlsError(f"TLS record length {length}", hint=AlertDescription.record_overflow)
        if n - off < HEADER + length:
            return spans, off, HEADER + length
        spans.append((off, HEADER + length))
        off += HEADER + length
    return spans, off, 0


class _Protect13:
    __slots__ = ("aead", "iv")

    def __init__(self, s: _Suite, secret: bytes) -> None:
        key = expand_label(s.hash_name, secret, b"key", b"", s.key_len, prefix=LABEL13)
        self.iv = int.from_bytes(expand_label(s.hash_name, secret, b"iv", b"", 12,
                                              prefix=LABEL13), "big")
        self.aead: AESGCM | ChaCha20Poly1305 = ChaCha20Poly1305(key) if s.chacha \
            else AESGCM(key)

    def nonce(self, seq: int) -> bytes:
        return (self.iv ^ seq).to_bytes(12, "big")


def _next13(s: _Suite, secret: bytes) -> bytes:
    """RFC 8446 §7.2: application_traffic_secret_N+1."""
    return expand_label(s.hash_name, secret, b"traffic upd", b"", s.hash_len, prefix=LABEL13)


class RecordLayer:
    """One connection's records after the handshake (module docstring)."""

    __slots__ = ("_hs", "_out", "_r13", "_r12", "_rsecret", "_suite", "_w12", "_w13",
                 "_wsecret", "closed", "keys", "rgen", "rseq", "wgen", "wseq")

    def __init__(self, keys: SessionKeys, rgen: int = 0, rseq: int = 0, wgen: int = 0,
                 wseq: int = 0) -> None:
        if min(rgen, rseq, wgen, wseq) < 0 or max(rseq, wseq) >= 1 << 64:
            # a damaged hand-over record: refused here, not as an OverflowError from the
            # nonce at the first open() (which promises DtlsError only)
            raise DtlsError("TLS record state out of range")
        self.keys = keys
        self._suite = s = SUITES[keys.suite]
        self.rgen, self.rseq, self.wgen, self.wseq = rgen, rseq, wgen, wseq
        #: the peer sent close_notify: nothing more will be read
        self.closed = False
        self._hs = bytearray()  # a TLS 1.3 post-handshake message split over records
        self._out = bytearray()  # records of our own to send (a KeyUpdate answer)
        self._r13: _Protect13 | None = None
        self._w13: _Protect13 | None = None
        self._r12: RecordCipher | None = None
        self._w12: RecordCipher | None = None
        self._rsecret = self._wsecret = b""
        if s.version == TLS13:
            if rgen > 64 or wgen > 64:  # a client updating that often is not a TURN client
                raise DtlsError("TLS 1.3 key generation out of range")
            self._rsecret, self._wsecret = keys.read, keys.write
            for _ in range(rgen):
                self._rsecret = _next13(s, self._rsecret)
            for _ in range(wgen):
                self._wsecret = _next13(s, self._wsecret)
            self._r13 = _Protect13(s, self._rsecret)
            self._w13 = _Protect13(s, self._wsecret)
        else:
            if rgen or wgen:
                raise DtlsError("TLS 1.2 has no key generations")
            p = s.params12
            k = p.key_len
            self._r12 = RecordCipher(p, keys.read[:k], keys.read[k:])
            self._w12 = RecordCipher(p, keys.write[:k], keys.write[k:])

    @property
    def state(self) -> tuple[int, int, int, int]:
        """(read generation, read sequence, write generation, write sequence)."""
        return self.rgen, self.rseq, self.wgen, self.wseq

    # -- reading ------------------------------------------------------------------------------

    def open(self, record: bytes | bytearray | memoryview) -> bytes:
        """One whole record (header included, as :func:`record_spans_untrusted` spans it):
        its application data (b"" for a KeyUpdate, a close_notify, an empty record).
        Raises only :class:`DtlsError`."""
        if self.closed:
            raise DtlsError("record after close_notify", hint=AlertDescription.unexpected_message)
        if len(record) < HEADER or len(record) - HEADER != \
                ((record[3] << 8) | record[4]):
            raise DtlsError("not one whole TLS record")
        header = bytes(record[:HEADER])
        ctype = header[0]
        if header[1] != 3:
            raise DtlsError("not a TLS record version")
        body = record[HEADER:]
        if self._r13 is not None:
            return self._open13(header, ctype, body)
        return self._open12(ctype, header, body)

    def _open13(self, header: bytes, ctype: int, body: bytes | bytearray | memoryview) -> bytes:
        if ctype != APPLICATION_DATA:
            raise DtlsError(f"unprotected TLS 1.3 record of type {ctype} after the handshake",
                            hint=AlertDescription.unexpected_message)
        if len(body) > MAX_PLAINTEXT + 256 or len(body) < TAG + 1:
            raise DtlsError("TLS 1.3 record length", hint=AlertDescription.record_overflow)
        assert self._r13 is not None
        try:
            inner = self._r13.aead.decrypt(self._r13.nonce(self.rseq), bytes(body), header)
        except InvalidTag:
            raise DtlsError("record authentication failed",
                            hint=AlertDescription.bad_record_mac) from None
        self.rseq += 1
        end = len(inner)
        while end and not inner[end - 1]:
            end -= 1
        if not end:
            raise DtlsError("TLS 1.3 record with no content type",
                            hint=AlertDescription.unexpected_message)
        real = inner[end - 1]
        content = inner[: end - 1]
        if len(content) > MAX_PLAINTEXT:
            raise DtlsError("TLS 1.3 plaintext too long", hint=AlertDescription.record_overflow)
        if real == APPLICATION_DATA:
            if self._hs:
                raise DtlsError("application data inside a handshake message",
                                hint=AlertDescription.unexpected_message)
            return content
        if real == ALERT:
            self._alert(content)
            return b""
        if real == HANDSHAKE:
            self._handshake13(content)
            return b""
        raise DtlsError(f"TLS 1.3 content type {real} after the handshake",
                        hint=AlertDescription.unexpected_message)

    def _handshake13(self, content: bytes) -> None:
        if not content:
            raise DtlsError("empty handshake record", hint=AlertDescription.unexpected_message)
        self._hs += content
        hs = self._hs
        while len(hs) >= 4:
            size = int.from_bytes(hs[1:4], "big")
            if hs[0] != KEY_UPDATE:
                raise DtlsError(f"handshake message {hs[0]} after the handshake",
                                hint=AlertDescription.unexpected_message)
            if size != 1:
                raise DtlsError("KeyUpdate length", hint=AlertDescription.decode_error)
            if len(hs) < 5:
                return
            request = hs[4]
            if request > 1:
                raise DtlsError("KeyUpdate request", hint=AlertDescription.illegal_parameter)
            if len(hs) > 5:  # RFC 8446 §5.1: a key change ends its record
                raise DtlsError("data after a KeyUpdate in its record",
                                hint=AlertDescription.unexpected_message)
            hs.clear()
            self._key_update_read()
            if request:
                self._out += self._seal13(HANDSHAKE, bytes((KEY_UPDATE, 0, 0, 1, 0)))
                self._key_update_write()

    def _key_update_read(self) -> None:
        if self.rgen >= 64:
            raise DtlsError("too many KeyUpdates", hint=AlertDescription.unexpected_message)
        self._rsecret = _next13(self._suite, self._rsecret)
        self._r13 = _Protect13(self._suite, self._rsecret)
        self.rgen += 1
        self.rseq = 0

    def _key_update_write(self) -> None:
        self._wsecret = _next13(self._suite, self._wsecret)
        self._w13 = _Protect13(self._suite, self._wsecret)
        self.wgen += 1
        self.wseq = 0

    def _open12(self, ctype: int, header: bytes, body: bytes | bytearray | memoryview) -> bytes:
        if ctype not in (APPLICATION_DATA, ALERT):
            raise DtlsError(f"TLS 1.2 record of type {ctype} after the handshake "
                            "(renegotiation is refused)", hint=AlertDescription.unexpected_message)
        if (header[1] << 8 | header[2]) != TLS12:
            raise DtlsError("TLS 1.2 record version", hint=AlertDescription.protocol_version)
        assert self._r12 is not None
        if self.rseq >= _SEQ_LIMIT:
            raise DtlsError("TLS 1.2 sequence numbers exhausted")
        content = self._r12.decrypt(ctype, TLS12, 0, self.rseq, bytes(body))
        self.rseq += 1
        if len(content) > MAX_PLAINTEXT:
            raise DtlsError("TLS 1.2 plaintext too long", hint=AlertDescription.record_overflow)
        if ctype == ALERT:
            self._alert(content)
            return b""
        return content

    def _alert(self, content: bytes) -> None:
        if len(content) != 2:
            raise DtlsError("alert length", hint=AlertDescription.decode_error)
        if content[1] == AlertDescription.close_notify:
            self.closed = True
            return
        if content[0] == 1 and content[1] == 90:  # user_canceled: a warning, close follows
            return
        raise DtlsError(f"the peer sent alert {content[1]}", hint=AlertDescription.close_notify)

    # -- writing ------------------------------------------------------------------------------

    def seal(self, data: bytes | bytearray | memoryview) -> bytes:
        """``data`` as application data records (split at 2^14 bytes), sequence numbers
        taken. Any record of our own that waits (a KeyUpdate answer) goes first."""
        out = self._out
        self._out = bytearray()
        mv = memoryview(data)
        for at in range(0, len(mv), MAX_PLAINTEXT):
            out += self._seal(APPLICATION_DATA, mv[at : at + MAX_PLAINTEXT])
        return bytes(out)

    def pending(self) -> bytes:
        """Records of our own to send now (a KeyUpdate answer), or b""."""
        out, self._out = bytes(self._out), bytearray()
        return out

    def alert(self, description: int) -> bytes:
        """A fatal alert (a close_notify when ``description`` is 0) as a record."""
        level = 1 if description == AlertDescription.close_notify else 2
        # what waits goes first and is taken, as in seal(): else pending() would send it again
        out, self._out = bytes(self._out), bytearray()
        return out + self._seal(ALERT, bytes((level, description)))

    def _seal(self, ctype: int, data: bytes | memoryview) -> bytes:
        if self._w13 is not None:
            return self._seal13(ctype, data)
        assert self._w12 is not None
        if self.wseq >= _SEQ_LIMIT:
            raise DtlsError("TLS 1.2 sequence numbers exhausted")
        fragment = self._w12.encrypt(ctype, TLS12, 0, self.wseq, bytes(data))
        self.wseq += 1
        return bytes((ctype, 3, 3)) + len(fragment).to_bytes(2, "big") + fragment

    def _seal13(self, ctype: int, data: bytes | memoryview) -> bytes:
        assert self._w13 is not None
        header = bytes((APPLICATION_DATA, 3, 3)) + (len(data) + 1 + TAG).to_bytes(2, "big")
        sealed = self._w13.aead.encrypt(self._w13.nonce(self.wseq), bytes(data) + bytes((ctype,)),
                                        header)
        self.wseq += 1
        return header + sealed


def server_random_untrusted(flight: bytes | bytearray | memoryview) -> bytes | None:
    """The random of the ServerHello at the start of the server's first flight (TLS 1.2's
    key block needs it), or None when it is not there."""
    if len(flight) < HEADER + 4 + 2 + 32 or flight[0] != HANDSHAKE or flight[5] != 2:
        return None
    return bytes(flight[HEADER + 4 + 2 : HEADER + 4 + 2 + 32])


class KeyLog:
    """OpenSSL's key log (``SSLContext.keylog_filename``, NSS format), read as it grows:
    ``label client_random_hex secret_hex`` lines, kept per client random until taken.
    Bounded: at most ``limit`` hellos' entries (the oldest go)."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._partial = b""
        self.entries: dict[bytes, dict[str, bytes]] = {}

    def feed(self, data: bytes) -> None:
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()[-1024:]
        for line in lines:
            parts = line.split()
            if len(parts) != 3 or line.startswith(b"#"):
                continue
            try:
                random = bytes.fromhex(parts[1].decode("ascii"))
                secret = bytes.fromhex(parts[2].decode("ascii"))
                label = parts[0].decode("ascii")
            except (UnicodeDecodeError, ValueError):
                continue
            entry = self.entries.pop(random, None) or {}
            entry[label] = secret
            self.entries[random] = entry  # most recent last
            while len(self.entries) > self.limit:
                del self.entries[next(iter(self.entries))]

    def take(self, client_random: bytes) -> dict[str, bytes]:
        return self.entries.pop(client_random, {})


def session_keys(log: dict[str, bytes], version: str, suite: str, client_random: bytes,
                 server_random: bytes | None) -> SessionKeys | None:
    """The keys of a finished handshake from its key log entries (``version`` and ``suite``
    as ``SSLObject.version()`` / ``cipher()[0]`` name them), or None when something needed
    is missing or the suite is not one this layer speaks."""
    s = SUITES.get(suite)
    if s is None:
        return None
    if version == "TLSv1.3" and s.version == TLS13:
        read = log.get("CLIENT_TRAFFIC_SECRET_0")
        write = log.get("SERVER_TRAFFIC_SECRET_0")
        if read is None or write is None or len(read) != s.hash_len or len(write) != s.hash_len:
            return None
        return SessionKeys(suite, read, write)
    if version == "TLSv1.2" and s.version == TLS12:
        master = log.get("CLIENT_RANDOM")
        if master is None or len(master) != 48 or server_random is None:
            return None
        return keys12(suite, master, client_random, server_random)
    return None
