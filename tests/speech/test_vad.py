"""Silero VAD (ONNX, onnxruntime, no torch) and the energy VAD behind one interface, and
the Realtime server_vad turn detector around them, on espeak-ng speech, silence and noise."""

from __future__ import annotations

import pytest
from speech.speech_support import espeak_pcm48, frames, mix, noise, silence, speech_bounds_ms

from appliance.agents.vad import EnergyVad
from appliance.speech.vad import (
    SileroVad,
    SpeechAudio,
    SpeechStarted,
    SpeechStopped,
    TurnConfig,
    TurnDetector,
    Vad,
    make_vad,
    silero_session,
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
    assert TurnConfig.from_realtime({"type": "semantic_vad", "eagerness": "high"}
                                    ).silence_duration_ms == 350  # type: ignore[union-attr]
    assert TurnConfig.from_realtime({"type": "semantic_vad"}
                                    ).silence_duration_ms == 700  # type: ignore[union-attr]
    for bad in ({"type": "telepathy"}, {"threshold": 2}, {"silence_duration_ms": -1},
                {"type": "semantic_vad", "eagerness": "eager"}):
        with pytest.raises(ValueError, match="unknown|between|0..10000"):
            TurnConfig.from_realtime(bad)
