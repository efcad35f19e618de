"""A phone call's end-of-call report and its counters in ``/metrics`` (issue 28 items 3-4).

* The ``realtime.call.ended`` webhook of a phone call carries what a WebRTC call's does —
  ``transcript`` and ``turns`` (the agent's ``transcript.*`` and ``turn.metrics`` events,
  kept by the transceiver's phone session) and ``stats`` (the session object's, with the
  RTP leg's counters) — plus ``sip``: the INVITE's Call-ID, From and To, and the hangup
  cause. SIPp calls in with a 1 kHz PCMU
  tone from a pcap, the webhook's backend accepts it with an agent that echoes and reports
  two transcript lines and a turn, and SIPp hangs up.
* The transceiver's phone counters (RTP/RTCP each way, drops by cause — ``stray``: the
  latch refused a source — SRTP authentication failures, DTMF) reach signaling's
  ``/metrics`` as ``appliance_transceiver_phone_<name>_total``, equal to the ended leg's own
  counters. A few packets from a second port of the caller's address, once the call has
  latched, are latching refusals: the relay's vouch query is answered no (the transceiver's
  ``vouch_refused``, also in ``/metrics``) and they never reach the leg.

Every wait is on a condition: SIPp's exit, the webhook's arrival, the transceiver's tables,
the counters as ``/metrics`` shows them (it refreshes from the transceivers' ``stats``).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from sip.support import (
    SIPP,
    TIMEOUT,
    run_sipp,
    start_phone_stack,
    until_incoming,
    unwrap,
    write_tone_pcap,
)

from appliance.proto.rtp import rtp_header
from appliance.signaling.webhooks import CALL_ENDED
from appliance.transceiver.phone_session import LEG_COUNTERS

pytestmark = [pytest.mark.interop,
              pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")]

AGENT = f"{Path(__file__).parent / 'transcript_agent.py'}:agent"


async def eventually(pred: Any, what: str) -> None:
    with trio.fail_after(TIMEOUT):
        while not pred():  # noqa: ASYNC110 - polling state that lives in other tasks
            await trio.sleep(0.02)


def header(event: dict[str, Any], name: str) -> str:
    return next(h["value"] for h in event["data"]["sip_headers"] if h["name"] == name)


async def test_phone_call_report_carries_transcript_stats_and_sip_fields(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    from sip.transcript_agent import GREETING, HEARD, TURN

    stack = await start_phone_stack(nursery, tmp_path, webhooks=True)
    phone = stack.phone
    assert phone.receiver is not None
    write_tone_pcap(tmp_path / "tone.pcap", seconds=3.0)
    with trio.fail_after(TIMEOUT):
        run = await run_sipp(nursery, phone, "echo_pcap.xml", cwd=tmp_path)
        incoming = await until_incoming(phone, run)
        call_id = incoming["data"]["call_id"]
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            r = await http.post(f"{phone.base_url}/v1/realtime/calls/{call_id}/accept",
                                params={"agent": AGENT}, json={"type": "realtime"})
        assert r.status_code == 200, r.text
        code, out = await run.result()
        assert code == 0, out  # the tone played, our BYE's 200 came
        ended = await phone.receiver.wait_for(CALL_ENDED)
    raw = next(body for headers, body in phone.receiver.raw if b'"realtime.call.ended"' in body)
    headers = next(h for h, body in phone.receiver.raw if body == raw)
    assert unwrap(raw, headers).type == CALL_ENDED  # signed like every other event
    assert ended["data"]["call_id"] == call_id and ended["data"]["transport"] == "sip"
    report = ended["data"]["report"]
    lines = report["transcript"]
    assert [(t["who"], t["text"]) for t in lines] == [("agent", GREETING), ("user", HEARD)]
    assert report["turns"] == [TURN]  # the turn's waterfall (issue 38 item 5)
    sip = report["sip"]
    assert sip["direction"] == "inbound"
    assert sip["call_id"] == header(incoming, "Call-ID")
    assert sip["from"] == header(incoming, "From") and "sip:caller@127.0.0.1" in sip["from"]
    assert sip["to"] == header(incoming, "To") and sip["to"].startswith("<sip:agent@")
    assert sip["hangup_cause"] == "bye" and report["hung_up_by"] == "client"
    # the scenario holds the call 3.5 s between its ACK and its BYE
    assert report["duration_seconds"] >= 3.0, report
    assert report["duration_seconds"] == round(report["ended_at"] - report["started_at"], 3)
    stats = report["stats"]
    assert stats["codec"] == "PCMU/8000" and stats["srtp_profile"] is None
    assert stats["leg"]["rtp_in"] >= 100 and stats["leg"]["rtp_out"] >= 100, stats
    assert stats["packets_in"] >= stats["leg"]["rtp_in"]
    assert len([e for e in phone.receiver.events if e["type"] == CALL_ENDED]) == 1
    # One registry (issue 39 item 2): the phone call is a session like any, of its kind,
    # in GET /v1/sessions and /v1/sessions/{id} (what the dashboard's feed lists).
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        listed = (await http.get(f"{phone.base_url}/v1/sessions")).json()["sessions"]
        one = (await http.get(f"{phone.base_url}/v1/sessions/{call_id}")).json()
    [mine] = [x for x in listed if x["id"] == call_id]
    for view in (mine, one):
        assert view["kind"] == "phone" and view["state"] == "ended", view
        assert view["codec"] == "PCMU/8000" and view["packets_in"] >= 100
        assert view["phone"]["leg"]["rtp_in"] >= 100


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_phone_counters_reach_metrics(nursery: trio.Nursery, tmp_path: Path) -> None:
    stack = await start_phone_stack(nursery, tmp_path)
    tr = stack.transceiver
    write_tone_pcap(tmp_path / "tone.pcap", seconds=3.0)
    strays = 5
    with trio.fail_after(TIMEOUT):
        run = await run_sipp(nursery, stack.phone, "echo_pcap.xml", cwd=tmp_path)

        def latched() -> Any:
            return next((p for p in tr.calls.values() if p.latched is not None), None)

        await eventually(lambda: latched() is not None or run.done.is_set(), "the latch")
        assert latched() is not None, run.text
        with trio.socket.socket(type=socket.SOCK_DGRAM) as s:  # the caller's IP, another port
            await s.bind(("127.0.0.1", 0))
            for i in range(strays):
                await s.sendto(rtp_header(0, 7000 + i, 160 * i, 0xBADC0DE) + b"\xff" * 160,
                               stack.relay_public)
        code, out = await run.result()
        assert code == 0, out
        await eventually(lambda: not tr.calls, "the BYE ended the phone session")
    leg = tr.ended_phones[-1]["phone"]["leg"]
    # the latch refused the second port (RFC 4961 behaviour, docs/adr-sip-media.md)
    # the latch refused the second port (RFC 4961 behaviour, docs/adr-sip-media.md) before
    # it reached the leg: the relay asked the transceiver once, was told no, and dropped them
    assert leg["stray"] == 0 and leg["learning"] == 0, leg
    assert tr.counters["vouch_refused"] >= 1, tr.counters
    assert tr.counters["vouch_queries"] == tr.counters["vouch_answers"] + tr.counters[
        "vouch_refused"], tr.counters
    assert stack.relay_stats()["counters"]["drops"].get("vouch-pending", 0) >= strays
    assert tr.counters["phone_dtmf_in"] == 0

    def scrape() -> str:
        r = httpx.get(stack.phone.base_url + "/metrics", timeout=TIMEOUT)
        r.raise_for_status()
        return r.text

    want = {f"appliance_transceiver_phone_{name}_total": leg[name] for name in LEG_COUNTERS}
    want["appliance_transceiver_vouch_queries_total"] = tr.counters["vouch_queries"]
    want["appliance_transceiver_vouch_answers_total"] = tr.counters["vouch_answers"]
    want["appliance_transceiver_vouch_refused_total"] = tr.counters["vouch_refused"]
    with trio.fail_after(TIMEOUT):  # signaling's view refreshes from the transceiver's stats
        while True:
            text = await trio.to_thread.run_sync(scrape)
            got = {name: metric(text, name) for name in want}
            if got == want:
                break
            await trio.sleep(0.1)
    assert want["appliance_transceiver_phone_rtp_in_total"] >= 100
    assert metric(text, "appliance_transceiver_phone_dtmf_in_total") == 0
    assert "# TYPE appliance_transceiver_phone_auth_failed_total counter" in text
