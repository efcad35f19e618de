"""Silero VAD (ONNX, onnxruntime, no torch) and the energy VAD behind one interface, and
the Realtime server_vad turn detector around them, on espeak-ng speech, silence and noise."""

from __future__ import annotations

from dataclasses import replace

import pytest
from speech.speech_support import espeak_pcm48, frames, mix, noise, silence, speech_bounds_ms

from appliance.agents.vad import EnergyVad
from appliance.speech.vad import (
    EAGERNESS,
    EndOfTurnQuery,
    SileroVad,
    SpeechAudio,
    SpeechStarted,
    SpeechStopped,
    TurnConfig,
    TurnDetector,
    Vad,
    make_vad,
    silero_session,
    unfinished,
)


def flags(vad: Vad, pcm: bytes) -> list[bool]:
    return [vad.update(f) for f in frames(pcm)]


def test_both_detectors_satisfy_the_interface() -> None:
    assert isinstance(EnergyVad(), Vad)
    assert isinstance(SileroVad(), Vad)
    assert isinstance(make_vad("energy"), EnergyVad)
    with pytest.raises(ValueError, match="unknown VAD"):
        make_vad("webrtc")
    with pytest.raises(ValueError, match="threshold"):
        SileroVad(threshold=1.5)


def test_model_loads_once_per_process() -> None:
    assert SileroVad()._session is SileroVad()._session is silero_session()


def test_silero_hears_speech_not_silence_or_noise() -> None:
    speech = espeak_pcm48("the quick brown fox jumps over the lazy dog")
    vad = SileroVad()
    assert not any(flags(vad, silence(1.0)))
    on = flags(vad, speech)
    assert sum(on) / len(on) > 0.6  # syllable gaps may dip; most of it is speech
    vad = SileroVad()
    off = flags(vad, noise(3.0, dbfs=-30))
    assert sum(off) / len(off) < 0.05
    assert vad.last_level == pytest.approx(-30, abs=1.5)


def test_silero_hears_speech_in_noise_where_energy_adapts_it_away() -> None:
    """Steady noise at -35 dBFS, then speech mixed into it at a low level."""
    quiet = espeak_pcm48("open the front door please")
    bed = noise(6.0, dbfs=-35, seed=3)
    signal = mix(bed, silence(3.0) + quiet + silence(6.0))
    silero = flags(SileroVad(), signal)
    n_lead = 3 * 50
    n_speech = len(frames(quiet))
    assert sum(silero[:n_lead]) <= 2  # the noise bed alone
    assert sum(silero[n_lead : n_lead + n_speech]) / n_speech > 0.5


def test_turn_detector_server_vad() -> None:
    speech = espeak_pcm48("please call me back tomorrow")
    cfg = TurnConfig(prefix_padding_ms=300, silence_duration_ms=500)
    det = TurnDetector(cfg)
    audio = silence(1.0) + speech + silence(1.5)
    events = []
    for i, f in enumerate(frames(audio)):
        det.handle_input(i * 0.02, f)
        while (ev := det.poll_output()) is not None:
            events.append(ev)
    starts = [e for e in events if isinstance(e, SpeechStarted)]
    stops = [e for e in events if isinstance(e, SpeechStopped)]
    assert len(starts) == 1 and len(stops) == 1
    first, last = speech_bounds_ms(speech)
    onset_ms, end_ms = 1000 + first, 1000 + last
    # The turn starts prefix_padding_ms before the frame that confirmed it.
    assert onset_ms - 300 - 20 <= starts[0].audio_start_ms <= onset_ms + 100
    assert end_ms - 200 <= stops[0].audio_end_ms <= end_ms + 200
    assert stops[0].at * 1000 - stops[0].audio_end_ms == pytest.approx(500 - 20, abs=25)
    pcm = b"".join(e.pcm for e in events if isinstance(e, SpeechAudio))
    assert len(pcm) // 96 >= end_ms - starts[0].audio_start_ms  # the whole utterance


def test_turn_detector_ignores_a_click() -> None:
    det = TurnDetector(TurnConfig())  # Silero (the energy VAD's 200 ms hangover would open it)
    click = b"\xff\x7f" * 960  # one loud frame
    for i, f in enumerate(frames(silence(0.5) + click + silence(1.0))):
        det.handle_input(i * 0.02, f)
    assert det.poll_output() is None


def test_realtime_turn_detection_maps() -> None:
    assert TurnConfig.from_realtime(None) is None
    cfg = TurnConfig.from_realtime({"type": "server_vad", "threshold": 0.7,
                                    "prefix_padding_ms": 200, "silence_duration_ms": 800,
                                    "create_response": False, "interrupt_response": False})
    assert cfg == TurnConfig(threshold=0.7, prefix_padding_ms=200, silence_duration_ms=800,
                             create_response=False, interrupt_response=False)
    assert TurnDetector(cfg).vad.threshold == 0.7  # type: ignore[attr-defined]
    assert not cfg.semantic  # server_vad keeps its meaning: silence alone
    high = TurnConfig.from_realtime({"type": "semantic_vad", "eagerness": "high"})
    assert high is not None and high.semantic
    assert (high.semantic_threshold, high.silence_duration_ms, high.pause_ms,
            high.words_threshold, high.hold_ms, high.hold_floor_ms) == EAGERNESS["high"]
    # The default holds a complete verdict until the pause has lasted 600 ms (issue 38
    # item 2: the false cut-offs at the default); a caller may still choose to be fast.
    assert TurnConfig.semantic_vad("auto").hold_ms == 600
    assert TurnConfig.semantic_vad("auto", hold_ms=0).hold_ms == 0
    # ... and learns the caller's pace from there (test_a_learned_hold_*); low is patient.
    assert TurnConfig.semantic_vad("auto").hold_floor_ms == 300
    assert TurnConfig.semantic_vad("low").hold_floor_ms is None
    auto = TurnConfig.from_realtime({"type": "semantic_vad", "create_response": False})
    assert auto == TurnConfig.semantic_vad("medium", create_response=False)
    # Eagerer ends sooner: never a higher threshold, a longer bound or a later question.
    lo, med, hi = EAGERNESS["low"], EAGERNESS["medium"], EAGERNESS["high"]
    assert all(a >= b >= c for a, b, c in zip(lo[:5], med[:5], hi[:5], strict=True))
    assert lo != med != hi
    for bad in ({"type": "telepathy"}, {"threshold": 2}, {"silence_duration_ms": -1},
                {"type": "semantic_vad", "eagerness": "eager"}):
        with pytest.raises(ValueError, match="unknown|between|0..10000"):
            TurnConfig.from_realtime(bad)


# -- semantic end of turn: the query/verdict protocol on a fake clock and a fake VAD -------


class ScriptedVad:
    """Speech wherever the frame is not all zeros (the test writes the script in bytes)."""

    last_level = -120.0

    def update(self, pcm: bytes) -> bool:
        return any(pcm)


SPEECH = b"\x10\x00" * 960  # one 20 ms frame the scripted VAD calls speech
QUIET = bytes(1920)


class Driver:
    """Feeds frames at 20 ms steps of a virtual clock and keeps every event."""

    def __init__(self, cfg: TurnConfig) -> None:
        self.det = TurnDetector(cfg, vad=ScriptedVad())
        self.now = 0.0
        self.events: list[object] = []

    def feed(self, frame: bytes, n: int = 1) -> None:
        for _ in range(n):
            self.det.handle_input(self.now, frame)
            self.now += 0.02
            self.drain()

    def drain(self) -> None:
        while (ev := self.det.poll_output()) is not None:
            self.events.append(ev)

    def verdict(self, query: EndOfTurnQuery, p: float, text: str | None = None) -> None:
        self.det.handle_verdict(self.now, query.query_id, p, text)
        self.drain()

    def of(self, kind: type) -> list:  # type: ignore[type-arg]
        return [e for e in self.events if isinstance(e, kind)]


SEMANTIC = TurnConfig(semantic=True, semantic_threshold=0.5, pause_ms=200,
                      silence_duration_ms=1000, prefix_padding_ms=100)


def test_semantic_complete_verdict_ends_the_turn_at_once() -> None:
    d = Driver(SEMANTIC)
    d.feed(QUIET, 5)
    d.feed(SPEECH, 50)  # 1 s of speech, ending at 1.1 s
    d.feed(QUIET, 9)
    assert not d.of(EndOfTurnQuery)  # 180 ms is not yet a pause
    d.feed(QUIET)
    (q,) = d.of(EndOfTurnQuery)
    assert q.audio_end_ms == 1100 and q.at == pytest.approx(1.28)
    # The turn so far at 16 kHz PCM16: the 100 ms of prefix padding before the onset (all
    # the quiet there was), the 1 s of speech and the 200 ms pause.
    assert len(q.audio16k) == pytest.approx(32 * (100 + 1000 + 200), abs=64)
    d.feed(QUIET, 3)  # the model answers ~60 ms later; the frames went on meanwhile
    assert not d.of(SpeechStopped)
    d.verdict(q, 0.9)
    (stop,) = d.of(SpeechStopped)
    assert stop.audio_end_ms == 1100 and stop.at == pytest.approx(1.36)
    assert d.det.last_probability == 0.9 and not d.det.in_turn


def test_semantic_incomplete_verdict_waits_for_the_silence_bound() -> None:
    d = Driver(SEMANTIC)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q,) = d.of(EndOfTurnQuery)
    d.verdict(q, 0.2)  # "I would like to …": unfinished
    d.feed(QUIET, 39)
    assert not d.of(SpeechStopped)  # one query per pause: no second question
    assert len(d.of(EndOfTurnQuery)) == 1
    d.feed(QUIET)  # 1000 ms of silence: the bound
    (stop,) = d.of(SpeechStopped)
    assert stop.at == pytest.approx(0.4 + 1.0 - 0.02)


def test_semantic_verdict_after_the_caller_spoke_again_is_stale() -> None:
    """The model answers 'complete' for a pause the caller has already ended: the turn goes
    on, and the next pause gets a question of its own."""
    d = Driver(SEMANTIC)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q1,) = d.of(EndOfTurnQuery)
    d.feed(SPEECH, 5)  # "… order a large pizza"
    d.verdict(q1, 0.99)
    assert not d.of(SpeechStopped) and d.det.in_turn and d.det.last_probability is None
    d.feed(QUIET, 10)
    q1_, q2 = d.of(EndOfTurnQuery)
    assert q2.query_id != q1.query_id and q2.audio_end_ms == (20 + 10 + 5) * 20
    d.verdict(q2, 0.7)
    (stop,) = d.of(SpeechStopped)
    assert stop.audio_end_ms == q2.audio_end_ms


def test_semantic_verdict_after_the_bound_is_stale_and_unknown_ids_raise() -> None:
    d = Driver(TurnConfig(semantic=True, pause_ms=200, silence_duration_ms=300))
    d.feed(SPEECH, 10)
    d.feed(QUIET, 15)
    (q,) = d.of(EndOfTurnQuery)
    assert len(d.of(SpeechStopped)) == 1  # the bound ended it before the model answered
    d.verdict(q, 0.9)
    assert len(d.of(SpeechStopped)) == 1
    with pytest.raises(ValueError, match="no EndOfTurnQuery"):
        d.det.handle_verdict(d.now, q.query_id + 1, 0.9)


def test_server_vad_never_queries() -> None:
    d = Driver(TurnConfig(silence_duration_ms=500))
    for _ in range(3):
        d.feed(SPEECH, 20)
        d.feed(QUIET, 30)
    assert not d.of(EndOfTurnQuery)
    assert [e.at for e in d.of(SpeechStopped)] == pytest.approx(
        [0.4 + 0.48 + i * 1.0 for i in range(3)])


def test_semantic_query_carries_at_most_the_models_window() -> None:
    d = Driver(SEMANTIC)
    d.feed(SPEECH, 12 * 50)  # 12 s of speech
    d.feed(QUIET, 10)
    (q,) = d.of(EndOfTurnQuery)
    assert len(q.audio16k) == 8 * 16_000 * 2


# -- the transcript as a second signal, and a second question (issue 38 item 2) ------------


@pytest.mark.parametrize("text", [
    "I would like to...", "I would like to", "And then we…", "We need milk, eggs,",
    "Send the report to.", "I'd like to book a table for.", "What I really want is a.",
    "My number is 555.", "My number is five five five.", "The address is twelve.",
    "Um.", "The meeting is at.", "", "   ", "...", "Let me see the",
    "Is it the?",  # articles and conjunctions dangle in a question too
    # A list paused between items (Whisper closes each chunk with a full stop), a
    # hesitation, a question stopped before its verb, a first step with no next one.
    "We need milk, eggs.", "I need apples, oranges.", "Hmm, let me think.",
    "Could you please?", "First, open the settings.", "Okay. So I need bread, milk.",
])
def test_transcripts_that_read_as_cut_short(text: str) -> None:
    assert unfinished(text)


@pytest.mark.parametrize("text", [
    "Yes.", "No thanks.", "What time is it?", "Okay, thank you.", "I think so.",
    "Hold on.", "I like that.", "Send the report to Anna and Peter.",
    "Where are you from?", "What is it for?",  # a question may end on a preposition
    "Turn the music down!", "That's all.",
    "We need milk, eggs and bread.", "I need apples, oranges, or grapes.",
    "No, that's fine.", "Yes, please.", "We'll arrive on Friday, around noon.",
    "First, open the settings, then tap on network.", "Could you please help me?",
    "Let me think. No, that's fine.",  # the hesitation was not the last sentence
    "Play some music, please.", "Call me back, thanks.",  # a closing word, no list item
])
def test_transcripts_that_read_as_finished(text: str) -> None:
    assert not unfinished(text)


def test_a_complete_verdict_the_words_contradict_waits_for_the_bound() -> None:
    """Smart Turn calls "send the report to |" complete (0.94-0.98 on the bench voice);
    the pause's transcript ends on "to", so the turn goes on to the silence bound."""
    d = Driver(SEMANTIC)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q,) = d.of(EndOfTurnQuery)
    d.verdict(q, 0.97, "Send the report to...")
    assert not d.of(SpeechStopped) and d.det.in_turn and d.det.vetoes == 1
    d.feed(QUIET, 39)
    assert not d.of(SpeechStopped)
    d.feed(QUIET)
    (stop,) = d.of(SpeechStopped)
    assert stop.at == pytest.approx(0.4 + 1.0 - 0.02) and stop.pause == q.query_id


def test_a_complete_verdict_with_finished_words_ends_the_turn() -> None:
    d = Driver(SEMANTIC)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q,) = d.of(EndOfTurnQuery)
    d.verdict(q, 0.97, "Send the report to Anna.")
    (stop,) = d.of(SpeechStopped)
    assert stop.pause == q.query_id and d.det.vetoes == 0


def test_a_veto_lasts_for_its_pause_only() -> None:
    """The next pause is judged afresh: its own verdict and its own words."""
    d = Driver(SEMANTIC)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q1,) = d.of(EndOfTurnQuery)
    d.verdict(q1, 0.99, "I would like to...")
    d.feed(SPEECH, 20)  # "… order a large pizza."
    d.feed(QUIET, 10)
    _, q2 = d.of(EndOfTurnQuery)
    d.verdict(q2, 0.99, "I would like to order a large pizza.")
    (stop,) = d.of(SpeechStopped)
    assert stop.pause == q2.query_id


def test_an_unfinished_transcript_never_makes_a_turn_end_sooner() -> None:
    """The words only veto: an incomplete verdict with finished words still waits."""
    d = Driver(SEMANTIC)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q,) = d.of(EndOfTurnQuery)
    d.verdict(q, 0.2, "Yes.")
    d.feed(QUIET, 30)
    assert not d.of(SpeechStopped) and d.det.vetoes == 0


REASK = TurnConfig(semantic=True, semantic_threshold=0.5, pause_ms=200, reask_ms=500,
                   silence_duration_ms=1000, prefix_padding_ms=100)


def test_an_unfinished_pause_is_asked_again_later_once() -> None:
    d = Driver(REASK)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)  # 200 ms: the first question
    (q1,) = d.of(EndOfTurnQuery)
    assert not q1.again
    d.verdict(q1, 0.3, "I need it by Monday.")
    d.feed(QUIET, 14)
    assert len(d.of(EndOfTurnQuery)) == 1
    d.feed(QUIET)  # 500 ms of silence: asked again, with more silence in the window
    _, q2 = d.of(EndOfTurnQuery)
    assert q2.again and q2.at == pytest.approx(0.4 + 0.48)
    assert q2.audio_end_ms == q1.audio_end_ms and len(q2.audio16k) > len(q1.audio16k)
    d.verdict(q2, 0.3)
    d.feed(QUIET, 24)
    assert len(d.of(EndOfTurnQuery)) == 2 and not d.of(SpeechStopped)  # not a third time
    d.feed(QUIET)
    (stop,) = d.of(SpeechStopped)
    assert stop.at == pytest.approx(0.4 + 0.98)


def test_a_second_question_can_end_the_turn_and_names_the_first() -> None:
    """The pause's first query is the one a shell speculated at: SpeechStopped names it."""
    d = Driver(REASK)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q1,) = d.of(EndOfTurnQuery)
    d.verdict(q1, 0.3, "I need it by Monday.")
    d.feed(QUIET, 15)
    _, q2 = d.of(EndOfTurnQuery)
    d.verdict(q2, 0.9)  # no words: the first question's ruling stands (none here)
    (stop,) = d.of(SpeechStopped)
    assert stop.pause == q1.query_id and stop.at == pytest.approx(0.4 + 0.5)


def test_words_that_vetoed_a_pause_are_not_asked_about_again() -> None:
    d = Driver(REASK)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q1,) = d.of(EndOfTurnQuery)
    d.verdict(q1, 0.3, "I would like to...")
    d.feed(QUIET, 30)
    assert len(d.of(EndOfTurnQuery)) == 1 and not d.of(SpeechStopped)


def test_speech_withdraws_a_pending_second_question() -> None:
    d = Driver(REASK)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q1,) = d.of(EndOfTurnQuery)
    d.verdict(q1, 0.3, "Let me think.")
    d.feed(SPEECH, 5)  # the caller goes on before 500 ms
    d.feed(QUIET, 10)
    qs = d.of(EndOfTurnQuery)
    assert len(qs) == 2 and not qs[1].again  # the new pause's first question


def test_server_vad_and_speculation_never_ask_again() -> None:
    d = Driver(TurnConfig(silence_duration_ms=1000, speculate=True, reask_ms=500))
    d.feed(SPEECH, 20)
    d.feed(QUIET, 60)
    (q,) = d.of(EndOfTurnQuery)
    assert not q.again and len(d.of(SpeechStopped)) == 1


WORDS = TurnConfig(semantic=True, semantic_threshold=0.8, words_threshold=0.5, pause_ms=200,
                   reask_ms=500, silence_duration_ms=1000, prefix_padding_ms=100)


def test_with_words_a_lower_probability_ends_the_turn() -> None:
    """The words veto what they contradict, so the model need only lean complete."""
    d = Driver(WORDS)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q,) = d.of(EndOfTurnQuery)
    d.verdict(q, 0.6, "Turn the music down.")
    (stop,) = d.of(SpeechStopped)
    assert stop.pause == q.query_id


def test_without_words_the_model_threshold_holds() -> None:
    """The Realtime machine passes no transcript: 0.6 is under its 0.8."""
    d = Driver(WORDS)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q,) = d.of(EndOfTurnQuery)
    d.verdict(q, 0.6)
    d.feed(QUIET, 10)
    assert not d.of(SpeechStopped)


def test_a_second_question_keeps_the_words_threshold_of_its_pause() -> None:
    d = Driver(WORDS)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q1,) = d.of(EndOfTurnQuery)
    d.verdict(q1, 0.3, "I need it by Monday.")
    d.feed(QUIET, 15)
    _, q2 = d.of(EndOfTurnQuery)
    d.verdict(q2, 0.6)  # no words with a second question: the pause had them
    (stop,) = d.of(SpeechStopped)
    assert stop.pause == q1.query_id


def test_a_turn_that_opens_as_the_last_one_ends_keeps_its_onset() -> None:
    """Issue 38 item 8a: in Chromium, "hello there, what time is it right now" came out as
    two turns, the second heard as "time as it right now". Smart Turn called "hello there"
    complete, but its verdict came back after the caller had gone on: the next word had
    begun, in frames the VAD still called silent (Silero flags a word 60-100 ms after its
    onset). The verdict ended the turn with that onset inside it, and the next turn's
    pre-roll only began there, so its audio started inside the word. The pre-roll now runs
    through a turn's trailing silence: the next turn opens with the whole onset, and still
    after the last turn's speech."""
    onset = b"\x20\x00" * 960  # the next word, before and after the VAD flags it
    det = TurnDetector(replace(SEMANTIC, vad="flag"))  # prefix 100 ms + min_speech 60 ms
    events: list[object] = []
    now = 0.0

    def feed(pcm: bytes, speech: bool, n: int) -> None:
        nonlocal now
        for _ in range(n):
            det.handle_frame(now, pcm, speech)
            now += 0.02
            while (ev := det.poll_output()) is not None:
                events.append(ev)

    feed(SPEECH, True, 20)
    feed(QUIET, False, 10)  # the 200 ms pause: the query
    (query,) = [e for e in events if isinstance(e, EndOfTurnQuery)]
    feed(onset, False, 3)  # the caller goes on; the VAD has not flagged it yet
    det.handle_verdict(now, query.query_id, 0.9)  # "complete", 60 ms late
    while (ev := det.poll_output()) is not None:
        events.append(ev)
    feed(onset, True, 3)  # flagged: the next turn opens after min_speech_ms
    stop = next(e for e in events if isinstance(e, SpeechStopped))
    second = [e for e in events if isinstance(e, SpeechStarted)][1]
    opening = events[events.index(second) + 1]
    assert isinstance(opening, SpeechAudio)
    assert opening.pcm == QUIET * 2 + onset * 6  # 160 ms of pre-roll: all of the onset
    assert second.audio_start_ms == (36 - 8) * 20 >= stop.audio_end_ms == 400


HOLD = TurnConfig(semantic=True, semantic_threshold=0.5, pause_ms=200, hold_ms=500,
                  silence_duration_ms=1000, prefix_padding_ms=100)


def test_a_held_complete_verdict_ends_the_turn_when_the_silence_reaches_the_hold() -> None:
    """Asked at 200 ms, answered "complete" 60 ms later: the turn ends at 500 ms of
    silence, the verdict long in hand (no inference left to wait for)."""
    d = Driver(HOLD)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q,) = d.of(EndOfTurnQuery)
    d.feed(QUIET, 3)
    d.verdict(q, 0.9, "What time is it?")
    assert d.det.in_turn and not d.of(SpeechStopped)
    d.feed(QUIET, 11)
    assert not d.of(SpeechStopped)  # 480 ms
    d.feed(QUIET)
    (stop,) = d.of(SpeechStopped)
    assert stop.at == pytest.approx(0.4 + 0.48) and stop.pause == q.query_id
    assert len(d.of(EndOfTurnQuery)) == 1


def test_speech_before_the_hold_withdraws_a_complete_verdict() -> None:
    """"We'll arrive on Friday, | around noon": the words and the model both said
    complete, and the caller went on before the hold: the turn goes on."""
    d = Driver(HOLD)
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q1,) = d.of(EndOfTurnQuery)
    d.verdict(q1, 0.98, "We'll arrive on Friday.")
    d.feed(QUIET, 10)  # a 400 ms pause
    d.feed(SPEECH, 20)
    d.feed(QUIET, 26)  # longer than the hold, less than the bound: no verdict, no end
    assert not d.of(SpeechStopped) and d.det.in_turn
    _, q2 = d.of(EndOfTurnQuery)
    d.verdict(q2, 0.98, "We'll arrive on Friday, around noon.")
    (stop,) = d.of(SpeechStopped)  # its silence is past the hold: at once
    assert stop.pause == q2.query_id


def test_a_hold_with_a_second_question_ends_on_its_complete_verdict() -> None:
    d = Driver(replace(HOLD, reask_ms=500))
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    (q1,) = d.of(EndOfTurnQuery)
    d.verdict(q1, 0.3, "I need it by Monday.")  # the model: unfinished
    d.feed(QUIET, 15)
    _, q2 = d.of(EndOfTurnQuery)
    assert q2.again and not d.of(SpeechStopped)
    d.feed(QUIET, 2)
    d.verdict(q2, 0.8)  # past the hold already: ends now
    (stop,) = d.of(SpeechStopped)
    assert stop.at == pytest.approx(0.4 + 0.54) and stop.pause == q1.query_id


LEARN = replace(HOLD, hold_ms=600, hold_floor_ms=300)


def crisp_turn(d: Driver, text: str = "What time is it?") -> SpeechStopped:
    """A turn with no pause inside: 400 ms of speech, a complete verdict at the pause,
    the hold, then the quiet of the agent's answer (past the bound: a turn change)."""
    before = len(d.of(SpeechStopped))
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    d.verdict(d.of(EndOfTurnQuery)[-1], 0.9, text)
    d.feed(QUIET, 40)
    stops = d.of(SpeechStopped)
    assert len(stops) == before + 1
    return stops[-1]


def test_a_learned_hold_starts_at_the_hold_and_relaxes_for_a_caller_who_never_pauses() -> None:
    d = Driver(LEARN)
    ends = []
    for _ in range(5):
        stop = crisp_turn(d)
        ends.append(round(stop.at * 1000 - stop.audio_end_ms) + 20)  # at: the frame's start
    # 600 at first (a caller not yet heard gets the fixed hold), then 3/4 of the way down
    # to the 300 ms floor at each turn change (in whole frames): 380, 320, 300.
    assert ends == [600, 380, 320, 300, 300]
    assert d.det.hold_ms == 300


def test_a_learned_hold_rises_after_a_pause_the_caller_spoke_on_after() -> None:
    d = Driver(LEARN)
    for _ in range(2):
        crisp_turn(d)
    assert d.det.hold_ms == 380  # 320 once the next turn starts (a turn change)
    # "We'll arrive on Friday, | around noon": a 280 ms pause the model called complete
    # (held, not yet ended at the learned 320), then more words.
    d.feed(SPEECH, 20)
    assert d.det.hold_ms == 320
    d.feed(QUIET, 10)
    d.verdict(d.of(EndOfTurnQuery)[-1], 0.98, "We'll arrive on Friday.")
    d.feed(QUIET, 4)
    assert d.det.in_turn
    d.feed(SPEECH, 20)
    assert d.det.hold_ms == 380  # the 280 ms pause + the 100 ms margin
    d.feed(QUIET, 10)
    d.verdict(d.of(EndOfTurnQuery)[-1], 0.98, "We'll arrive on Friday, around noon.")
    d.feed(QUIET, 40)
    stop = d.of(SpeechStopped)[-1]
    assert round(stop.at * 1000 - stop.audio_end_ms) + 20 == 380
    # A turn with a pause in it does not relax the hold at the next turn change...
    stop = crisp_turn(d)
    assert round(stop.at * 1000 - stop.audio_end_ms) + 20 == 380
    stop = crisp_turn(d)  # ... one with none does
    assert round(stop.at * 1000 - stop.audio_end_ms) + 20 == 320


def test_a_learned_hold_rises_after_a_cut_off_the_caller_talked_over() -> None:
    d = Driver(LEARN)
    for _ in range(4):
        crisp_turn(d)
    assert d.det.hold_ms == 300
    d.feed(SPEECH, 20)
    d.feed(QUIET, 10)
    d.verdict(d.of(EndOfTurnQuery)[-1], 0.98, "Please add eggs.")
    d.feed(QUIET, 5)
    assert not d.det.in_turn  # cut off at 300 ms
    d.feed(QUIET, 15)  # the caller goes on 600 ms after the end of their words
    d.feed(SPEECH, 20)
    assert d.det.in_turn and d.det.hold_ms == 700
    # Never past the ceiling (800), whatever the gap short of the bound.
    d.feed(QUIET, 10)
    d.verdict(d.of(EndOfTurnQuery)[-1], 0.98, "Flour.")
    d.feed(QUIET, 25)
    assert not d.det.in_turn  # the learned 700 ms
    d.feed(QUIET, 10)
    d.feed(SPEECH, 20)  # 900 ms after: still a cut-off (the bound is 1000)
    assert d.det.hold_ms == 800


def test_a_fixed_hold_learns_nothing() -> None:
    d = Driver(replace(LEARN, hold_floor_ms=None))
    for _ in range(4):
        stop = crisp_turn(d)
    assert round(stop.at * 1000 - stop.audio_end_ms) + 20 == 600 and d.det.hold_ms == 600
