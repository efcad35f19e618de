"""build_answer(datachannel=True) / choose_application: the RFC 8841 data-channel section."""

from __future__ import annotations

import aiortc.sdp
import pytest
from proto.sdp.test_answer import CANDIDATES, FINGERPRINT, PWD, UFRAG, answer, lines, load

from appliance.proto.sdp import (
    MAX_MESSAGE_SIZE,
    SCTP_PORT,
    SdpError,
    Setup,
    choose_application,
    choose_audio,
    choose_plans,
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


# -- data-only sessions: an offer with only an application section (RFC 8841, no audio) ------


def test_data_only_offer_gets_the_application_section_alone() -> None:
    a = answer(load("chrome-data-only.sdp"), datachannel=True)
    ls = lines(a)
    assert a.plan is None and a.application is not None and a.application.mid == "0"
    assert (a.audio_mid, a.audio_index, a.opus_pt, a.opus_fmtp, a.direction) == (
        None, None, None, None, None)
    # The application section carries the transport: the peer's ICE and DTLS from it.
    assert a.transport.section is a.application.section
    assert (a.transport.ice_ufrag, a.transport.setup) == ("Qx7k", Setup.ACTPASS)
    assert a.transport.bundled and a.bundle_mids == ("0",) and "a=group:BUNDLE 0" in ls
    assert [x for x in ls if x.startswith("m=")] == [
        "m=application 3478 UDP/DTLS/SCTP webrtc-datachannel"]
    assert a.dtls_client  # actpass: we start DTLS, data-only or not (RFC 8842 §5.3)
    for needed in [f"a=ice-ufrag:{UFRAG}", f"a=fingerprint:{FINGERPRINT}", "a=setup:active",
                   f"a=sctp-port:{SCTP_PORT}", f"a=max-message-size:{MAX_MESSAGE_SIZE}",
                   "a=mid:0", "a=end-of-candidates"]:
        assert needed in ls, needed
    assert not [x for x in ls if x.startswith(("a=rtpmap", "a=ssrc", "a=msid:", "a=sendrecv"))]
    # The ICE restart sdpfrag repeats the application line (RFC 8840 §9).
    assert a.media_line == "m=application 9 UDP/DTLS/SCTP webrtc-datachannel"
    assert a.transport_mid == "0"


def test_aiortc_parses_a_data_only_answer() -> None:
    desc = aiortc.sdp.SessionDescription.parse(answer(load("chrome-data-only.sdp"),
                                                      datachannel=True).text)
    assert [m.kind for m in desc.media] == ["application"]
    app = desc.media[0]
    # a=setup:active: aiortc reads it as our DTLS role, the client (RFC 8842 §5.3).
    assert app.sctp_port == SCTP_PORT and app.dtls is not None and app.dtls.role == "client"
    assert desc.group[0].items == ["0"]


def test_data_only_without_bundle_is_served_unbundled() -> None:
    text = load("chrome-data-only.sdp").replace("a=group:BUNDLE 0\r\n", "")
    a = answer(text, datachannel=True)
    assert a.plan is None and a.bundle_mids == () and "a=group" not in a.text


def test_data_only_with_disabled_audio_rejects_the_audio_in_place() -> None:
    """Port 0 disables the audio (RFC 3264 §8.2): the application is served alone and the
    audio is echoed rejected, in order (§6)."""
    a = answer(load("chrome.sdp").replace("m=audio 9 ", "m=audio 0 "), datachannel=True)
    ls = lines(a)
    assert a.plan is None and a.application is not None and a.application.mid == "1"
    assert [x for x in ls if x.startswith("m=")] == [
        "m=audio 0 UDP/TLS/RTP/SAVPF 111 63 9 0 8 13 110 126",
        "m=application 3478 UDP/DTLS/SCTP webrtc-datachannel"]
    assert a.bundle_mids == ("1",)


def test_data_only_needs_datachannel() -> None:
    """Without ``datachannel`` nothing in a data-only offer is servable: ``no-audio``."""
    with pytest.raises(SdpError) as info:
        answer(load("chrome-data-only.sdp"))
    assert info.value.code == "no-audio"


def test_unservable_audio_is_not_dropped_to_serve_data_only() -> None:
    """An enabled audio section we cannot serve keeps its precise code even beside an
    application section: the caller asked for audio."""
    # Neither Opus nor the G.711 fallback (static pts 0 and 8 dropped too, RFC 3551).
    no_opus = (load("chrome.sdp").replace("opus/48000/2", "opus/48000")
               .replace(" 9 0 8 13 ", " 9 13 ").replace("a=rtpmap:0 PCMU/8000\r\n", "")
               .replace("a=rtpmap:8 PCMA/8000\r\n", ""))
    with pytest.raises(SdpError) as info:
        answer(no_opus, datachannel=True)
    assert info.value.code == "no-opus"


@pytest.mark.parametrize(
    ("old", "new", "code"),
    [
        ("UDP/DTLS/SCTP webrtc-datachannel", "DTLS/SCTP 5000", "unsupported-application"),
        ("UDP/DTLS/SCTP webrtc-datachannel", "UDP/DTLS/SCTP bfcp", "unsupported-application"),
        ("a=sctp-port:5000", "a=sctp-port:0", "bad-sctp-port"),
        ("a=setup:actpass", "a=setup:holdconn", "bad-setup"),
        ("a=ice-pwd:V2uK1d3mFTcLXTq7Z5c0i9yP\r\n", "", "no-ice-credentials"),
        ("a=fingerprint:sha-256 93:90:EF:32:AD:DF:32:BF:DE:A7:86:BC:1E:20:67:95:92:49:80:68:"
         "BC:BF:CD:35:7E:A1:0A:B6:4E:A3:5E:47\r\n", "", "no-fingerprint"),
        ("m=application 9 ", "m=application 0 ", "no-audio"),
    ],
)
def test_bad_data_only_offers_get_a_precise_422(old: str, new: str, code: str) -> None:
    text = load("chrome-data-only.sdp")
    assert old in text
    with pytest.raises(SdpError) as info:
        answer(text.replace(old, new), datachannel=True)
    assert info.value.code == code and info.value.status == 422


def test_choose_plans_fails_fast_for_both_shapes() -> None:
    audio, app, transport = choose_plans(parse_offer_untrusted(load("chrome.sdp")))
    assert audio is not None and app is not None and transport is audio.transport
    audio, app, transport = choose_plans(parse_offer_untrusted(load("chrome-data-only.sdp")))
    assert audio is None and app is not None and transport.section is app.section
