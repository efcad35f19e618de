"""build_answer(datachannel=True) / choose_application: the RFC 8841 data-channel section."""

from __future__ import annotations

import aiortc.sdp
import pytest
from proto.sdp.test_answer import CANDIDATES, FINGERPRINT, PWD, UFRAG, answer, lines, load

from appliance.proto.sdp import (
    MAX_MESSAGE_SIZE,
    SCTP_PORT,
    SdpError,
    choose_application,
    choose_audio,
    parse_offer_untrusted,
)


def section(ls: list[str], start: str) -> list[str]:
    """The lines of the m= section beginning with ``start``, up to the next m= line."""
    i = next(n for n, x in enumerate(ls) if x.startswith(start))
    end = next((n for n in range(i + 1, len(ls)) if ls[n].startswith("m=")), len(ls))
    return ls[i:end]


@pytest.mark.parametrize("name", ["chrome.sdp", "firefox.sdp"])
def test_browser_offer_gets_audio_and_data_channel_on_one_transport(name: str) -> None:
    a = answer(load(name), datachannel=True)
    ls = lines(a)
    assert a.application is not None and a.application.mid == "1"
    assert a.bundle_mids == ("0", "1") and "a=group:BUNDLE 0 1" in ls
    app = section(ls, "m=application")
    assert app[0] == "m=application 3478 UDP/DTLS/SCTP webrtc-datachannel"
    for needed in [
        "c=IN IP4 203.0.113.7",
        "a=mid:1",
        f"a=ice-ufrag:{UFRAG}",
        f"a=ice-pwd:{PWD}",
        f"a=fingerprint:{FINGERPRINT}",
        "a=setup:active",  # the same transport as the audio: we are its DTLS client
        f"a=sctp-port:{SCTP_PORT}",
        f"a=max-message-size:{MAX_MESSAGE_SIZE}",
        "a=end-of-candidates",
    ]:
        assert needed in app, needed
    assert sum(x.startswith("a=candidate:") for x in app) == len(CANDIDATES)
    # Media attributes never leak into the application section.
    assert not [x for x in app if x.startswith(("a=rtpmap", "a=rtcp-mux", "a=ssrc", "a=msid"))]
    # The audio section is unchanged by the data channel.
    assert a.text.replace("\r\n", "\n").count("m=audio 3478") == 1


def test_peer_sctp_parameters_are_read() -> None:
    chrome = parse_offer_untrusted(load("chrome.sdp"))
    plan = choose_application(chrome, choose_audio(chrome))
    assert plan is not None and (plan.sctp_port, plan.max_message_size) == (5000, 262144)
    assert plan.can_send(262144) and not plan.can_send(262145)
    firefox = parse_offer_untrusted(load("firefox.sdp"))
    plan = choose_application(firefox, choose_audio(firefox))
    assert plan is not None and plan.max_message_size == 1073741823


def test_absent_sctp_attributes_take_rfc8841_defaults() -> None:
    """RFC 8841 §5.2 (sctp-port 5000) and §6.1 (max-message-size 64 KiB; 0 = no limit)."""
    text = load("chrome.sdp").replace("a=sctp-port:5000\r\n", "")
    text = text.replace("a=max-message-size:262144\r\n", "")
    offer = parse_offer_untrusted(text)
    plan = choose_application(offer, choose_audio(offer))
    assert plan is not None and (plan.sctp_port, plan.max_message_size) == (5000, 65536)
    unlimited = parse_offer_untrusted(
        load("chrome.sdp").replace("a=max-message-size:262144", "a=max-message-size:0")
    )
    plan = choose_application(unlimited, choose_audio(unlimited))
    assert plan is not None and plan.can_send(10**9)


def test_aiortc_parses_the_answer_with_sctp() -> None:
    a = answer(load("chrome.sdp"), datachannel=True)
    desc = aiortc.sdp.SessionDescription.parse(a.text)
    app = desc.media[1]
    assert app.kind == "application" and app.port == 3478
    assert app.sctp_port == SCTP_PORT and app.sctpCapabilities is not None
    assert app.sctpCapabilities.maxMessageSize == MAX_MESSAGE_SIZE
    assert app.dtls is not None and app.dtls.role == "client"
    assert desc.group[0].items == ["0", "1"]


def test_without_datachannel_the_application_section_is_still_rejected() -> None:
    a = answer(load("chrome.sdp"))
    assert a.application is None and a.bundle_mids == ("0",)
    assert "m=application 0 UDP/DTLS/SCTP webrtc-datachannel" in lines(a)


def test_disabled_application_section_is_rejected_not_served() -> None:
    text = load("chrome.sdp").replace("m=application 9 ", "m=application 0 ")
    a = answer(text, datachannel=True)
    assert a.application is None
    assert "m=application 0 UDP/DTLS/SCTP webrtc-datachannel" in lines(a)


@pytest.mark.parametrize(
    ("old", "new", "code"),
    [
        # The pre-RFC 8841 draft spelling (Chrome < 58): a different SCTP mapping.
        (
            "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
            "m=application 9 DTLS/SCTP 5000",
            "unsupported-application",
        ),
        (
            "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
            "m=application 9 UDP/DTLS/SCTP bfcp",
            "unsupported-application",
        ),
        ("a=sctp-port:5000", "a=sctp-port:0", "bad-sctp-port"),
        ("a=group:BUNDLE 0 1", "a=group:BUNDLE 0", "not-bundled"),
    ],
)
def test_unservable_application_sections_get_a_precise_422(old: str, new: str, code: str) -> None:
    text = load("chrome.sdp")
    assert old in text
    with pytest.raises(SdpError) as info:
        answer(text.replace(old, new), datachannel=True)
    assert info.value.code == code and info.value.status == 422
    assert "application m= section 1" in info.value.detail
