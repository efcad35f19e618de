"""RTCP compound packets (RFC 3550 §6.4-§6.6, RFC 4585 §6) and their serialisation.

Implemented: SR and RR with report blocks and profile extensions (RFC 3550 §6.4),
SDES chunks and items (§6.5), BYE with reason (§6.6), RTPFB generic NACK (RFC 4585
§6.2.1), PSFB PLI (§6.3.1); other feedback formats and unknown packet types are kept
raw so nothing in a compound packet is lost. Reduced-size RTCP (RFC 5506) needs nothing
special: we never require the compound to start with SR/RR.

Deliberately omitted: the RFC 3550 A.2 "first packet must be SR/RR" check (RFC 5506 lifts
it and browsers negotiate rtcp-rsize); XR (RFC 3611), APP (kept raw as unknown); writing
padding (we never pad: SRTCP adds its own trailer).

Common header of every RTCP packet (RFC 3550 §6.4.1)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |V=2|P| RC/SC/FMT |      PT       |             length            |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

``length`` is the packet's size in 32-bit words minus one, header included.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from appliance.proto.errors import LocalProtocolError
from appliance.proto.rtp.errors import RtpError

_COMMON: Final = struct.Struct("!BBH")
_U32: Final = struct.Struct("!I")
_TWO_U32: Final = struct.Struct("!II")
_SENDER_INFO: Final = struct.Struct("!IIIII")
_REPORT_BLOCK: Final = struct.Struct("!IB3sIIII")
REPORT_BLOCK_SIZE: Final = 24


class RtcpType(enum.IntEnum):
    """RFC 3550 §12.1 and RFC 4585 §6.1 packet types."""

    SR = 200
    RR = 201
    SDES = 202
    BYE = 203
    APP = 204
    RTPFB = 205
    PSFB = 206
    XR = 207


class SdesItem(enum.IntEnum):
    """RFC 3550 §6.5 SDES item types (only CNAME is mandatory)."""

    END = 0
    CNAME = 1
    NAME = 2
    EMAIL = 3
    PHONE = 4
    LOC = 5
    TOOL = 6
    NOTE = 7
    PRIV = 8


@dataclass(frozen=True, slots=True)
class ReportBlock:
    """RFC 3550 §6.4.1 reception report block (24 bytes)::

        |                 SSRC_n (SSRC of source)                       |
        | fraction lost |       cumulative number of packets lost       |
        |           extended highest sequence number received           |
        |                      interarrival jitter                      |
        |                         last SR (LSR)                         |
        |                   delay since last SR (DLSR)                  |

    ``cumulative_lost`` is a *signed* 24-bit number: duplicates can make it negative.
    """

    ssrc: int
    fraction_lost: int  # fixed point, lost/expected * 256
    cumulative_lost: int
    highest_sequence: int  # extended: cycles << 16 | seq
    jitter: int  # RTP timestamp units
    lsr: int  # middle 32 bits of the last SR's NTP timestamp, 0 if none
    dlsr: int  # 1/65536 s since that SR arrived

    def __bytes__(self) -> bytes:
        lost = max(-(1 << 23), min((1 << 23) - 1, self.cumulative_lost)) & 0xFFFFFF
        return _REPORT_BLOCK.pack(
            self.ssrc,
            self.fraction_lost,
            lost.to_bytes(3, "big"),
            self.highest_sequence & 0xFFFFFFFF,
            self.jitter & 0xFFFFFFFF,
            self.lsr,
            self.dlsr & 0xFFFFFFFF,
        )

    @classmethod
    def _parse(cls, data: bytes, pos: int) -> ReportBlock:
        ssrc, fraction, lost3, ext, jitter, lsr, dlsr = _REPORT_BLOCK.unpack_from(data, pos)
        lost = int.from_bytes(lost3, "big", signed=True)
        return cls(ssrc, fraction, lost, ext, jitter, lsr, dlsr)


@dataclass(frozen=True, slots=True)
class RtcpSenderReport:
    """SR, PT=200 (RFC 3550 §6.4.1)::

        header | V=2|P|RC | PT=200 | length |
               |         SSRC of sender    |
        sender |  NTP timestamp, msw       |
        info   |  NTP timestamp, lsw       |
               |  RTP timestamp            |
               |  sender's packet count    |
               |  sender's octet count     |

    then RC report blocks of 24 bytes and any profile-specific ``extension`` bytes.
    """

    ssrc: int
    ntp_msw: int
    ntp_lsw: int
    rtp_timestamp: int
    packet_count: int
    octet_count: int
    reports: tuple[ReportBlock, ...] = ()
    extension: bytes = b""

    def __bytes__(self) -> bytes:
        body = _U32.pack(self.ssrc) + _SENDER_INFO.pack(
            self.ntp_msw,
            self.ntp_lsw,
            self.rtp_timestamp,
            self.packet_count & 0xFFFFFFFF,
            self.octet_count & 0xFFFFFFFF,
        )
        body += b"".join(bytes(r) for r in self.reports) + self.extension
        return _pack(RtcpType.SR, len(self.reports), body)


@dataclass(frozen=True, slots=True)
class RtcpReceiverReport:
    """RR, PT=201 (RFC 3550 §6.4.2): SR without the sender info."""

    ssrc: int
    reports: tuple[ReportBlock, ...] = ()
    extension: bytes = b""

    def __bytes__(self) -> bytes:
        body = _U32.pack(self.ssrc) + b"".join(bytes(r) for r in self.reports)
        return _pack(RtcpType.RR, len(self.reports), body + self.extension)


@dataclass(frozen=True, slots=True)
class SdesChunk:
    """One SDES chunk: an SSRC and its ``(item type, value)`` items."""

    ssrc: int
    items: tuple[tuple[int, bytes], ...]

    @property
    def cname(self) -> bytes | None:
        for kind, value in self.items:
            if kind == SdesItem.CNAME:
                return value
        return None


@dataclass(frozen=True, slots=True)
class RtcpSdes:
    """SDES, PT=202 (RFC 3550 §6.5)::

        header |V=2|P|    SC   |  PT=SDES=202  |             length            |
        chunk  |                          SSRC/CSRC_1                          |
          1    | type  | len   | text (len bytes) ... | type=0 (END) | pad to 4  |

    SC chunks follow one another; item values are bytes (UTF-8 by convention).
    """

    chunks: tuple[SdesChunk, ...]

    def __bytes__(self) -> bytes:
        body = bytearray()
        for chunk in self.chunks:
            body += _U32.pack(chunk.ssrc)
            for kind, value in chunk.items:
                if not 1 <= kind <= 255 or len(value) > 255:
                    raise LocalProtocolError("SDES item type must be 1..255, value <= 255")
                body += bytes([kind, len(value)]) + value
            # §6.5: the item list ends with at least one null octet, then pads to 32 bits.
            body += bytes(4 - len(body) % 4)
        return _pack(RtcpType.SDES, len(self.chunks), bytes(body))


@dataclass(frozen=True, slots=True)
class RtcpBye:
    """BYE, PT=203 (RFC 3550 §6.6): SC SSRCs, then optional ``length, reason``, padded."""

    sources: tuple[int, ...]
    reason: bytes | None = None

    def __bytes__(self) -> bytes:
        body = b"".join(_U32.pack(s) for s in self.sources)
        if self.reason is not None:
            if len(self.reason) > 255:
                raise LocalProtocolError("BYE reason is at most 255 bytes")
            r = bytes([len(self.reason)]) + self.reason
            body += r + bytes(-len(r) % 4)
        return _pack(RtcpType.BYE, len(self.sources), body)


@dataclass(frozen=True, slots=True)
class RtcpNack:
    """RTPFB FMT=1 generic NACK (RFC 4585 §6.2.1)::

        |V=2|P| FMT=1 |   PT=205     |          length               |
        |                  SSRC of packet sender                      |
        |                  SSRC of media source                       |
        |            PID                |             BLP             |  x N

    PID is a lost sequence number; bit i of BLP means PID+i+1 is lost too.
    """

    sender_ssrc: int
    media_ssrc: int
    items: tuple[tuple[int, int], ...]  # (pid, blp)

    def lost(self) -> list[int]:
        out = []
        for pid, blp in self.items:
            out.append(pid)
            out.extend((pid + i + 1) & 0xFFFF for i in range(16) if blp >> i & 1)
        return out

    @classmethod
    def from_lost(cls, sender_ssrc: int, media_ssrc: int, lost: Iterable[int]) -> RtcpNack:
        items: list[tuple[int, int]] = []
        for seq in lost:
            if items:
                pid, blp = items[-1]
                delta = (seq - pid) & 0xFFFF
                if 1 <= delta <= 16:
                    items[-1] = (pid, blp | 1 << (delta - 1))
                    continue
            items.append((seq & 0xFFFF, 0))
        return cls(sender_ssrc, media_ssrc, tuple(items))

    def __bytes__(self) -> bytes:
        fci = b"".join(struct.pack("!HH", p, b) for p, b in self.items)
        return _pack(RtcpType.RTPFB, 1, _TWO_U32.pack(self.sender_ssrc, self.media_ssrc) + fci)


@dataclass(frozen=True, slots=True)
class RtcpPli:
    """PSFB FMT=1 picture loss indication (RFC 4585 §6.3.1): no FCI."""

    sender_ssrc: int
    media_ssrc: int

    def __bytes__(self) -> bytes:
        return _pack(RtcpType.PSFB, 1, _TWO_U32.pack(self.sender_ssrc, self.media_ssrc))


@dataclass(frozen=True, slots=True)
class RtcpFeedback:
    """Any other RTPFB/PSFB format (TWCC, REMB, FIR, ...), FCI kept raw."""

    packet_type: int  # RtcpType.RTPFB or RtcpType.PSFB
    fmt: int
    sender_ssrc: int
    media_ssrc: int
    fci: bytes = b""

    def __bytes__(self) -> bytes:
        body = _TWO_U32.pack(self.sender_ssrc, self.media_ssrc) + self.fci
        return _pack(self.packet_type, self.fmt, body)


@dataclass(frozen=True, slots=True)
class RtcpUnknown:
    """A packet type we do not interpret (APP, XR, ...), body without padding, raw."""

    packet_type: int
    count: int  # the 5-bit RC/SC/FMT field
    body: bytes

    def __bytes__(self) -> bytes:
        return _pack(self.packet_type, self.count, self.body)


RtcpPacket = (
    RtcpSenderReport
    | RtcpReceiverReport
    | RtcpSdes
    | RtcpBye
    | RtcpNack
    | RtcpPli
    | RtcpFeedback
    | RtcpUnknown
)


def _pack(packet_type: int, count: int, body: bytes) -> bytes:
    if len(body) % 4:
        raise LocalProtocolError("RTCP body must be whole 32-bit words")
    if not 0 <= count <= 31 or len(body) // 4 > 0xFFFF:
        raise LocalProtocolError("RTCP count > 31 or packet too long")
    return _COMMON.pack(0x80 | count, packet_type, len(body) // 4) + body


def serialize_rtcp(packets: Iterable[RtcpPacket]) -> bytes:
    """A compound packet: the packets back to back (RFC 3550 §6.1)."""
    return b"".join(bytes(p) for p in packets)


def _need(body: bytes, size: int, what: str) -> None:
    if len(body) < size:
        raise _rtcp_error(f"RTCP {what} needs {size} bytes, has {len(body)}")


def _rtcp_error(msg: str) -> RtpError:
    return RtpError(msg, hint="rtcp")


def _parse_reports(body: bytes, pos: int, count: int, what: str) -> tuple[ReportBlock, ...]:
    _need(body, pos + count * REPORT_BLOCK_SIZE, what)
    return tuple(ReportBlock._parse(body, pos + i * REPORT_BLOCK_SIZE) for i in range(count))


def _parse_sdes(body: bytes, count: int) -> RtcpSdes:
    chunks = []
    pos = 0
    for _ in range(count):
        _need(body, pos + 4, "SDES chunk")
        (ssrc,) = _U32.unpack_from(body, pos)
        pos += 4
        items = []
        while True:
            if pos >= len(body):
                raise _rtcp_error("SDES chunk has no END item")
            kind = body[pos]
            if kind == SdesItem.END:
                # Skip the END octet and the padding up to the next 32-bit boundary.
                pos += 1
                pos += -pos % 4
                break
            if pos + 2 > len(body) or pos + 2 + body[pos + 1] > len(body):
                raise _rtcp_error("SDES item overruns the packet")
            length = body[pos + 1]
            items.append((kind, body[pos + 2 : pos + 2 + length]))
            pos += 2 + length
        chunks.append(SdesChunk(ssrc, tuple(items)))
    return RtcpSdes(tuple(chunks))


def _parse_bye(body: bytes, count: int) -> RtcpBye:
    _need(body, 4 * count, "BYE")
    sources = struct.unpack_from(f"!{count}I", body, 0)
    reason = None
    pos = 4 * count
    if pos < len(body):
        length = body[pos]
        if pos + 1 + length > len(body):
            raise _rtcp_error("BYE reason overruns the packet")
        reason = body[pos + 1 : pos + 1 + length]
    return RtcpBye(tuple(sources), reason)


def _parse_one(packet_type: int, count: int, body: bytes) -> RtcpPacket:
    if packet_type == RtcpType.SR:
        _need(body, 24, "SR")
        ssrc, msw, lsw, rtp_ts, packets, octets = struct.unpack_from("!6I", body, 0)
        reports = _parse_reports(body, 24, count, "SR")
        ext = body[24 + count * REPORT_BLOCK_SIZE :]
        return RtcpSenderReport(ssrc, msw, lsw, rtp_ts, packets, octets, reports, ext)
    if packet_type == RtcpType.RR:
        _need(body, 4, "RR")
        (ssrc,) = _U32.unpack_from(body, 0)
        reports = _parse_reports(body, 4, count, "RR")
        return RtcpReceiverReport(ssrc, reports, body[4 + count * REPORT_BLOCK_SIZE :])
    if packet_type == RtcpType.SDES:
        return _parse_sdes(body, count)
    if packet_type == RtcpType.BYE:
        return _parse_bye(body, count)
    if packet_type in (RtcpType.RTPFB, RtcpType.PSFB):
        _need(body, 8, "feedback")
        sender, media = _TWO_U32.unpack_from(body, 0)
        fci = body[8:]
        if packet_type == RtcpType.RTPFB and count == 1:
            # len(body) is a multiple of 4, so the FCI is whole (PID, BLP) pairs.
            pairs = struct.unpack(f"!{len(fci) // 2}H", fci)
            return RtcpNack(sender, media, tuple(zip(pairs[::2], pairs[1::2], strict=True)))
        if packet_type == RtcpType.PSFB and count == 1 and not fci:
            return RtcpPli(sender, media)
        return RtcpFeedback(packet_type, count, sender, media, fci)
    return RtcpUnknown(packet_type, count, body)


def parse_rtcp_untrusted(buf: bytes | bytearray | memoryview) -> list[RtcpPacket]:
    """Parse a compound RTCP packet (RFC 3550 §6.1). Raises only :class:`RtpError`.

    Every packet must be version 2, its length must fit, and together they must cover the
    buffer exactly (RFC 3550 A.2). Padding (P bit, last octet = count) is stripped.
    """
    data = bytes(buf)
    if not data:
        raise _rtcp_error("empty RTCP packet")
    out: list[RtcpPacket] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < 4:
            raise RtpError("RTCP header truncated", hint="truncated")
        b0, packet_type, words = _COMMON.unpack_from(data, pos)
        if b0 >> 6 != 2:
            raise RtpError(f"RTCP version {b0 >> 6}, expected 2", hint="version")
        end = pos + 4 + 4 * words
        if end > len(data):
            raise RtpError("RTCP length field exceeds the datagram", hint="length")
        body = data[pos + 4 : end]
        if b0 & 0x20:
            pad = body[-1] if body else 0
            if pad == 0 or pad > len(body):
                raise RtpError("RTCP padding count is invalid", hint="padding")
            body = body[:-pad]
            # Re-align: parsers below rely on whole words, padding keeps them whole.
            if len(body) % 4:
                raise RtpError("RTCP padding leaves a partial word", hint="padding")
        out.append(_parse_one(packet_type, b0 & 0x1F, body))
        pos = end
    return out
