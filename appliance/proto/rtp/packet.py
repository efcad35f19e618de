"""RTP data packets (RFC 3550 §5.1, §5.3.1) and a cheap header reader for the hot path.

Implemented: the fixed header, CSRC list, one header extension (kept as profile + raw
bytes, with an RFC 8285 one-/two-byte element reader), padding (RFC 3550 §5.1 P bit).
Deliberately omitted: RTP validity heuristics of A.1 that need session state (see
``stats.ReceptionStats``); RFC 5285's mixed one/two-byte negotiation (a=extmap-allow-mixed
only changes what we would *send*, and we send no extensions).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from appliance.proto.errors import LocalProtocolError
from appliance.proto.rtp.errors import RtpError

# RFC 3550 §5.1:
#
#     0                   1                   2                   3
#     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
#    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#    |V=2|P|X|  CC   |M|     PT      |       sequence number         |
#    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#    |                           timestamp                           |
#    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#    |           synchronization source (SSRC) identifier            |
#    +=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+=+
#    |            contributing source (CSRC) identifiers             |
#    |                             ....                              |
#    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#
# RFC 3550 §5.3.1, present when X=1, right after the CSRCs:
#
#    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#    |      defined by profile       |           length              |
#    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#    |                        header extension                       |
#    |                             ....                              |
#
# "length" counts 32-bit words of extension data, not including the 4-byte header.
# With P=1 the last payload byte says how many padding bytes (itself included) to drop.

_HEADER: Final = struct.Struct("!BBHII")
_EXT_HEADER: Final = struct.Struct("!HH")
HEADER_SIZE: Final = 12
MAX_CSRC: Final = 15

#: RFC 8285 §4.2 one-byte-header profile, §4.3 two-byte-header profiles (0x100X).
ONE_BYTE_PROFILE: Final = 0xBEDE
TWO_BYTE_PROFILE_MASK: Final = 0xFFF0
TWO_BYTE_PROFILE: Final = 0x1000


def rtp_header(payload_type: int, sequence: int, timestamp: int, ssrc: int,
               marker: bool = False) -> bytes:
    """The plain 12-byte fixed header (V=2; no padding, extension or CSRCs) for the
    per-packet send path: one ``struct`` pack, no :class:`RtpPacket` object. The caller
    passes values in range (``payload_type`` 0..127, 16-bit sequence, 32-bit timestamp and
    SSRC); ``bytes(RtpPacket(...))`` is the validating, general form."""
    return _HEADER.pack(0x80, (0x80 if marker else 0) | payload_type, sequence, timestamp, ssrc)


def rtp_header_fields_untrusted(
    buf: bytes | bytearray | memoryview,
) -> tuple[int, int, int, int, bool, int, int]:
    """Hot-path read of one RTP packet without building objects.

    Returns ``(payload_type, sequence, timestamp, ssrc, marker, payload_offset,
    payload_end)``; ``buf[payload_offset:payload_end]`` is the payload with any padding
    already excluded. Raises only :class:`RtpError`.
    """
    n = len(buf)
    if n < HEADER_SIZE:
        raise RtpError(f"RTP packet of {n} bytes is shorter than the header", hint="truncated")
    b0, b1, seq, ts, ssrc = _HEADER.unpack_from(buf, 0)
    if b0 >> 6 != 2:
        raise RtpError(f"RTP version {b0 >> 6}, expected 2", hint="version")
    offset = HEADER_SIZE + 4 * (b0 & 0x0F)
    if b0 & 0x10:
        if n < offset + 4:
            raise RtpError("RTP header extension is truncated", hint="truncated")
        offset += 4 + 4 * ((buf[offset + 2] << 8) | buf[offset + 3])
    end = n
    if b0 & 0x20:
        if n == 0 or buf[n - 1] == 0:
            raise RtpError("RTP padding count is zero", hint="padding")
        end = n - buf[n - 1]
    if offset > end:
        raise RtpError("RTP header, extension and padding exceed the packet", hint="truncated")
    return b1 & 0x7F, seq, ts, ssrc, bool(b1 & 0x80), offset, end


@dataclass(frozen=True, slots=True)
class RtpPacket:
    """One RTP packet. ``bytes(pkt)`` serialises it; ``extension`` is True iff
    ``extension_profile`` is not None. ``padding_size`` > 0 sets the P bit."""

    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    payload: bytes = b""
    marker: bool = False
    csrc: tuple[int, ...] = ()
    extension_profile: int | None = None
    extension_data: bytes = b""
    padding_size: int = 0
    version: int = 2

    def __post_init__(self) -> None:
        # Caller-built packets: refuse values that cannot be encoded (parse never builds
        # such a packet, so this never fires on network input).
        if not 0 <= self.payload_type <= 127:
            raise LocalProtocolError("payload_type must be 0..127")
        if not (0 <= self.sequence <= 0xFFFF and 0 <= self.timestamp <= 0xFFFFFFFF):
            raise LocalProtocolError("sequence/timestamp out of range")
        if not 0 <= self.ssrc <= 0xFFFFFFFF or len(self.csrc) > MAX_CSRC:
            raise LocalProtocolError("ssrc out of range or more than 15 CSRCs")
        if len(self.extension_data) % 4 or len(self.extension_data) > 4 * 0xFFFF:
            raise LocalProtocolError("extension_data must be whole 32-bit words")
        if not 0 <= self.padding_size <= 255:
            raise LocalProtocolError("padding_size must be 0..255")

    @property
    def padding(self) -> bool:
        return self.padding_size > 0

    @property
    def extension(self) -> bool:
        return self.extension_profile is not None

    @classmethod
    def parse_untrusted(cls, buf: bytes | bytearray | memoryview) -> RtpPacket:
        """Parse one RTP packet (see the diagram above). Raises only :class:`RtpError`."""
        pt, seq, ts, ssrc, marker, offset, end = rtp_header_fields_untrusted(buf)
        data = bytes(buf)
        b0 = data[0]
        cc = b0 & 0x0F
        csrc = struct.unpack_from(f"!{cc}I", data, HEADER_SIZE) if cc else ()
        profile: int | None = None
        ext = b""
        if b0 & 0x10:
            pos = HEADER_SIZE + 4 * cc
            profile, words = _EXT_HEADER.unpack_from(data, pos)
            ext = data[pos + 4 : pos + 4 + 4 * words]
        return cls(
            payload_type=pt,
            sequence=seq,
            timestamp=ts,
            ssrc=ssrc,
            payload=data[offset:end],
            marker=marker,
            csrc=tuple(csrc),
            extension_profile=profile,
            extension_data=ext,
            padding_size=len(data) - end,
        )

    def __bytes__(self) -> bytes:
        b0 = (
            (self.version << 6)
            | (0x20 if self.padding_size else 0)
            | (0x10 if self.extension_profile is not None else 0)
            | len(self.csrc)
        )
        b1 = (0x80 if self.marker else 0) | self.payload_type
        parts = [_HEADER.pack(b0, b1, self.sequence, self.timestamp, self.ssrc)]
        if self.csrc:
            parts.append(struct.pack(f"!{len(self.csrc)}I", *self.csrc))
        if self.extension_profile is not None:
            parts.append(_EXT_HEADER.pack(self.extension_profile, len(self.extension_data) // 4))
            parts.append(self.extension_data)
        parts.append(self.payload)
        if self.padding_size:
            parts.append(bytes(self.padding_size - 1) + bytes([self.padding_size]))
        return b"".join(parts)


def parse_header_extensions_untrusted(profile: int, data: bytes) -> list[tuple[int, bytes]]:
    """RFC 8285 §4.2/§4.3 elements as ``[(id, value), ...]``; other profiles give ``[]``.

    ::

        one-byte (0xBEDE):   | ID(4) | L(4) | data (L+1 bytes) ...   ID 15 stops parsing
        two-byte (0x100X):   | ID(8) | L(8) | data (L bytes) ...
        a zero byte between elements is padding.
    """
    out: list[tuple[int, bytes]] = []
    i, n = 0, len(data)
    if profile == ONE_BYTE_PROFILE:
        while i < n:
            b = data[i]
            if b == 0:
                i += 1
                continue
            ext_id, length = b >> 4, (b & 0x0F) + 1
            if ext_id == 15:  # §4.2: reserved, stop processing
                break
            if i + 1 + length > n:
                raise RtpError("RTP one-byte header extension overruns", hint="extension")
            out.append((ext_id, data[i + 1 : i + 1 + length]))
            i += 1 + length
    elif profile & TWO_BYTE_PROFILE_MASK == TWO_BYTE_PROFILE:
        while i < n:
            if data[i] == 0:
                i += 1
                continue
            if i + 2 > n:
                raise RtpError("RTP two-byte header extension truncated", hint="extension")
            ext_id, length = data[i], data[i + 1]
            if i + 2 + length > n:
                raise RtpError("RTP two-byte header extension overruns", hint="extension")
            out.append((ext_id, data[i + 2 : i + 2 + length]))
            i += 2 + length
    return out
