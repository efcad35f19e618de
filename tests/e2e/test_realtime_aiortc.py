"""The OpenAI Realtime event protocol end to end (issue 17, items 2-3): ``appliance up
--agent realtime`` (relay, transceiver, signaling as real processes), aiortc as the caller
on the plain WHIP route ``POST /v1/sessions`` with a DCEP channel labelled ``oai-events``.

The caller's microphone is a WAV file played by aiortc's MediaPlayer at real time: 0.5 s
of silence, a 1.2 s "utterance", 3 s of silence, a 2.5 s one, and two more. Over the
channel: ``session.created`` on open, ``session.update`` acknowledged; each utterance is a
server-VAD turn (speech_started/stopped, committed, the user item) answered by the echo
realtime agent: its transcript "(echo, N s)" and the turn's audio coming back on the media
track between ``output_audio_buffer.started`` and ``stopped``. The second answer is cut
with ``output_audio_buffer.clear`` half a second in: ``cleared`` and the item truncated at
what was played. The fourth utterance starts while the third is being answered: a
barge-in, cut by the server VAD alone (``interrupt_response``).

The pre-negotiated mode (OpenAI's ``?dcid=``) runs through real relay and transceiver
processes with the per-call params set in-process (tests/e2e/rt_dcid_agent.py), as the
``/v1/realtime/calls`` route's plumbing will set them."""

from __future__ import annotations

import asyncio
import json
import uuid
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaPlayer
from e2e.procs import Proc, free_tcp_port, free_udp_port
from e2e.rt_dcid_agent import DCID
from e2e.test_aiortc_relay import ToneTrack, cluster, control
from e2e.test_up_http import http_json, in_fresh_thread
from realtime.shapes import check_event

pytestmark = [pytest.mark.interop, pytest.mark.slow]
RATE = 48_000
__all__ = ["cluster"]  # the module fixture, re-used


def write_wav(path: Path) -> None:
    t = np.arange(RATE) / RATE

    def utter(seconds: float) -> np.ndarray:
        n = int(seconds * RATE)
        env = np.minimum(1.0, np.minimum(np.arange(n), n - np.arange(n)) / 480)
        return 0.3 * 32767 * env * np.sin(2 * np.pi * 300 * np.resize(t, n))

    def silence(seconds: float) -> np.ndarray:
        return np.zeros(int(seconds * RATE))

    # Turn 3's answer starts ~0.5 s after it ends (12.2 s); turn 4 (13.5 s) talks over it.
    pcm = np.concatenate([silence(0.5), utter(1.2), silence(3.0), utter(2.5), silence(3.0),
                          utter(2.0), silence(1.3), utter(1.0), silence(5.0)]).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("rt")
    http, udp = free_tcp_port(), free_udp_port()
    proc = Proc(["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
                 "--public-address", "127.0.0.1", "--state-dir", str(tmp / "state"),
                 "--transceivers", "1", "--agent", "realtime"], "appliance ready", timeout=60)
    try:
        yield f"http://127.0.0.1:{http}"
    finally:
        rc = proc.stop()
    assert rc == 0, "".join(proc.stderr)[-3000:]


class Events:
    """The oai-events channel as a list, with waiting."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []
        self.cond = asyncio.Condition()

    async def add(self, message: str) -> None:
        async with self.cond:
            self.got.append(json.loads(message))
            self.cond.notify_all()

    async def wait(self, kind: str, n: int = 1, within: float = 15.0, **match: Any
                   ) -> dict[str, Any]:
        def found() -> list[dict[str, Any]]:
            return [e for e in self.got if e["type"] == kind
                    and all(e.get(k) == v for k, v in match.items())]
        try:
            async with asyncio.timeout(within), self.cond:
                await self.cond.wait_for(lambda: len(found()) >= n)
        except TimeoutError:
            raise AssertionError(f"no {kind} #{n}: got {[e['type'] for e in self.got]}"
                                 ) from None
        return found()[n - 1]


def oai_caller(wav: Path) -> tuple[RTCPeerConnection, MediaPlayer, Any, Events]:
    """An aiortc caller as a browser places one: ``wav`` as its microphone track and the
    ``oai-events`` channel read into :class:`Events`, before the offer is made."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    player = MediaPlayer(str(wav))
    assert player.audio is not None
    pc.addTrack(player.audio)
    channel = pc.createDataChannel("oai-events")
    events = Events()
    channel.on("message", lambda m: asyncio.ensure_future(events.add(m)))
    return pc, player, channel, events


async def realtime_call(base: str, wav: Path) -> dict[str, Any]:
    pc, player, channel, events = oai_caller(wav)
    loop = asyncio.get_running_loop()
    heard: list[tuple[float, float]] = []  # (time, peak) of each received frame

    @pc.on("track")
    def _(track: Any) -> None:
        async def drain() -> None:
            while True:
                frame = await track.recv()
                heard.append((loop.time(), float(np.abs(frame.to_ndarray()).max())))
        asyncio.ensure_future(drain())

    def loud(after: float, before: float) -> int:
        return sum(1 for t, peak in heard if after <= t < before and peak > 3000)

    await pc.setLocalDescription(await pc.createOffer())
    status, _, body = await asyncio.to_thread(
        http_json, "POST", base + "/v1/sessions?agent=realtime",
        pc.localDescription.sdp.encode(), "application/sdp")
    assert status == 201, body[:300]
    await pc.setRemoteDescription(RTCSessionDescription(body.decode(), "answer"))
    out: dict[str, Any] = {}
    try:
        out["created"] = await events.wait("session.created")
        channel.send(json.dumps({"type": "session.update", "event_id": "c1", "session": {
            "type": "realtime", "instructions": "echo me", "x-unknown": 7,
            "audio": {"input": {"turn_detection": {"type": "server_vad",
                                                   "silence_duration_ms": 500}}}}}))
        out["updated"] = await events.wait("session.updated")
        channel.send('{"type": "no.such.event", "event_id": "c2"}')
        out["error"] = await events.wait("error")
        # Turn 1: answered in full.
        out["transcript1"] = await events.wait("response.output_audio_transcript.done")
        started = await events.wait("output_audio_buffer.started")
        t_start = loop.time()
        out["stopped"] = await events.wait("output_audio_buffer.stopped")
        out["loud1"] = loud(t_start, loop.time() + 0.3)
        # Turn 2: cut half a second into its answer.
        started = await events.wait("output_audio_buffer.started", 2)
        await asyncio.sleep(0.5)  # let 0.5 s of the answer play: the scenario, not a sync
        channel.send('{"type": "output_audio_buffer.clear", "event_id": "c3"}')
        t_clear = loop.time()
        out["cleared"] = await events.wait("output_audio_buffer.cleared")
        out["truncated"] = await events.wait("conversation.item.truncated")
        await asyncio.sleep(1.0)  # listen on: nothing of the cut answer may follow
        out["loud_after_clear"] = loud(t_clear + 0.25, loop.time())
        out["started2"] = started
        # Turn 4 barges in on turn 3's answer: no client event, the server VAD cuts it.
        out["started3"] = await events.wait("output_audio_buffer.started", 3)
        out["speech4"] = await events.wait("input_audio_buffer.speech_started", 4)
        out["cleared3"] = await events.wait("output_audio_buffer.cleared", 2)
        out["truncated3"] = await events.wait("conversation.item.truncated", 2)
        out["events"] = list(events.got)
    finally:
        await pc.close()
        player.audio.stop()
    return out


def test_realtime_events_turns_and_clear_through_up(up: str, tmp_path: Path) -> None:
    wav = tmp_path / "mic.wav"
    write_wav(wav)
    out = in_fresh_thread(lambda: asyncio.run(realtime_call(up, wav)))
    kinds = [e["type"] for e in out["events"]]
    print("event types:", kinds)
    for e in out["events"]:
        check_event(e)  # every event of the GA shape
    assert kinds[0] == "session.created"
    assert out["created"]["session"]["object"] == "realtime.session"
    session = out["updated"]["session"]
    assert session["instructions"] == "echo me" and session["x-unknown"] == 7
    assert out["error"]["error"]["event_id"] == "c2"
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                 "input_audio_buffer.committed", "conversation.item.added",
                 "conversation.item.done", "response.created", "response.output_item.added",
                 "response.output_audio.done", "response.done"):
        assert kind in kinds, kind
    # "(echo, 1.7 s)": the 1.2 s utterance with its prefix padding and end-of-turn silence.
    transcript = out["transcript1"]["transcript"]
    assert transcript.startswith("(echo, ") and transcript.endswith(" s)")
    assert 1.2 <= float(transcript[7:-3]) <= 2.6, transcript
    assert out["loud1"] >= 40, out["loud1"]  # >= 0.8 s of the 1.2 s tone came back
    done = next(e for e in out["events"] if e["type"] == "response.done")
    assert done["response"]["status"] == "completed"
    assert done["response"]["usage"]["total_tokens"] > 0
    assert out["cleared"]["response_id"] == out["started2"]["response_id"]
    assert 300 <= out["truncated"]["audio_end_ms"] <= 1500, out["truncated"]
    assert out["loud_after_clear"] <= 3, out["loud_after_clear"]
    # Barge-in: cleared right after the caller's speech started, the item cut where heard.
    assert out["cleared3"]["response_id"] == out["started3"]["response_id"]
    got = out["events"]
    assert got.index(out["speech4"]) < got.index(out["cleared3"])
    assert 200 <= out["truncated3"]["audio_end_ms"] <= 2000, out["truncated3"]


async def prenegotiated_call(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    pc = RTCPeerConnection()
    pc.addTrack(ToneTrack())
    channel = pc.createDataChannel("oai-events", negotiated=True, id=DCID)
    events = Events()
    channel.on("message", lambda m: asyncio.ensure_future(events.add(m)))
    await pc.setLocalDescription(await pc.createOffer())
    resp = await asyncio.to_thread(control, str(cluster["tmp"] / "t0.sock"), {
        "op": "create", "session_id": uuid.uuid4().hex, "offer": pc.localDescription.sdp,
        "agent": str(Path(__file__).with_name("rt_dcid_agent.py")) + ":agent",
        "candidates": [["127.0.0.1", cluster["public"]]]})
    assert resp["ok"], resp
    await pc.setRemoteDescription(RTCSessionDescription(resp["answer"], "answer"))
    try:
        created = await events.wait("session.created")
        assert created["session"]["instructions"] == "pre-negotiated"
        channel.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "over a negotiated channel"}]}}))
        channel.send(json.dumps({"type": "response.create",
                                 "response": {"output_modalities": ["text"]}}))
        await events.wait("response.done")
        return list(events.got)
    finally:
        await pc.close()


def test_prenegotiated_oai_events_channel(cluster: dict[str, Any]) -> None:
    """OpenAI's ``?dcid=`` mode: the agent opens the channel by id, no DCEP round trip;
    session.created is its first message, and it carries the session from the params."""
    got = in_fresh_thread(lambda: asyncio.run(prenegotiated_call(cluster)))
    assert got[0]["type"] == "session.created"
    for e in got:
        check_event(e)
    text = next(e for e in got if e["type"] == "response.output_text.done")
    assert text["text"] == "over a negotiated channel"
