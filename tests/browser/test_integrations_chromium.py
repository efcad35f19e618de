"""Issue 21 item 3: real headless Chromium calls through `appliance up` into a Pipecat pipeline
and a LiveKit Agents session (the examples, with the real packages from PyPI, each in its
own process behind ``--agent ws://``), and their audio comes back.

The fake microphone loops a *turns* pattern (tests/browser/helpers.write_turns_wav): 1 s of
440 Hz, 0.6 s of silence, 1 s of 440 Hz, 2.4 s of silence. So every 5 s the caller says
something, pauses, starts again while the bot is answering (a barge-in), then waits for
the answer. The remote track goes through a WebAudio analyser in the page, which logs the
loudest frequency every 50 ms: the bot's answer is *heard*, at its own pitch (the parrot
says the caller's 440 Hz back; the LiveKit example answers with 660 Hz). Data channels are
Chromium's own SCTP: a message to the Pipecat transport comes back as its
``{"echo": ...}``; the LiveKit example reports each ``on_playback_finished`` on it, so the
barge-in's truncated position and the whole answer's full one arrive in the page.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser.helpers import PageErrors, launch, screenshot, write_turns_wav
from browser.test_e2e_up import appliance_up
from integrations.bridge import bot_process
from peers import chromium_version
from playwright.sync_api import Browser, Page, Playwright

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.interop]

__all__ = ["appliance_up"]  # the fixture, re-used
HARNESS = Path(__file__).with_name("dc_harness.js")

# The page's ear: the remote track into an analyser; the loudest bin every 50 ms.
EAR = """
() => {
  const pc = dcHarness.t.pc;
  const track = pc.getReceivers().map((r) => r.track).find((t) => t && t.kind === "audio");
  const stream = new MediaStream([track]);
  const el = new Audio(); el.muted = true; el.srcObject = stream; el.play();  // Chromium
  // feeds a remote WebRTC track to WebAudio only while a media element plays it too.
  const ac = new AudioContext();
  const an = ac.createAnalyser();
  an.fftSize = 4096;
  ac.createMediaStreamSource(stream).connect(an);
  const bins = new Float32Array(an.frequencyBinCount);
  window.ear = [];
  const t0 = performance.now();
  setInterval(() => {
    an.getFloatFrequencyData(bins);
    let k = 1;
    for (let i = 2; i < bins.length; i++) if (bins[i] > bins[k]) k = i;
    window.ear.push([(performance.now() - t0) / 1000, k * ac.sampleRate / an.fftSize, bins[k]]);
  }, 50);
  return ac.state;
}
"""


@pytest.fixture(scope="module")
def browser(playwright_instance: Playwright, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[Browser]:
    wav = write_turns_wav(tmp_path_factory.mktemp("audio") / "turns.wav")
    b = launch(playwright_instance, wav)
    yield b
    b.close()


@pytest.fixture(scope="module")
def parrot() -> Iterator[str]:
    with bot_process("pipecat_parrot.py") as url:
        yield url


@pytest.fixture(scope="module")
def tone_bot() -> Iterator[str]:
    with bot_process("livekit_tone.py") as url:
        yield url


def call(page: Page, base: str, agent: str) -> dict[str, Any]:
    print(f"chromium {chromium_version()}")
    page.goto(base + "/demo")  # any page of the appliance: same origin as the API
    page.add_script_tag(content=HARNESS.read_text())
    out: dict[str, Any] = page.evaluate("([a, c]) => dcHarness.connect(a, c)",
                                        [agent, [["chat", {}]]])
    page.evaluate(EAR)
    return out


def heard(page: Page, hz: float, seconds: float, *, level_db: float = -60.0) -> list[float]:
    """Listen for ``seconds``; the times at which ``hz`` (±15 Hz) was the loudest and loud."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        page.wait_for_timeout(250)  # the analyser samples on its own clock; we just listen
    ear: list[list[float]] = page.evaluate("window.ear")
    return [t for t, f, db in ear if abs(f - hz) <= 15 and db > level_db]


def messages(page: Page, label: str) -> list[Any]:
    got: list[Any] = page.evaluate("(l) => dcHarness.t.got[l]", label)
    return got


def test_chromium_through_a_pipecat_pipeline(appliance_up: str, parrot: str, page: Page) -> None:
    errors = PageErrors(page)
    call(page, appliance_up, parrot)
    # Two 5 s turn cycles: the parrot's answers are heard at the caller's pitch, in
    # windows after each pause (not one continuous tone: it answers, it is cut, it answers).
    times = heard(page, 440, 10.0)
    print(f"parrot heard in {len(times)} of 200 50-ms samples")
    assert len(times) >= 20, f"the parrot was heard {len(times)} times (50 ms samples)"
    # A message on Chromium's channel reaches the pipeline as a transport message frame
    # and comes back as the parrot's {"echo": ...}.
    page.evaluate("dcHarness.t.chans.chat.send(JSON.stringify({hello: 'pipecat'}))")
    deadline = time.monotonic() + 10
    while not any("pipecat" in m for m in messages(page, "chat") if isinstance(m, str)):
        assert time.monotonic() < deadline, messages(page, "chat")
        page.wait_for_timeout(100)  # poll: the condition above is what is checked
    echo = [json.loads(m) for m in messages(page, "chat") if isinstance(m, str) and "pipecat" in m]
    assert echo[0] == {"echo": {"hello": "pipecat"}}
    screenshot(page, "integrations-pipecat")
    assert not errors.unexpected(), errors.errors


def test_chromium_through_a_livekit_agent_session(appliance_up: str, tone_bot: str,
                                                  page: Page) -> None:
    errors = PageErrors(page)
    call(page, appliance_up, tone_bot)
    times = heard(page, 660, 10.0)
    print(f"tone heard in {len(times)} of 200 50-ms samples")
    assert len(times) >= 20, f"the session's 660 Hz answer was heard {len(times)} times"
    reports = [json.loads(m) for m in messages(page, "chat") if isinstance(m, str)]
    finished = [r for r in reports if r.get("event") == "playback_finished"]
    # Each 5 s cycle: an answer cut by the caller's second utterance (interrupted, part of
    # the 1.5 s tone), and one heard whole.
    cut = [r for r in finished if r["interrupted"]]
    whole = [r for r in finished if not r["interrupted"]]
    print(f"playback_finished: {finished}")
    assert cut and whole, finished
    # A cut answer stopped short of the whole 1.5 s by at least a frame. Which utterance cut
    # it depends on when the answer started: usually the caller's second one, ~0.4 s in, but
    # on a loaded machine an answer that starts late is cut by the next cycle's first
    # utterance instead (1.38 s seen with a CPU hog; a bound of 1.2 s failed there).
    assert all(0.0 < r["position"] < 1.5 - 0.02 for r in cut), cut
    assert all(r["position"] == pytest.approx(1.5, abs=0.05) for r in whole), whole
    screenshot(page, "integrations-livekit")
    assert not errors.unexpected(), errors.errors
