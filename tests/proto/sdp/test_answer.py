"""build_answer / choose_audio: what we serve, what we reject, and that peers accept it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiortc.sdp
import pytest

from appliance.proto.errors import LocalProtocolError
from appliance.proto.sdp import (
    OPUS_FMTP,
    Answer,
    Direction,
    SdpError,
    Setup,
    answer_setup,
    build_answer,
    choose_audio,
    parse_offer_untrusted,
)

DATA = Path(__file__).parent / "data"
FINGERPRINT = "sha-256 " + ":".join(f"{i:02X}" for i in range(32))
UFRAG = "AAEB+kq9x0"
PWD = "p" * 24
CANDIDATES = [("203.0.113.7", 3478), ("2001:db8::7", 3478)]


def load(name: str) -> str:
    return (DATA / name).read_text().replace("\n", "\r\n")


def answer(text: str, **overrides: Any) -> Answer:
    kwargs: dict[str, Any] = dict(
        ice_ufrag=UFRAG,
        ice_pwd=PWD,
        fingerprint=FINGERPRINT,
        candidates=CANDIDATES,
        ssrc=0x12345678,
        cname="appliance-cname",
        session_id=4242,
    )
    kwargs.update(overrides)
    return build_answer(parse_offer_untrusted(text), **kwargs)


def lines(a: Answer) -> list[str]:
    assert a.text.endswith("\r\n") and "\n" not in a.text.replace("\r\n", "")
    return a.text.split("\r\n")[:-1]


def test_chromium_answer_shape() -> None:
    a = answer(load("chrome.sdp"))
    ls = lines(a)
    assert ls[:5] == ["v=0", "o=- 4242 1 IN IP4 0.0.0.0", "s=-", "t=0 0", "a=ice-lite"]
    assert "a=group:BUNDLE 0" in ls  # the data channel is not bundled: it is rejected
    assert (a.audio_mid, a.audio_index, a.opus_pt, a.telephone_event_pt) == ("0", 0, 111, 110)
    assert a.opus_fmtp == OPUS_FMTP == "minptime=10;useinbandfec=1"
    assert a.bundle_mids == ("0",) and a.rtcp_rsize and a.direction is Direction.SENDRECV
    m_lines = [x for x in ls if x.startswith("m=")]
    # RFC 3264 §6: same number of m= lines, same order; Opus first, telephone-event next.
    assert m_lines == [
        "m=audio 3478 UDP/TLS/RTP/SAVPF 111 110",
        "m=application 0 UDP/DTLS/SCTP webrtc-datachannel",
    ]
    audio = ls[ls.index(m_lines[0]) : ls.index(m_lines[1])]
    for needed in [
        "c=IN IP4 203.0.113.7",
        "a=mid:0",
        f"a=ice-ufrag:{UFRAG}",
        f"a=ice-pwd:{PWD}",
        f"a=fingerprint:{FINGERPRINT}",
        "a=setup:active",  # RFC 8842 §5.3: to actpass we answer active (DTLS client)
        "a=sendrecv",
        "a=rtcp-mux",
        "a=rtpmap:111 opus/48000/2",
        "a=fmtp:111 minptime=10;useinbandfec=1",
        "a=rtpmap:110 telephone-event/48000",
        f"a=ssrc:{0x12345678} cname:appliance-cname",
        "a=end-of-candidates",
    ]:
        assert needed in audio, needed
    assert audio.index("a=rtpmap:111 opus/48000/2") < audio.index(
        "a=rtpmap:110 telephone-event/48000"
    )
    cands = [x for x in audio if x.startswith("a=candidate:")]
    assert cands == [
        "a=candidate:1 1 udp 2130706431 203.0.113.7 3478 typ host",
        "a=candidate:2 1 udp 2130706175 2001:db8::7 3478 typ host",
    ]
    assert a.plan is not None
    assert a.plan.remote_ssrc == 3046219543 and a.plan.send_fec and not a.plan.send_stereo
    # The rejected data section keeps its mid and carries no transport.
    rejected = ls[ls.index(m_lines[1]) :]
    assert "a=mid:1" in rejected and not any("ice-ufrag" in x for x in rejected)


def test_candidate_priority_formula() -> None:
    """RFC 8445 §5.1.2.1 with type preference 126 (host), component 1."""
    a = answer(load("chrome.sdp"))
    prios = [int(x.split()[3]) for x in lines(a) if x.startswith("a=candidate:")]
    assert prios == [(126 << 24) + (65535 << 8) + 255, (126 << 24) + (65534 << 8) + 255]


def test_firefox_answer() -> None:
    a = answer(load("firefox.sdp"))
    assert (a.opus_pt, a.telephone_event_pt, a.audio_mid) == (109, 101, "0")
    assert "a=fmtp:101 0-15" in lines(a)
    plan = a.plan
    assert plan is not None
    assert plan.fingerprints[0].algorithm == "sha-256"  # from session level
    assert plan.ice_ufrag == "8f3e2a1b" and len(plan.candidates) == 4
    assert plan.send_stereo and plan.send_fec


def test_answer_parses_with_our_parser() -> None:
    for name in ("chrome.sdp", "firefox.sdp", "chrome-audio-only.sdp"):
        a = answer(load(name))
        again = parse_offer_untrusted(a.text)
        audio = again.media[a.audio_index]
        assert again.ice_lite and audio.setup is Setup.ACTIVE and a.dtls_client
        assert audio.codecs[0].name == "opus" and audio.codecs[0].pt == a.opus_pt
        assert all(m.port == 0 for m in again.media if m is not audio)


@pytest.mark.interop
@pytest.mark.parametrize("name", ["chrome.sdp", "firefox.sdp", "chrome-audio-only.sdp"])
def test_aiortc_parses_our_answer(name: str) -> None:
    a = answer(load(name))
    desc = aiortc.sdp.SessionDescription.parse(a.text)
    audio = desc.media[a.audio_index]
    assert audio.kind == "audio" and audio.port == 3478
    assert audio.dtls is not None and audio.dtls.role == "client"  # we answered active
    assert audio.dtls.fingerprints[0].algorithm == "sha-256"
    assert audio.ice is not None and audio.ice.usernameFragment == UFRAG
    assert audio.rtcp_mux and audio.direction == "sendrecv"
    codec = audio.rtp.codecs[0]
    assert (codec.mimeType, codec.clockRate, codec.channels, codec.payloadType) == (
        "audio/opus",
        48000,
        2,
        a.opus_pt,
    )
    assert codec.parameters == {"minptime": 10, "useinbandfec": 1}
    assert [c.ip for c in audio.ice_candidates] == ["203.0.113.7", "2001:db8::7"]
    assert audio.ice_candidates_complete
    assert [g.items for g in desc.group] == [list(a.bundle_mids)]
    assert all(m.port == 0 for m in desc.media if m is not audio)


@pytest.mark.parametrize(
    ("offered", "answered"),
    [
        ("sendrecv", "sendrecv"),
        ("recvonly", "sendonly"),
        ("sendonly", "recvonly"),
        ("inactive", "inactive"),
    ],
)
def test_direction_is_reversed(offered: str, answered: str) -> None:
    a = answer(load("chrome.sdp").replace("a=sendrecv", f"a={offered}"))
    assert a.direction.value == answered and f"a={answered}" in lines(a)
    # Our SSRC is only announced when we send.
    assert (f"a=ssrc:{0x12345678} cname:appliance-cname" in lines(a)) == (
        answered in ("sendrecv", "sendonly")
    )


def test_video_first_and_second_audio_are_rejected_in_order() -> None:
    chrome = load("chrome-audio-only.sdp")
    head, audio = chrome.split("m=audio", 1)
    video = (
        "m=video 9 UDP/TLS/RTP/SAVPF 96 97\r\nc=IN IP4 0.0.0.0\r\na=mid:v\r\n"
        "a=rtpmap:96 VP8/90000\r\na=rtpmap:97 rtx/90000\r\na=fmtp:97 apt=96\r\n"
    )
    audio2 = "m=audio" + audio.replace("a=mid:0", "a=mid:1").replace("3046219543", "11")
    text = head.replace("BUNDLE 0", "BUNDLE v 0 1") + video + "m=audio" + audio + audio2
    a = answer(text)
    ls = lines(a)
    assert [x for x in ls if x.startswith("m=")] == [
        "m=video 0 UDP/TLS/RTP/SAVPF 96 97",
        "m=audio 3478 UDP/TLS/RTP/SAVPF 111 110",
        "m=audio 0 UDP/TLS/RTP/SAVPF 111 63 9 0 8 13 110 126",
    ]
    assert a.audio_index == 1 and a.bundle_mids == ("0",)
    assert "a=group:BUNDLE 0" in ls
    desc = aiortc.sdp.SessionDescription.parse(a.text)
    assert [m.port for m in desc.media] == [0, 3478, 0]


def test_bundle_only_audio_inherits_transport_from_tag() -> None:
    """RFC 8843 §7.2.1: a bundle-only section has port 0 and no transport attributes."""
    chrome = load("chrome.sdp")
    head, audio = chrome.split("m=audio", 1)
    audio, data = audio.split("m=application", 1)
    data = "m=application" + data  # tagged: first in the BUNDLE group
    stripped = "\r\n".join(
        x
        for x in audio.split("\r\n")
        if not x.startswith(("a=ice-", "a=fingerprint", "a=setup", "a=rtcp-mux"))
    )
    stripped = stripped.replace(" 9 UDP/TLS", " 0 UDP/TLS", 1) + "a=bundle-only\r\n"
    data = data.replace("a=mid:1", "a=mid:1\r\na=rtcp-mux")
    text = head.replace("BUNDLE 0 1", "BUNDLE 1 0") + data + "m=audio" + stripped
    a = answer(text)
    assert a.audio_mid == "0" and a.transport.ice_ufrag == "Qx7k"
    assert a.transport.setup is Setup.ACTPASS


def _err(text: str) -> SdpError:
    with pytest.raises(SdpError) as info:
        answer(text)
    assert info.value.status == 422
    return info.value


def test_unservable_offers_are_422_with_codes() -> None:
    chrome = load("chrome.sdp")
    no_audio = chrome.replace("m=audio 9 ", "m=audio 0 ")
    assert _err(no_audio).code == "no-audio"
    # No Opus and no G.711 fallback (PCMU/PCMA, RFC 3551) either.
    no_opus = re.sub(r"a=rtpmap:(111 opus/48000/2|0 PCMU/8000|8 PCMA/8000)\r\n", "",
                     chrome).replace(" 111 63 9 0 8 13 ", " 111 63 9 13 ")
    assert _err(no_opus).code == "no-opus"
    mono_opus = no_opus.replace("a=fmtp:111", "a=rtpmap:111 opus/48000\r\na=fmtp:111")
    assert _err(mono_opus).code == "no-opus"
    plain = chrome.replace("UDP/TLS/RTP/SAVPF 111", "RTP/AVP 111")
    assert _err(plain).code == "unsupported-proto"
    no_fp = re.sub(r"a=fingerprint:[^\r]*\r\n", "", chrome)
    assert _err(no_fp).code == "no-fingerprint"
    sha1_only = re.sub(
        r"a=fingerprint:[^\r]*", "a=fingerprint:sha-1 " + ":".join(["AA"] * 20), chrome
    )
    assert _err(sha1_only).code == "no-fingerprint"
    no_ice = re.sub(r"a=ice-pwd:[^\r]*\r\n", "", chrome)
    err = _err(no_ice)
    assert err.code == "no-ice-credentials" and "ice-pwd" in err.detail
    holdconn = chrome.replace("a=setup:actpass", "a=setup:holdconn")
    assert _err(holdconn).code == "bad-setup"
    no_mux = chrome.replace("a=rtcp-mux\r\n", "")
    assert _err(no_mux).code == "no-rtcp-mux"
    video_only = chrome.replace("m=audio", "m=video")
    assert _err(video_only).code == "no-audio"


def test_active_and_absent_setup_are_served() -> None:
    chrome = load("chrome-audio-only.sdp")
    active = answer(chrome.replace("actpass", "active"))
    assert active.plan.setup is Setup.ACTIVE
    # RFC 8842 §5.3: the offerer is the DTLS client, so we fall back to passive.
    assert active.setup is Setup.PASSIVE and not active.dtls_client
    assert "a=setup:passive" in lines(active) and "a=setup:active" not in lines(active)
    # RFC 4145 §4.1: absent means active.
    absent = answer(chrome.replace("a=setup:actpass\r\n", ""))
    assert absent.plan.setup is Setup.ACTIVE and absent.setup is Setup.PASSIVE


def test_setup_roles() -> None:
    """RFC 8842 §5.3: actpass is answered active (we start DTLS) unless the caller prefers
    passive; a passive offer (the offerer wants to be the server) is answered active."""
    chrome = load("chrome-audio-only.sdp")
    a = answer(chrome)
    assert a.plan.setup is Setup.ACTPASS and a.setup is Setup.ACTIVE and a.dtls_client
    assert "a=setup:active" in lines(a)
    passive_pref = answer(chrome, prefer_active=False)
    assert passive_pref.setup is Setup.PASSIVE and "a=setup:passive" in lines(passive_pref)
    offered_passive = answer(chrome.replace("a=setup:actpass", "a=setup:passive"))
    assert offered_passive.setup is Setup.ACTIVE and offered_passive.dtls_client
    forced = answer(chrome.replace("a=setup:actpass", "a=setup:passive"), prefer_active=False)
    assert forced.setup is Setup.ACTIVE  # no choice: someone must be the client
    assert answer_setup(Setup.ACTPASS) is Setup.ACTIVE
    assert answer_setup(Setup.ACTPASS, prefer_active=False) is Setup.PASSIVE
    assert answer_setup(Setup.ACTIVE) is Setup.PASSIVE
    assert answer_setup(Setup.PASSIVE) is Setup.ACTIVE
    with pytest.raises(LocalProtocolError):
        answer_setup(Setup.HOLDCONN)


def test_choose_audio_fails_fast_without_credentials() -> None:
    plan = choose_audio(parse_offer_untrusted(load("firefox.sdp")))
    assert plan.mid == "0" and plan.opus.pt == 109 and plan.bundled


def test_no_bundle_in_offer_means_none_in_answer() -> None:
    text = load("chrome-audio-only.sdp").replace("a=group:BUNDLE 0\r\n", "")
    a = answer(text)
    assert a.bundle_mids == () and not any(x.startswith("a=group") for x in lines(a))


def test_no_candidates_uses_placeholder_address() -> None:
    a = answer(load("chrome.sdp"), candidates=[])
    assert "m=audio 9 UDP/TLS/RTP/SAVPF 111 110" in lines(a)
    assert "c=IN IP4 0.0.0.0" in lines(a)


def test_ipv6_first_candidate_sets_ip6_connection() -> None:
    a = answer(load("chrome.sdp"), candidates=[("2001:db8::7", 3478)])
    assert "c=IN IP6 2001:db8::7" in lines(a)


@pytest.mark.parametrize(
    "bad",
    [
        {"ice_ufrag": "ab"},
        {"ice_ufrag": "ab cd"},
        {"ice_pwd": "short"},
        {"fingerprint": "sha-1 AB:CD"},
        {"fingerprint": FINGERPRINT.lower()},
        {"candidates": [("relay.example", 3478)]},
        {"candidates": [("203.0.113.7", 0)]},
        {"ssrc": 2**32},
        {"session_id": 2**63},
        {"cname": "has space"},
        {"cname": ""},
    ],
)
def test_local_misuse_is_local_protocol_error(bad: dict[str, Any]) -> None:
    with pytest.raises(LocalProtocolError):
        answer(load("chrome.sdp"), **bad)


@pytest.mark.parametrize(("law", "pt"), [("PCMU", 0), ("PCMA", 8)])
def test_g711_alone_is_answered(law: str, pt: int) -> None:
    """An offer with no Opus but G.711 (RFC 3551 §4.5.14) gets that law, with no fmtp, and
    the 8 kHz telephone-event (RFC 4733 §2.1: the audio's clock); Opus still wins when both
    are offered (the tests above)."""
    chrome = load("chrome.sdp")
    other = "PCMA" if law == "PCMU" else "PCMU"
    offer = re.sub(rf"a=rtpmap:(111 opus/48000/2|\d+ {other}/8000)\r\na=fmtp:111 [^\r]*\r\n|"
                   rf"a=rtpmap:\d+ {other}/8000\r\n", "", chrome)
    offer = offer.replace(" 111 63 9 0 8 13 ", f" 63 9 {pt} 13 ")
    offer = re.sub(r"a=rtpmap:111 opus/48000/2\r\n", "", offer)
    a = answer(offer)
    assert a.plan.codec_name == law.lower() and a.opus_pt == pt and a.opus_fmtp == ""
    assert f"a=rtpmap:{pt} {law}/8000\r\n" in a.text
    assert "opus" not in a.text and f"a=fmtp:{pt}" not in a.text
    assert a.telephone_event_pt == 126
    assert re.search(rf"^m=audio \d+ UDP/TLS/RTP/SAVPF {pt} 126\r$", a.text, re.M)
