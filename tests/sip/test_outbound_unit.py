"""Outbound calls without sockets: the trunks file (sip_trunks.py), our SDP offer and the
callee's answer (RelayAnswerMedia as OutboundPhoneMedia), and SipOutbound driving a real
SipEndpoint UAC against a scripted trunk on trio's MockClock (ring timeout → CANCEL and
408, Timer B, busy, answer → active, an unusable answer → BYE). Plus the digest
challenge parser fuzzed (hypothesis): it raises only SipError."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.proto.sdp.sdes import CryptoAttribute
from appliance.proto.sip import (
    CallAnswered,
    CallEnded,
    CallProgress,
    Decision,
    EndpointConfig,
    Request,
    Response,
    SipEndpoint,
    Transmit,
)
from appliance.proto.sip import auth as digest
from appliance.proto.sip.errors import SipError
from appliance.proto.sip.message import parse_untrusted
from appliance.signaling.phone_media import (
    MediaAnswer,
    MediaOffer,
    MediaRefusal,
    OutboundPhoneMedia,
    RelayAnswerMedia,
)
from appliance.signaling.sip_call import CallError
from appliance.signaling.sip_outbound import SipOutbound, failure_code
from appliance.signaling.sip_trunks import Trunk, TrunkError, load_trunks, parse_trunks

TRUNK_ADDR = ("127.0.0.1", 5099)
SECRET = "p4ss-w0rd-never-shown"


# ---------------------------------------------------------------- the trunks file


def test_trunks_from_toml_with_password_from_the_environment(tmp_path: Path) -> None:
    f = tmp_path / "trunks.toml"
    f.write_text('[trunks.twilio]\nhost = "example.pstn.twilio.com"\ntransport = "tls"\n'
                 'from_user = "+15551234567"\nusername = "appliance"\n'
                 'password_env = "TRUNK_PW"\nsrtp = true\n'
                 '[trunks.lab]\nhost = "10.0.0.7"\n')
    trunks = load_trunks(f, env={"TRUNK_PW": SECRET})
    tw = trunks["twilio"]
    assert (tw.port, tw.transport, tw.srtp) == (5061, "tls", True)
    assert tw.from_uri == "sip:+15551234567@example.pstn.twilio.com"
    creds = tw.credentials
    assert creds is not None and creds.password == SECRET
    for text in (repr(tw), str(tw), repr(creds), str(creds), repr(trunks)):
        assert SECRET not in text
    assert trunks["lab"].credentials is None and trunks["lab"].port == 5060
    assert tw.target_uri("+15550001111") == "sip:+15550001111@example.pstn.twilio.com;transport=tls"
    assert trunks["lab"].target_uri("tel:+1555") == "sip:+1555@10.0.0.7;user=phone"
    assert trunks["lab"].target_uri("sip:bob@example.com") == "sip:bob@example.com"


def test_trunk_errors_name_the_key_never_the_secret(tmp_path: Path) -> None:
    bad = [
        ({"trunks": {"t": {"host": "h", "username": "u"}}}, "go together"),
        ({"trunks": {"t": {"host": "h", "username": "u", "password_env": "NOPE"}}}, "NOPE"),
        ({"trunks": {"t": {"host": "h", "transport": "sctp"}}}, "transport"),
        ({"trunks": {"t": {"host": "h", "port": 70000}}}, "port"),
        ({"trunks": {"t": {"host": "h", "pasword": SECRET}}}, "unknown keys"),
        ({"trunks": {"t": {"host": "h", "username": "u", "password": SECRET,
                           "password_env": "X"}}}, "one of"),
        ({"trunks": {}}, "at least one"),
    ]
    for data, words in bad:
        with pytest.raises(TrunkError) as e:
            parse_trunks(data, env={})
        assert words in str(e.value) and SECRET not in str(e.value)
    f = tmp_path / "broken.json"
    f.write_text('{"trunks": {"t": {"host": "h", "password": "' + SECRET + '",}}}')
    with pytest.raises(TrunkError) as e:
        load_trunks(f)
    assert SECRET not in str(e.value)
    pw = tmp_path / "pw.txt"
    pw.write_text(SECRET + "\n")
    g = tmp_path / "t.json"
    g.write_text(json.dumps({"trunks": {"t": {"host": "h", "username": "u",
                                               "password_file": "pw.txt"}}}))
    creds = load_trunks(g)["t"].credentials
    assert creds is not None and creds.password == SECRET


# ---------------------------------------------------------------- offer / answer

ANSWER = ("v=0\r\no=- 1 1 IN IP4 10.0.0.9\r\ns=-\r\nc=IN IP4 10.0.0.9\r\nt=0 0\r\n"
          "m=audio 30000 {proto} {pt} 101\r\na=rtpmap:{pt} {name}/8000\r\n"
          "a=rtpmap:101 telephone-event/8000\r\n{extra}a=sendrecv\r\n")


async def test_relay_media_offers_g711_and_takes_the_answer() -> None:
    media = RelayAnswerMedia("203.0.113.5", 40000)
    assert isinstance(media, OutboundPhoneMedia)
    got = await media.offer("rtc_sip_a", TRUNK_ADDR, "echo", {"type": "realtime"})
    assert isinstance(got, MediaOffer)
    assert "m=audio 40000 RTP/AVP 0 8 101\r\n" in got.sdp and "c=IN IP4 203.0.113.5" in got.sdp
    assert "a=crypto" not in got.sdp
    ans = await media.answered("rtc_sip_a", ANSWER.format(proto="RTP/AVP", pt=8, name="PCMA",
                                                          extra="").encode())
    assert isinstance(ans, MediaAnswer) and ans.plan.codec.name == "PCMA"
    params = media.calls["rtc_sip_a"].params()
    assert params.remote == ("10.0.0.9", 30000) and params.codec == "PCMA"
    assert params.trunk_ip == "127.0.0.1" and params.srtp is None
    await media.end("rtc_sip_a")
    assert not media.calls and not media.offers


async def test_relay_media_sdes_offer_keys_the_chosen_line() -> None:
    media = RelayAnswerMedia("203.0.113.5", 40000)
    got = await media.offer("rtc_sip_b", TRUNK_ADDR, "echo", {}, secure=True)
    assert isinstance(got, MediaOffer)
    lines = [ln for ln in got.sdp.split("\r\n") if ln.startswith("a=crypto:")]
    assert "RTP/SAVP 0 8 101" in got.sdp and len(lines) == 2
    ours = CryptoAttribute.parse_untrusted(lines[1])  # tag 2, the 32-bit tag suite
    key = ours.build().split()[2]  # inline:<base64 key||salt>
    assert key[len("inline:"):] not in repr(media.offers["rtc_sip_b"])  # keys never in a repr
    theirs = "a=crypto:2 AES_CM_128_HMAC_SHA1_32 inline:" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVpBQkNE\r\n"
    ans = await media.answered("rtc_sip_b", ANSWER.format(proto="RTP/SAVP", pt=0, name="PCMU",
                                                          extra=theirs).encode())
    assert isinstance(ans, MediaAnswer), ans
    srtp = media.calls["rtc_sip_b"].params().srtp
    assert srtp is not None and srtp.suite == "AES_CM_128_HMAC_SHA1_32"
    assert srtp.local == ours.material  # our tag-2 key, the line the answer chose
    assert srtp.remote == CryptoAttribute.parse_untrusted(theirs.strip()).material


@pytest.mark.parametrize(("proto", "pt", "name", "extra", "words"), [
    ("RTP/AVP", 18, "G729", "", "no common codec"),
    ("RTP/SAVP", 0, "PCMU", "a=crypto:9 AES_CM_128_HMAC_SHA1_80 inline:"
     "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVpBQkNE\r\n", "matches none"),
    ("RTP/AVP", 0, "PCMU", "", "not SRTP"),
])
async def test_relay_media_refuses_unusable_answers(proto: str, pt: int, name: str, extra: str,
                                                    words: str) -> None:
    media = RelayAnswerMedia("203.0.113.5", 40000)
    await media.offer("c", TRUNK_ADDR, "echo", {}, secure=words != "no common codec")
    got = await media.answered("c", ANSWER.format(proto=proto, pt=pt, name=name,
                                                  extra=extra).encode())
    assert isinstance(got, MediaRefusal) and words in got.text and got.status == 488
    assert "c" not in media.calls


# ---------------------------------------------------------------- SipOutbound on a fake clock


class FakeShell:
    """SipService's part SipOutbound uses: the endpoint, drain() collecting what it sends,
    connect() (never called for UDP trunks)."""

    def __init__(self) -> None:
        self.endpoint = SipEndpoint(EndpointConfig(host="127.0.0.1", port=5060))
        self.host = "127.0.0.1"
        self.sent: list[Request | Response] = []
        self.outbound: SipOutbound | None = None
        self._wake = trio.Event()

    async def timers(self) -> None:
        """sip_server.SipService.timers: the endpoint's transaction timers."""
        ep = self.endpoint
        while True:
            deadline = ep.poll_timeout()
            with trio.move_on_at(float("inf") if deadline is None else deadline):
                await self._wake.wait()
            self._wake = trio.Event()
            due = ep.poll_timeout()
            if due is not None and due <= trio.current_time():
                ep.handle_timeout(trio.current_time())
                self.drain()

    def drain(self) -> None:
        self._wake.set()
        while (out := self.endpoint.poll_output()) is not None:
            if isinstance(out, Transmit):
                assert out.addr == TRUNK_ADDR
                msg = parse_untrusted(out.data)
                assert isinstance(msg, Request | Response)
                self.sent.append(msg)
            else:
                assert self.outbound is not None and self.outbound.on_event(out)

    async def connect(self, *a: Any, **kw: Any) -> tuple[str, int]:
        raise AssertionError("UDP trunks need no connection")

    def requests(self, method: str) -> list[Request]:
        return [m for m in self.sent if isinstance(m, Request) and m.method == method]

    def reply(self, req: Request, status: int, reason: str, body: str = "",
              extra: tuple[tuple[str, str], ...] = ()) -> None:
        hs = [(k, v) for k, v in req.headers if k in ("Via", "From", "Call-ID", "CSeq")]
        hs.append(("To", f"{req.get('To')};tag=callee1"))
        hs.append(("Contact", "<sip:callee@127.0.0.1:5099>"))
        hs.extend(extra)
        if body:
            hs.append(("Content-Type", "application/sdp"))
        self.endpoint.handle_input(trio.current_time(), bytes(Response(status, reason,
                                                                       tuple(hs), body.encode())),
                                   TRUNK_ADDR)
        self.drain()


async def outbound(nursery: trio.Nursery, **trunk: Any
                   ) -> tuple[SipOutbound, FakeShell, RelayAnswerMedia, list[tuple[str, Any]]]:
    emitted: list[tuple[str, Any]] = []
    state = SimpleNamespace(clock=trio.current_time,
                            config=SimpleNamespace(realtime_agent="echo"),
                            webhooks=SimpleNamespace(emit=lambda k, d: emitted.append((k, d))))
    media = RelayAnswerMedia("127.0.0.1", 40000)
    t = Trunk(name="t", host=TRUNK_ADDR[0], port=TRUNK_ADDR[1], **trunk)
    ob = SipOutbound(cast(Any, state), {"t": t}, media)
    shell = FakeShell()
    shell.outbound = ob
    ob.attach(shell, nursery)
    nursery.start_soon(shell.timers)
    return ob, shell, media, emitted


async def wait_for(cond: Any) -> None:
    """Poll a condition (the fake clock jumps while everything sleeps)."""
    while True:
        if cond():
            return
        await trio.sleep(0.1)


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_ring_timeout_cancels_and_reports_no_answer(nursery: trio.Nursery,
                                                          mock_clock: trio.testing.MockClock) -> None:
    ob, shell, media, _ = await outbound(nursery, ring_timeout=20.0)
    call = await ob.place("1000", None, None, {"type": "realtime"})
    await wait_for(lambda: shell.requests("INVITE"))
    invite = shell.requests("INVITE")[0]
    assert str(invite.uri) == "sip:1000@127.0.0.1:5099"
    shell.reply(invite, 180, "Ringing")
    assert ob.get(call.call_id).state == "ringing"
    start = trio.current_time()
    await wait_for(lambda: shell.requests("CANCEL"))
    assert trio.current_time() - start == pytest.approx(20.0, abs=0.15)
    view = ob.get(call.call_id).view()
    assert view["status"] == "failed" and view["failure"]["code"] == "no_answer"
    assert view["failure"]["status_code"] == 408
    cancel = shell.requests("CANCEL")[0]
    assert cancel.vias[0].branch == invite.vias[0].branch
    shell.reply(cancel, 200, "OK")
    shell.reply(invite, 487, "Request Terminated")
    assert len(shell.requests("ACK")) == 1
    await wait_for(lambda: not media.offers)


async def test_no_response_at_all_is_timer_b(nursery: trio.Nursery,
                                             mock_clock: trio.testing.MockClock) -> None:
    ob, shell, _, _ = await outbound(nursery, ring_timeout=600.0)
    call = await ob.place("1000", "t", None, {})
    await wait_for(lambda: ob.get(call.call_id).state == "failed")
    # Timer A retransmitted at .5, 1.5, 3.5, … ; Timer B ended it at 64·T1 = 32 s
    assert len(shell.requests("INVITE")) == 7
    assert ob.get(call.call_id).failure == {"status_code": 408, "reason": "Request Timeout",
                                            "code": "unreachable"}


async def test_busy_and_answer_and_unusable_answer(nursery: trio.Nursery,
                                                   mock_clock: trio.testing.MockClock) -> None:
    ob, shell, media, emitted = await outbound(nursery)
    busy = await ob.place("1", None, None, {})
    await wait_for(lambda: shell.requests("INVITE"))
    shell.reply(shell.requests("INVITE")[-1], 486, "Busy Here")
    assert ob.get(busy.call_id).failure == {"status_code": 486, "reason": "Busy Here",
                                            "code": "busy"}
    assert shell.requests("ACK")  # the transaction ACKed the 486

    good = await ob.place("2", None, "echo", {"model": "gpt-realtime"})
    await wait_for(lambda: len(shell.requests("INVITE")) == 2)
    shell.reply(shell.requests("INVITE")[-1], 200, "OK",
                ANSWER.format(proto="RTP/AVP", pt=0, name="PCMU", extra=""))
    await wait_for(lambda: ob.get(good.call_id).state == "active")
    assert good.call_id in media.calls
    assert emitted[-1][0] == "realtime.call.started"
    assert emitted[-1][1]["direction"] == "outbound"
    ob.hangup(good.call_id)
    assert shell.requests("BYE")
    bye = shell.requests("BYE")[-1]
    shell.endpoint.handle_input(trio.current_time(), bytes(Response(
        200, "OK", tuple((k, v) for k, v in bye.headers if k in ("Via", "From", "To", "Call-ID",
                                                                  "CSeq")))), TRUNK_ADDR)
    shell.drain()
    assert ob.get(good.call_id).state == "ended" and ob.get(good.call_id).hung_up_by == "api"
    # the ended event waits for the media's end (its session object feeds the report)
    await wait_for(lambda: emitted[-1][0] == "realtime.call.ended")
    sip = emitted[-1][1]["report"]["sip"]
    assert sip["direction"] == "outbound" and sip["hangup_cause"] == "hangup"
    assert sip["to"].startswith("sip:2@") and sip["from"] is not None
    # the Call-ID the trunk saw on the wire, so a backend can match its CDRs
    assert sip["call_id"] == bye.get("Call-ID") and sip["call_id"]

    odd = await ob.place("3", None, None, {})
    await wait_for(lambda: len(shell.requests("INVITE")) == 3)
    shell.reply(shell.requests("INVITE")[-1], 200, "OK",
                ANSWER.format(proto="RTP/AVP", pt=18, name="G729", extra=""))
    await wait_for(lambda: len(shell.requests("BYE")) == 2)  # the dialog exists: BYE it
    failure = ob.get(odd.call_id).failure
    assert failure is not None and failure["code"] == "media_refused"
    assert ob.get(odd.call_id).state in ("answering", "failed")


async def test_place_checks_its_input(nursery: trio.Nursery) -> None:
    ob, _, _, _ = await outbound(nursery)
    for args, code in [(("x y", None), "invalid_to"), (("1", "nope"), "trunk_not_found")]:
        with pytest.raises(CallError) as e:
            await ob.place(args[0], args[1], None, {})
        assert e.value.code == code
    with pytest.raises(CallError) as e:
        await ob.place("1", None, None, {}, {"Authorization": "x"})
    assert e.value.code == "invalid_headers"
    assert failure_code(486) == "busy" and failure_code(502) == "trunk_error"
    assert failure_code(606) == "declined" and failure_code(410) == "rejected"


# ---------------------------------------------------------------- digest challenge parser


_PARAM = st.sampled_from(["realm", "nonce", "qop", "algorithm", "opaque", "stale", "x"])
_VALUE = st.one_of(st.text(max_size=20), st.sampled_from(['"auth"', "MD5", "SHA-256", '""',
                                                          '"a,b"', '"\\"', "true"]))
_CHALLENGES = st.one_of(
    st.text(max_size=300),
    st.lists(st.tuples(_PARAM, _VALUE), max_size=8).map(
        lambda ps: "Digest " + ", ".join(f"{k}={v}" for k, v in ps)),
)


@settings(max_examples=300, deadline=None)
@given(_CHALLENGES)
def test_challenge_parser_raises_only_sip_error(text: str) -> None:
    try:
        ch = digest.parse_challenge_untrusted(text)
    except SipError:
        return
    assert ch.realm is not None and ch.nonce is not None
    creds = digest.Credentials("u", "\x00never-sent\x00")
    if digest.usable(ch):
        value = digest.authorization(ch, creds, "INVITE", "sip:x@y", cnonce="c")
        assert value.startswith("Digest ") and creds.password not in value


@given(st.sampled_from(["MD5", "SHA-256", "MD5-sess", "SHA-256-sess"]),
       st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e, blacklist_characters='"\\'),
               min_size=1, max_size=40))
def test_challenge_round_trip(algorithm: str, nonce: str) -> None:
    value = f'Digest realm="r.example", nonce="{nonce}", qop="auth,auth-int", algorithm={algorithm}'
    try:
        ch = digest.parse_challenge_untrusted(value)
    except SipError:
        assert "," in nonce or '"' in nonce
        return
    assert ch.nonce == nonce and ch.algorithm == algorithm and digest.usable(ch)


# ---------------------------------------------------------------- a trunk outside --sip-allow


def test_called_trunk_is_served_only_for_its_calls() -> None:
    """--sip-drop-refused and a trunk not in --sip-allow: the answers to our INVITE and the
    callee's BYE are served; a new INVITE from the same address is still dropped, and
    once the call is over so is everything else from it."""
    trunk = ("198.51.100.7", 5060)
    ep = SipEndpoint(EndpointConfig(host="127.0.0.1", allow=lambda ip: Decision.DROP))
    sip_id = ep.invite(0.0, "sip:1000@198.51.100.7", "sip:me@example.com", b"", trunk)

    def out() -> tuple[list[Request | Response], list[object]]:
        sent: list[Request | Response] = []
        events: list[object] = []
        while (o := ep.poll_output()) is not None:
            if isinstance(o, Transmit):
                m = parse_untrusted(o.data)
                assert isinstance(m, Request | Response)
                sent.append(m)
            else:
                events.append(o)
        return sent, events

    (invite,), _ = out()
    assert isinstance(invite, Request)

    def answer(status: int, reason: str) -> bytes:
        hs = [(k, v) for k, v in invite.headers if k in ("Via", "From", "Call-ID", "CSeq")]
        hs += [("To", f"{invite.get('To')};tag=t1"), ("Contact", "<sip:1000@198.51.100.7>")]
        return bytes(Response(status, reason, tuple(hs)))

    ep.handle_input(1.0, answer(180, "Ringing"), trunk)
    assert out()[1] == [CallProgress(sip_id, 180, "Ringing")]
    stranger = (b"INVITE sip:x@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 198.51.100.7;branch=z9hG4bKs\r\n"
                b"From: <sip:a@b>;tag=1\r\nTo: <sip:x@127.0.0.1>\r\nCall-ID: s1\r\n"
                b"CSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n")
    ep.handle_input(1.5, stranger, trunk)
    assert out() == ([], []) and ep.counters["dropped-source"] == 1
    ep.handle_input(2.0, answer(200, "OK"), trunk)
    sent, events = out()
    assert [m.method for m in sent if isinstance(m, Request)] == ["ACK"]
    assert events == [CallAnswered(sip_id, b"")]
    bye = (f"BYE sip:me@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 198.51.100.7;branch=z9hG4bKb\r\n"
           f"From: {invite.get('To')};tag=t1\r\nTo: {invite.get('From')}\r\n"
           f"Call-ID: {invite.call_id}\r\nCSeq: 5 BYE\r\nContent-Length: 0\r\n\r\n").encode()
    ep.handle_input(3.0, bye, trunk)
    sent, events = out()
    assert [m.status for m in sent if isinstance(m, Response)] == [200]
    assert events == [CallEnded(sip_id, "bye", "remote")]
    ep.handle_input(4.0, answer(200, "OK"), trunk)  # the call is gone: silence again
    assert out() == ([], []) and ep.counters["dropped-source"] == 2


def in_dialog(invite: Request, method: str, seq: int, body: str = "",
              ctype: str = "application/sdp") -> bytes:
    """A request from the callee inside the dialog of our INVITE (To/From swapped)."""
    hdr = "" if not body else f"Content-Type: {ctype}\r\n"
    return (f"{method} sip:me@127.0.0.1:5060 SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:5099;branch=z9hG4bK{method.lower()}{seq}\r\n"
            f"From: {invite.get('To')};tag=callee1\r\nTo: {invite.get('From')}\r\n"
            f"Call-ID: {invite.call_id}\r\nCSeq: {seq} {method}\r\n"
            f"Contact: <sip:callee@127.0.0.1:5099>\r\n{hdr}"
            f"Content-Length: {len(body.encode())}\r\n\r\n{body}").encode()


async def test_callee_hold_reinvite_and_dtmf(nursery: trio.Nursery,
                                             mock_clock: trio.testing.MockClock) -> None:
    ob, shell, _, _ = await outbound(nursery)
    call = await ob.place("1", None, None, {})
    await wait_for(lambda: shell.requests("INVITE"))
    invite = shell.requests("INVITE")[0]
    shell.reply(invite, 200, "OK", ANSWER.format(proto="RTP/AVP", pt=0, name="PCMU", extra=""))
    await wait_for(lambda: ob.get(call.call_id).state == "active")
    hold = ANSWER.format(proto="RTP/AVP", pt=0, name="PCMU", extra="").replace(
        "a=sendrecv", "a=sendonly")
    shell.endpoint.handle_input(trio.current_time(), in_dialog(invite, "INVITE", 2, hold),
                                TRUNK_ADDR)
    shell.drain()
    await wait_for(lambda: any(isinstance(m, Response) and m.status == 200
                               and m.cseq.method == "INVITE" for m in shell.sent))
    ok = next(m for m in shell.sent if isinstance(m, Response) and m.status == 200)
    assert b"a=recvonly" in ok.body  # the media's answer to the hold
    shell.endpoint.handle_input(trio.current_time(), in_dialog(
        invite, "INFO", 3, "Signal=7\r\nDuration=160\r\n", "application/dtmf-relay"),
        TRUNK_ADDR)
    shell.drain()
    assert ob.get(call.call_id).view()["dtmf"] == "7"


class BrokenMedia(RelayAnswerMedia):
    async def answered(self, call_id: str, answer_sdp: bytes) -> MediaAnswer | MediaRefusal:
        raise RuntimeError("the media backend broke")


async def test_a_broken_media_backend_fails_the_call_not_the_service(
        nursery: trio.Nursery, mock_clock: trio.testing.MockClock) -> None:
    ob, shell, _, _ = await outbound(nursery)
    ob.media = BrokenMedia("127.0.0.1", 40000)
    call = await ob.place("1", None, None, {})
    await wait_for(lambda: shell.requests("INVITE"))
    shell.reply(shell.requests("INVITE")[0], 200, "OK",
                ANSWER.format(proto="RTP/AVP", pt=0, name="PCMU", extra=""))
    await wait_for(lambda: shell.requests("BYE"))
    failure = ob.get(call.call_id).failure
    assert failure is not None and failure["status_code"] == 500
    second = await ob.place("2", None, None, {})  # still serving
    assert second.state == "dialing"


def test_trunk_rate_and_invite_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from appliance.signaling.options import add_sip_arguments, sip_settings

    f = tmp_path / "trunks.json"
    f.write_text(json.dumps({"trunks": {"a": {"host": "192.0.2.9", "username": "u",
                                              "password_env": "OB_TEST_PW"}}}))
    monkeypatch.setenv("OB_TEST_PW", SECRET)
    parser = argparse.ArgumentParser()
    add_sip_arguments(parser)
    got = sip_settings(parser.parse_args(["--sip", "127.0.0.1:0", "--sip-trunks", str(f),
                                          "--sip-rate", "5", "--sip-max-invites", "3"]), [])
    assert got is not None and got.rate == 5 and got.max_invites == 3
    creds = got.trunks["a"].credentials
    assert creds is not None and creds.password == SECRET and SECRET not in repr(got)
    with pytest.raises(ValueError, match="needs --sip"):
        sip_settings(parser.parse_args(["--sip-trunks", str(f)]), [])
    with pytest.raises(ValueError, match="--sip-rate"):
        sip_settings(parser.parse_args(["--sip", "127.0.0.1:0", "--sip-rate", "0"]), [])
    monkeypatch.delenv("OB_TEST_PW")
    with pytest.raises(ValueError, match="OB_TEST_PW"):
        sip_settings(parser.parse_args(["--sip", "127.0.0.1:0", "--sip-trunks", str(f)]), [])


_SDP_LINES = st.sampled_from([
    "v=0", "o=- 1 1 IN IP4 10.0.0.9", "s=-", "c=IN IP4 10.0.0.9", "c=IN IP4 0.0.0.0", "t=0 0",
    "m=audio 30000 RTP/AVP 0 101", "m=audio 30000 RTP/SAVP 8", "m=audio 0 RTP/AVP 0",
    "m=video 4000 RTP/AVP 96", "a=rtpmap:0 PCMU/8000", "a=rtpmap:8 PCMA/8000",
    "a=rtpmap:101 telephone-event/8000", "a=rtcp-mux", "a=rtcp:abc", "a=sendonly",
    "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVpBQkNE",
    "a=crypto:2 AES_CM_128_HMAC_SHA1_32 inline:!!", "a=crypto:x", "m=audio 99999 RTP/AVP 0",
])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=400),
                 st.lists(st.one_of(_SDP_LINES, st.text(max_size=40)), max_size=14).map(
                     lambda ls: ("\r\n".join(ls) + "\r\n").encode("utf-8", "replace"))),
       st.booleans())
def test_any_callee_answer_is_taken_or_refused(answer: bytes, secure: bool) -> None:
    """The callee's SDP is untrusted: answered() gives MediaAnswer or MediaRefusal, never
    raises, and keeps nothing for a refused answer."""
    async def run() -> object:
        media = RelayAnswerMedia("127.0.0.1", 40000)
        await media.offer("c", TRUNK_ADDR, "echo", {}, secure=secure)
        got = await media.answered("c", answer)
        assert isinstance(got, MediaAnswer) == ("c" in media.calls)
        return got

    assert isinstance(trio.run(run), MediaAnswer | MediaRefusal)
