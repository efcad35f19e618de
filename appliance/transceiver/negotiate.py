"""SDP negotiation of a WebRTC call, beside the call (str0m's ``accept_offer``): an offer in,
the answer out with what the call is then made with — our ICE credentials, the SSRC and
CNAME we send with, and the codec and transport the answer chose (:class:`Accepted`).

Pure: no trio, no socket, no clock; what rotates or is secret by the transceiver (the
server ufrag, which carries the routing MAC; the DTLS certificate's fingerprint; whether
DTLS cookie mode is on) is passed in, and what is the call's own (ICE password, SSRC,
CNAME, the SDP session id) is minted here. The control op (ops.py ``_op_create``) turns
the errors into control answers and makes the call from the result.

Parsing and building are ``proto/sdp``'s (RFC 8829 JSEP, RFC 8839 ICE, RFC 8842 setup,
RFC 8841 data channels); this module only decides what a transceiver answers with.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from appliance.proto.sdp import Answer, build_answer, parse_offer_untrusted


@dataclass(frozen=True, slots=True)
class Accepted:
    """An accepted offer: the answer (``answer.text`` is what signaling returns; the rest is
    what the answer chose, for the call) and the values minted for this call."""

    answer: Answer
    ufrag: str  # our ICE ufrag (the caller's: it is the routing hint)
    pwd: str  # our ICE password
    ssrc: int  # the SSRC we send audio with
    cname: str  # our RTCP CNAME


def ice_pwd() -> str:
    """A new ICE password."""
    # RFC 8445 §5.3: >= 128 bits, ICE characters; base64 of 18 bytes is 24 of them.
    return base64.b64encode(secrets.token_bytes(18)).decode()


def accept_offer(offer_text: str, *, ufrag: str, fingerprint: str,
                 candidates: Sequence[tuple[str, int]],
                 tcp_candidates: Sequence[tuple[str, int]] = (),
                 prefer_active: bool = True) -> Accepted:
    """Answer a client's offer as an ICE-lite server with a data channel: ``ufrag`` and
    ``fingerprint`` are ours (the DTLS certificate's ``sha-256 AB:…``), ``candidates`` the
    public UDP addresses to advertise and ``tcp_candidates`` the ICE-TCP passive ones.

    ``prefer_active``: answer ``actpass`` with ``a=setup:active`` (we start DTLS, one round
    trip sooner); False while DTLS cookie mode is on, so that the client starts it and
    admission.py bounds what it costs (docs/adr-dtls-active.md).

    Raises :class:`~appliance.proto.sdp.SdpError` (its ``status``, ``code`` and ``detail``
    name the problem) for an offer we cannot answer, and
    :class:`~appliance.proto.errors.LocalProtocolError` for an ``a=setup`` with no answer.
    """
    pwd = ice_pwd()
    ssrc, cname = secrets.randbits(32), secrets.token_hex(8)
    offer = parse_offer_untrusted(offer_text)
    answer = build_answer(
        offer, ice_ufrag=ufrag, ice_pwd=pwd, fingerprint=fingerprint,
        candidates=candidates, ssrc=ssrc, cname=cname,
        session_id=secrets.randbits(62), datachannel=True, tcp_candidates=tcp_candidates,
        prefer_active=prefer_active,
    )
    return Accepted(answer, ufrag, pwd, ssrc, cname)
