"""Prometheus metrics, the server-sent event feed and the real hypercorn server (HTTP/HTTPS)."""

from __future__ import annotations

import json
import re
import ssl
from functools import partial
from typing import Any

import trio
from signaling.fakes import OFFER

from appliance.signaling import serve_signaling
from appliance.signaling.tls import ensure_self_signed

SDP = {"Content-Type": "application/sdp"}
# One sample line of the text exposition format 0.0.4.
_SAMPLE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?P<labels>[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*)\})? (?P<value>[-+]?(?:[0-9.e+-]+|Inf|NaN))$'
)


def parse_exposition(text: str) -> dict[str, float]:
    """Strictly parse the text format: every family has HELP and TYPE before its samples."""
    assert text.endswith("\n")
    samples: dict[str, float] = {}
    typed: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram"), line
            assert name not in typed, f"family {name} declared twice"
            typed[name] = kind
            continue
        m = _SAMPLE.match(line)
        assert m, f"bad sample line {line!r}"
        family = re.sub(r"_(bucket|sum|count)$", "", m["name"])
        assert m["name"] in typed or family in typed, f"{m['name']} has no TYPE"
        key = m["name"] + ("{" + m["labels"] + "}" if m["labels"] else "")
        samples[key] = float(m["value"])
    return samples


async def test_metrics_format_and_values(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    for _ in range(3):
        assert (await c.post("/v1/sessions", data=OFFER, headers=SDP)).status_code == 201
    await c.get("/v1/sessions")  # observes the setup timelines
    resp = await c.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    m = parse_exposition((await resp.get_data()).decode())
    assert m['appliance_sessions{state="connected"}'] == 3
    assert m['appliance_sessions{state="ended"}'] == 0
    assert m["appliance_sessions_created_total"] == 3
    # Setup histogram: dtls_done at 14 ms for all three sessions, cumulative buckets.
    assert m['appliance_session_setup_seconds_bucket{step="dtls_done",le="0.01"}'] == 0
    assert m['appliance_session_setup_seconds_bucket{step="dtls_done",le="0.025"}'] == 3
    assert m['appliance_session_setup_seconds_bucket{step="dtls_done",le="+Inf"}'] == 3
    assert m['appliance_session_setup_seconds_count{step="dtls_done"}'] == 3
    assert abs(m['appliance_session_setup_seconds_sum{step="dtls_done"}'] - 0.042) < 1e-9
    assert m['appliance_session_setup_seconds_count{step="first_rtp_out"}'] == 0
    # Counters from the peers' stats, nested objects flattened.
    assert m['appliance_transceiver_datagrams_in_total{transceiver="0"}'] == 10
    assert m['appliance_transceiver_drops_bad_proxy_total{transceiver="1"}'] == 1
    assert m['appliance_relay_packets_in_total{worker="0"}'] == 100
    assert m['appliance_relay_drops_bad_mac_total{worker="0"}'] == 2
    assert m['appliance_relay_flows{worker="0"}'] == 3
    assert m['appliance_process_up{role="transceiver",id="0"}'] == 1
    assert m['appliance_http_responses_total{code="201"}'] == 3
    # Observing again does not count a session twice.
    await c.get("/v1/sessions")
    m = parse_exposition((await (await c.get("/metrics")).get_data()).decode())
    assert m['appliance_session_setup_seconds_count{step="dtls_done"}'] == 3


async def test_turn_waterfalls_become_histograms(make_env: Any) -> None:
    """The turns an agent reported (``turn.metrics``, kept in the session object by the
    transceiver) reach /metrics the way the setup timelines do: through the list poll, one
    observation per turn and span, timed from the caller's end of speech (issue 38 item 5)."""
    env = await make_env(n=1)
    c = env.client()
    assert (await c.post("/v1/sessions", data=OFFER, headers=SDP)).status_code == 201
    m = parse_exposition((await (await c.get("/metrics")).get_data()).decode())
    for span in ("speech", "end_of_turn", "transcript", "first_token", "first_audio",
                 "first_sent"):
        assert m[f"appliance_turn_{span}_seconds_count"] == 0  # declared before any turn
    [fake] = env.fakes.values()
    [session] = fake.sessions.values()
    turn = {"turn": 1, "speech_start_ms": -1840.0, "speech_end_ms": -520.0,
            "transcript_ms": 2.1, "stt_ms": 2.0, "first_token_ms": -60.3,
            "first_audio_ms": 31.0, "first_sent_ms": 31.2}
    session["turns"] = [turn]
    await c.get("/metrics")
    session["turns"] = [turn, {**turn, "turn": 2, "first_sent_ms": 280.0}]
    m = parse_exposition((await (await c.get("/metrics")).get_data()).decode())
    # 0.5512 s and 0.8 s from the end of speech to the first frame sent: cumulative buckets.
    assert m['appliance_turn_first_sent_seconds_bucket{le="0.5"}'] == 0
    assert m['appliance_turn_first_sent_seconds_bucket{le="0.6"}'] == 1
    assert m['appliance_turn_first_sent_seconds_bucket{le="0.8"}'] == 2
    assert m['appliance_turn_first_sent_seconds_bucket{le="+Inf"}'] == 2
    assert m["appliance_turn_first_sent_seconds_count"] == 2
    assert abs(m["appliance_turn_first_sent_seconds_sum"] - 1.3512) < 1e-9
    assert m["appliance_turn_end_of_turn_seconds_count"] == 2
    assert abs(m["appliance_turn_end_of_turn_seconds_sum"] - 1.04) < 1e-9
    assert abs(m["appliance_turn_speech_seconds_sum"] - 2.64) < 1e-9
    # The session's own view carries them (the dashboard draws them from it).
    view = await (await c.get(f"/v1/sessions/{session['id']}")).get_json()
    assert [t["turn"] for t in view["turns"]] == [1, 2]


async def test_lost_sessions_are_counted(make_env: Any) -> None:
    env = await make_env(n=1)
    c = env.client()
    await c.post("/v1/sessions", data=OFFER, headers=SDP)
    env.cancel[0].cancel()
    await env.state.process_down("transceiver", "0")
    m = parse_exposition((await (await c.get("/metrics")).get_data()).decode())
    assert m["appliance_sessions_lost_total"] == 1
    assert m['appliance_process_up{role="transceiver",id="0"}'] == 0


async def http_get(stream: trio.abc.Stream, path: str, until: bytes, headers: str = "") -> bytes:
    """Send a GET and read until the ``until`` regex matches what arrived."""
    await stream.send_all(
        f"GET {path} HTTP/1.1\r\nHost: test\r\n{headers}Accept: text/event-stream\r\n\r\n".encode()
    )
    buf = b""
    while not re.search(until, buf):
        chunk = await stream.receive_some(65536)
        assert chunk, buf
        buf += chunk
    return buf


async def test_events_stream_yields_sessions_and_health(make_env: Any, nursery: trio.Nursery) -> None:
    env = await make_env()
    env.state.config.http = ("127.0.0.1", 0)
    await env.client().post("/v1/sessions", data=OFFER, headers=SDP)
    binds = await nursery.start(partial(serve_signaling, env.state.config, state=env.state))
    port = int(binds[0].rsplit(":", 1)[1])
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            raw = await http_get(stream, "/v1/events", rb"event: health\ndata: [^\n]*\n\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"content-type: text/event-stream" in head.lower()
    events = {}
    for block in body.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            events.setdefault(fields["event"], json.loads(fields["data"]))
    assert [s["state"] for s in events["sessions"]["sessions"]] == ["connected"]
    roles = [(p["role"], p["id"], p["up"]) for p in events["health"]["processes"]]
    assert roles == [("signaling", "0", True), ("transceiver", "0", True),
                     ("transceiver", "1", True), ("relay", "0", True)]


async def test_https_with_a_self_signed_certificate(make_env: Any, nursery: trio.Nursery, tmp_path: Any) -> None:
    cert, key, fp = ensure_self_signed(tmp_path / "state", ["192.0.2.10"])
    env = await make_env(http=("127.0.0.1", 0), tls_cert=cert, tls_key=key)
    binds = await nursery.start(partial(serve_signaling, env.state.config, state=env.state))
    assert binds[0].startswith("https://")
    port = int(binds[0].rsplit(":", 1)[1])
    ctx = ssl.create_default_context(cafile=cert)
    with trio.fail_after(5):
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        stream = trio.SSLStream(tcp, ctx, server_hostname="localhost")
        async with stream:
            raw = await http_get(stream, "/healthz", rb'"ok"\}')
    assert raw.startswith(b"HTTP/1.1 200")
    assert re.fullmatch(r"([0-9A-F]{2}:){31}[0-9A-F]{2}", fp)
