"""Stored GPT-Live sessions and forks (issue 42 item 7), driven by the official ``openai``
SDK against the signaling server on loopback: a ``store: true`` WebSocket session's
``client.live.sessions.download_recording`` is a 24 kHz stereo WAV whose left channel holds
the input's energy where the caller spoke and whose right channel holds the answer's; a
``client.live.forks.connect`` fork starts with the stored conversation as its agent's
context (tests/live/recall_agent.py keeps every request; with the default assistant, the
fork's first request to a local OpenAI-compatible LLM stand-in holds it); an unknown or unstored id is a
404 naming it on the content, WebRTC fork and WebSocket fork routes."""

from __future__ import annotations

import base64
import io
import json
import math
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from live.recall_agent import SEEN
from live.test_sdk import FRAME, TIMEOUT, Recorder, client, first_of, start_server

from appliance.live import store
from appliance.live.config import fork_untrusted, history, resolve_untrusted
from appliance.live.schema import LiveError

openai = pytest.importorskip("openai")
websockets = pytest.importorskip("websockets")
AGENT = "realtime:live.recall_agent:Recall"
HEADERS = {"X-Agent": AGENT}


def tone24(seconds: float, hz: float = 440.0) -> bytes:
    t = np.arange(int(24_000 * seconds)) / 24_000
    return (np.sin(2 * math.pi * hz * t) * 8000).astype("<i2").tobytes()


def stored_session(url: str) -> dict[str, Any]:
    """A stored session: a user turn (0.2 s silence, 1 s tone, 1.5 s silence), the
    agent's answer heard whole, then close."""
    out: dict[str, Any] = {}
    with client(url).live.connect(extra_headers=HEADERS) as conn:
        rec = Recorder(conn)
        conn.session.start(session={
            "model": "gpt-live-1", "store": True, "instructions": "Be brief.",
            "input": [{"role": "user", "content": [{"text": "My locker is number 42."}]}]})
        started = rec.next()
        assert started.type == "session.started" and started.session.store is True
        pcm = bytes(9600) + tone24(1.0) + bytes(72_000)
        for i in range(0, len(pcm), FRAME):
            conn.session.input_audio.append(audio=base64.b64encode(pcm[i : i + FRAME]).decode())
        heard = 0
        while heard < 24_000:  # the whole 0.5 s answer, as 24 kHz PCM16
            heard += len(base64.b64decode(first_of(rec, "session.output_audio.delta").delta))
        conn.session.close()
        out["closed"] = first_of(rec, "session.closed")
        assert list(conn) == []  # closed by the server: the session is stored by now
        out["events"] = rec.events
    out["id"] = out["closed"].session.id
    out["wav"] = client(url).live.sessions.download_recording(out["id"]).content
    return out


def forked(url: str, session_id: str) -> list[Any]:
    with client(url).live.forks.connect(session_id=session_id, extra_headers=HEADERS) as conn:
        rec = Recorder(conn)
        conn.session.start(session={"audio": {"format": {"type": "audio/pcm", "rate": 16000}}})
        started = rec.next()
        assert started.type == "session.started"
        pcm = bytes(6400) + tone24(1.0)[: 32_000] + bytes(48_000)  # 16 kHz: same turn shape
        for i in range(0, len(pcm), 1600):
            conn.session.input_audio.append(audio=base64.b64encode(pcm[i : i + 1600]).decode())
        first_of(rec, "session.output_transcript.delta")
        conn.session.close()
        first_of(rec, "session.closed")
    return rec.events


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) if len(x) else 0.0


async def test_a_stored_session_is_recorded_and_forked(nursery: trio.Nursery,
                                                       tmp_path: Path) -> None:
    SEEN.clear()
    url, _ = await start_server(nursery, recordings_dir=tmp_path)
    with trio.fail_after(TIMEOUT):
        out = await trio.to_thread.run_sync(stored_session, url)
    assert not [e for e in out["events"] if e.type == "info"]  # no store_unavailable
    with wave.open(io.BytesIO(out["wav"])) as w:
        assert (w.getnchannels(), w.getframerate(), w.getsampwidth()) == (2, 24_000, 2)
        x = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
    left, right = x[:, 0], x[:, 1]
    turn = left[int(0.3 * 24_000) : int(1.1 * 24_000)]  # inside the 1 s input tone
    assert rms(turn) > 3000 and rms(left[: int(0.15 * 24_000)]) < 100
    assert rms(right[: int(1.1 * 24_000)]) < 100  # the agent said nothing during the turn
    loud = np.flatnonzero(np.abs(right) > 2000)
    assert len(loud) > 0.4 * 24_000  # the 0.5 s answer is on the right
    assert loud[0] > int(1.2 * 24_000)  # after the turn
    kept = json.loads((tmp_path / f"{out['id']}.live.json").read_text())
    assert kept["session"]["store"] is True and kept["session"]["instructions"] == "Be brief."
    texts = [i["content"][0]["text"] for i in kept["conversation"]]
    assert "My locker is number 42." in texts and "Noted." in texts

    before = len(SEEN)
    with trio.fail_after(TIMEOUT):
        events = await trio.to_thread.run_sync(forked, url, out["id"])
    started = events[0].session
    assert started.id != out["id"] and started.model == "gpt-live-1"
    assert started.audio.format.rate == 16000 and started.store is True  # override, inherited
    first = SEEN[before]  # the fork's first answer: its context holds the stored history
    context = json.dumps(first.conversation)
    assert "My locker is number 42." in context and "Noted." in context
    assert first.instructions == "Be brief."


def quota_session(url: str) -> list[Any]:
    """A stored session: a turn, until the recording is told stopped and the answer was
    heard whole (in either order), then a second turn whose answer is heard whole, then
    close."""
    def heard(rec: Recorder) -> int:
        return sum(len(base64.b64decode(e.delta)) for e in rec.events
                   if e.type == "session.output_audio.delta")

    def speak(conn: Any) -> None:
        pcm = bytes(9600) + tone24(1.0) + bytes(72_000)
        for i in range(0, len(pcm), FRAME):
            conn.session.input_audio.append(audio=base64.b64encode(pcm[i : i + FRAME]).decode())

    with client(url).live.connect(extra_headers=HEADERS) as conn:
        rec = Recorder(conn)
        conn.session.start(session={"model": "gpt-live-1", "store": True})
        assert rec.next().type == "session.started"
        speak(conn)
        rec.until(lambda e: heard(rec) >= 24_000 and any(x.type == "error" for x in rec.events))
        speak(conn)  # after the failure: the session still hears and answers
        rec.until(lambda e: heard(rec) >= 48_000)  # two 0.5 s answers, 24 kHz PCM16
        conn.session.close()
        first_of(rec, "session.closed")
    return rec.events


async def test_a_recording_stopped_by_the_quota_is_told_and_the_session_goes_on(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """Signaling's recordings keep up's --recording-quota: a quota smaller than the first
    half second of the stereo recording stops it, the client is told with ``error``
    ``session_storage_failed`` (the SDK's code) while the session goes on — its answer is
    heard whole after it and it closes as asked — and what was kept is still served."""
    url, _ = await start_server(nursery, recordings_dir=tmp_path, recording_quota=100_000)
    with trio.fail_after(TIMEOUT):
        events = await trio.to_thread.run_sync(quota_session, url)
    failed = [e for e in events if e.type == "error"]
    assert [(e.error.code, e.error.type) for e in failed] == [
        ("session_storage_failed", "server_error")]
    assert "quota" in failed[0].error.message
    assert events[-1].type == "session.closed" and events[-1].reason == "close_requested"
    download = client(url).live.sessions.download_recording
    got = await trio.to_thread.run_sync(download, events[-1].session.id)
    with wave.open(io.BytesIO(got.content)) as w:
        assert w.getnframes() < 100_000 // 4  # what was written before the quota, no more


def not_found(url: str) -> dict[str, Any]:
    c = client(url)
    out: dict[str, Any] = {}
    with pytest.raises(openai.NotFoundError) as content:
        c.live.sessions.download_recording("live_nothingStoredHere")
    out["content"] = content.value.body
    with pytest.raises(openai.NotFoundError) as fork:
        c.live.sessions.fork("live_nothingStoredHere",
                             transport={"type": "webrtc", "sdp": "v=0\r\n"})
    out["fork"] = fork.value.body
    ws = url.replace("http://", "ws://") + "/v1/live/sessions/live_nothingStoredHere/fork"
    with pytest.raises(websockets.exceptions.InvalidStatus) as upgrade:
        websockets.sync.client.connect(ws)
    out["ws"] = upgrade.value.response
    return out


async def test_unknown_or_unstored_sessions_are_404s_naming_them(nursery: trio.Nursery,
                                                                 tmp_path: Path) -> None:
    url, _ = await start_server(nursery, recordings_dir=tmp_path)
    with trio.fail_after(TIMEOUT):
        out = await trio.to_thread.run_sync(not_found, url)
    for body in (out["content"], out["fork"]):
        assert body["param"] == "session_id" and "live_nothingStoredHere" in body["message"]
    assert out["ws"].status_code == 404
    assert b"live_nothingStoredHere" in out["ws"].body


def test_a_fork_config_takes_only_a_forks_overrides() -> None:
    kept = {"id": "live_x", "session": {"model": "m", "store": True, "client": {
        "data_channel": {}}, "audio": {"format": {"type": "audio/pcmu", "rate": 8000}}},
        "conversation": history([{"type": "message", "role": "system",
                                  "content": [{"type": "input_text", "text": "hi"}]}])}
    ws = fork_untrusted(kept, {"store": False})
    assert ws["input"] == [{"role": "developer", "content": [{"type": "input_text",
                                                             "text": "hi"}]}]
    assert ws["store"] is False and "client" not in ws and ws["audio"]["format"]["rate"] == 8000
    assert "format" not in fork_untrusted(kept, {}, media=True)["audio"]
    for bad, param in (({"model": "n"}, "session.model"),
                       ({"client": {"data_channel": {}}}, "session.client"),
                       ({"delegation": {"type": "client"}}, "session.delegation.type"),
                       ({"delegation": {"type": "responses"}}, "session.delegation.type")):
        with pytest.raises(LiveError) as exc:
            fork_untrusted({**kept, "session": {**kept["session"],
                                                "delegation": {"type": "client"}}}, bad)
        assert exc.value.param == param


def test_a_fork_of_a_responses_session_updates_its_backends_settings() -> None:
    """``ForkSessionConfig.delegation``: a sparse update of the stored Responses settings,
    checked like ``session.update``'s (hosted tools refused); the type cannot change."""
    tool = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    kept = {"id": "live_x", "conversation": [], "session": {
        "model": "m", "delegation": {"type": "responses", "acknowledgement_delay_ms": 0,
                                     "responses": {"model": "small", "instructions": "be brief",
                                                   "tools": [tool]}}}}
    forked = fork_untrusted(kept, {"delegation": {
        "type": "responses", "acknowledgement_delay_ms": 250,
        "responses": {"model": "large"}}})
    assert forked["delegation"] == {
        "type": "responses", "acknowledgement_delay_ms": 250,
        "responses": {"model": "large", "instructions": "be brief", "tools": [tool]}}
    assert kept["session"]["delegation"]["responses"]["model"] == "small"  # not mutated
    assert resolve_untrusted(forked)["delegation"]["responses"]["model"] == "large"
    for bad, param in (
            ({"type": "client"}, "session.delegation.type"),
            ({"type": "responses", "responses": {"tools": [{"type": "web_search"}]}},
             "session.delegation.responses.tools[0].type"),
            ({"type": "responses", "responses": {"models": "x"}},
             "session.delegation.responses.models")):
        with pytest.raises(LiveError) as exc:
            fork_untrusted(kept, {"delegation": bad})
        assert exc.value.param == param


def test_content_is_the_recording_at_24_khz(tmp_path: Path) -> None:
    from appliance.transceiver.recording import wav_header
    t = np.arange(48_000) / 48_000
    left = (np.sin(2 * math.pi * 440 * t) * 8000).astype("<i2")
    stereo = np.stack([left, np.zeros_like(left)], axis=1).tobytes()
    (tmp_path / "live_abc.wav").write_bytes(wav_header(len(stereo)) + stereo)
    with wave.open(io.BytesIO(store.content(tmp_path, "live_abc"))) as w:
        assert (w.getnchannels(), w.getframerate()) == (2, 24_000)
        x = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
    assert abs(len(x) - 24_000) <= 1 and rms(x[1000:-1000, 0]) > 5000
    assert rms(x[:, 1]) == 0
    (tmp_path / "live_part.wav.part").write_bytes(b"")
    with pytest.raises(store.NotStored) as exc:
        store.content(tmp_path, "live_part")
    assert exc.value.in_progress
    with pytest.raises(store.NotStored):
        store.content(tmp_path, "../etc")


def test_a_recording_finished_between_the_two_looks_is_served(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (as the realtime route's, tests/signaling/test_recording_route.py): no
    final file, then the writer's rename, then no part: "not stored" for a recording that
    existed."""
    from appliance.transceiver.recording import wav_header
    stereo = bytes(4 * 480)
    part = tmp_path / "live_race.wav.part"
    part.write_bytes(wav_header(len(stereo)) + stereo)
    exists = Path.exists

    def finished_meanwhile(self: Path) -> bool:
        if self == part:
            part.replace(tmp_path / "live_race.wav")  # the writer's rename, just now
        return exists(self)

    monkeypatch.setattr(Path, "exists", finished_meanwhile)
    with wave.open(io.BytesIO(store.content(tmp_path, "live_race"))) as w:
        assert w.getframerate() == 24_000


def talk_and_fork(url: str, say: str) -> str:
    """A stored session with one answered turn, closed; returns its id."""
    with client(url).live.connect() as conn:
        rec = Recorder(conn)
        conn.session.start(session={"model": "gpt-live-1", "store": True})
        assert rec.next().type == "session.started"
        turn(conn, 24_000)
        rec.until(lambda e: e.type == "session.output_transcript.delta" and say in e.delta)
        conn.session.close()
        closed = first_of(rec, "session.closed")
        assert list(conn) == []
    sid: str = closed.session.id
    with client(url).live.forks.connect(session_id=sid) as fork:
        rec = Recorder(fork)
        fork.session.start(session={})
        assert rec.next().type == "session.started"
        turn(fork, 24_000)
        first_of(rec, "session.output_transcript.delta")
        fork.session.close()
        first_of(rec, "session.closed")
    return sid


def turn(conn: Any, rate: int) -> None:
    pcm = bytes(rate // 5 * 2) + tone24(1.0) + bytes(rate * 3 // 2 * 2)
    for i in range(0, len(pcm), FRAME):
        conn.session.input_audio.append(audio=base64.b64encode(pcm[i : i + FRAME]).decode())


async def test_a_forks_first_llm_request_holds_the_stored_history(
        nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default assistant behind Live, its LLM and STT the local OpenAI-compatible
    stand-in (tests/speech/fake_openai.py): the fork's first chat request carries what
    the stored session's user said and what its assistant answered."""
    from speech.fake_openai import KEY, fake_openai

    async with fake_openai() as api:
        monkeypatch.setenv("APPLIANCE_LLM_KEY", KEY)
        monkeypatch.setenv("APPLIANCE_STT_URL", api.base_url)
        monkeypatch.setenv("APPLIANCE_SPEECH_KEY", KEY)
        api.transcripts.extend(["My locker is number 42."] * 2 + ["Which locker?"] * 2)
        api.replies.extend(["Noted, locker 42.", "Number 42."])
        spec = f"assistant?llm={api.base_url}&model=m1&stt={api.base_url}"
        url, _ = await start_server(nursery, recordings_dir=tmp_path, live_agent=spec)
        with trio.fail_after(TIMEOUT):
            await trio.to_thread.run_sync(talk_and_fork, url, "locker 42")
        stored, forked = api.chat_requests[0], api.chat_requests[-1]
    assert len(api.chat_requests) == 2
    assert "Noted, locker 42." not in json.dumps(stored["messages"])
    said = json.dumps(forked["messages"])
    assert "My locker is number 42." in said and "Noted, locker 42." in said
    assert forked["messages"][-1]["role"] == "user"
