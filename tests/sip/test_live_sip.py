"""GPT-Live's SIP surface on the appliance's phone calls (issue 42 item 6): a SIPp caller's
INVITE fires ``live.transport.incoming`` beside ``realtime.call.incoming`` (both checked with
the official SDK's ``client.webhooks.unwrap``), and the official SDK's
``client.live.sessions.accept / reject / hangup`` drive the same pending call as
``client.realtime.calls`` does; the first accept on either surface wins.

Every wait is on an event: SIPp's exit (each scenario fails on an unexpected or missing
message, ``-timeout_error``) or the webhook receiver getting a delivery.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import openai
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from sip.support import (
    SIPP,
    TIMEOUT,
    LoopbackSniffer,
    Phone,
    SippRun,
    free_media_ports,
    run_sipp,
    start_phone,
    start_phone_stack,
    until_incoming,
    unwrap,
    write_tone_pcap,
)
from sip.test_sipp_calls import until_status

from appliance.live.plugin import agent_spec
from appliance.proto.rtp import rtp_header_fields_untrusted
from appliance.proto.rtp.dtmf import TelephoneEvent, event_for
from appliance.signaling.live_http import (
    parse_accept_untrusted,
    parse_refer_untrusted,
    parse_reject_untrusted,
)
from appliance.signaling.realtime_http import RealtimeProblem
from appliance.signaling.sip_calls import CALL_ID_RE, CALL_INCOMING, LIVE_ID_RE, LIVE_INCOMING
from appliance.signaling.webhooks import CALL_ENDED, CALL_STARTED

SESSION: Any = {"type": "live", "model": "gpt-live-1", "instructions": "You answer the phone."}


async def both_webhooks(phone: Phone, run: SippRun) -> tuple[Any, Any]:
    """The call's two incoming webhooks, each signature checked and parsed by the SDK."""
    rx = phone.receiver
    assert rx is not None
    realtime_ev = await until_incoming(phone, run)
    live_ev = await rx.wait_for(LIVE_INCOMING)

    def parsed(ev: dict[str, Any]) -> Any:
        headers, body = rx.raw[rx.events.index(ev)]
        return unwrap(body, headers)

    return (await trio.to_thread.run_sync(parsed, realtime_ev),
            await trio.to_thread.run_sync(parsed, live_ev))


def status_of(fn: Any) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as err:
        fn()
    return err.value


@pytest.mark.interop
@pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")
async def test_one_invite_fires_both_webhooks_for_one_pending_call(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "reject.xml", cwd=tmp_path)
        rt, live = await both_webhooks(phone, proc)
        assert rt.type == CALL_INCOMING and CALL_ID_RE.fullmatch(rt.data.call_id)
        # the SDK's LiveTransportIncomingWebhookEvent: a live_ id, type sip, the headers
        assert type(live).__name__ == "LiveTransportIncomingWebhookEvent"
        assert live.type == LIVE_INCOMING and live.data.type == "sip"
        assert LIVE_ID_RE.fullmatch(live.data.session_id), live.data.session_id
        assert live.data.session_id != rt.data.call_id
        assert [h.model_dump() for h in live.data.sip_headers] == \
            [h.model_dump() for h in rt.data.sip_headers]
        assert live.data.sip_media_security == "rtp"  # the offer is RTP/AVP
        # one record, two names: GET by the rtc_ id names the live_ one
        view = await trio.to_thread.run_sync(
            lambda: phone.client().get(f"/realtime/calls/{rt.data.call_id}", cast_to=object))
        assert view["live_session_id"] == live.data.session_id and view["status"] == "ringing"
        calls = phone.client().realtime.calls
        await trio.to_thread.run_sync(lambda: calls.reject(rt.data.call_id))  # 603
        code, out = await proc.result()
    assert code == 0, out
    assert phone.receiver is not None
    kinds = [e["type"] for e in phone.receiver.events]
    assert kinds.count(CALL_INCOMING) == 1 and kinds.count(LIVE_INCOMING) == 1
    assert "live.call.incoming" not in kinds  # deprecated; no subscriptions here (docs)


@pytest.mark.interop
@pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")
async def test_accept_via_live_wins_and_realtime_accept_gets_409(nursery: trio.Nursery,
                                                                 tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "accept_caller_bye.xml", cwd=tmp_path)
        rt, live = await both_webhooks(phone, proc)
        client = phone.client()
        sid, call_id = live.data.session_id, rt.data.call_id
        got = await trio.to_thread.run_sync(lambda: client.live.sessions.accept(sid, session=SESSION))
        assert got is None  # 200, empty body: what the SDK expects
        err = await trio.to_thread.run_sync(status_of, lambda: client.realtime.calls.accept(
            call_id, type="realtime", model="gpt-realtime"))
        assert err.status_code == 409
        body: Any = err.body
        assert body["code"] == "call_accepted_on_other_surface", body
        assert "live" in body["message"] and sid in body["message"]
        # a second accept on the winning surface: the call is no longer ringing
        err = await trio.to_thread.run_sync(status_of, lambda: client.live.sessions.accept(
            sid, session=SESSION))
        assert err.status_code == 409 and err.body["code"] == "invalid_call_state"  # type: ignore[index]
        code, out = await proc.result()  # 200 with our answer, ACK, the caller's BYE
        assert code == 0, out
        assert phone.receiver is not None
        ended = await phone.receiver.wait_for(CALL_ENDED)
    started = await phone.receiver.wait_for(CALL_STARTED)
    assert started["data"]["call_id"] == call_id and started["data"]["model"] == "gpt-live-1"
    # --live-agent answers, behind the Live event core (appliance/live/plugin.py)
    assert started["data"]["agent"] == agent_spec(phone.state.config.live_agent)
    assert ended["data"]["call_id"] == call_id
    view = await trio.to_thread.run_sync(
        lambda: client.get(f"/realtime/calls/{call_id}", cast_to=object))
    assert view["accepted_via"] == "live" and view["status"] == "ended"


@pytest.mark.interop
@pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")
async def test_reject_via_live_sends_the_status_code(nursery: trio.Nursery,
                                                     tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "reject_486.xml", cwd=tmp_path)
        _, live = await both_webhooks(phone, proc)
        sessions = phone.client().live.sessions
        sid = live.data.session_id
        await trio.to_thread.run_sync(lambda: sessions.reject(sid, status_code=486))
        code, out = await proc.result()  # the scenario fails unless 486 arrives
    assert code == 0, out
    # the call is over: accepting it now is a clear 409, not a crash
    err = await trio.to_thread.run_sync(status_of, lambda: sessions.accept(sid, session=SESSION))
    assert err.status_code == 409


@pytest.mark.interop
@pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")
async def test_hangup_via_live_sends_bye(nursery: trio.Nursery, tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "accept_callee_bye.xml", cwd=tmp_path)
        _, live = await both_webhooks(phone, proc)
        sessions = phone.client().live.sessions
        sid = live.data.session_id
        await trio.to_thread.run_sync(lambda: sessions.accept(sid, session=SESSION))
        await trio.to_thread.run_sync(lambda: sessions.hangup(sid))
        code, out = await proc.result()  # the scenario fails unless our BYE arrives
        assert code == 0, out
        assert phone.receiver is not None
        ended = await phone.receiver.wait_for(CALL_ENDED)
    assert ended["data"]["report"]["hung_up_by"] == "api"


@pytest.mark.interop
@pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")
async def test_realtime_accept_wins_then_live_refers(nursery: trio.Nursery,
                                                     tmp_path: Path) -> None:
    """The other way round: a Realtime accept wins, a Live accept gets the 409; the other
    operations are not tied to a surface, so the Live refer transfers the call."""
    phone = await start_phone(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "refer.xml", cwd=tmp_path)
        rt, live = await both_webhooks(phone, proc)
        client = phone.client()
        sid, call_id = live.data.session_id, rt.data.call_id
        await trio.to_thread.run_sync(lambda: client.realtime.calls.accept(
            call_id, type="realtime", model="gpt-realtime"))
        err = await trio.to_thread.run_sync(status_of, lambda: client.live.sessions.accept(
            sid, session=SESSION))
        assert err.status_code == 409
        assert err.body["code"] == "call_accepted_on_other_surface"  # type: ignore[index]
        assert call_id in err.body["message"]  # type: ignore[index]
        await until_status(phone, call_id, "active")  # REFER needs the ACKed dialog
        await trio.to_thread.run_sync(lambda: client.live.sessions.refer(
            sid, target_uri="sip:desk@example.com"))
        code, out = await proc.result()  # REFER, 202, NOTIFY 200, our BYE
    assert code == 0, out
    view = await trio.to_thread.run_sync(
        lambda: client.get(f"/realtime/calls/{call_id}", cast_to=object))
    assert view["accepted_via"] == "realtime" and view["refer"][-1]["target_uri"] == \
        "sip:desk@example.com"


# -- the Live event core on the phone call: its sideband, DTMF both ways, its end --------------

VOICED = f"realtime:{Path(__file__).parent / 'voiced_agent.py'}:VoicedAgent"
CALLER_KEY, OUR_KEY = "7", "9"


def watched_call(phone: Phone, sid: str) -> dict[str, Any]:
    """The application's backend, with the official SDK only: accept the call on the Live
    surface, attach a sideband by its ``live_sip_…`` id, hear the caller's keypress, speak
    a commentary, press a key on the phone leg (threaded SDK: run in a worker thread while
    the appliance runs in the test's nursery). The sideband stays open: :func:`hang_up`."""
    from live.test_sideband import Reader

    c = phone.client()
    c.live.sessions.accept(sid, session=SESSION, extra_headers={"X-Agent": VOICED})
    out: dict[str, Any] = {"stack": ExitStack()}
    sb = out["stack"].enter_context(c.live.sideband.connect(session_id=sid,
                                                             graceful_close=True))
    out["sb"] = sb
    out["side"] = side = Reader(sb, sideband=True)  # each frame checked: ConnectServerEvent
    out["replay"] = side.until("session.started")
    side.until("session.input_audio.append")  # the caller's RTP, reflected
    out["dtmf"] = side.until("transport.dtmf.received")  # SIPp's RFC 4733 digit
    sb.session.commentary.append(content="One moment please.", delegation_id=None,
                                 event_id="c1")
    side.until("session.commentary.appended", client_event_id="c1")
    out["said"] = side.until("session.output_transcript.delta")
    if not side.of("session.output_audio.delta"):  # (either may come first)
        side.until("session.output_audio.delta")
    out["audio"] = side.of("session.output_audio.delta")
    sb.transport.dtmf.send(event=OUR_KEY, event_id="d1")
    out["sent"] = side.until("transport.dtmf.sent", client_event_id="d1")
    return out


def hang_up(out: dict[str, Any]) -> None:
    """``session.close`` on the sideband: ``session.closed``, then the socket's end."""
    with out["stack"]:
        out["sb"].session.close(event_id="bye")
        out["closed"] = out["side"].until("session.closed")
        out["after"] = list(out["sb"])  # closed with 1000 once session.closed is out
        out["events"] = out["side"].raw


def telephone_events(sniff: LoopbackSniffer, payload_type: int) -> list[TelephoneEvent]:
    rtp = [rtp_header_fields_untrusted(p) + (p,) for p in sniff.payloads]
    return [TelephoneEvent.parse_untrusted(p[off:end]) for pt, *_, off, end, p in rtp
            if pt == payload_type]


@pytest.mark.interop
@pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")
@pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root (AF_PACKET)")
async def test_a_live_sideband_on_a_phone_call_hears_and_sends_dtmf_and_hangs_up(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """SIPp is the phone (RTP from a pcap: silence, and the caller's key every second as
    RFC 4733 events); the backend accepts with ``client.live.sessions.accept`` and attaches
    ``client.live.sideband.connect`` to the ``live_sip_…`` id: the replayed
    ``session.started`` (the accept's instructions), the reflected caller audio, the key as
    ``transport.dtmf.received``, a commentary's transcript and timestamped audio, its
    ``transport.dtmf.send`` on SIPp's RTP as telephone-events, and ``session.close`` ending
    the call with the BYE SIPp's scenario waits for."""
    stack = await start_phone_stack(nursery, tmp_path, agent="realtime", webhooks=True)
    write_tone_pcap(tmp_path / "tone.pcap", freq=0.0, seconds=40.0, dtmf=(CALLER_KEY, 1.0))
    mp = free_media_ports()
    sniff = LoopbackSniffer(mp, stack.relay_public[1])
    nursery.start_soon(sniff.run)
    with trio.fail_after(TIMEOUT * 3):
        run = await run_sipp(nursery, stack.phone, "pcap_callee_bye.xml", cwd=tmp_path,
                             media_port=mp)
        rt, live = await both_webhooks(stack.phone, run)
        sid, call_id = live.data.session_id, rt.data.call_id
        out = await trio.to_thread.run_sync(watched_call, stack.phone, sid)
        # the key the sideband pressed reaches SIPp's media port, to its end packet
        while not any(e.end for e in telephone_events(sniff, 101)):
            await sniff.changed.wait()
        await trio.to_thread.run_sync(hang_up, out)
        code, text = await run.result()  # 200, ACK, RTP, then our BYE (session.close)
        assert code == 0, text
    replay = out["replay"]["session"]
    assert replay["id"] == sid and replay["status"] == "active"
    assert replay["instructions"] == SESSION["instructions"]  # the accept's session
    assert out["dtmf"]["event"] == CALLER_KEY
    assert out["said"]["delta"] == "One moment please."
    spans = [(e["start_ms"], e["end_ms"]) for e in out["audio"]]  # 24 kHz, on the timeline
    assert all(end > start for start, end in spans) and sum(e - s for s, e in spans) >= 250
    assert out["sent"]["event"] == OUR_KEY
    closed = out["closed"]
    assert closed["reason"] == "close_requested" and closed["client_event_id"] == "bye"
    assert out["after"] == []
    kinds = [e["type"] for e in out["events"]]
    assert kinds[0] == "session.started" and "error" not in kinds, kinds
    pressed = telephone_events(sniff, 101)
    assert {e.event for e in pressed} == {event_for(OUR_KEY)}  # our key, nothing else
    assert max(e.duration for e in pressed) == 800  # 100 ms at 8 kHz: the whole press
    view = await trio.to_thread.run_sync(
        lambda: stack.phone.client().get(f"/realtime/calls/{call_id}", cast_to=object))
    assert view["status"] == "ended" and view["accepted_via"] == "live"
    assert view["dtmf"].startswith(CALLER_KEY)  # the call record heard the same key
    ended = stack.transceiver.ended_phones[-1]
    assert ended["id"] == call_id and ended["phone"]["leg"]["rtp_in"] > 0


async def test_a_live_sideband_of_a_phone_call_is_refused_until_answered_and_after(
        tmp_path: Path) -> None:
    """The look-up before the upgrade (signaling/sideband.py ``attach_live``), by the
    ``live_sip_…`` id: unknown 404, ringing 409, ended 410, each naming the Live id."""
    from sip.test_sip_sideband import lookup_rig, sip_call

    from appliance.signaling.proxied import CLIENT_IS_LOCAL
    from appliance.signaling.sideband import attach_live

    rt, calls = lookup_rig(tmp_path)
    ringing, ended = (f"rtc_sip_{c * 24}" for c in "ab")
    calls.calls[ringing] = sip_call(ringing, "ringing")
    calls.ended[ended] = sip_call(ended, "ended")

    async def refusal(session_id: str) -> tuple[int, str, str]:
        local = CLIENT_IS_LOCAL.set(True)
        try:
            with pytest.raises(RealtimeProblem) as got:
                await attach_live(rt, session_id, "", {}, lambda _: False, calls)
        finally:
            CLIENT_IS_LOCAL.reset(local)
        return got.value.status, got.value.code, str(got.value.detail)

    status, code, text = await refusal(f"live_sip_{'0' * 24}")
    assert (status, code) == (404, "session_not_found") and f"live_sip_{'0' * 24}" in text
    status, code, text = await refusal(f"live_sip_{'a' * 24}")
    assert (status, code) == (409, "call_not_answered") and "rtc_sip_" not in text
    status, code, _ = await refusal(f"live_sip_{'b' * 24}")
    assert (status, code) == (410, "session_closed")


async def test_bad_requests_are_4xx_naming_the_problem(nursery: trio.Nursery,
                                                       tmp_path: Path) -> None:
    """No SIPp needed: ids that name no call, and bodies the SDK's types would not build."""
    phone = await start_phone(nursery, tmp_path)
    client = phone.client()

    def post(path: str, body: Any) -> openai.APIStatusError:
        return status_of(lambda: client.post(path, body=body, cast_to=object))

    with trio.fail_after(TIMEOUT):
        err = await trio.to_thread.run_sync(status_of, lambda: client.live.sessions.hangup(
            "live_sip_" + "0" * 24))
        assert err.status_code == 404 and err.body["code"] == "session_not_found"  # type: ignore[index]
        err = await trio.to_thread.run_sync(status_of, lambda: client.live.sessions.reject(
            "live_nope", status_code=486))
        assert err.status_code == 404
        sid = "live_sip_" + "1" * 24
        cases = [("accept", {}, "session"),
                 ("accept", {"session": {"model": "gpt-live-1"}}, "session.type"),
                 ("accept", {"session": {**SESSION, "audio": {"format": {"type": "audio/pcmu"}}}},
                  "session.audio.format"),
                 ("accept", {"session": {**SESSION, "wake_policy": {"type": "speech"}}},
                  "session.wake_policy"),
                 ("reject", {}, "status_code"),
                 ("reject", {"status_code": 200}, "status_code"),
                 ("refer", {"target_uri": " "}, "target_uri")]
        for op, body, param in cases:
            err = await trio.to_thread.run_sync(post, f"/live/sessions/{sid}/{op}", body)
            assert err.status_code == 400, (op, body, err.body)
            assert err.body["param"] == param, (op, body, err.body)  # type: ignore[index]


def test_no_sip_means_404_not_500(tmp_path: Path) -> None:
    """The routes exist without --sip (the trust test walks them): they say SIP is off."""
    from appliance.signaling import SignalingConfig, SignalingState
    from appliance.signaling.app import create_app

    app = create_app(SignalingState(SignalingConfig(webui_dir=tmp_path)))

    async def main() -> int:
        client = app.test_client()
        resp = await client.post(f"/v1/live/sessions/live_sip_{'2' * 24}/hangup")
        body = await resp.get_json()
        assert body["error"]["code"] == "session_not_found", body
        return resp.status_code

    assert trio.run(main) == 404


@given(st.binary(max_size=256) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids,
                                                               max_size=3),
    max_leaves=8).map(lambda v: json.dumps({"session": v, "status_code": v,
                                            "target_uri": v}).encode()))
def test_the_body_parsers_raise_only_their_problem(raw: bytes) -> None:
    statuses = []
    for parse in (parse_accept_untrusted, parse_reject_untrusted, parse_refer_untrusted):
        try:
            parse(raw)
        except RealtimeProblem as p:  # the only error that may escape
            statuses.append(p.status)
    assert all(400 <= s < 500 for s in statuses), statuses
