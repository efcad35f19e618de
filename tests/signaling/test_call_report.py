"""The end-of-call report (``realtime.call.ended``'s ``data.report``) is built once
(webhooks.end_report) for every call kind: a WebRTC call's, an incoming SIP call's and an
outbound SIP call's carry the same keys in the same order, read the same session object the
same way, and only the SIP ones add ``sip``. Driven without sockets: each surface's report
step is called with the same session object and its emitted event is read back."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from appliance.signaling import SignalingConfig, SignalingState
from appliance.signaling.phone_media import TransceiverPhoneMedia
from appliance.signaling.realtime_http import Realtime
from appliance.signaling.registry import SessionRecord
from appliance.signaling.sip_call import CallState
from appliance.signaling.sip_calls import SipCall, SipCalls
from appliance.signaling.sip_config import SipSettings
from appliance.signaling.sip_outbound import OutboundCall, SipOutbound
from appliance.signaling.webhooks import CALL_ENDED, report_stats

TURN = {"turn": 1, "speech_start_ms": -1840.0, "first_sent_ms": 31.2}
#: a session object as the transceiver reports one (session_info.py), media included
SESSION: dict[str, Any] = {
    "packets_in": 120, "packets_out": 118, "bytes_in": 19200, "bytes_out": 18880,
    "rtt_ms": 21.5, "jitter_ms": 2.0, "loss": 0.01, "codec": "PCMU/8000", "datachannels": 0,
    "transcript": [{"who": "user", "text": "hello", "at": 11.0}, "not a line"],
    "turns": [TURN]}
COMMON = ["started_at", "ended_at", "duration_seconds", "end_reason", "hung_up_by", "stats",
          "recording", "transcript", "turns"]


def signaling(tmp_path: Path) -> tuple[SignalingState, list[tuple[str, dict[str, Any]]]]:
    cfg = SignalingConfig(http=("127.0.0.1", 0), public_addresses=["127.0.0.1"],
                          udp_port=9, webui_dir=tmp_path / "webui",
                          transceivers={0: str(tmp_path / "t0.sock")})
    state = SignalingState(cfg, clock=lambda: 20.0)
    emitted: list[tuple[str, dict[str, Any]]] = []
    state.webhooks.emit = lambda kind, data: emitted.append((kind, data))  # type: ignore[method-assign]
    return state, emitted


def webrtc(tmp_path: Path) -> dict[str, Any]:
    state, emitted = signaling(tmp_path)
    rt = Realtime(state)
    state.registry.add(SessionRecord(id="rtc_w", transceiver=0, etag="e", created_at=10.0,
                                     created_mono=0.0, agent="echo", ended_at=14.5,
                                     end_reason="hangup", last=dict(SESSION)))
    state.webhooks.pending_calls["rtc_w"] = {"call_id": "rtc_w", "transport": "webrtc",
                                             "agent": "echo", "model": None}
    assert rt.call_ended_if_done("rtc_w")
    ((kind, data),) = emitted
    assert kind == CALL_ENDED
    return data


def sip_inbound(tmp_path: Path) -> dict[str, Any]:
    state, emitted = signaling(tmp_path)
    calls = SipCalls(state, SipSettings(udp_tcp=("127.0.0.1", 0)),
                     media=TransceiverPhoneMedia(state))
    invite = {"Call-ID": "abc@trunk", "From": "<sip:caller@trunk>;tag=1", "To": "<sip:agent@us>"}
    call = SipCall("rtc_sip_i", "sip_i", 9.0, SimpleNamespace(invite=invite),
                   state=CallState.ENDED, started_at=10.0, ended_at=14.5, hung_up_by="api",
                   dtmf=["1", "2"])
    calls._report(call, "hangup", dict(SESSION))
    ((kind, data),) = emitted
    assert kind == CALL_ENDED
    assert data["report"]["sip"] == {"direction": "inbound", "call_id": "abc@trunk",
                                     "from": invite["From"], "to": invite["To"],
                                     "hangup_cause": "hangup", "dtmf": "12"}
    return data


def sip_outbound(tmp_path: Path) -> dict[str, Any]:
    state, emitted = signaling(tmp_path)
    ob = SipOutbound(state, {}, None)
    call = OutboundCall("rtc_sip_o", "sip_o", 9.0, "t", "1000", "echo", {},
                        state=CallState.ENDED, started_at=10.0, ended_at=14.5,
                        hung_up_by="api", from_uri="sip:us@trunk", target="sip:1000@trunk",
                        sip_call_id="xyz@us", media_reason="hangup")
    ob._report(call, "bye", dict(SESSION))
    ((kind, data),) = emitted
    assert kind == CALL_ENDED
    assert data["report"]["sip"] == {"direction": "outbound", "call_id": "xyz@us",
                                     "from": "sip:us@trunk", "to": "sip:1000@trunk",
                                     "hangup_cause": "hangup", "dtmf": ""}
    return data


@pytest.mark.parametrize("kind", [webrtc, sip_inbound, sip_outbound],
                         ids=["webrtc", "sip-inbound", "sip-outbound"])
def test_every_call_kind_reports_the_same_keys_from_the_same_session(kind: Any,
                                                                     tmp_path: Path) -> None:
    data = kind(tmp_path)
    report = data["report"]
    assert list(report)[:len(COMMON)] == COMMON
    assert set(report) - set(COMMON) == (set() if kind is webrtc else {"sip"})
    assert report["started_at"] == 10.0 and report["ended_at"] == 14.5
    assert report["duration_seconds"] == 4.5
    assert report["hung_up_by"] == "api"
    assert report["stats"] == report_stats(SESSION) and report["stats"]["codec"] == "PCMU/8000"
    assert report["transcript"] == [{"who": "user", "text": "hello", "at": 11.0}]
    assert report["turns"] == [TURN]
    assert report["recording"] is None  # the session object says nothing was recorded
    assert data["call_id"].startswith("rtc_")
