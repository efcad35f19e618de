"""Signaling's ``TransceiverPhoneMedia`` with fake transceiver control clients (no I/O): a
phone call is placed like a WebRTC call (least loaded first, phone calls counted, a 503
tries the next), its ``create`` (leg ``phone``) carries the PhoneParams, ``update``/``dtmf``/``end``
reach the transceiver that has it, and ``events`` answers become listener calls."""

from __future__ import annotations

from typing import Any

import trio

from appliance.phone_params import PhoneParams
from appliance.signaling.phone_media import MediaAnswer, MediaRefusal, TransceiverPhoneMedia
from appliance.signaling.state import SignalingConfig, SignalingState

OFFER = (b"v=0\r\no=trunk 1 1 IN IP4 203.0.113.5\r\ns=-\r\nc=IN IP4 203.0.113.5\r\nt=0 0\r\n"
         b"m=audio 40000 RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
         b"a=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n")
HOLD = OFFER.replace(b"a=sendrecv", b"a=sendonly")


class FakeTransceiver:
    def __init__(self, k: int, answers: list[dict[str, Any]] | None = None) -> None:
        self.k = k
        self.got: list[dict[str, Any]] = []
        self.answers = answers or []

    async def request(self, req: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self.got.append(req)
        return self.answers.pop(0) if self.answers else {"ok": True}


class Listener:
    def __init__(self) -> None:
        self.ended: list[tuple[str, str]] = []
        self.digits: list[tuple[str, str, int]] = []

    def media_ended(self, call_id: str, reason: str) -> None:
        self.ended.append((call_id, reason))

    def dtmf(self, call_id: str, digit: str, duration_ms: int) -> None:
        self.digits.append((call_id, digit, duration_ms))


def setup(*fakes: FakeTransceiver) -> tuple[TransceiverPhoneMedia, Listener]:
    st = SignalingState(SignalingConfig(
        transceivers={f.k: f"127.0.0.1:{9000 + f.k}" for f in fakes},
        public_addresses=["198.51.100.7"], udp_port=3478))
    for f in fakes:
        st.transceivers[f.k].client = f  # type: ignore[assignment]
    media = TransceiverPhoneMedia(st)
    listener = Listener()
    media.bind(listener)
    return media, listener


async def test_a_call_is_placed_least_loaded_first_and_a_503_tries_the_next() -> None:
    busy = FakeTransceiver(0, [{"ok": False, "status": 503, "code": "overloaded",
                                "detail": "no headroom"}])
    free = FakeTransceiver(1)
    media, _ = setup(busy, free)
    got = await media.create("rtc_sip_" + "1" * 24, OFFER, ("203.0.113.5", 5060), "echo",
                             {"instructions": "hi"})
    assert isinstance(got, MediaAnswer)
    assert "c=IN IP4 198.51.100.7" in got.sdp and "m=audio 3478 RTP/AVP 0 101" in got.sdp
    assert [r["op"] for r in busy.got] == ["create"]
    [req] = free.got
    params = PhoneParams.from_json_untrusted(req["phone"])
    assert req["session_id"] == "rtc_sip_" + "1" * 24 and params.remote == ("203.0.113.5", 40000)
    assert params.trunk_ip == "203.0.113.5" and params.session == {"instructions": "hi"}
    assert media.where == {"rtc_sip_" + "1" * 24: 1}
    # the next call: transceiver 1 holds a phone call now, so 0 comes first
    await media.create("rtc_sip_" + "2" * 24, OFFER, ("203.0.113.5", 5060), "echo", {})
    assert media.where["rtc_sip_" + "2" * 24] == 0


async def test_no_transceiver_is_a_503_refusal_and_forgets_the_answer() -> None:
    media, _ = setup(FakeTransceiver(0, [{"ok": False, "status": 503, "code": "full",
                                          "detail": "500 sessions is the limit"}]))
    got = await media.create("rtc_sip_" + "3" * 24, OFFER, ("203.0.113.5", 5060), "echo", {})
    assert isinstance(got, MediaRefusal) and got.status == 503 and "limit" in got.text
    assert media.sdp.calls == {} and media.where == {}


async def test_update_dtmf_and_end_go_to_the_transceiver_that_has_the_call() -> None:
    t = FakeTransceiver(0)
    media, _ = setup(t)
    cid = "rtc_sip_" + "4" * 24
    await media.create(cid, OFFER, ("203.0.113.5", 5060), "echo", {})
    held = await media.update(cid, HOLD)
    assert isinstance(held, MediaAnswer) and "a=recvonly" in held.sdp
    await media.dtmf(cid, "9", 120)
    await media.end(cid)
    await media.end(cid)  # idempotent: nothing more is sent
    ops = [(r["op"], r.get("phone", {}).get("direction"), r.get("digit")) for r in t.got]
    assert ops == [("create", "sendrecv", None), ("patch", "recvonly", None),
                   ("dtmf", None, "9"), ("delete", None, None),
                   ("get", None, None)]  # the ended session object, for the report
    assert t.got[1]["answered"] is False  # a re-INVITE's leg options, not an answer
    assert media.where == {}


async def test_end_returns_the_ended_session_object_even_after_the_media_ended_first() -> None:
    """The end-of-call report's stats and transcript come from the transceiver's ended
    session object: end() fetches it with get, also when the media ended the call
    (an ``ended`` event came first and the call is no longer placed)."""
    session = {"id": "x", "transcript": [{"who": "agent", "text": "hi", "at": 1.0}],
               "phone": {"leg": {"rtp_in": 7}}}
    t = FakeTransceiver(0, [{"ok": True}, {"ok": True}, {"ok": True, "session": session}])
    media, listener = setup(t)
    cid = "rtc_sip_" + "7" * 24
    await media.create(cid, OFFER, ("203.0.113.5", 5060), "echo", {})
    media.handle_events(0, [{"type": "ended", "call_id": cid, "reason": "rtp-timeout"}])
    assert listener.ended == [(cid, "rtp-timeout")] and media.where == {}
    assert await media.end(cid) == session
    assert [r["op"] for r in t.got] == ["create", "delete", "get"]
    assert await media.end(cid) is None  # once: nothing is left to ask


async def test_events_become_listener_calls_for_calls_placed_there_only() -> None:
    t0, t1 = FakeTransceiver(0), FakeTransceiver(1)
    media, listener = setup(t0, t1)
    a, b = "rtc_sip_" + "5" * 24, "rtc_sip_" + "6" * 24
    await media.create(a, OFFER, ("203.0.113.5", 5060), "echo", {})
    await media.create(b, OFFER, ("203.0.113.5", 5060), "echo", {})
    ka, kb = media.where[a], media.where[b]
    assert ka != kb
    media.handle_events(ka, [{"type": "dtmf", "call_id": a, "digit": "4", "duration_ms": 80},
                             {"type": "dtmf", "call_id": b, "digit": "1"},  # not on ka
                             "junk", {"type": "ended", "call_id": a, "reason": "rtp-timeout"}])
    assert listener.digits == [(a, "4", 80)] and listener.ended == [(a, "rtp-timeout")]
    assert a not in media.where
    # a restarted transceiver (a new epoch) no longer has b: the call's media is lost
    media.handle_events(kb, [], live=set())
    assert listener.ended[-1] == (b, "transceiver-lost") and media.where == {}


async def test_a_phone_call_is_in_the_one_registry_and_its_end_comes_from_events() -> None:
    """Issue 39 item 2: a placed phone call is a session record (``GET /v1/sessions``, the
    dashboard) of kind ``phone``, counted for placement; the transceiver's ``events``
    end it there and in the SIP call control at once; DELETE hangs it up (a BYE), never a
    WebRTC ``delete`` the transceiver would not know."""
    t = FakeTransceiver(0)
    media, listener = setup(t)
    st = media.state
    hung_up: list[str] = []
    st.hang_up_phone = hung_up.append
    cid = "rtc_sip_" + "8" * 24
    await media.create(cid, OFFER, ("203.0.113.5", 5060), "echo", {})
    [view] = st.registry.views()
    assert view["id"] == cid and view["kind"] == "phone" and view["state"] == "new"
    assert view["transceiver"] == 0 and view["agent"] == "echo"
    assert st.registry.active_counts() == {0: 1}
    await st.delete_session(st.registry.lookup(cid))
    assert hung_up == [cid] and [r["op"] for r in t.got] == ["create"]
    session = {**view, "state": "ended", "end_reason": "sip-bye", "ended_at": 1.5e9,
               "packets_in": 40}
    st.call_events.handle(0, [{"type": "ended", "call_id": cid, "kind": "phone",
                               "reason": "sip-bye", "session": session, "seq": 1}])
    assert listener.ended == [(cid, "sip-bye")]
    [view] = st.registry.views()
    assert (view["state"], view["end_reason"], view["packets_in"]) == ("ended", "sip-bye", 40)
    assert st.registry.active_counts() == {}


ANSWER = (b"v=0\r\no=callee 7 1 IN IP4 203.0.113.9\r\ns=-\r\nc=IN IP4 203.0.113.9\r\n"
          b"t=0 0\r\nm=audio 41000 RTP/AVP 8 101\r\na=rtpmap:8 PCMA/8000\r\n"
          b"a=rtpmap:101 telephone-event/8000\r\na=sendrecv\r\n")


async def test_an_outbound_call_places_a_pending_session_then_answered_gives_it_its_leg() -> None:
    t = FakeTransceiver(0)
    media, _ = setup(t)
    cid = "rtc_sip_" + "7" * 24
    offer = await media.offer(cid, ("203.0.113.9", 5060), "echo", {"voice": "x"})
    assert not isinstance(offer, MediaRefusal)
    assert "c=IN IP4 198.51.100.7" in offer.sdp and "m=audio 3478 RTP/AVP 0 8 101" in offer.sdp
    [pending] = t.got
    assert (pending["op"], pending["leg"]) == ("create", "phone") and "phone" not in pending  # no leg before the answer
    assert pending["agent"] == "echo" and pending["session"] == {"voice": "x"}
    got = await media.answered(cid, ANSWER)
    assert isinstance(got, MediaAnswer) and got.plan.codec.name.upper() == "PCMA"
    op = t.got[-1]
    assert (op["op"], op["answered"], op["session_id"]) == ("patch", True, cid)
    params = PhoneParams.from_json_untrusted(op["phone"])
    assert params.remote == ("203.0.113.9", 41000)
    await media.end(cid)
    assert [r["op"] for r in t.got[-2:]] == ["delete", "get"] and media.where == {}


async def test_an_outbound_answer_we_cannot_serve_never_reaches_the_transceiver() -> None:
    t = FakeTransceiver(0)
    media, _ = setup(t)
    cid = "rtc_sip_" + "8" * 24
    await media.offer(cid, ("203.0.113.9", 5060), "echo", {})
    bad = ANSWER.replace(b"RTP/AVP 8 101", b"RTP/AVP 18 101").replace(b"8 PCMA", b"18 G729")
    got = await media.answered(cid, bad)
    assert isinstance(got, MediaRefusal) and got.status == 488
    assert [r["op"] for r in t.got] == ["create"]


async def test_no_transceiver_for_an_outbound_call_means_it_is_never_dialled() -> None:
    media, _ = setup(FakeTransceiver(0, [{"ok": False, "status": 503, "code": "full"}]))
    got = await media.offer("rtc_sip_" + "9" * 24, ("203.0.113.9", 5060), "echo", {})
    assert isinstance(got, MediaRefusal) and got.status == 503
    assert media.sdp.offers == {} and media.where == {}
