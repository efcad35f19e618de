"""RFC 7983 §7 (updating RFC 5764 §5.1.2): demultiplex one UDP 5-tuple by the first byte.

::

                   +----------------+
                   |        [0..3] -+--> forward to STUN
                   |                |
                   |      [16..19] -+--> forward to ZRTP      (we drop it)
                   |                |
       packet -->  |      [20..63] -+--> forward to DTLS
                   |                |
                   |      [64..79] -+--> forward to TURN Channel (we drop it)
                   |                |
                   |    [128..191] -+--> forward to RTP/RTCP
                   +----------------+

A pure function of the first byte: demultiplexing never depends on a parser failing
(STYLE.md rule 7). RTP vs RTCP is told apart by the payload type (RFC 5761 §4).
"""

from __future__ import annotations

import enum


class Kind(enum.Enum):
    STUN = "stun"
    DTLS = "dtls"
    RTP = "rtp"
    RTCP = "rtcp"
    UNKNOWN = "unknown"


def _build_table() -> tuple[Kind, ...]:
    table = []
    for b in range(256):
        if b <= 3:
            table.append(Kind.STUN)
        elif 20 <= b <= 63:
            table.append(Kind.DTLS)
        elif 128 <= b <= 191:
            table.append(Kind.RTP)  # refined to RTCP by the second byte
        else:
            table.append(Kind.UNKNOWN)
    return tuple(table)


_FIRST_BYTE: tuple[Kind, ...] = _build_table()


def classify(data: bytes | bytearray | memoryview) -> Kind:
    """Classify a datagram; empty input is ``Kind.UNKNOWN``."""
    if not data:
        return Kind.UNKNOWN
    kind = _FIRST_BYTE[data[0]]
    if kind is Kind.RTP:
        # RFC 5761 §4: RTCP packet types 192..223 (SR=200, RR=201, ... PSFB=206, XR=207)
        # occupy the second byte where RTP carries M-bit + payload type 64..95.
        if len(data) < 2:
            return Kind.UNKNOWN
        if 192 <= data[1] <= 223:
            return Kind.RTCP
    return kind


def first_byte_kind(first: int) -> Kind:
    """Coarse kind from the first byte only (RTP and RTCP both map to ``Kind.RTP``)."""
    return _FIRST_BYTE[first & 0xFF]
