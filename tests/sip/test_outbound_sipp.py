"""Outbound phone calls (issue 28 item 5) with SIPp as the callee (``uas`` scenarios):
``POST /v1/realtime/calls/sip`` through a trunk of ``--sip-trunks``, the call's state from
``GET /v1/realtime/calls/{id}``, ``/hangup``, busy, no answer, and digest authentication
checked by SIPp's own ``verifyauth`` (RFC 2617 MD5, qop=auth).

Waits are on conditions: SIPp's exit (every scenario fails on a missing or unexpected
message, ``-timeout_error``) or the call's state as the API shows it, polled under one
generous overall timeout.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from sip.support import (
    SCENARIOS,
    SIPP,
    TIMEOUT,
    Phone,
    SippRun,
    free_media_ports,
    free_port,
    start_phone,
)

from appliance.signaling.sip_calls import CALL_ID_RE
from appliance.signaling.sip_trunks import Trunk
from appliance.signaling.webhooks import CALL_ENDED, CALL_STARTED

pytestmark = [pytest.mark.interop,
              pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")]

PASSWORD = "s3cret-pa55"  # the one uas_auth.xml's verifyauth expects


def _listening(port: int, tcp: bool) -> bool:
    """Whether a socket is bound to 127.0.0.1:port (TCP: in LISTEN), from /proc: no probe
    connection that SIPp would have to deal with."""
    table = "/proc/net/tcp" if tcp else "/proc/net/udp"
    want = f"0100007F:{port:04X}"
    for line in Path(table).read_text().splitlines()[1:]:
        parts = line.split()
        if parts[1] == want and (not tcp or parts[3] == "0A"):
            return True
    return False


async def start_callee(nursery: trio.Nursery, scenario: str, port: int, transport: str,
                       cwd: Path) -> SippRun:
    assert SIPP is not None
    cmd = [SIPP, "-sf", str(SCENARIOS / scenario), "-t", transport, "-i", "127.0.0.1",
           "-p", str(port), "-mp", str(free_media_ports()), "-m", "1", "-nostdin",
           "-timeout", str(int(TIMEOUT)), "-timeout_error", "-max_recv_loops", "100"]
    proc = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, cwd=cwd)
    run = SippRun(proc)
    nursery.start_soon(run.pump)
    while not _listening(port, transport.startswith("t")):
        if run.done.is_set():
            raise AssertionError(f"SIPp exited before it listened: {run.text}")
        await trio.sleep(0.02)
    return run


async def phone_with_trunk(nursery: trio.Nursery, tmp_path: Path, transport: str = "u1",
                           **trunk: Any) -> tuple[Phone, int]:
    kind = socket.SOCK_STREAM if transport.startswith("t") else socket.SOCK_DGRAM
    port = free_port(kind)
    t = Trunk(name="test", host="127.0.0.1", port=port,
              transport="tcp" if transport.startswith("t") else "udp",
              from_user="+15550001111", **trunk)
    phone = await start_phone(nursery, tmp_path, trunks={"test": t})
    return phone, port


def metrics(phone: Phone) -> str:
    r = httpx.get(phone.base_url + "/metrics", timeout=TIMEOUT)
    r.raise_for_status()
    return r.text


def place(phone: Phone, **body: Any) -> Any:
    return phone.client().post("/realtime/calls/sip", body=body, cast_to=object)


def get_call(phone: Phone, call_id: str) -> Any:
    return phone.client().get(f"/realtime/calls/{call_id}", cast_to=object)


def hangup(phone: Phone, call_id: str) -> Any:
    return phone.client().post(f"/realtime/calls/{call_id}/hangup", cast_to=object)


async def until_status(phone: Phone, call_id: str, *statuses: str) -> dict[str, Any]:
    while True:
        view = await trio.to_thread.run_sync(get_call, phone, call_id)
        assert isinstance(view, dict)
        if view["status"] in statuses:
            return view
        await trio.sleep(0.05)


@pytest.mark.parametrize("transport", ["u1", "t1"], ids=["udp", "tcp"])
async def test_outbound_call_answered_then_the_callee_hangs_up(
        nursery: trio.Nursery, tmp_path: Path, transport: str) -> None:
    phone, port = await phone_with_trunk(nursery, tmp_path, transport)
    with trio.fail_after(TIMEOUT):
        callee = await start_callee(nursery, "uas_answer_bye.xml", port, transport, tmp_path)
        call = await trio.to_thread.run_sync(
            lambda: place(phone, to="+15552223333", agent="echo",
                          session={"type": "realtime", "model": "gpt-realtime"},
                          headers={"X-Campaign": "spring"}))
        assert isinstance(call, dict) and CALL_ID_RE.fullmatch(call["id"]), call
        assert call["status"] == "dialing" and call["direction"] == "outbound"
        code, out = await callee.result()
        assert code == 0, out  # our offer checked, 200 ACKed, BYE answered 200
        view = await until_status(phone, call["id"], "ended", "failed")
        assert phone.receiver is not None
        started = await phone.receiver.wait_for(CALL_STARTED)
        ended = await phone.receiver.wait_for(CALL_ENDED)
    assert view["status"] == "ended" and view["hung_up_by"] == "callee", view
    assert view["failure"] is None and view["agent"] == "echo" and view["progress"] == 180
    assert started["data"]["call_id"] == call["id"]
    assert started["data"]["direction"] == "outbound" and started["data"]["model"] == "gpt-realtime"
    assert ended["data"]["report"]["hung_up_by"] == "callee"


async def test_busy_callee_is_a_clear_failure(nursery: trio.Nursery, tmp_path: Path) -> None:
    phone, port = await phone_with_trunk(nursery, tmp_path)
    with trio.fail_after(TIMEOUT):
        callee = await start_callee(nursery, "uas_busy.xml", port, "u1", tmp_path)
        call = await trio.to_thread.run_sync(lambda: place(phone, to="sip:bob@127.0.0.1"))
        view = await until_status(phone, call["id"], "failed", "ended")
        code, out = await callee.result()
    assert code == 0, out  # the 486 was ACKed
    assert view["status"] == "failed"
    assert view["failure"] == {"status_code": 486, "reason": "Busy Here", "code": "busy"}
    text = await trio.to_thread.run_sync(metrics, phone)
    assert 'appliance_sip_calls_total{direction="outbound",event="failed-busy"} 1' in text
    assert 'appliance_sip_calls_total{direction="outbound",event="placed"} 1' in text
    assert 'appliance_sip_calls{direction="outbound"} 0' in text


async def test_sip_counters_reach_metrics(nursery: trio.Nursery, tmp_path: Path) -> None:
    phone, _ = await phone_with_trunk(nursery, tmp_path)
    with trio.socket.socket(type=socket.SOCK_DGRAM) as s:
        await s.sendto(b"NOT SIP AT ALL\r\n\r\n", phone.sip)
        with trio.fail_after(TIMEOUT):
            while True:
                text = await trio.to_thread.run_sync(metrics, phone)
                if 'appliance_sip_endpoint_total{event="malformed"} 1' in text:
                    break
                await trio.sleep(0.05)
    assert "# TYPE appliance_sip_endpoint_total counter" in text
    assert 'appliance_sip_transactions{kind="server"} 0' in text
    assert "appliance_sip_connections 0" in text and "appliance_sip_pending_invites 0" in text


async def test_no_answer_cancels_and_reports_408(nursery: trio.Nursery, tmp_path: Path) -> None:
    phone, port = await phone_with_trunk(nursery, tmp_path, ring_timeout=1.0)
    with trio.fail_after(TIMEOUT):
        callee = await start_callee(nursery, "uas_no_answer.xml", port, "u1", tmp_path)
        call = await trio.to_thread.run_sync(lambda: place(phone, to="1000"))
        view = await until_status(phone, call["id"], "failed", "ended")
        code, out = await callee.result()
    assert code == 0, out  # CANCEL after the 180, 487 ACKed
    assert view["status"] == "failed"
    assert view["failure"]["status_code"] == 408 and view["failure"]["code"] == "no_answer"


async def test_digest_challenge_answered_and_verified(nursery: trio.Nursery,
                                                      tmp_path: Path) -> None:
    phone, port = await phone_with_trunk(nursery, tmp_path, username="alice",
                                         password=PASSWORD, realm="trunk.test")
    with trio.fail_after(TIMEOUT):
        callee = await start_callee(nursery, "uas_auth.xml", port, "u1", tmp_path)
        call = await trio.to_thread.run_sync(lambda: place(phone, to="2000"))
        view = await until_status(phone, call["id"], "active", "failed", "ended")
        assert view["status"] == "active", view  # SIPp's verifyauth accepted our answer
        await trio.to_thread.run_sync(hangup, phone, call["id"])
        code, out = await callee.result()
        view = await until_status(phone, call["id"], "ended", "failed")
    assert code == 0, out  # the BYE came
    assert view["status"] == "ended" and view["hung_up_by"] == "api"
    assert PASSWORD not in str(view)


async def test_second_challenge_is_an_auth_failure(nursery: trio.Nursery,
                                                   tmp_path: Path) -> None:
    phone, port = await phone_with_trunk(nursery, tmp_path, username="alice",
                                         password="wrong-password")
    with trio.fail_after(TIMEOUT):
        callee = await start_callee(nursery, "uas_auth_refused.xml", port, "u1", tmp_path)
        call = await trio.to_thread.run_sync(lambda: place(phone, to="2000"))
        view = await until_status(phone, call["id"], "failed", "ended")
        code, out = await callee.result()
    assert code == 0, out  # exactly one retry, with Authorization; both 401s ACKed
    assert view["failure"]["status_code"] == 401 and view["failure"]["code"] == "auth_failed"


async def test_place_refuses_bad_requests(nursery: trio.Nursery, tmp_path: Path) -> None:
    phone, _ = await phone_with_trunk(nursery, tmp_path)
    client = phone.client()

    def status_of(**body: Any) -> tuple[int, str]:
        import openai
        try:
            client.post("/realtime/calls/sip", body=body, cast_to=object)
        except openai.APIStatusError as exc:
            body_ = exc.body if isinstance(exc.body, dict) else {}
            return exc.status_code, str(body_.get("code") or body_.get("error", {}))
        return 201, ""

    assert (await trio.to_thread.run_sync(lambda: status_of(to="+1555", trunk="nope")))[0] == 404
    assert (await trio.to_thread.run_sync(lambda: status_of(to="no spaces allowed")))[0] == 400
    assert (await trio.to_thread.run_sync(lambda: status_of(to=5)))[0] == 400
    assert (await trio.to_thread.run_sync(
        lambda: status_of(to="+1555", headers={"Via": "evil"})))[0] == 400


async def test_outbound_over_tls_into_our_own_listener(nursery: trio.Nursery,
                                                       tmp_path: Path) -> None:
    """SIPp here has no TLS, so the callee is the appliance's own ``--sip-tls`` listener:
    the outbound INVITE goes out over a verified TLS connection (our self-signed certificate
    as the trunk's CA), rings as an incoming call, is accepted over HTTP, and the caller
    side becomes active; hanging up the outbound side ends both."""
    from appliance.signaling.tls import ensure_self_signed

    cert, key, _ = ensure_self_signed(tmp_path / "tls", ["127.0.0.1"])
    tls_port = free_port(socket.SOCK_STREAM)
    t = Trunk(name="self", host="127.0.0.1", port=tls_port, transport="tls", tls_ca=cert,
              from_user="loop")
    phone = await start_phone(nursery, tmp_path, trunks={"self": t},
                              tls=("127.0.0.1", tls_port), tls_cert=cert, tls_key=key)
    assert phone.receiver is not None
    with trio.fail_after(TIMEOUT):
        call = await trio.to_thread.run_sync(lambda: place(phone, to="agent"))
        ev = await phone.receiver.wait_for("realtime.call.incoming")
        inbound = ev["data"]["call_id"]
        via = next(h["value"] for h in ev["data"]["sip_headers"] if h["name"] == "Via")
        assert via.startswith("SIP/2.0/TLS ")
        await trio.to_thread.run_sync(lambda: phone.client().realtime.calls.accept(
            inbound, type="realtime", model="gpt-realtime"))
        view = await until_status(phone, call["id"], "active", "failed", "ended")
        assert view["status"] == "active", view
        await trio.to_thread.run_sync(hangup, phone, call["id"])
        view = await until_status(phone, call["id"], "ended", "failed")
        other = await until_status(phone, inbound, "ended")
    assert view["hung_up_by"] == "api" and other["end_reason"] == "bye"


def load_example() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples" / "outbound_call.py"
    spec = importlib.util.spec_from_file_location("outbound_call_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


async def test_the_outbound_example_places_and_hangs_up(nursery: trio.Nursery,
                                                        tmp_path: Path) -> None:
    """examples/outbound_call.py against SIPp (digest-challenging callee): answered, then
    hung up by the example, which returns the ended call."""
    example = load_example()
    phone, port = await phone_with_trunk(nursery, tmp_path, username="alice", password=PASSWORD)
    lines: list[str] = []
    with trio.fail_after(TIMEOUT):
        callee = await start_callee(nursery, "uas_auth.xml", port, "u1", tmp_path)
        call = await trio.to_thread.run_sync(lambda: example.follow_call(
            phone.client(), "2000", trunk="test", hangup_after=0.0, poll=0.05,
            timeout=TIMEOUT, say=lines.append))
        code, out = await callee.result()
    assert code == 0, out
    assert call["status"] == "ended" and call["answered_at"] is not None, (call, lines)
    assert any(": active" in ln for ln in lines) and "ended by api" in lines[-1], lines
