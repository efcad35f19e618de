"""DTLS 1.3 records: the unified header, inner plaintext and the ACK message.

RFC 9147 §4 (record layer), §4.1 (demultiplexing the header formats), §4.2.2
(reconstructing epoch and sequence number), §7 (ACK). Epoch-0 records keep the DTLS 1.2
``DTLSPlaintext`` header and are parsed by :mod:`.record`. Deliberately omitted:
connection IDs (RFC 9147 §9; a record with the C bit is dropped), 8-bit sequence
numbers and length-less records on *send* (both accepted on receive).

Unified header (RFC 9147 §4)::

     0 1 2 3 4 5 6 7
    +-+-+-+-+-+-+-+-+
    |0|0|1|C|S|L|E E|
    +-+-+-+-+-+-+-+-+
    | Connection ID |   Legend:
    | (if any,      |
    /  length as    /   C   - Connection ID (CID) present
    |  negotiated)  |   S   - Sequence number length
    +-+-+-+-+-+-+-+-+   L   - Length present
    |  8 or 16 bit  |   E   - Epoch
    |Sequence Number|
    +-+-+-+-+-+-+-+-+
    | 16 bit Length |
    | (if present)  |
    +-+-+-+-+-+-+-+-+

ACK (RFC 9147 §7)::

    struct { uint64 epoch; uint64 sequence_number; } RecordNumber;
    struct { RecordNumber record_numbers<0..2^16-1>; } ACK;
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.proto.dtls._wire import AlertDescription, DtlsError, Reader, u16

# Our sends: fixed bits 001, no CID, 16-bit sequence number, length present.
_SEND_FLAGS = 0x2C
UNIFIED_HEADER_LEN = 5
MAX_CIPHERTEXT13 = 2**14 + 256  # RFC 8446 §5.2: TLSCiphertext.length limit


def is_unified_header(first: int) -> bool:
    """RFC 9147 §4.1: the leading bits 001 mark a DTLSCiphertext."""
    return first & 0xE0 == 0x20


@dataclass(frozen=True, slots=True)
class CiphertextRecord:
    """One DTLSCiphertext as received: header bytes (sequence number still masked)."""

    epoch_bits: int
    seq_len: int  # 1 or 2
    header: bytes
    ciphertext: bytes


def parse_ciphertext_untrusted(data: bytes | memoryview, offset: int) -> tuple[CiphertextRecord, int]:
    """Parse a unified-header record at ``offset``; return it and the next offset."""
    r = Reader(data, offset)
    flags = r.uint(1)
    if not is_unified_header(flags):
        raise DtlsError("not a DTLSCiphertext header")
    if flags & 0x10:
        # RFC 9147 §9: we never negotiate connection IDs, so we cannot find its length.
        raise DtlsError("connection ID present but not negotiated")
    seq_len = 2 if flags & 0x08 else 1
    r.take(seq_len)
    if flags & 0x04:
        length = r.uint(2)
        if length > MAX_CIPHERTEXT13:
            raise DtlsError("record too long", hint=AlertDescription.record_overflow)
    else:
        length = r.remaining  # RFC 9147 §4: no length: the record fills the datagram
    header_len = 1 + seq_len + (2 if flags & 0x04 else 0)
    header = bytes(data[offset : offset + header_len])
    ciphertext = r.take(length)
    return CiphertextRecord(flags & 3, seq_len, header, ciphertext), offset + header_len + length


def encode_header(epoch: int, seq: int, length: int) -> bytes:
    """Our header, sequence number in the clear (masked by the caller after sealing)."""
    return bytes((_SEND_FLAGS | (epoch & 3),)) + u16(seq & 0xFFFF) + u16(length)


def apply_mask(header: bytes, seq_len: int, mask: bytes) -> bytes:
    """XOR the record-number mask into the header's sequence bytes (RFC 9147 §4.2.3)."""
    seq = bytes(a ^ b for a, b in zip(header[1 : 1 + seq_len], mask, strict=False))
    return header[:1] + seq + header[1 + seq_len :]


def reconstruct_seq(wire: int, bits: int, expected: int) -> int:
    """RFC 9147 §4.2.2: the value with these low ``bits`` closest to ``expected``."""
    span = 1 << bits
    candidate = (expected & ~(span - 1)) | wire
    if candidate - expected > span // 2 and candidate >= span:
        candidate -= span
    elif expected - candidate > span // 2:
        candidate += span
    return candidate


def split_inner_plaintext_untrusted(inner: bytes) -> tuple[int, bytes]:
    """RFC 8446 §5.4 DTLSInnerPlaintext: content ‖ type ‖ zero padding."""
    end = len(inner)
    while end and inner[end - 1] == 0:
        end -= 1
    if not end:
        # RFC 8446 §5.4: an all-zero plaintext has no content type.
        raise DtlsError("inner plaintext has no content type",
                        hint=AlertDescription.unexpected_message)
    return inner[end - 1], inner[: end - 1]


@dataclass(frozen=True, slots=True)
class Ack:
    record_numbers: tuple[tuple[int, int], ...]

    @classmethod
    def parse_untrusted(cls, body: bytes) -> Ack:
        r = Reader(body)
        block = r.sub(2)
        r.expect_end("ACK")
        if block.remaining % 16:
            raise DtlsError("ACK length not a multiple of 16")
        out = []
        while block.remaining:
            out.append((block.uint(8), block.uint(8)))
        return cls(tuple(out))

    def __bytes__(self) -> bytes:
        body = b"".join(e.to_bytes(8, "big") + s.to_bytes(8, "big")
                        for e, s in self.record_numbers)
        return u16(len(body)) + body
