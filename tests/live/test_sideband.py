"""GPT-Live's sideband, ``GET /v1/live/sessions/{id}/attach[?graceful_close=true]``, driven
by the official SDK's own helper (``client.live.sideband.connect``) against the signaling
server on loopback (the app ``appliance up`` serves), attached to a **WebSocket** Live
session (``client.live.connect``) — the WebRTC half is tests/e2e/test_live_aiortc.py.

Every frame the sideband receives is checked against the SDK's ``ConnectServerEvent``
types (live_shapes.py ``sideband=True``): the replayed ``session.started``, the session's
events, the reflected input audio and the timestamped output audio. The SDK is a threaded
client: each exchange runs in a worker thread while the server runs in the test's nursery.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import trio
from speech.speech_support import espeak_pcm48, have_espeak, silence

from appliance.realtime.audio import pcm48k_to_24k

openai = pytest.importorskip("openai")
from live.live_shapes import shape_errors  # noqa: E402
from live.test_sdk import API_TOKEN, FRAME, TIMEOUT, client, start_server  # noqa: E402

needs_espeak = pytest.mark.skipif(not have_espeak(), reason="espeak-ng is not installed")


class Reader:
    """One connection's frames, checked against the SDK's types as they come."""

    def __init__(self, conn: Any, *, sideband: bool) -> None:
        self.conn = conn
        self.sideband = sideband
        self.raw: list[dict[str, Any]] = []

    def until(self, kind: str, **fields: Any) -> dict[str, Any]:
        while True:
            raw = json.loads(self.conn.recv_bytes())
            assert shape_errors(raw, sideband=self.sideband) == [], raw
            self.conn.parse_event(json.dumps(raw))  # the SDK's own parse takes it
            self.raw.append(raw)
            if raw["type"] == kind and all(raw.get(k) == v for k, v in fields.items()):
                return raw

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.raw if e["type"] == kind]


def watched_session(url: str) -> dict[str, Any]:
    c = client(url)
    speech = pcm48k_to_24k(silence(0.3) + espeak_pcm48("hello there") + silence(1.5))
    with c.live.connect(extra_headers={"X-Agent": "realtime"}) as conn:
        primary = Reader(conn, sideband=False)
        conn.session.start(session={"model": "gpt-live-1"}, event_id="s1")
        sid = primary.until("session.started")["session"]["id"]
        with c.live.sideband.connect(session_id=sid, graceful_close=True) as sb:
            side = Reader(sb, sideband=True)
            replay = side.until("session.started")
            # a command of the sideband, acted on like the client's: both sides see the ack
            sb.session.instructions.append(content="Be brief.", delegation_id=None,
                                           event_id="i1")
            side.until("session.instructions.appended", client_event_id="i1")
            primary.until("session.instructions.appended", client_event_id="i1")
            # not a sideband command: an error to the sideband alone
            sb.send({"type": "session.input_audio.append", "event_id": "a1",
                     "audio": base64.b64encode(bytes(480)).decode()})
            refused = side.until("error", client_event_id="a1")
            for i in range(0, len(speech), FRAME):
                conn.session.input_audio.append(
                    audio=base64.b64encode(speech[i : i + FRAME]).decode())
            said = primary.until("session.output_transcript.delta")  # "(echo, 1.3 s)"
            side.until("session.output_transcript.delta", delta=said["delta"])
            sb.session.close(event_id="bye")
            closed = side.until("session.closed")
            primary.until("session.closed")
            # the session is over for both: each socket is closed with 1000, so each of
            # the SDK's iterators just ends
            assert list(sb) == []
            assert list(conn) == []
    return {"sid": sid, "replay": replay, "refused": refused, "closed": closed,
            "primary": primary.raw, "side": side.raw, "speech": speech}


@needs_espeak
async def test_a_sideband_watches_and_closes_a_websocket_session(
        nursery: trio.Nursery) -> None:
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):
        out = await trio.to_thread.run_sync(watched_session, url)
    side, primary = out["side"], out["primary"]
    # the short replay: session.started, the session as it stands
    assert out["replay"]["session"]["id"] == out["sid"]
    assert out["replay"]["session"]["status"] == "active"
    assert out["refused"]["error"]["code"] == "unsupported_event"
    assert not [e for e in primary if e["type"] == "error"]  # the sideband's, not its
    # the observer extras: the caller's audio reflected (24 kHz PCM16, what was sent)...
    reflected = b"".join(base64.b64decode(e["audio"])
                         for e in side if e["type"] == "session.input_audio.append")
    assert reflected == out["speech"]
    # ... and the answer's audio with its span on the timeline, as much as the primary got
    audio = [e for e in side if e["type"] == "session.output_audio.delta"]
    assert audio and all(e["end_ms"] > e["start_ms"] for e in audio)
    spans = [(e["start_ms"], e["end_ms"]) for e in audio]
    assert all(b[0] >= a[0] for a, b in zip(spans, spans[1:], strict=False))
    ms = sum(e - s for s, e in spans)
    primary_ms = sum(len(base64.b64decode(e["delta"])) for e in primary
                     if e["type"] == "session.output_audio.delta") / 48  # 24 kHz PCM16
    assert ms == pytest.approx(primary_ms, abs=len(spans) + 1)
    assert all("start_ms" not in e for e in primary if e["type"] == "session.output_audio.delta")
    assert out["closed"]["reason"] == "close_requested"
    assert out["closed"]["client_event_id"] == "bye"


def refused_attach(url: str, key: str, session_id: str) -> int:
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as info, client(url, key).live.sideband.connect(
            session_id=session_id):
        pass
    return int(info.value.response.status_code)


async def test_an_unknown_session_is_404_before_the_upgrade(nursery: trio.Nursery) -> None:
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):
        assert await trio.to_thread.run_sync(refused_attach, url, "k", "live_unknown0") == 404


async def test_the_api_token_is_required_off_loopback(nursery: trio.Nursery) -> None:
    url, _ = await start_server(nursery, api_token=API_TOKEN, auth_required=True)
    with trio.fail_after(TIMEOUT):
        assert await trio.to_thread.run_sync(refused_attach, url, "wrong", "live_x") == 401
        # with the token, the id is looked at: unknown
        assert await trio.to_thread.run_sync(refused_attach, url, API_TOKEN, "live_x") == 404
