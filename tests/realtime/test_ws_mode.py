"""The machine's WebSocket mode (no media track) and function calls, with no I/O; the G.711
encoders the mode's output needs."""

from __future__ import annotations

import base64
import json

import numpy as np
from realtime.support import Harness

from appliance.audio import g711
from appliance.audio.resample import TELEPHONE, resample
from appliance.realtime.audio import from_48k, to_48k
from appliance.realtime.interface import AudioDelta, FunctionCall
from appliance.realtime.machine import FRAME_BYTES, StartResponse


def loud(pcm_frames: int) -> bytes:
    t = np.arange(960 * pcm_frames) / 48_000
    return (np.sin(2 * np.pi * 300 * t) * 8000).astype("<i2").tobytes()


def test_g711_formats_are_the_phone_legs_g711() -> None:
    """``audio/pcmu`` / ``audio/pcma`` are appliance/audio/g711.py over the telephone
    low-pass (one G.711, one resampler): exactly what a G.711 leg encodes from the same
    audio taken as one piece, and decoding gives the tone back within G.711's companding."""
    pcm = loud(10)
    want8k = np.frombuffer(resample(pcm, 48_000, 8_000, TELEPHONE), "<i2")
    for fmt, law in (("audio/pcmu", "pcmu"), ("audio/pcma", "pcma")):
        coded = from_48k(pcm, fmt)
        assert coded == g711.encode(law, want8k)
        got = g711.decode(law, coded).astype(float)
        err = np.sqrt(np.mean((got - want8k) ** 2)) / np.sqrt(np.mean(want8k.astype(float) ** 2))
        assert err < 0.03  # G.711's companding: about 2 % of a speech-level tone
        back = np.frombuffer(to_48k(coded, fmt), "<i2").astype(float)
        ref = np.frombuffer(pcm, "<i2").astype(float)
        assert len(back) == len(ref)
        mid = slice(960, -960)  # the ends of one event's audio meet silence in the filter
        err = np.sqrt(np.mean((back[mid] - ref[mid]) ** 2)) / np.sqrt(np.mean(ref[mid] ** 2))
        assert err < 0.05


def test_appended_audio_runs_the_vad_and_deltas_carry_the_audio() -> None:
    verdicts: list[bool] = []

    def vad(frame: bytes) -> bool:
        assert len(frame) == FRAME_BYTES
        speech = bool(np.abs(np.frombuffer(frame, "<i2")).max() > 1000)
        verdicts.append(speech)
        return speech

    h = Harness(vad=vad)
    h.m.handle_open()
    h.drain()
    pcm24 = loud(25)[::2] + bytes(2 * 24_000)  # 0.5 s of tone then 1 s of silence, 24 kHz
    events = []
    for i in range(0, len(pcm24), 4_802):  # odd-sized appends: frames span them
        events += h.send(type="input_audio_buffer.append",
                         audio=base64.b64encode(pcm24[i : i + 4_802]).decode())
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["input_audio_buffer.speech_started",
                         "input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    assert "response.created" in kinds and True in verdicts
    [start] = [a for a in h.actions if isinstance(a, StartResponse)]
    rid = start.request.response_id
    assert h.m.handle_delta(rid, AudioDelta(loud(5))) is False  # nothing to queue: an event
    [delta] = h.drain()
    assert delta["type"] == "response.output_audio.delta"
    assert len(base64.b64decode(delta["delta"])) == 4_800  # 100 ms of 24 kHz PCM16
    h.m.handle_response_end(rid)
    kinds = [e["type"] for e in h.drain()]
    assert kinds[-1] == "response.done"
    assert not [k for k in h.types(h.events) if k.startswith("output_audio_buffer.")]


def test_a_function_call_is_an_output_item_and_its_output_reaches_the_agent() -> None:
    h = Harness(vad=lambda _: False)
    h.m.handle_open()
    h.drain()
    h.send(type="session.update", session={"output_modalities": ["text"], "tools": [
        {"type": "function", "name": "add", "parameters": {"type": "object"}}]})
    h.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]})
    h.send(type="response.create")
    rid = [a for a in h.actions if isinstance(a, StartResponse)][-1].request.response_id
    h.m.handle_delta(rid, FunctionCall("add", '{"a":1}', call_id="call_1"))
    events = h.drain()
    assert h.types(events) == [
        "response.output_item.added", "conversation.item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "conversation.item.done"]
    done = events[3]
    assert (done["name"], done["arguments"], done["call_id"], done["output_index"]) == (
        "add", '{"a":1}', "call_1", 1)
    h.m.handle_response_end(rid)
    [final] = [e for e in h.drain() if e["type"] == "response.done"]
    out = final["response"]["output"]
    assert [o["type"] for o in out] == ["message", "function_call"]
    assert out[1]["status"] == "completed" and out[1]["arguments"] == '{"a":1}'
    h.send(type="conversation.item.create", item={
        "type": "function_call_output", "call_id": "call_1", "output": "2"})
    h.send(type="response.create")
    request = [a for a in h.actions if isinstance(a, StartResponse)][-1].request
    kinds = [(i["type"], i.get("output")) for i in request.conversation]
    assert ("function_call_output", "2") in kinds
    json.dumps(request.conversation)
