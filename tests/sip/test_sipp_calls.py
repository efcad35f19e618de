"""Phone calls into signaling's SIP listener, driven by SIPp (Debian ``sip-tester``), with
call control over HTTP through the official ``openai`` SDK (``client.realtime.calls``) and
the ``realtime.call.incoming`` webhook verified with ``client.webhooks.unwrap``.

Every wait is on an event: SIPp's exit (each scenario fails on an unexpected or missing
message, ``-timeout_error``) or the webhook receiver getting a delivery.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from sip.support import SIPP, TIMEOUT, Phone, SippRun, run_sipp, start_phone, until_incoming, unwrap

from appliance.signaling.sip_calls import CALL_ID_RE, CALL_INCOMING
from appliance.signaling.webhooks import CALL_ENDED, CALL_STARTED

pytestmark = [pytest.mark.interop,
              pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")]


async def incoming(phone: Phone, run: SippRun) -> dict[str, Any]:
    """The webhook of SIPp's call, its signature checked by the SDK."""
    assert phone.receiver is not None
    ev = await until_incoming(phone, run)
    headers, body = phone.receiver.raw[phone.receiver.events.index(ev)]
    got = await trio.to_thread.run_sync(unwrap, body, headers)  # signature + timestamp
    assert got.type == CALL_INCOMING and got.data.call_id == ev["data"]["call_id"]
    return ev


def accept(phone: Phone, call_id: str) -> None:
    calls = phone.client().realtime.calls
    assert hasattr(calls, "accept"), "this openai SDK has no realtime.calls.accept"
    calls.accept(call_id, type="realtime", model="gpt-realtime",
                 instructions="You answer the phone.")


def get_call(phone: Phone, call_id: str) -> Any:
    """GET /v1/realtime/calls/{id} through the SDK's client (its auth and base URL)."""
    return phone.client().get(f"/realtime/calls/{call_id}", cast_to=object)


async def test_options_ping_is_answered(nursery: trio.Nursery, tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        code, out = await (await run_sipp(nursery, phone, "options.xml", cwd=tmp_path)).result()
    assert code == 0, out


@pytest.mark.parametrize("transport", ["u1", "t1"], ids=["udp", "tcp"])
async def test_accept_over_http_then_the_caller_hangs_up(nursery: trio.Nursery, tmp_path: Path,
                                                         transport: str) -> None:
    phone = await start_phone(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "accept_caller_bye.xml", transport=transport, cwd=tmp_path)
        ev = await incoming(phone, proc)
        call_id = ev["data"]["call_id"]
        assert CALL_ID_RE.fullmatch(call_id), call_id
        names = [h["name"] for h in ev["data"]["sip_headers"]]
        values = {h["name"]: h["value"] for h in ev["data"]["sip_headers"]}
        assert names[0] == "Via" and "X-Test-Caller" in names and values["Subject"] == "phone test"
        await trio.to_thread.run_sync(accept, phone, call_id)
        code, out = await proc.result()
        assert code == 0, out  # 200 with our PCMU answer (checked in the scenario), ACK, BYE
        assert phone.receiver is not None
        ended = await phone.receiver.wait_for(CALL_ENDED)
    started = await phone.receiver.wait_for(CALL_STARTED)
    assert started["data"]["transport"] == "sip" and started["data"]["model"] == "gpt-realtime"
    assert ended["data"]["call_id"] == call_id
    assert ended["data"]["report"]["hung_up_by"] == "client"
    view = await trio.to_thread.run_sync(get_call, phone, call_id)
    assert isinstance(view, dict) and view["status"] == "ended" and view["transport"] == "sip"


@pytest.mark.parametrize("transport", ["u1", "t1"], ids=["udp", "tcp"])
async def test_the_callee_hangs_up_with_the_sdk(nursery: trio.Nursery, tmp_path: Path,
                                                transport: str) -> None:
    phone = await start_phone(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "accept_callee_bye.xml", transport=transport,
                              cwd=tmp_path)
        call_id = (await incoming(phone, proc))["data"]["call_id"]
        await trio.to_thread.run_sync(accept, phone, call_id)
        calls = phone.client().realtime.calls
        # the hangup must wait for the ACK (RFC 3261 §15): our BYE follows it either way
        await trio.to_thread.run_sync(lambda: calls.hangup(call_id))
        code, out = await proc.result()
        assert code == 0, out
        assert phone.receiver is not None
        ended = await phone.receiver.wait_for(CALL_ENDED)
    assert ended["data"]["report"]["hung_up_by"] == "api"


async def test_reject_answers_603(nursery: trio.Nursery, tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "reject.xml", cwd=tmp_path)
        call_id = (await incoming(phone, proc))["data"]["call_id"]
        calls = phone.client().realtime.calls
        await trio.to_thread.run_sync(lambda: calls.reject(call_id))
        code, out = await proc.result()
    assert code == 0, out
    # a second answer to a finished call is a clear 4xx, not a crash
    import openai

    with pytest.raises(openai.APIStatusError) as err:
        await trio.to_thread.run_sync(lambda: calls.accept(call_id, type="realtime"))
    assert err.value.status_code == 409


async def test_cancel_before_the_answer_gets_487(nursery: trio.Nursery, tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path)
    assert phone.receiver is not None
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "cancel.xml", cwd=tmp_path)
        code, out = await proc.result()  # SIPp cancels at once: its exit may beat the hook
        assert code == 0, out
        call_id = (await phone.receiver.wait_for(CALL_INCOMING))["data"]["call_id"]
    view = await trio.to_thread.run_sync(get_call, phone, call_id)
    assert isinstance(view, dict) and view["status"] == "ended"
    assert view["end_reason"] == "cancelled"


async def test_no_answer_gets_480(nursery: trio.Nursery, tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path, answer_timeout=1.0)
    assert phone.receiver is not None
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "no_answer.xml", cwd=tmp_path)
        code, out = await proc.result()
        assert code == 0, out
        call_id = (await phone.receiver.wait_for(CALL_INCOMING))["data"]["call_id"]  # it rang
    view = await trio.to_thread.run_sync(get_call, phone, call_id)
    assert view["status"] == "ended" and view["end_reason"] == "rejected 480"


async def test_a_malformed_request_gets_400_over_udp(nursery: trio.Nursery,
                                                     tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        code, out = await (await run_sipp(nursery, phone, "malformed.xml",
                                            cwd=tmp_path)).result()
    assert code == 0, out


async def test_a_source_outside_sip_allow_gets_403(nursery: trio.Nursery,
                                                   tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path, allow=["127.0.0.1/32"])
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "forbidden.xml", local_ip="127.0.0.2", cwd=tmp_path)
        code, out = await proc.result()
    assert code == 0, out


async def until_status(phone: Phone, call_id: str, status: str) -> None:
    """Poll the call's view until it reaches ``status`` (the caller bounds the wait)."""
    while True:
        view = await trio.to_thread.run_sync(get_call, phone, call_id)
        if view["status"] == status:
            return
        await trio.sleep(0.05)


async def test_refer_transfers_and_leaves_the_call(nursery: trio.Nursery,
                                                   tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "refer.xml", cwd=tmp_path)
        call_id = (await incoming(phone, proc))["data"]["call_id"]
        await trio.to_thread.run_sync(accept, phone, call_id)
        await until_status(phone, call_id, "active")  # REFER needs the ACKed dialog
        calls = phone.client().realtime.calls
        await trio.to_thread.run_sync(
            lambda: calls.refer(call_id, target_uri="sip:desk@example.com"))
        code, out = await proc.result()
        assert code == 0, out
        await until_status(phone, call_id, "ended")
    view = await trio.to_thread.run_sync(get_call, phone, call_id)
    assert view["refer"][-1]["status"] == 200 and view["refer"][-1]["final"] is True


async def test_sip_agent_answers_at_once_without_webhooks(nursery: trio.Nursery,
                                                          tmp_path: Path) -> None:
    """The dev-box path: no --webhook-url, --sip-agent answers every call."""
    phone = await start_phone(nursery, tmp_path, webhooks=False, agent="echo")
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "accept_caller_bye.xml", cwd=tmp_path)
        code, out = await proc.result()
    assert code == 0, out


async def test_no_call_control_at_all_is_480_at_once(nursery: trio.Nursery,
                                                     tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path, webhooks=False)  # default 30 s bound
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "no_answer.xml", cwd=tmp_path)
        code, out = await proc.result()
    assert code == 0, out


async def test_a_reinvite_to_hold_is_answered_recvonly(nursery: trio.Nursery,
                                                      tmp_path: Path) -> None:
    phone = await start_phone(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        proc = await run_sipp(nursery, phone, "hold.xml", cwd=tmp_path)
        call_id = (await incoming(phone, proc))["data"]["call_id"]
        await trio.to_thread.run_sync(accept, phone, call_id)
        code, out = await proc.result()  # the scenario checks a=recvonly in our answer
    assert code == 0, out
