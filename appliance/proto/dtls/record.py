"""DTLS 1.2 record and handshake-fragment codecs, reassembly and the anti-replay window.

Implements RFC 6347 §4.1 (record layer), §4.1.2.6 (anti-replay, 64-entry window), §4.2.2
(handshake message header), §4.2.3 (fragmentation and reassembly). Deliberately omitted:
record compression (RFC 5246 §6.2.2, only ``null`` is accepted), DTLS 1.3 unified headers
(RFC 9147 §4, never sent to a 1.2 server), and connection IDs (RFC 9146).

Record header (RFC 6347 §4.1)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |  ContentType  |   ProtocolVersion (254,253)   |     epoch     |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |     epoch     |          sequence_number (48 bits)            |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |      sequence_number          |            length             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

Handshake header (RFC 6347 §4.2.2)::

    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |   msg_type    |                 length (24)                   |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |        message_seq            |    fragment_offset (24) ...   |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |   ...         |             fragment_length (24)              |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.proto.dtls._wire import (
    DTLS_1_0,
    DTLS_1_2,
    AlertDescription,
    ContentType,
    DtlsError,
    Reader,
    u16,
    u24,
)

RECORD_HEADER_LEN = 13
HANDSHAKE_HEADER_LEN = 12
# RFC 6347 §4.1 / RFC 5246 §6.2.3: TLSCiphertext.length MUST NOT exceed 2^14 + 2048.
MAX_CIPHERTEXT_LEN = 2**14 + 2048
MAX_PLAINTEXT_LEN = 2**14
MAX_SEQUENCE = 2**48 - 1


def is_client_hello(payload: bytes | memoryview) -> bool:
    """An epoch-0 handshake record (RFC 6347 §4.1) whose first message is a ClientHello
    (type 1, §4.2.2: the byte after the 13-byte record header). A peek, never raises."""
    return (len(payload) > 25 and payload[0] == 22 and payload[3] == 0 and payload[4] == 0
            and payload[13] == 1)


@dataclass(frozen=True, slots=True)
class Record:
    content_type: int
    version: int
    epoch: int
    sequence_number: int
    fragment: bytes

    def __bytes__(self) -> bytes:
        return (
            bytes((self.content_type,))
            + u16(self.version)
            + u16(self.epoch)
            + self.sequence_number.to_bytes(6, "big")
            + u16(len(self.fragment))
            + self.fragment
        )


def parse_record_untrusted(data: bytes | memoryview, offset: int = 0) -> tuple[Record, int]:
    """Parse one record starting at ``offset``; return it and the offset after it."""
    r = Reader(data, offset)
    content_type = r.uint(1)
    if content_type not in ContentType._value2member_map_:
        raise DtlsError(
            f"unknown content type {content_type}", hint=AlertDescription.unexpected_message
        )
    version = r.uint(2)
    # RFC 6347 §4.1: accept 1.0 in the record layer (HelloVerifyRequest and some
    # ClientHellos use it); anything not DTLS is noise on the 5-tuple.
    if version not in (DTLS_1_2, DTLS_1_0):
        raise DtlsError(f"record version {version:#06x}", hint=AlertDescription.protocol_version)
    epoch = r.uint(2)
    seq = r.uint(6)
    length = r.uint(2)
    if length > MAX_CIPHERTEXT_LEN:
        raise DtlsError(f"record length {length} too large", hint=AlertDescription.record_overflow)
    fragment = r.take(length)
    return Record(content_type, version, epoch, seq, fragment), offset + RECORD_HEADER_LEN + length


def parse_records_untrusted(data: bytes | memoryview) -> list[Record]:
    """Parse every record of a datagram (RFC 6347 §4.1.1: several records may share one)."""
    out = []
    offset = 0
    while offset < len(data):
        record, offset = parse_record_untrusted(data, offset)
        out.append(record)
    return out


@dataclass(frozen=True, slots=True)
class HandshakeFragment:
    msg_type: int
    length: int
    message_seq: int
    fragment_offset: int
    body: bytes

    def __bytes__(self) -> bytes:
        return (
            bytes((self.msg_type,))
            + u24(self.length)
            + u16(self.message_seq)
            + u24(self.fragment_offset)
            + u24(len(self.body))
            + self.body
        )


def parse_handshake_fragments_untrusted(payload: bytes) -> list[HandshakeFragment]:
    """Split a handshake record's plaintext into fragments (several may share a record)."""
    r = Reader(payload)
    out = []
    while r.remaining:
        msg_type = r.uint(1)
        length = r.uint(3)
        message_seq = r.uint(2)
        fragment_offset = r.uint(3)
        fragment_length = r.uint(3)
        # RFC 6347 §4.2.3: a fragment must lie within the message it claims to be part of.
        if fragment_offset + fragment_length > length:
            raise DtlsError("handshake fragment beyond message length")
        body = r.take(fragment_length)
        out.append(HandshakeFragment(msg_type, length, message_seq, fragment_offset, body))
    return out


def handshake_header(msg_type: int, length: int, message_seq: int) -> bytes:
    """The header as if unfragmented: what the transcript hash covers (RFC 6347 §4.2.6)."""
    return bytes((msg_type,)) + u24(length) + u16(message_seq) + u24(0) + u24(length)


class _PartialMessage:
    """One handshake message being reassembled from fragments (RFC 6347 §4.2.3)."""

    __slots__ = ("msg_type", "body", "have", "missing", "epoch")

    def __init__(self, msg_type: int, length: int, epoch: int) -> None:
        self.msg_type = msg_type
        self.body = bytearray(length)
        self.have = bytearray(length)  # one flag per byte: simple and bounded by the caller
        self.missing = length
        self.epoch = epoch

    def add(self, offset: int, data: bytes) -> None:
        end = offset + len(data)
        self.body[offset:end] = data
        new = len(data) - sum(self.have[offset:end])
        self.have[offset:end] = b"\x01" * len(data)
        self.missing -= new


@dataclass(frozen=True, slots=True)
class HandshakeMessage:
    """A fully reassembled handshake message, with the epoch it arrived in."""

    msg_type: int
    message_seq: int
    body: bytes
    epoch: int


class Reassembler:
    """Collect fragments for ``message_seq >= next_seq`` and release whole messages in order.

    The total bytes held are bounded by ``max_buffer``; a fragment that would exceed it is
    dropped (the peer retransmits, RFC 6347 §4.2.4), which keeps a flood of bogus
    fragments from costing more than ``max_buffer`` of memory.
    """

    __slots__ = ("next_seq", "max_buffer", "_partial", "_held")

    # RFC 6347 §4.2.2: buffer only a few messages ahead of the one we expect.
    WINDOW = 16

    def __init__(self, max_buffer: int) -> None:
        self.next_seq = 0
        self.max_buffer = max_buffer
        self._partial: dict[int, _PartialMessage] = {}
        self._held = 0

    def add(self, frag: HandshakeFragment, epoch: int) -> bool:
        """Take a fragment; return False if it was old (a retransmission) and so ignored."""
        if frag.message_seq < self.next_seq:
            return False
        if frag.message_seq >= self.next_seq + self.WINDOW:
            return True  # too far ahead: drop silently, it will be retransmitted
        msg = self._partial.get(frag.message_seq)
        if msg is None:
            if self._held + frag.length > self.max_buffer:
                return True
            msg = _PartialMessage(frag.msg_type, frag.length, epoch)
            self._partial[frag.message_seq] = msg
            self._held += frag.length
        # Fragments of one message must agree on type, length and epoch, otherwise the
        # reassembled bytes would mix data from two different messages.
        if msg.msg_type != frag.msg_type or len(msg.body) != frag.length or msg.epoch != epoch:
            return True
        msg.add(frag.fragment_offset, frag.body)
        return True

    def pop(self) -> HandshakeMessage | None:
        """The next whole message in sequence, if it is complete."""
        msg = self._partial.get(self.next_seq)
        if msg is None or msg.missing:
            return None
        del self._partial[self.next_seq]
        self._held -= len(msg.body)
        out = HandshakeMessage(msg.msg_type, self.next_seq, bytes(msg.body), msg.epoch)
        self.next_seq += 1
        return out

    def clear(self) -> None:
        self._partial.clear()
        self._held = 0


class ReplayWindow:
    """RFC 6347 §4.1.2.6 sliding window of 64 record sequence numbers for one epoch.

    ``check`` before authenticating (cheap reject), ``mark`` only after the record has
    been authenticated, so that forged records cannot advance the window.
    """

    __slots__ = ("_top", "_bits")
    SIZE = 64

    def __init__(self) -> None:
        self._top = -1
        self._bits = 0

    def check(self, seq: int) -> bool:
        if seq > self._top:
            return True
        diff = self._top - seq
        if diff >= self.SIZE:
            return False
        return not (self._bits >> diff) & 1

    def mark(self, seq: int) -> None:
        if seq > self._top:
            shift = seq - self._top
            # A jump of a whole window or more forgets everything (and keeps the int small).
            kept = (self._bits << shift) if shift < self.SIZE else 0
            self._bits = (kept | 1) & ((1 << self.SIZE) - 1)
            self._top = seq
        else:
            self._bits |= 1 << (self._top - seq)
