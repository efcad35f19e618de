"""RTP and RTCP for one audio stream: codecs, statistics, NTP arithmetic.

* :mod:`.packet` — ``RtpPacket`` (RFC 3550 §5.1); ``rtp_header`` and
  ``rtp_header_fields_untrusted`` for the per-packet hot path (the one place an RTP header
  is packed); RFC 8285 header-extension elements.
* :mod:`.rtcp` — compound RTCP: SR, RR, SDES, BYE (RFC 3550 §6), generic NACK and PLI
  (RFC 4585 §6); everything else kept raw.
* :mod:`.stats` — ``ReceptionStats`` (RFC 3550 A.1/A.3/A.8), ``SenderStats``, NTP helpers
  and RTT (§6.4.1).

Packets here are plaintext: SRTP protection is a separate layer. No I/O, no clock.
"""

from __future__ import annotations

from appliance.proto.rtp.errors import RtpError
from appliance.proto.rtp.packet import (
    RtpPacket,
    parse_header_extensions_untrusted,
    rtp_header,
    rtp_header_fields_untrusted,
)
from appliance.proto.rtp.rtcp import (
    ReportBlock,
    RtcpBye,
    RtcpFeedback,
    RtcpNack,
    RtcpPacket,
    RtcpPli,
    RtcpReceiverReport,
    RtcpSdes,
    RtcpSenderReport,
    RtcpType,
    RtcpUnknown,
    SdesChunk,
    SdesItem,
    parse_rtcp_untrusted,
    serialize_rtcp,
)
from appliance.proto.rtp.stats import (
    NTP_UNIX_OFFSET,
    ReceptionStats,
    SenderStats,
    compact_ntp,
    ntp_from_unix,
    rtt_from_compact,
    rtt_from_report_block,
    unix_from_ntp,
)

__all__ = [
    "NTP_UNIX_OFFSET",
    "ReceptionStats",
    "ReportBlock",
    "RtcpBye",
    "RtcpFeedback",
    "RtcpNack",
    "RtcpPacket",
    "RtcpPli",
    "RtcpReceiverReport",
    "RtcpSdes",
    "RtcpSenderReport",
    "RtcpType",
    "RtcpUnknown",
    "RtpError",
    "RtpPacket",
    "SdesChunk",
    "SdesItem",
    "SenderStats",
    "compact_ntp",
    "ntp_from_unix",
    "parse_header_extensions_untrusted",
    "parse_rtcp_untrusted",
    "rtp_header",
    "rtp_header_fields_untrusted",
    "rtt_from_compact",
    "rtt_from_report_block",
    "serialize_rtcp",
    "unix_from_ntp",
]
