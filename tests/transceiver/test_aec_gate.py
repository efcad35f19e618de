"""The echo canceller's gate (stages/aec.py "Echo gate"): the agent's returning voice is
kept from the VAD from its first word, before the delay is known and while the filter
converges (where an agent with barge-in used to interrupt itself), while a caller who
talks over the agent from the start still comes through."""

from __future__ import annotations

import numpy as np
import pytest
from transceiver.speech_audio import SR, espeak
from transceiver.test_speech_stages import FRAME, echo_call, speech_like

from appliance.agents import EnergyVad


def vad_flags(out: np.ndarray) -> list[bool]:
    vad = EnergyVad()
    return [vad.update(out[i : i + FRAME].astype("<i2").tobytes())
            for i in range(0, len(out) - FRAME + 1, FRAME)]


@pytest.mark.parametrize("delay_ms", [80.0, 200.0])
def test_no_echo_reaches_the_vad_from_the_first_frame(delay_ms: float) -> None:
    far = speech_like(6.0, seed=11)
    _, raw, _ = echo_call(far, [(0.0, delay_ms)], aec=False)
    _, out, aec = echo_call(far, [(0.0, delay_ms)])
    assert sum(vad_flags(raw)) > 100  # without: the echo is speech to the VAD
    assert sum(vad_flags(out)) == 0  # with: not one frame, convergence included
    assert aec is not None and aec.delay is not None and aec.gated > 0
    assert aec.stats()["gated"] == aec.gated


def test_a_caller_talking_from_the_start_is_not_gated() -> None:
    far = speech_like(5.0, seed=12)
    near = np.zeros_like(far)
    talk = espeak(1)[: 3 * SR] * 2.0  # louder than the agent's echo, as a caller is
    near[SR // 2 : SR // 2 + len(talk)] = talk
    _, out, _ = echo_call(far, [(0.0, 120.0)], near_talk=near)
    span = slice(SR // 2, SR // 2 + len(talk))
    kept = 10 * np.log10((out[span] ** 2).sum() / (near[span] ** 2).sum())
    assert kept > -6, kept  # most of the caller's energy passes, before the delay is known
    assert sum(vad_flags(out[span])) > 40
