"""SDP for a WebRTC voice answerer: parse browser offers, write ICE-lite answers.

* :mod:`.parse` — ``parse_offer_untrusted`` (RFC 8866 and the WebRTC attribute RFCs) and
  ``parse_sdpfrag_untrusted`` (RFC 8840 trickle-ice-sdpfrag, WHIP PATCH bodies).
* :mod:`.answer` — ``choose_plans`` (``choose_audio`` / ``choose_application``) / ``build_answer`` (RFC 3264, RFC 8829 §5.3) and
  ``build_sdpfrag_answer`` (RFC 9725 §4.4.1 ICE restart).
* :mod:`.errors` — ``SdpError`` with the HTTP status to answer and a machine ``code``.

Each module's docstring lists the RFC sections it implements and those it omits. This
package never imports DTLS or SRTP (STYLE.md rule 8) and does no I/O.
"""

from __future__ import annotations

from appliance.proto.sdp.answer import (
    DATACHANNEL_FORMAT,
    MAX_MESSAGE_SIZE,
    OPUS_FMTP,
    SCTP_PORT,
    USABLE_HASHES,
    Answer,
    ApplicationPlan,
    AudioPlan,
    TransportPlan,
    answer_setup,
    build_answer,
    build_sdpfrag_answer,
    choose_application,
    choose_audio,
    choose_plans,
    host_candidate_lines,
)
from appliance.proto.sdp.errors import CODES, SdpError
from appliance.proto.sdp.model import (
    Candidate,
    Codec,
    Direction,
    Extmap,
    Fingerprint,
    Group,
    MediaKind,
    MediaSection,
    Offer,
    Origin,
    Setup,
    SsrcAttribute,
)
from appliance.proto.sdp.parse import (
    MAX_BYTES,
    MAX_LINES,
    MAX_MEDIA,
    SdpFrag,
    parse_candidate_untrusted,
    parse_offer_untrusted,
    parse_sdpfrag_untrusted,
)

__all__ = [
    "CODES",
    "DATACHANNEL_FORMAT",
    "MAX_BYTES",
    "MAX_LINES",
    "MAX_MESSAGE_SIZE",
    "MAX_MEDIA",
    "OPUS_FMTP",
    "SCTP_PORT",
    "USABLE_HASHES",
    "Answer",
    "ApplicationPlan",
    "AudioPlan",
    "Candidate",
    "Codec",
    "Direction",
    "Extmap",
    "Fingerprint",
    "Group",
    "MediaKind",
    "MediaSection",
    "Offer",
    "Origin",
    "SdpError",
    "SdpFrag",
    "Setup",
    "SsrcAttribute",
    "TransportPlan",
    "answer_setup",
    "build_answer",
    "build_sdpfrag_answer",
    "choose_application",
    "choose_audio",
    "choose_plans",
    "host_candidate_lines",
    "parse_candidate_untrusted",
    "parse_offer_untrusted",
    "parse_sdpfrag_untrusted",
]
