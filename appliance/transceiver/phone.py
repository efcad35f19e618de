"""The transceiver's half of a phone call's media, the pure part: what a phone ``create``
control op's params (``appliance/phone_params.py``) become — the :class:`~.rtp_leg.RtpLeg`
configuration — and the relay's vouch rule for the call's sources (docs/adr-sip-media.md,
"Latching, restricted").

::

    signaling PhoneMedia ── create {leg: phone, PhoneParams} ──► leg_config() ──► RtpLeg
                                                            │ + PcmPipeline + the agent:
                                                            │   phone_session.PhoneSession
    relay look-up for an unknown source ─────────────────► vouches(params, latched, src)

The session and its ops live in ``phone_session.py`` and ``ops.py`` (``_op_phone_*``).
"""

from __future__ import annotations

from ..phone_params import PhoneParams
from ..proto.sdp.sdes import CryptoSuite
from .rtp_leg import Address, RtpLegConfig, SdesKeys


def leg_config(params: PhoneParams, ssrc: int) -> RtpLegConfig:
    """The leg for this call; raises ValueError (unknown suite, bad key sizes, a payload
    type the RFC 5761 demux cannot carry)."""
    keys = None
    if params.srtp is not None:
        try:
            suite = CryptoSuite(params.srtp.suite)
        except ValueError:
            raise ValueError(f"unknown SRTP suite {params.srtp.suite!r}") from None
        try:
            keys = SdesKeys(suite, params.srtp.local, params.srtp.remote)
        except Exception as exc:  # LocalProtocolError: the sizes do not fit the suite
            raise ValueError(str(exc)) from None
    try:
        return RtpLegConfig(
            remote=params.remote, ssrc=ssrc, payload_type=params.payload_type,
            clock_rate=params.clock_rate, dtmf_payload_type=params.dtmf_payload_type,
            srtp=keys, rtcp_mux=params.rtcp_mux, remote_rtcp=params.remote_rtcp)
    except Exception as exc:  # LocalProtocolError from the config's own checks
        raise ValueError(str(exc)) from None


def vouches(params: PhoneParams, latched: Address | None, src: Address) -> bool:
    """Whether the owning transceiver answers VOUCH for ``src`` (ADR "Latching,
    restricted"): once latched only the latched address; before, the signalled RTP (or
    RTCP) address, or any port of the IP the call's SIP came from (the NAT case)."""
    if latched is not None:
        return src == latched
    if src == params.remote or (params.remote_rtcp is not None and src == params.remote_rtcp):
        return True
    return src[0] == params.trunk_ip
