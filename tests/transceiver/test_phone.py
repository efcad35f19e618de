"""From a trunk's SDP offer to working media legs: signaling's ``RelayAnswerMedia`` answers
and keeps the call, its phone ``create`` params cross a JSON round trip, the transceiver
turns them into an ``RtpLeg``, and that leg talks (SRTP or plain) with a leg keyed the way
the trunk would key it from our answer. Also the relay vouch rule of the ADR."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field

import pytest
import trio

from appliance.phone_params import PhoneParams
from appliance.proto.sdp.sdes import CryptoAttribute, CryptoSuite
from appliance.signaling.phone_media import MediaAnswer, MediaRefusal, RelayAnswerMedia
from appliance.transceiver.phone import leg_config, vouches
from appliance.transceiver.rtp_leg import RtpLeg, RtpLegConfig, SdesKeys, Transmit

TRUNK = ("203.0.113.5", 40000)
RELAY = ("198.51.100.1", 3478)
OFFER_KEY = bytes(range(30))  # AES_CM key || salt of the trunk


def offer(secure: bool) -> bytes:
    crypto = ("a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:"
              + base64.b64encode(OFFER_KEY).decode() + "\r\n") if secure else ""
    proto = "RTP/SAVP" if secure else "RTP/AVP"
    return ("v=0\r\no=trunk 1 1 IN IP4 203.0.113.5\r\ns=-\r\nc=IN IP4 203.0.113.5\r\n"
            f"t=0 0\r\nm=audio 40000 {proto} 8 0 101\r\na=rtpmap:8 PCMA/8000\r\n"
            "a=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\n"
            f"a=fmtp:101 0-15\r\n{crypto}a=sendrecv\r\n").encode()


@dataclass
class Slot:
    got: list[bytes] = field(default_factory=list)

    def handle_rtp(self, now: float, plain: bytes, ssrc: int, seq: int, ts: int,
                   marker: bool, off: int, end: int) -> None:
        self.got.append(plain[off:end])

    def poll_timeout(self) -> float | None:
        return None

    def handle_timeout(self, now: float) -> None:
        raise AssertionError("no timer was asked for")


async def answered(secure: bool) -> tuple[RelayAnswerMedia, MediaAnswer]:
    media = RelayAnswerMedia(*RELAY)
    got = await media.create("rtc_sip_" + "1" * 24, offer(secure), ("203.0.113.5", 5060),
                             "echo", {"type": "realtime", "instructions": "hi"})
    assert isinstance(got, MediaAnswer), got
    return media, got


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "sdes"])
async def test_the_answer_becomes_a_leg_that_talks_to_the_trunk(secure: bool) -> None:
    media, answer = await answered(secure)
    assert f"c=IN IP4 {RELAY[0]}" in answer.sdp and f"m=audio {RELAY[1]} " in answer.sdp
    assert "a=rtpmap:8 PCMA/8000" in answer.sdp  # the trunk's first choice
    wire = json.loads(json.dumps(media.calls["rtc_sip_" + "1" * 24].params().to_json()))
    params = PhoneParams.from_json_untrusted(wire)
    assert params.codec == "PCMA" and params.payload_type == 8 and params.dtmf_payload_type == 101
    assert params.remote == TRUNK and params.trunk_ip == "203.0.113.5"
    assert params.session["instructions"] == "hi"
    ours = RtpLeg(leg_config(params, ssrc=0x1111), 0.0)
    trunk_keys = None
    if secure:
        line = next(ln for ln in answer.sdp.split("\r\n") if ln.startswith("a=crypto:"))
        answer_key = CryptoAttribute.parse_untrusted(line[len("a=crypto:"):]).material
        assert answer_key != OFFER_KEY and params.srtp is not None
        assert "local" not in repr(params.srtp)  # keys are never in a repr
        trunk_keys = SdesKeys(CryptoSuite.AES_CM_128_HMAC_SHA1_80, OFFER_KEY, answer_key)
    trunk = RtpLeg(RtpLegConfig(remote=RELAY, ssrc=0x2222, payload_type=8,
                                dtmf_payload_type=101, srtp=trunk_keys), 0.0)
    ours.media, trunk.media = Slot(), Slot()
    for i in range(3):  # trunk -> us, then us -> trunk
        trunk.send_rtp(0.02 * i, 500 + i, 160 * i, i == 0, bytes([i]) * 160)
    for leg, peer, src in ((trunk, ours, TRUNK), (ours, trunk, RELAY)):
        if leg is ours:
            for i in range(3):
                ours.send_rtp(0.1 + 0.02 * i, 900 + i, 160 * i, i == 0, bytes([9]) * 160)
        while (out := leg.poll_output()) is not None:
            if isinstance(out, Transmit) and not out.rtcp:
                peer.handle_input(0.2, out.payload, src)
    assert isinstance(ours.media, Slot) and isinstance(trunk.media, Slot)
    assert ours.media.got == [bytes([i]) * 160 for i in range(3)]
    assert trunk.media.got == [bytes([9]) * 160] * 3
    await media.end("rtc_sip_" + "1" * 24)
    assert not media.calls


async def test_a_reinvite_keeps_our_key_and_bumps_the_version() -> None:
    media, first = await answered(True)
    again = await media.update("rtc_sip_" + "1" * 24, offer(True))
    assert isinstance(again, MediaAnswer)
    key = [ln for ln in first.sdp.split("\r\n") if ln.startswith("a=crypto")]
    assert key == [ln for ln in again.sdp.split("\r\n") if ln.startswith("a=crypto")]
    assert first.sdp.split("\r\n")[1].split()[2] == "1"
    assert again.sdp.split("\r\n")[1].split()[2] == "2"


async def test_unservable_offers_are_refused_not_raised() -> None:
    media = RelayAnswerMedia(*RELAY)
    for sdp, why in ((b"", "without an SDP offer"), (b"garbage", "unreadable"),
                     (offer(True).replace(b"AES_CM_128_HMAC_SHA1_80", b"F8_128_HMAC_SHA1_80"),
                      "crypto")):
        got = await media.create("rtc_sip_" + "2" * 24, sdp, TRUNK, "echo", {})
        assert isinstance(got, MediaRefusal) and got.status == 488 and why in got.text, got
    assert not media.calls
    await trio.lowlevel.checkpoint()


def test_vouch_rule() -> None:
    base = PhoneParams.from_json_untrusted({
        "call_id": "rtc_sip_x", "agent": "echo", "session": {}, "codec": "PCMU",
        "payload_type": 0, "clock_rate": 8000, "dtmf_payload_type": None,
        "direction": "sendrecv", "remote": ["10.0.0.5", 4000], "rtcp_mux": True,
        "remote_rtcp": None, "trunk_ip": "203.0.113.5", "srtp": None})
    assert vouches(base, None, ("10.0.0.5", 4000))  # the signalled address
    assert vouches(base, None, ("203.0.113.5", 61000))  # the trunk's NAT, any port
    assert not vouches(base, None, ("192.0.2.66", 4000))  # a stranger
    assert not vouches(base, ("203.0.113.5", 61000), ("10.0.0.5", 4000))  # latched: fixed
    assert vouches(base, ("203.0.113.5", 61000), ("203.0.113.5", 61000))


@pytest.mark.parametrize("bad", [
    {}, {"codec": "G729"}, {"remote": ["x", 1]}, {"payload_type": 300},
    {"srtp": {"suite": "AES_CM_128_HMAC_SHA1_80", "local": "!!", "remote": ""}},
    {"direction": "sideways"}, {"session": []},
])
def test_params_refuse_bad_input_with_value_error(bad: dict[str, object]) -> None:
    good = {"call_id": "c", "agent": "echo", "session": {}, "codec": "PCMU",
            "payload_type": 0, "clock_rate": 8000, "dtmf_payload_type": None,
            "direction": "sendrecv", "remote": ["10.0.0.5", 4000], "rtcp_mux": True,
            "remote_rtcp": None, "trunk_ip": "203.0.113.5", "srtp": None}
    with pytest.raises(ValueError, match="must"):
        PhoneParams.from_json_untrusted(bad if not bad else {**good, **bad})


def test_leg_config_refuses_wrong_key_sizes() -> None:
    p = PhoneParams.from_json_untrusted({
        "call_id": "c", "agent": "echo", "session": {}, "codec": "PCMU", "payload_type": 0,
        "clock_rate": 8000, "dtmf_payload_type": None, "direction": "sendrecv",
        "remote": ["10.0.0.5", 4000], "rtcp_mux": True, "remote_rtcp": None,
        "trunk_ip": "203.0.113.5",
        "srtp": {"suite": "AES_CM_128_HMAC_SHA1_80", "local": "AAAA", "remote": "AAAA"}})
    with pytest.raises(ValueError, match="bytes"):
        leg_config(p, 1)
