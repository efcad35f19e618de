"""negotiate.accept_offer (issue 39 item 4: SDP negotiation beside the call, str0m's
``accept_offer``): real browser offers (tests/proto/sdp/data) in, the answer and what the
call is made with out; no socket, no trio, no transceiver."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.proto.sdp import SdpError, Setup
from appliance.transceiver.negotiate import accept_offer

DATA = Path(__file__).resolve().parents[1] / "proto" / "sdp" / "data"
FINGERPRINT = "sha-256 " + ":".join(f"{i:02X}" for i in range(32))
UFRAG = "AbCdEfGhIjKlMnOp"
CANDIDATES = [("203.0.113.7", 3478)]


def offer(name: str) -> str:
    return (DATA / name).read_text().replace("\n", "\r\n")


def lines(text: str) -> list[str]:
    return text.split("\r\n")


@pytest.mark.parametrize(("name", "opus_pt"), [("chrome.sdp", 111), ("firefox.sdp", 109)])
def test_a_browser_offer_gets_our_credentials_ice_lite_and_its_opus(name: str,
                                                                    opus_pt: int) -> None:
    acc = accept_offer(offer(name), ufrag=UFRAG, fingerprint=FINGERPRINT,
                       candidates=CANDIDATES)
    got = lines(acc.answer.text)
    assert "a=ice-lite" in got  # RFC 8445 §2.5: the server never sends checks
    assert f"a=fingerprint:{FINGERPRINT}" in got
    assert f"a=ice-ufrag:{UFRAG}" in got and acc.ufrag == UFRAG
    assert f"a=ice-pwd:{acc.pwd}" in got and len(acc.pwd) >= 22  # RFC 8445 §5.3
    # the codec: the offer's own Opus payload type, and nothing we do not serve
    assert acc.answer.opus_pt == opus_pt
    assert f"a=rtpmap:{opus_pt} opus/48000/2" in got
    assert not any("PCMU" in x or "G722" in x for x in got)
    assert f"a=ssrc:{acc.ssrc} cname:{acc.cname}" in got
    assert "a=candidate:1 1 udp 2130706431 203.0.113.7 3478 typ host" in got


def test_each_call_gets_its_own_password_ssrc_and_cname() -> None:
    a, b = (accept_offer(offer("chrome.sdp"), ufrag=UFRAG, fingerprint=FINGERPRINT,
                         candidates=CANDIDATES) for _ in range(2))
    assert a.pwd != b.pwd and a.ssrc != b.ssrc and a.cname != b.cname


def test_dtls_role_follows_prefer_active() -> None:
    """actpass is answered active (we start DTLS) unless cookie mode asks for passive
    (docs/adr-dtls-active.md)."""
    active = accept_offer(offer("chrome.sdp"), ufrag=UFRAG, fingerprint=FINGERPRINT,
                          candidates=CANDIDATES)
    passive = accept_offer(offer("chrome.sdp"), ufrag=UFRAG, fingerprint=FINGERPRINT,
                           candidates=CANDIDATES, prefer_active=False)
    assert active.answer.setup is Setup.ACTIVE and "a=setup:active" in active.answer.text
    assert passive.answer.setup is Setup.PASSIVE and "a=setup:passive" in passive.answer.text


def test_data_channel_and_tcp_candidates_are_answered() -> None:
    acc = accept_offer(offer("chrome.sdp"), ufrag=UFRAG, fingerprint=FINGERPRINT,
                       candidates=CANDIDATES, tcp_candidates=[("203.0.113.7", 443)])
    got = lines(acc.answer.text)
    assert acc.answer.application is not None
    assert any(x.startswith("m=application 3478 UDP/DTLS/SCTP webrtc-datachannel") for x in got)
    assert any(x.endswith("203.0.113.7 443 typ host tcptype passive") for x in got)


def test_an_offer_we_cannot_answer_raises_the_sdp_error() -> None:
    with pytest.raises(SdpError) as err:
        accept_offer("v=0\r\nnot an offer\r\n", ufrag=UFRAG, fingerprint=FINGERPRINT,
                     candidates=CANDIDATES)
    assert 400 <= err.value.status < 500 and err.value.code and err.value.detail
