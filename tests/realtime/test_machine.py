"""The Realtime event state machine with no I/O: a fake clock, a fake output queue."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from realtime.support import Harness, tone

from appliance.realtime.interface import AudioDelta, TextDelta, TranscriptDelta
from appliance.realtime.machine import (
    HELD_BEFORE_OPEN,
    CancelResponse,
    ClearAudio,
    JudgeTurn,
    SpeculateTurn,
    StartResponse,
)


def opened(**kw: Any) -> Harness:
    h = Harness(**kw)
    h.m.handle_open()
    assert h.types(h.drain()) == ["session.created"]
    return h


def start(h: Harness) -> StartResponse:
    starts = [a for a in h.actions if isinstance(a, StartResponse)]
    assert starts
    return starts[-1]


def test_session_created_has_the_ga_shape() -> None:
    h = Harness()
    h.m.handle_open()
    [created] = h.drain()
    s = created["session"]
    assert created["event_id"].startswith("event_")
    assert (s["type"], s["object"], s["output_modalities"]) == ("realtime", "realtime.session",
                                                                ["audio"])
    assert s["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert s["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}


def test_session_update_merges_keeps_unknown_fields_and_refuses_bad_ones() -> None:
    h = opened()
    [ev] = h.send(type="session.update", event_id="c1", session={
        "type": "realtime", "instructions": "be brief", "output_modalities": ["text"],
        "future_field": {"x": 1},
        "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"},
                            "transcription": {"model": "gpt-4o-mini-transcribe"},
                            "shiny": True},
                  "output": {"voice": "marin"}}})
    assert ev["type"] == "session.updated"
    s = ev["session"]
    assert s["instructions"] == "be brief" and s["output_modalities"] == ["text"]
    assert s["future_field"] == {"x": 1} and s["audio"]["input"]["shiny"] is True
    assert s["audio"]["input"]["turn_detection"]["eagerness"] == "high"
    assert s["audio"]["output"] == {"format": {"type": "audio/pcm", "rate": 24000},
                                    "voice": "marin", "speed": 1.0}
    # One bad field refuses the whole update (atomic), naming the event and the field.
    [err] = h.send(type="session.update", event_id="c2", session={
        "instructions": "changed", "audio": {"input": {"turn_detection": {"threshold": 3}}}})
    assert err["type"] == "error"
    assert err["error"]["event_id"] == "c2"
    assert err["error"]["param"] == "session.audio.input.turn_detection.threshold"
    assert h.m.session["instructions"] == "be brief"
    [err] = h.send(type="session.update", event_id="c3", session={"output_modalities": "x"})
    assert (err["error"]["code"], err["error"]["param"]) == ("invalid_type",
                                                             "session.output_modalities")


@pytest.mark.parametrize("raw", ["not json", "[1]", '{"type": 5}', '{"type": "nope"}',
                                 '{"type": "response.audio.delta"}', '{"type": "session.update"}',
                                 '{"type": "conversation.item.truncate", "item_id": "x"}',
                                 '{"type":"x","event_id":3}', "NaN", "[" * 5000])
def test_anything_unknown_gets_an_error_event(raw: str) -> None:
    h = opened()
    h.m.handle_message(raw)
    [err] = h.drain()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"


def spoken_turn(h: Harness, ms: int = 1000) -> list[dict[str, Any]]:
    h.silence(400)
    return h.frames(tone(ms), True) + h.silence(400)


def test_server_vad_turn_then_response_events_in_ga_order() -> None:
    h = opened()
    evs = spoken_turn(h, 1000)
    assert h.types(evs)[:6] == [
        "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed", "conversation.item.added", "conversation.item.done",
        "response.created"]
    started, stopped, committed, added = evs[0], evs[1], evs[2], evs[3]
    assert started["audio_start_ms"] == 400 - 300  # prefix_padding_ms before the speech
    # 500 ms of silence ends the turn, 200 of which the VAD's hangover already covered.
    assert stopped["audio_end_ms"] == 400 + 1000 + 300
    assert started["item_id"] == stopped["item_id"] == committed["item_id"]
    assert added["item"]["content"] == [{"type": "input_audio", "transcript": None}]
    req = start(h).request
    assert req.turn is not None and req.turn.seconds == pytest.approx(1.6, abs=0.03)
    rid = req.response_id
    h.delta(rid, TranscriptDelta("(echo, 1.6 s)"))
    h.delta(rid, AudioDelta(req.turn.audio))
    h.m.handle_response_end(rid)
    h.drain()
    tail = h.types()[h.types().index("response.created"):]
    assert tail == [
        "response.created", "rate_limits.updated", "response.output_item.added",
        "conversation.item.added", "response.content_part.added",
        "response.output_audio_transcript.delta", "output_audio_buffer.started",
        "response.output_audio.done", "response.output_audio_transcript.done",
        "response.content_part.done", "response.output_item.done", "conversation.item.done",
        "response.done"]
    done = h.events[-1]["response"]
    assert done["status"] == "completed" and done["usage"]["output_tokens"] > 0
    assert done["output"][0]["content"] == [{"type": "output_audio",
                                            "transcript": "(echo, 1.6 s)"}]
    h.now += 2.0
    h.m.handle_output_drained(rid)
    assert h.types(h.drain()) == ["output_audio_buffer.stopped"]


def test_clear_truncates_the_item_at_what_was_played() -> None:
    h = opened()
    spoken_turn(h, 1000)
    req = start(h).request
    h.delta(req.response_id, AudioDelta(bytes(96 * 2000)))  # 2 s queued
    h.now += 0.7  # 700 ms played
    evs = h.send(type="output_audio_buffer.clear", event_id="c9")
    assert h.types(evs) == ["output_audio_buffer.cleared", "conversation.item.truncated"]
    assert evs[1]["audio_end_ms"] == 700
    assert isinstance(h.actions[-1], ClearAudio) and h.queued() == 0
    # Later audio of the cut response is dropped; the item keeps no unheard transcript.
    assert not h.delta(req.response_id, AudioDelta(bytes(1920)))
    h.m.handle_response_end(req.response_id)
    h.drain()
    item = h.events[-1]["response"]["output"][0]
    assert item["content"][0]["transcript"] is None
    [ret] = h.send(type="conversation.item.retrieve", item_id=item["id"])
    audio = base64.b64decode(ret["item"]["content"][0]["audio"])
    assert len(audio) == 2 * 24 * 700  # 700 ms at 24 kHz


def test_barge_in_cancels_the_response_and_truncates() -> None:
    h = opened()
    spoken_turn(h, 600)
    req = start(h).request
    h.delta(req.response_id, AudioDelta(bytes(96 * 1000)))
    evs = h.frames(tone(200), True)  # the caller speaks over it, ~20 ms in
    t = h.types(evs)
    assert t[0] == "input_audio_buffer.speech_started"
    assert "response.done" in t and "output_audio_buffer.cleared" in t
    done = next(e for e in evs if e["type"] == "response.done")["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    trunc = next(e for e in evs if e["type"] == "conversation.item.truncated")
    assert trunc["audio_end_ms"] == 20
    assert any(isinstance(a, CancelResponse) for a in h.actions)


def test_text_items_retrieve_delete_and_a_text_response() -> None:
    h = opened()
    evs = h.send(type="conversation.item.create", event_id="c1", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
    assert h.types(evs) == ["conversation.item.added", "conversation.item.done"]
    item_id = evs[0]["item"]["id"]
    h.send(type="response.create", response={"output_modalities": ["text"],
                                              "metadata": {"k": "v"}})
    req = start(h).request
    assert req.turn is not None and req.turn.text == "hi" and req.output_modalities == ("text",)
    [err] = h.send(type="response.create", event_id="c2")
    assert err["error"]["code"] == "conversation_already_has_active_response"
    h.delta(req.response_id, TextDelta("hi"))
    h.m.handle_response_end(req.response_id)
    evs = h.drain()
    assert "response.output_text.done" in h.types(evs)
    assert evs[-1]["response"]["metadata"] == {"k": "v"}
    [ret] = h.send(type="conversation.item.retrieve", item_id=item_id)
    assert ret["item"]["content"] == [{"type": "input_text", "text": "hi"}]
    assert h.types(h.send(type="conversation.item.delete", item_id=item_id)) == [
        "conversation.item.deleted"]
    [err] = h.send(type="conversation.item.retrieve", event_id="c3", item_id=item_id)
    assert err["error"]["event_id"] == "c3"


def test_audio_item_create_and_cancel() -> None:
    h = opened()
    pcm24 = bytes(2 * 24 * 500)  # 500 ms at 24 kHz
    h.send(type="conversation.item.create", item={"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": base64.b64encode(pcm24).decode()}]})
    h.send(type="response.create")
    req = start(h).request
    assert req.turn is not None and req.turn.seconds == pytest.approx(0.5)
    evs = h.send(type="response.cancel")
    assert evs[-1]["response"]["status_details"]["reason"] == "client_cancelled"
    [err] = h.send(type="response.cancel", event_id="c4")
    assert err["error"]["code"] == "response_cancel_not_active"


def test_push_to_talk_append_commit_clear() -> None:
    h = opened()
    h.send(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
    [err] = h.send(type="input_audio_buffer.commit", event_id="e")
    assert err["error"]["code"] == "input_audio_buffer_commit_empty"
    h.send(type="input_audio_buffer.append", audio=base64.b64encode(bytes(4800)).decode())
    h.frames(tone(200), True)  # VAD off: the track's audio goes into the buffer too
    evs = h.send(type="input_audio_buffer.commit")
    assert h.types(evs) == ["input_audio_buffer.committed", "conversation.item.added",
                            "conversation.item.done"]
    assert not any(isinstance(a, StartResponse) for a in h.actions)  # no auto response
    assert h.types(h.send(type="input_audio_buffer.clear")) == ["input_audio_buffer.cleared"]


def test_pcmu_append_decodes() -> None:
    h = opened()
    h.send(type="session.update", session={"audio": {"input": {
        "format": {"type": "audio/pcmu"}, "turn_detection": None}}})
    h.send(type="input_audio_buffer.append", audio=base64.b64encode(b"\xff" * 800).decode())
    evs = h.send(type="input_audio_buffer.commit")
    item = h.m.conversation.get(evs[0]["item_id"])
    assert len(item.audio) == 2 * 48 * 100  # 100 ms of 8 kHz -> 48 kHz


def test_initial_session_from_params_and_bad_initial_session() -> None:
    h = Harness(session={"instructions": "from client_secrets", "x-extra": 1})
    h.m.handle_open()
    [created] = h.drain()
    assert created["session"]["instructions"] == "from client_secrets"
    assert created["session"]["x-extra"] == 1
    h = Harness(session={"output_modalities": ["smell"]})
    h.m.handle_open()
    assert h.types(h.drain()) == ["session.created", "error"]


def test_appended_audio_joins_the_next_vad_turn() -> None:
    """Regression: speech starting cleared the buffer, so audio the client had appended
    with input_audio_buffer.append in server-VAD mode was silently lost."""
    h = opened()
    h.send(type="input_audio_buffer.append", audio=base64.b64encode(bytes(4800)).decode())
    spoken_turn(h, 400)
    req = start(h).request
    assert req.turn is not None  # 100 ms appended + 300 ms prefix + 400 speech + 300 silence
    assert req.turn.seconds == pytest.approx(1.1, abs=0.03)


def test_response_params_are_checked_and_a_custom_voice_shows_its_id() -> None:
    h = opened()
    [err] = h.send(type="response.create", event_id="r1", response={"max_output_tokens": "x"})
    assert err["error"]["param"] == "response.max_output_tokens"
    h.send(type="session.update", session={"audio": {"output": {"voice": {"id": "voice_1"}}}})
    [created, *_] = h.send(type="response.create", response={"max_output_tokens": 50})
    assert created["response"]["audio"]["output"]["voice"] == "voice_1"
    assert created["response"]["max_output_tokens"] == 50


def test_a_turn_before_the_channel_opens_follows_session_created() -> None:
    """The caller may speak while DCEP is still opening ``oai-events`` (the browser's OPEN
    comes a round trip after the association): the turn's events wait for the channel and
    follow ``session.created``, as on OpenAI; they are not lost (a flaky browser test once
    missed ``speech_started``)."""
    h = Harness()
    h.silence(400)
    assert h.frames(tone(600), True) == []  # nothing leaves before the channel is open
    h.m.handle_open()
    evs = h.drain()
    assert h.types(evs)[:2] == ["session.created", "input_audio_buffer.speech_started"]
    assert h.types(h.silence(600))[:2] == ["input_audio_buffer.speech_stopped",
                                           "input_audio_buffer.committed"]


def test_events_held_for_a_channel_that_never_opens_are_bounded() -> None:
    h = Harness()
    for _ in range(400):  # 400 turns of an audio-only caller
        h.frames(tone(200), True)
        h.silence(600)
    assert len(h.m._events) <= HELD_BEFORE_OPEN
    h.m.handle_open()
    assert h.types(h.drain())[0] == "session.created"


def test_a_phone_keypad_press_is_openais_sip_dtmf_event() -> None:
    h = opened()
    h.m.handle_dtmf("7", 1_760_000_000)
    [ev] = h.drain()
    assert ev["type"] == "input_audio_buffer.dtmf_event_received"
    assert (ev["event"], ev["received_at"]) == ("7", 1_760_000_000)
    assert ev["event_id"].startswith("event_")


# -- the shared turn engine: semantic end of turn and work at the pause (issue 38 item 7) --


def _semantic(h: Harness, eagerness: str = "auto") -> None:
    h.send(type="session.update", session={"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "semantic_vad", "eagerness": eagerness}}}})


def _of(h: Harness, kind: type) -> list:  # type: ignore[type-arg]
    return [a for a in h.actions if isinstance(a, kind)]


def test_semantic_vad_asks_the_model_at_the_pause_and_a_complete_verdict_ends_the_turn() -> None:
    h = Harness(judge=True)
    h.send(type="session.update", session={"type": "realtime"})
    h.m.handle_open()
    _semantic(h)
    h.silence(400)
    h.frames(tone(600), True)
    assert not _of(h, JudgeTurn)
    # The flag falls 200 ms after the voice (the energy VAD's hangover): the first silent
    # flag is already a 200 ms pause, so the model is asked there.
    h.silence(20)
    (q,) = _of(h, JudgeTurn)
    assert len(q.audio16k) == pytest.approx(32 * (300 + 600 + 20), abs=64)
    h.silence(60)  # the model answers ~60 ms later; the frames went on meanwhile
    assert "input_audio_buffer.speech_stopped" not in h.types()
    h.m.handle_verdict(q.query_id, 0.95)
    assert "input_audio_buffer.speech_stopped" not in h.types(h.drain())
    # auto holds a complete verdict until the pause has lasted 600 ms (the flag's 200 ms
    # hangover and 400 ms of flagged silence): then it ends with no inference to wait for.
    h.silence(300)
    assert "input_audio_buffer.speech_stopped" not in h.types()
    new = h.silence(20)
    assert h.types(new)[:2] == ["input_audio_buffer.speech_stopped",
                                "input_audio_buffer.committed"]
    assert "response.created" in h.types(new)
    # ended at 400 ms of flagged silence: the bound (1000 ms for auto) was never reached
    assert new[0]["audio_end_ms"] == 400 + 600 + 400


def test_semantic_vad_takes_the_pause_words_with_the_verdict() -> None:
    """An agent that transcribes at pauses (the assistant) gets its words into the verdict:
    JudgeTurn names the SpeculateTurn of its pause, and words that dangle veto a
    "complete" (the ctx loop's rule, vad.unfinished): the turn waits for the bound."""
    h = Harness(judge=True, speculate=True)
    h.m.handle_open()
    _semantic(h, "high")  # no hold: the verdict ends the turn at once
    h.silence(200)
    h.frames(tone(400), True)
    h.silence(20)
    (q,) = _of(h, JudgeTurn)
    (s,) = _of(h, SpeculateTurn)
    assert (q.item_id, q.pause) == (s.item_id, s.pause)
    h.m.handle_verdict(q.query_id, 0.97, "Send the report to...")
    h.drain()
    assert "input_audio_buffer.speech_stopped" not in h.types()
    h.frames(tone(400), True)
    h.silence(20)
    q2 = _of(h, JudgeTurn)[-1]
    h.m.handle_verdict(q2.query_id, 0.97, "Send the report to Anna.")
    new = h.drain()
    assert h.types(new)[0] == "input_audio_buffer.speech_stopped"


def test_semantic_vad_unfinished_or_stale_verdicts_wait_for_the_bound() -> None:
    h = Harness(judge=True)
    h.m.handle_open()
    _semantic(h)  # auto: p >= 0.8 ends the turn, else 1000 ms of silence does
    h.silence(200)
    h.frames(tone(400), True)
    h.silence(20)
    (q1,) = _of(h, JudgeTurn)
    h.m.handle_verdict(q1.query_id, 0.3)  # "I would like to ..."
    h.frames(tone(400), True)  # ... and the caller goes on
    h.silence(20)
    q2 = _of(h, JudgeTurn)[-1]
    assert q2.query_id != q1.query_id
    h.m.handle_verdict(q1.query_id, 0.99)  # stale: that pause is over
    h.drain()
    assert "input_audio_buffer.speech_stopped" not in h.types()
    h.m.handle_verdict(q2.query_id, 0.5)  # unfinished
    h.silence(760)
    assert "input_audio_buffer.speech_stopped" not in h.types()
    h.silence(20)  # 800 ms of flags + the 200 ms hangover: the bound
    assert "input_audio_buffer.speech_stopped" in h.types()


def test_without_the_model_semantic_vad_is_its_eagerness_silence() -> None:
    h = Harness()  # judge=False: Smart Turn is not installed
    h.m.handle_open()
    _semantic(h, "high")  # 500 ms
    h.silence(200)
    h.frames(tone(400), True)
    assert not _of(h, JudgeTurn)
    h.silence(280)
    assert "input_audio_buffer.speech_stopped" not in h.types()
    h.silence(20)
    assert "input_audio_buffer.speech_stopped" in h.types()
    assert not _of(h, JudgeTurn)


def test_server_vad_speculation_names_the_pause_the_turn_ended_in() -> None:
    h = Harness(speculate=True)
    h.m.handle_open()
    h.silence(400)
    h.frames(tone(400), True)
    h.silence(20)
    (s1,) = _of(h, SpeculateTurn)
    started = next(e for e in h.events if e["type"] == "input_audio_buffer.speech_started")
    assert s1.item_id == started["item_id"]
    assert len(s1.audio) == 96 * (300 + 400 + 20)  # the item so far, prefix padding first
    h.frames(tone(200), True)  # the caller goes on: that speculation was in vain
    h.silence(20)
    s2 = _of(h, SpeculateTurn)[-1]
    assert s2.pause != s1.pause and s2.item_id == s1.item_id
    h.silence(300)  # server_vad's 500 ms (200 of them the hangover) ends it in that pause
    (start,) = _of(h, StartResponse)
    assert start.request.turn is not None
    assert start.request.turn.item_id == s1.item_id and start.request.turn.pause == s2.pause
    # the turn's audio is what the speculation saw, plus the silence after it
    assert start.request.turn.audio.startswith(s2.audio)
    assert not any(start.request.turn.audio[len(s2.audio):])


def test_a_turn_with_no_pause_before_its_end_carries_none() -> None:
    h = Harness()  # speculate=False, judge=False: no pause work is asked for
    h.m.handle_open()
    h.silence(400)
    h.frames(tone(400), True)
    h.silence(400)
    assert not _of(h, SpeculateTurn) and not _of(h, JudgeTurn)
    (start,) = _of(h, StartResponse)
    assert start.request.turn is not None and start.request.turn.pause is None
