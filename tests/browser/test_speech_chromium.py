"""Issue 30 items 5 and 6 in real Chromium: speech made with espeak-ng (en-gb, 140 wpm,
pitch 35: not the assistant's own en-us 165 wpm voice) is the browser's fake microphone
(``--use-file-for-fake-audio-capture``, which loops the file) and goes through
``appliance up --agent assistant`` (Silero VAD, Whisper tiny.en, the built-in responder,
espeak-ng). The demo page shows the live transcript of both sides from the assistant's
``transcript`` data channel; the test checks the words it heard (word error rate), that
the reply's audio arrives (speech-band energy of the received track, measured by a Web
Audio analyser), that the turn's waterfall is drawn (issue 38 item 5), and a barge-in:
the next loop of the phrase cuts the reply while it plays.

WER threshold: Whisper tiny.en on this voice through Opus and Chromium's audio processing
heard "What time is it?" (WER 0) in each of the 5 runs measured here; the threshold (0.25:
one word of four) leaves room for one word's error, not for a failure to hear. (A shorter
phrase fared worse: "who are you" came out as "Thank you." once, so the barge-in test does
not depend on what was heard.)
"""

from __future__ import annotations

import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser.helpers import PageErrors, launch, running_appliance_up, screenshot
from playwright.sync_api import Browser, Page, Playwright, expect
from speech.speech_support import espeak_pcm48, have_espeak, silence, wer

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not have_espeak(), reason="espeak-ng is not installed")]

PHRASE = "what time is it"
BARGE_PHRASE = "who are you"
# The file loops: 1 s of silence, the phrase, GAP s of silence. Whisper's decode takes from
# 1 s to over 10 s on this loaded box, so the next loop could land before the answer does;
# the test mutes the microphone once the turn detector closed the first turn (the page's
# "transcript.user.stopped", 0.5 s into the gap) and unmutes it when it wants the next one.
GAP = 3.0
MAX_WER = 0.25
READY_TIMEOUT = 120.0  # the transceiver loads Whisper and Silero before it is ready


def write_speech_wav(path: Path, text: str, gap: float) -> Path:
    pcm = silence(1.0) + espeak_pcm48(text) + silence(gap)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(48_000)
        w.writeframes(pcm)
    return path


@pytest.fixture(scope="module")
def speech_browser(playwright_instance: Playwright, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Browser]:
    wav = write_speech_wav(tmp_path_factory.mktemp("speech") / "what-time.wav", PHRASE, GAP)
    b = launch(playwright_instance, wav)
    yield b
    b.close()


@pytest.fixture(scope="module")
def barge_in_browser(playwright_instance: Playwright, tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[Browser]:
    wav = write_speech_wav(tmp_path_factory.mktemp("speech") / "who.wav", BARGE_PHRASE, GAP)
    b = launch(playwright_instance, wav)
    yield b
    b.close()


@pytest.fixture(scope="module")
def assistant_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("up")
    with running_appliance_up(tmp, "--agent", "assistant", "--transceivers", "1",
                              name="assistant", ready_timeout=READY_TIMEOUT) as base:
        yield base


START_BAND_JS = """async () => {
  // The received track through an analyser, from now until BAND_JS reads it: power in
  // 100-4000 Hz (a voice's fundamental and formants) vs all of it, and the loudest 40 ms.
  const audio = document.getElementById("remote-audio");
  const ctx = new AudioContext();
  await ctx.resume();
  const src = ctx.createMediaStreamSource(audio.srcObject);
  const an = ctx.createAnalyser();
  an.fftSize = 2048;
  src.connect(an);
  const bins = new Float32Array(an.frequencyBinCount);
  const hz = ctx.sampleRate / an.fftSize;
  const acc = { band: 0, total: 0, loudestDb: -Infinity };
  const timer = setInterval(() => {
    an.getFloatFrequencyData(bins);
    let b = 0, t = 0;
    for (let i = 1; i < bins.length; i++) {
      const p = Math.pow(10, bins[i] / 10);
      t += p;
      if (i * hz >= 100 && i * hz <= 4000) b += p;
    }
    acc.band += b; acc.total += t;
    acc.loudestDb = Math.max(acc.loudestDb, 10 * Math.log10(t + 1e-30));
  }, 40);
  window.__band = { acc, stop: () => { clearInterval(timer); src.disconnect(); ctx.close(); } };
}"""

BAND_JS = """() => {
  const { acc, stop } = window.__band;
  stop();
  return { ratio: acc.total > 0 ? acc.band / acc.total : 0, loudestDb: acc.loudestDb };
}"""


def mute_after_first_turn(page: Page) -> None:
    """Mute once a turn of the looping phrase was heard as words. Not at the first turn's
    end: the fake microphone plays from getUserMedia and the call connects later, so the
    first turn can be the tail of a phrase, which may be heard as nothing ("not
    understood": no reply); muted then, no turn would ever be answered (a clean-clone run
    waited 90 s for an answer that way)."""
    page.wait_for_function(
        "applianceDemo.transcript.some((t) => t.who === 'user' && t.final"
        " && t.text !== '(not understood)')", timeout=60_000)
    page.evaluate("applianceDemo.setMicEnabled(false)")


def transcript(page: Page) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = page.evaluate("applianceDemo.transcript")
    return lines


def test_assistant_hears_and_answers_aloud(assistant_up: str,
                                                    speech_browser: Browser) -> None:
    context = speech_browser.new_context(permissions=["microphone"])
    page = context.new_page()
    errors = PageErrors(page)
    try:
        page.goto(assistant_up + "/demo?agent=assistant")
        expect(page.get_by_label("Agent", exact=True)).to_have_value("assistant")
        page.get_by_role("button", name="Start", exact=True).click()
        expect(page.locator("#state")).to_have_text("connected", timeout=30_000)
        mute_after_first_turn(page)
        page.evaluate(START_BAND_JS)  # listening before the answer can start

        # 1. The user's words, as the assistant heard them (a final line).
        page.wait_for_function(
            "applianceDemo.transcript.some((t) => t.who === 'user' && t.final)",
            timeout=60_000)
        heard = [t["text"] for t in transcript(page) if t["who"] == "user" and t["final"]]
        norm = heard[0].lower().strip(" .?!")
        assert wer(PHRASE, norm) <= MAX_WER, heard

        # 2. The answer: its text on the page and its audio on the track, in the speech band.
        page.wait_for_function("applianceDemo.transcript.some((t) => t.who === 'agent')",
                               timeout=30_000)
        said = [t["text"] for t in transcript(page) if t["who"] == "agent"]
        assert said[0].startswith("It is "), said  # the built-in responder tells the time
        page.wait_for_timeout(2500)  # the answer (~1.2 s) plays out: a measuring window
        spectrum = page.evaluate(BAND_JS)
        # speech: loud enough to be the answer (not comfort noise), most of its power in
        # the voice band, 100-4000 Hz (white noise puts 0.16 of it there). Piper's joe is
        # a low male voice: 300-3400 Hz held only 0.49 of it, espeak-ng 0.77.
        assert spectrum["loudestDb"] > -50 and spectrum["ratio"] > 0.5, spectrum
        expect(page.locator("#transcript-log")).to_contain_text("you: ")
        expect(page.locator("#transcript-log")).to_contain_text("agent: It is ")
        # The turn's waterfall (issue 38 item 5): a bar, from the caller's speech to the
        # reply's first frame sent, every mark reported (the session object's turns).
        turn = page.locator("#turns .turn[data-turn='1']")
        expect(turn.locator("h4")).to_contain_text("Turn 1: reply sent ", timeout=10_000)
        expect(turn.locator(".tl-seg")).to_have_count(6)
        (marks,) = page.evaluate("applianceDemo.waterfalls")
        assert all(v is not None for v in marks.values()), marks
        assert marks["speech_start_ms"] < marks["speech_end_ms"] < 0 <= marks["transcript_ms"]
        assert marks["first_audio_ms"] <= marks["first_sent_ms"], marks
        # Setup is connect time (item 8c): measured before the assistant said anything.
        assert page.evaluate("applianceDemo.setupMs") is not None
        expect(page.locator("#setup-what")).to_contain_text("to connected")
        screenshot(page, "demo-assistant-transcript")

        # 3. The dashboard shows the call's transcript (the session object's lines).
        sid = page.evaluate("applianceDemo.sessionId")
        dash = context.new_page()
        dash.goto(assistant_up + "/")
        dash.get_by_role("button", name=f"Details of session {sid}").click()
        lines = dash.locator("#detail-transcript")
        expect(lines).to_contain_text(f"caller: {heard[0]}", timeout=15_000)
        expect(lines).to_contain_text("agent: It is ")
        expect(dash.locator("#detail-turns .turn[data-turn='1'] h4")).to_contain_text(
            "reply sent")
        screenshot(dash, "dashboard-assistant-transcript")
        assert not errors.unexpected()
    finally:
        context.close()


def test_speaking_over_the_answer_cuts_it(assistant_up: str, barge_in_browser: Browser) -> None:
    context = barge_in_browser.new_context(permissions=["microphone"])
    page = context.new_page()
    errors = PageErrors(page)
    try:
        page.goto(assistant_up + "/demo?agent=assistant")
        page.get_by_role("button", name="Start", exact=True).click()
        expect(page.locator("#state")).to_have_text("connected", timeout=30_000)
        mute_after_first_turn(page)
        # The answer (what the responder is and how to plug in a model, ~12 s, or "You said:
        # ... plug in a model for real answers.", ~6 s) starts; unmuted, the phrase is heard
        # again within GAP + 2 s (at once, if the unmute lands mid-phrase), while it plays.
        page.wait_for_function("applianceDemo.transcript.some((t) => t.who === 'agent')",
                               timeout=90_000)
        page.wait_for_function("applianceDemo.levels.output > 0.3", timeout=15_000)  # audible
        page.evaluate("applianceDemo.setMicEnabled(true)")
        page.wait_for_function("applianceDemo.transcript.some((t) => t.interrupted)",
                               timeout=30_000)
        lines = transcript(page)
        cut = next(t for t in lines if t.get("interrupted"))
        said = [t for t in lines if t["who"] == "agent" and not t.get("interrupted")]
        assert said and said[0]["at"] < cut["at"], lines  # the answer had begun
        # Cut part-way: some of the answer was heard, the queued rest of it dropped. How much
        # was heard is not the test's to fix: the fake microphone loops its phrase while muted,
        # so the unmute can land mid-phrase and the VAD cut the answer ~0.1 s after it became
        # audible (a clean-clone run, 0.14 s played, on a slow host) or land in the gap.
        assert cut["playedSeconds"] > 0 and cut["droppedSeconds"] > 0.2, cut
        expect(page.locator("#transcript-log")).to_contain_text("agent: (interrupted)")
        assert not errors.unexpected()
    finally:
        context.close()
