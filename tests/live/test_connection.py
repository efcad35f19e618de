"""The GPT-Live core (appliance/live/connection.py), sans-IO and clockless: Live events in,
Live events out, over the inner Realtime machine. The agent's part is played by hand
(``StartResponse`` → ``handle_delta`` / ``handle_response_end``, ``Transcribe`` → the
machine's transcript verbs), the VAD is "any loud sample", audio is a tone or zeros.
Every event it sends is checked against the SDK's ``ServerEvent`` types (live_shapes.py)."""

from __future__ import annotations

import base64
import itertools
import json
import math
from typing import Any

import numpy as np
import pytest
from live.live_shapes import shape_errors

from appliance.live.connection import SAY, AskBackend, LiveConnection, LiveEvent, Started, State
from appliance.realtime.interface import AudioDelta, FunctionCall, TextDelta, TranscriptDelta
from appliance.realtime.machine import CancelResponse, StartResponse, Transcribe
from appliance.realtime.socket_protocol import EndSession

pytest.importorskip("openai.types.live")


def tone(seconds: float, rate: int = 24_000) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * math.pi * 440 * t) * 8000).astype("<i2").tobytes()


def zeros(seconds: float, rate: int = 24_000) -> bytes:
    return bytes(2 * int(rate * seconds))


def loud(frame: bytes) -> bool:
    """The VAD here: any sample past 1000 (G.711's silence codes decode to ±8)."""
    return bool(np.abs(np.frombuffer(frame, "<i2").astype(np.int32)).max() > 1000)


class Core:
    """One LiveConnection and everything it said, every event checked against the SDK."""

    def __init__(self, *, observed: bool = False, **kw: Any) -> None:
        n = itertools.count()
        self.c = LiveConnection(session_id="live_test1", ids=lambda p: f"{p}_{next(n)}",
                                wall_clock=lambda: 1_000.5, vad=loud, **kw)
        self.c.observed = lambda: observed  # a sideband attached
        self.events: list[dict[str, Any]] = []
        self.observed: list[dict[str, Any]] = []  # the sideband's stream
        self.actions: list[object] = []

    def drain(self) -> list[dict[str, Any]]:
        while (seen := self.c.poll_observed()) is not None:
            assert shape_errors(seen, sideband=True) == [], seen
            self.observed.append(seen)
        new = []
        while (out := self.c.poll_output()) is not None:
            if isinstance(out, LiveEvent):
                assert shape_errors(out.event) == [], out.event
                new.append(out.event)
            else:
                self.actions.append(out)
        self.events += new
        return new

    def send(self, **event: Any) -> list[dict[str, Any]]:
        self.c.handle_input(json.dumps(event))
        return self.drain()

    def start(self, **session: Any) -> dict[str, Any]:
        [started] = self.send(type="session.start", session={"model": "gpt-live-1", **session},
                              event_id="s1")
        return started

    def audio(self, pcm: bytes, chunk: int = 4800) -> list[dict[str, Any]]:
        out = []
        for i in range(0, len(pcm), chunk):
            out += self.send(type="session.input_audio.append",
                             audio=base64.b64encode(pcm[i : i + chunk]).decode())
        return out

    def take(self, kind: type) -> list[Any]:
        found = [a for a in self.actions if isinstance(a, kind)]
        self.actions = [a for a in self.actions if not isinstance(a, kind)]
        return found

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


def test_silent_until_session_start_then_started_with_the_resolved_config() -> None:
    core = Core()
    core.c.handle_open()
    assert core.drain() == [] and core.actions == []
    started = core.start(instructions="Be brief.")
    assert started["client_event_id"] == "s1"
    s = started["session"]
    assert s["id"] == "live_test1" and s["status"] == "active"
    assert s["expires_at"] == 1_000 + 3600 and s["instructions"] == "Be brief."
    assert s["audio"] == {"format": {"type": "audio/pcm", "rate": 24000},
                          "output": {"voice": "marin"}}
    assert core.take(Started) == [Started("live_test1", "gpt-live-1", 3600.0)]
    # The inner machine took the prompt and the server's turns.
    inner = core.c.machine.session
    assert inner["instructions"] == "Be brief."
    assert inner["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"


def test_the_state_table_answers_out_of_order_commands_with_errors() -> None:
    core = Core()
    [err] = core.send(type="session.input_audio.mute", event_id="m")
    assert err["error"]["code"] == "session_not_started"
    assert err["client_event_id"] == err["error"]["client_event_id"] == "m"
    [err] = core.send(type="session.close")
    assert err["error"]["code"] == "session_not_started"
    # A refused config leaves the session unstarted: a good one still starts it.
    [err] = core.send(type="session.start", session={"model": "m", "turn_detection": {}})
    assert (err["error"]["code"], err["error"]["param"]) == ("unknown_parameter",
                                                             "session.turn_detection")
    assert core.c.state is State.NEW
    core.start()
    [err] = core.send(type="session.start", session={"model": "m"}, event_id="again")
    assert err["error"]["code"] == "session_already_started"
    assert core.c.config["model"] == "gpt-live-1"
    core.send(type="session.close")
    assert core.c.state is State.CLOSED
    [err] = core.send(type="session.input_audio.unmute")
    assert err["error"]["code"] == "session_closed"


def test_update_changes_delegation_settings_and_refuses_startup_fields() -> None:
    core = Core()
    core.start()
    [ev] = core.send(type="session.update", event_id="u1", session={
        "delegation": {"type": "client", "acknowledgement_delay_ms": 300}})
    assert ev["type"] == "session.updated" and ev["client_event_id"] == "u1"
    assert ev["session"]["delegation"] == {"type": "client", "acknowledgement_delay_ms": 300}
    [err] = core.send(type="session.update", session={"audio": {"output": {"voice": "ash"}}})
    assert (err["error"]["code"], err["error"]["param"]) == ("immutable_field_update",
                                                             "session.audio")


def _turn(core: Core, speech: float = 1.0) -> tuple[StartResponse, Transcribe]:
    core.audio(zeros(0.4) + tone(speech) + zeros(1.0))
    [start] = core.take(StartResponse)
    [tr] = core.take(Transcribe)
    return start, tr


def test_a_turn_becomes_transcripts_and_audio_on_the_session_timeline() -> None:
    core = Core()
    core.start()
    start, tr = _turn(core)
    m = core.c.machine
    m.handle_transcript_delta(tr.item_id, "Hello")
    m.handle_transcript(tr.item_id, "Hello")
    [heard] = core.drain()
    # The turn's span: from its start (prefix padding kept) to where it was ended.
    assert heard["type"] == "session.input_transcript.delta" and heard["delta"] == "Hello"
    assert 0 <= heard["start_ms"] <= 400 < heard["end_ms"] <= core.c.input_ms == 2400
    rid = start.request.response_id
    assert core.c.handle_delta(rid, TranscriptDelta("Hi there.")) is False
    assert core.drain() == []  # held until its audio is out
    assert core.c.handle_delta(rid, AudioDelta(zeros(0.5, 48_000)))
    [audio] = core.drain()
    assert audio == {"type": "session.output_audio.delta",
                     "delta": base64.b64encode(zeros(0.5)).decode()}
    core.c.handle_delta(rid, TranscriptDelta(" Bye."))
    core.c.handle_delta(rid, AudioDelta(zeros(0.25, 48_000)))
    core.c.handle_response_end(rid)
    core.drain()
    said = core.of("session.output_transcript.delta")
    assert [(e["delta"], e["start_ms"], e["end_ms"]) for e in said] == [
        ("Hi there.", 2400, 2900), (" Bye.", 2900, 3150)]
    # A second answer starts where the input stands, with a space before its words.
    start2, _ = _turn(core)
    core.c.handle_delta(start2.request.response_id, TextDelta("Again"))
    core.c.handle_response_end(start2.request.response_id)
    [again] = [e for e in core.drain() if e["type"] == "session.output_transcript.delta"]
    assert again["delta"] == " Again" and again["start_ms"] == again["end_ms"] == 4800


@pytest.mark.parametrize(("fmt", "in_bytes_per_s", "out_bytes_per_s"), [
    ({"type": "audio/pcm", "rate": 16000}, 32_000, 32_000),
    ({"type": "audio/pcmu", "rate": 8000}, 8_000, 8_000),
    ({"type": "audio/pcma", "rate": 8000}, 8_000, 8_000),
])
def test_other_formats_both_ways(fmt: dict[str, Any], in_bytes_per_s: int,
                                 out_bytes_per_s: int) -> None:
    core = Core()
    core.start(audio={"format": fmt})
    rate = in_bytes_per_s // (2 if fmt["type"] == "audio/pcm" else 1)
    if fmt["type"] == "audio/pcm":
        speech, quiet = tone(1.0, rate), zeros(1.0, rate)
    else:  # G.711 code bytes of a loud square wave, then of silence (0xFF / 0xD5)
        loud, still = (b"\x10\x90", b"\xff") if fmt["type"] == "audio/pcmu" else (
            b"\x2a\xaa", b"\xd5")
        speech, quiet = loud * (rate // 2), still * rate
    core.audio(zeros(0.2, rate)[: int(0.2 * in_bytes_per_s)] if fmt["type"] == "audio/pcm"
               else quiet[: int(0.2 * rate)])
    core.audio(speech + quiet, chunk=777)  # odd chunks: samples split across appends
    assert core.c.input_ms == 2200
    [start] = core.take(StartResponse)
    core.c.handle_delta(start.request.response_id, AudioDelta(zeros(0.1, 48_000) + b"\0\0"))
    core.c.handle_delta(start.request.response_id, AudioDelta(zeros(0.1, 48_000)))
    sent = b"".join(base64.b64decode(e["delta"]) for e in core.drain()
                    if e["type"] == "session.output_audio.delta")
    assert len(sent) == out_bytes_per_s // 5  # 200 ms, the odd sample carried, not lost


def test_muted_input_is_silence_to_the_turn_engine_and_acknowledged() -> None:
    core = Core()
    core.start()
    [ack] = core.send(type="session.input_audio.mute", event_id="m")
    assert ack == {"type": "session.input_audio.muted", "event_id": ack["event_id"],
                   "client_event_id": "m"}
    core.audio(tone(1.0) + zeros(1.0))
    assert core.take(StartResponse) == [] and core.c.input_ms == 2000  # the clock goes on
    [ack] = core.send(type="session.input_audio.unmute")
    assert ack["type"] == "session.input_audio.unmuted" and "client_event_id" not in ack
    core.audio(tone(1.0) + zeros(1.0))
    assert len(core.take(StartResponse)) == 1


def test_barge_in_cancels_the_answer_and_cuts_its_audio() -> None:
    core = Core()
    core.start()
    start, _ = _turn(core)
    rid = start.request.response_id
    core.c.handle_delta(rid, TranscriptDelta("A long answer."))
    core.c.handle_delta(rid, AudioDelta(zeros(5.0, 48_000)))
    assert core.c.output_ms == 2400 + 5000
    core.audio(tone(0.5))  # the caller talks over it
    assert core.take(CancelResponse) == [CancelResponse(rid)]
    assert core.c.handle_delta(rid, AudioDelta(zeros(0.1, 48_000))) is False
    core.drain()
    # The held words go out; the unplayed rest of the audio is off the timeline, from
    # the frame where the caller's speech was heard.
    [said] = core.of("session.output_transcript.delta")
    assert said["start_ms"] == 2400 and said["end_ms"] == core.c.output_ms == 2420


def test_usage_every_15_seconds_of_timeline() -> None:
    core = Core()
    core.start()
    core.audio(zeros(31.0), chunk=48_000)
    assert [e["usage"] for e in core.of("session.usage.updated")] == [
        {"seconds": 15.0}, {"seconds": 30.0}]


def test_context_appends_are_acknowledged_and_reach_the_agent() -> None:
    core = Core()
    core.start()
    core.audio(zeros(1.0))
    [ack] = core.send(type="session.instructions.append", content="Speak French.",
                      delegation_id=None, event_id="i")
    assert ack == {"type": "session.instructions.appended", "event_id": ack["event_id"],
                   "start_ms": 1000, "end_ms": 1000, "client_event_id": "i"}
    [ack] = core.send(type="session.thinking.append", content="The user is in Paris.",
                      delegation_id=None)
    assert ack["type"] == "session.thinking.appended"
    texts = [(i.data["role"], i.text()) for i in core.c.machine.conversation.items.values()]
    assert texts == [("system", "Speak French."),
                     ("system", "Silent context (do not read it out): The user is in Paris.")]
    assert core.take(StartResponse) == []  # context, not speech
    [err] = core.send(type="session.commentary.append", content="x", delegation_id="del_1")
    assert (err["error"]["code"], err["error"]["param"]) == ("invalid_value", "delegation_id")
    [err] = core.send(type="session.thinking.append", content="word " * 500,
                      delegation_id=None)
    assert err["error"]["code"] == "string_above_max_length"


def test_commentary_is_spoken_after_the_answer_in_progress() -> None:
    core = Core()
    core.start()
    core.send(type="session.commentary.append", content="18 degrees and sunny.",
              delegation_id=None, event_id="c1")
    [first] = core.take(StartResponse)
    assert first.request.extra == {SAY: "18 degrees and sunny."}
    assert first.request.turn is None
    [ack] = core.send(type="session.commentary.append", content="Second.", delegation_id=None)
    assert ack["type"] == "session.commentary.appended"
    assert core.take(StartResponse) == []  # queued behind the first
    core.c.handle_delta(first.request.response_id, TranscriptDelta("18 degrees and sunny."))
    core.c.handle_response_end(first.request.response_id)
    core.drain()
    [second] = core.take(StartResponse)
    assert second.request.extra == {SAY: "Second."}
    # What was said stays in the agent's conversation.
    said = [i.data["content"][0].get("transcript") for i in
            core.c.machine.conversation.items.values() if i.data["role"] == "assistant"]
    assert said[0] == "18 degrees and sunny."


def test_close_flushes_the_held_words_then_closes_with_usage() -> None:
    core = Core()
    core.start()
    start, _ = _turn(core)
    core.c.handle_delta(start.request.response_id, TranscriptDelta("Cut short."))
    core.c.handle_delta(start.request.response_id, AudioDelta(zeros(1.0, 48_000)))
    assert [e["type"] for e in core.drain()] == ["session.output_audio.delta"]
    events = core.send(type="session.close", event_id="bye")
    assert [e["type"] for e in events] == ["session.output_transcript.delta",
                                           "session.closed"]
    closed = events[-1]
    assert closed["reason"] == "close_requested" and closed["client_event_id"] == "bye"
    assert closed["usage"] == {"seconds": 3.0}  # the answer's audio ends at 3.4 s
    assert closed["session"]["id"] == "live_test1"
    assert core.take(EndSession) == [EndSession("close_requested")]


def test_expiry_and_a_lost_socket() -> None:
    core = Core()
    core.c.close("expired")  # not started: nothing
    assert core.drain() == []
    core.start()
    core.c.close("expired")
    [closed] = core.drain()
    assert closed["reason"] == "expired" and "client_event_id" not in closed
    assert core.take(EndSession) == [EndSession("expired")]
    lost = Core()
    lost.start()
    lost.c.lost()
    assert lost.drain() == [] and lost.c.state is State.CLOSED


def test_a_failed_transcription_is_an_info_event() -> None:
    core = Core()
    core.start()
    _, tr = _turn(core)
    core.c.machine.handle_transcript_failed(tr.item_id, "no engine")
    [info] = core.drain()
    assert info["type"] == "info" and info["code"] == "input_transcript_failed"


def test_a_stored_session_keeps_its_config_and_conversation_and_is_tapped() -> None:
    """``store: true`` (issue 42 item 7): no ``store_unavailable`` any more; ``stored()`` is
    the config as given (its ``input`` is in the conversation) and the conversation as
    ``session.input`` items; the tap hears the input (muted or not) and the answer at its
    place on the timeline (48 kHz, the recording's axis)."""
    core = Core()
    heard: list[tuple[str, float, int]] = []
    core.c.tap = lambda d, at, pcm: heard.append((d, at, len(pcm)))
    events = core.send(type="session.start", session={
        "model": "m", "store": True, "instructions": "hi",
        "input": [{"role": "user", "content": [{"text": "My name is Ada."}]}]})
    assert [e["type"] for e in events] == ["session.started"]
    start, _ = _turn(core)
    core.c.handle_delta(start.request.response_id, TranscriptDelta("Hello Ada."))
    core.c.handle_delta(start.request.response_id, AudioDelta(zeros(0.1, 48_000)))
    core.c.handle_response_end(start.request.response_id)
    ins = [h for h in heard if h[0] == "in"]
    assert ins[0][1] == 0 and sum(n for _, _, n in ins) == 2 * 48_000 * 2.4
    core.send(type="session.input_audio.mute")
    core.audio(zeros(0.2))  # the recording hears what was sent, before muting
    assert heard[-1][0] == "in" and heard[-1][1] >= 2.4
    [out] = [h for h in heard if h[0] == "out"]
    assert out[1] >= 1.4 and out[2] == 2 * 4800  # after the turn, 0.1 s
    kept = core.c.stored()
    assert kept["session"] == {"model": "m", "store": True, "instructions": "hi"}
    assert kept["conversation"][0] == {"role": "user", "content": [
        {"type": "input_text", "text": "My name is Ada."}]}
    assert kept["conversation"][-1] == {"role": "assistant", "content": [
        {"type": "output_text", "text": "Hello Ada."}]}


def test_initial_input_seeds_the_conversation() -> None:
    core = Core()
    core.start(input=[{"role": "user", "content": [{"text": "My name is Ada."}]},
                      {"role": "assistant", "content": [{"text": "Hello Ada."}]}])
    items = [(i.data["role"], i.text()) for i in core.c.machine.conversation.items.values()]
    assert items == [("user", "My name is Ada."), ("assistant", "Hello Ada.")]


def test_every_event_type_served_is_sent_and_matches_the_sdk() -> None:
    """One session that makes every event type docs/live.md says is sent; each was checked
    against the SDK's model on the way out (Core.drain), so together with the shape
    checker's own field walk no type or field outside the SDK's union goes unchecked."""
    from appliance.live.events import SERVER_EVENTS
    from appliance.realtime.protocol import Support

    core = Core(usage_every_ms=1000, observed=True)  # + the sideband's reflected input
    core.send(type="session.start", session={"model": "m", "store": True,
                                             "delegation": {"type": "client"}})
    core.send(type="session.update", session={"triggers": []})
    core.send(type="session.input_audio.mute")
    core.send(type="session.input_audio.unmute")
    for kind in ("instructions", "thinking", "commentary"):
        core.send(type=f"session.{kind}.append", content="x", delegation_id=None)
    [say] = core.take(StartResponse)
    core.c.handle_response_end(say.request.response_id)
    start, tr = _turn(core)
    core.c.machine.handle_transcript_delta(tr.item_id, "hi")
    core.c.handle_delta(start.request.response_id, TranscriptDelta("Hello."))
    core.c.handle_delta(start.request.response_id, AudioDelta(zeros(0.1, 48_000)))
    core.c.handle_delta(start.request.response_id, FunctionCall("delegate", "{}"))  # client
    core.c.handle_response_end(start.request.response_id)
    core.c.machine.handle_transcript_failed(tr.item_id, "no engine")  # + info
    core.send(type="session.input_audio.commit")
    core.send(type="session.close")
    sent = {e["type"] for e in core.events + core.observed}
    # a SIP call's own (transport.dtmf.*: the sideband of a phone session)
    phone = Core(observed=True, media=True, phone=True)
    phone.c.start({"model": "m"})
    phone.c.handle_dtmf("5")
    phone.c.handle_sideband(json.dumps({"type": "transport.dtmf.send", "event": "5"}))
    phone.drain()
    sent |= {e["type"] for e in phone.observed}
    # Responses delegation: a backend response asked for (the backend's part by hand).
    backed = Core(backend=True)
    backed.start(delegation={"type": "responses", "responses": {"model": "m"}})
    backed.send(type="response.create")
    [ask] = backed.take(AskBackend)
    backed.c.handle_backend_event(ask.delegation_id, {
        "type": "response.output_text.delta", "sequence_number": 0, "item_id": "msg_1",
        "output_index": 0, "content_index": 0, "delta": "x", "logprobs": []})
    backed.c.handle_backend_end(ask.delegation_id)
    sent |= {e["type"] for e in backed.drain()}
    served = {k for k, (support, _) in SERVER_EVENTS.items() if support is Support.SUPPORTED}
    assert sent == served


def test_a_stopped_recording_is_session_storage_failed_for_client_and_sidebands() -> None:
    """The shells call ``storage_failed`` when a stored session's recording stops early:
    one ``error`` to the client and the sidebands, the session still active; nothing
    before ``session.start`` or after the close."""
    core = Core(observed=True)
    core.c.storage_failed("quota")
    assert core.drain() == []  # not started: nothing to tell
    core.start(store=True)
    core.c.storage_failed("quota")
    [err] = core.drain()
    assert err["type"] == "error" and err["error"]["code"] == "session_storage_failed"
    assert err["error"]["type"] == "server_error" and "quota" in err["error"]["message"]
    assert err in core.observed and core.c.state is State.ACTIVE
    core.send(type="session.close")
    core.c.storage_failed("disk: No space left on device")
    assert [e["type"] for e in core.drain()] == []
