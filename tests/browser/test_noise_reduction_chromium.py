"""Noise reduction end to end (issue 31 item 4): headless Chromium whose fake microphone
plays a noisy room — a wavering fan and clatter (bursts of broadband noise every ~0.9 s,
all synthesized here) with one espeak-ng phrase in each 10 s loop — calls ``appliance up``
on ``POST /v1/realtime/calls`` with the browser's own audio processing off (a phone or a
cheap softphone does none). The same call twice, side by side in two pages: with the session's
``audio.input.noise_reduction`` null, the server VAD starts a "turn" at the clatter
(``speech_started`` with no one speaking); with ``far_field`` the RNNoise stage takes the
clatter out before the VAD, and the false starts are fewer, while the phrase still starts
its turn."""

from __future__ import annotations

import json
import time
import wave
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from browser.helpers import launch
from browser.realtime_support import appliance_up
from playwright.sync_api import Browser, Page, Playwright
from transceiver.speech_audio import espeak

pytestmark = [pytest.mark.browser, pytest.mark.slow]
RATE = 48_000
LOOP = 10.0  # s: Chromium's fake capture device loops the file
PHRASE_AT = 0.5  # s into each loop
LISTEN = 2 * LOOP  # s of each call that are counted


def noisy_room(seed: int = 1) -> tuple[np.ndarray, tuple[float, float]]:
    """(samples, (phrase start, end) in s): a fan (low-passed noise, its speed wavering by
    ±30 %) at about -43 dBFS, clatter bursts (150-300 ms, decaying, up to -18 dBFS) from
    2.8 s on, and an espeak-ng phrase at 0.5 s."""
    rng = np.random.default_rng(seed)
    n = int(LOOP * RATE)
    t = np.arange(n) / RATE
    w = rng.normal(0, 1, n)
    a = 0.97  # a one-pole low-pass, applied in the frequency domain
    spectrum = np.fft.rfft(w)
    omega = np.linspace(0, np.pi, len(spectrum))
    fan = np.fft.irfft(spectrum * (1 - a) / (1 - a * np.exp(-1j * omega)), n)
    fan = fan / np.sqrt((fan ** 2).mean()) * 300 * (1 + 0.3 * np.sin(2 * np.pi * 0.7 * t))
    clatter = np.zeros(n)
    for s in np.arange(2.8, LOOP - 0.5, 0.9):
        i = int((s + rng.uniform(-0.1, 0.1)) * RATE)
        m = min(int(rng.uniform(0.15, 0.3) * RATE), n - i)
        clatter[i : i + m] += rng.normal(0, 4000, m) * np.exp(-np.arange(m) / (0.06 * RATE))
    phrase = espeak(0)[: int(1.8 * RATE)]
    x = fan + clatter
    start = int(PHRASE_AT * RATE)
    x[start : start + len(phrase)] += phrase
    return np.clip(x, -32768, 32767), (PHRASE_AT, PHRASE_AT + len(phrase) / RATE)


@pytest.fixture(scope="module")
def browser(playwright_instance: Playwright, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Browser]:
    x, _ = noisy_room()
    path = tmp_path_factory.mktemp("audio") / "noisy-room.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(x.astype("<i2").tobytes())
    b = launch(playwright_instance, path)
    yield b
    b.close()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with appliance_up(tmp_path_factory.mktemp("up"), name="noise") as base:
        yield base


#: A Realtime WebRTC call as OpenAI's guide makes one (multipart: sdp + session), with the
#: browser's echo cancelling, noise suppression and gain control off, events kept.
CALL = """async ({session}) => {
  const pc = new RTCPeerConnection();
  window.__pc = pc;
  window.__events = [];
  const ms = await navigator.mediaDevices.getUserMedia({audio: {
    echoCancellation: false, noiseSuppression: false, autoGainControl: false}});
  pc.addTrack(ms.getTracks()[0]);
  pc.ontrack = () => {};
  const dc = pc.createDataChannel("oai-events");
  dc.addEventListener("message", (e) => window.__events.push(
    Object.assign(JSON.parse(e.data), {__t: performance.now()})));
  await pc.setLocalDescription(await pc.createOffer());
  const form = new FormData();
  form.set("sdp", pc.localDescription.sdp);
  form.set("session", JSON.stringify(session));
  const r = await fetch("/v1/realtime/calls", {method: "POST", body: form});
  const text = await r.text();
  if (!r.ok) return {status: r.status, error: text};
  await pc.setRemoteDescription({type: "answer", sdp: text});
  return {status: r.status, location: r.headers.get("Location")};
}"""


def wait_for(page: Page, expr: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := page.evaluate(expr)):
        assert time.monotonic() < deadline, f"never true within {timeout:.0f} s: {expr}"
        page.wait_for_timeout(100)  # a poll interval: the loop checks state
    return value


def start_call(page: Page, base: str, noise_reduction: str | None) -> dict[str, Any]:
    """Place the call on ``page``; its POST's answer (``location``)."""
    page.goto(base + "/readyz")  # the appliance's origin: a secure context, no CORS
    session = {"type": "realtime", "audio": {"input": {
        "noise_reduction": {"type": noise_reduction} if noise_reduction else None,
        "turn_detection": {"type": "server_vad", "silence_duration_ms": 200,
                           "create_response": False}}}}
    out = page.evaluate(CALL, {"session": session})
    assert out["status"] == 201, out
    wait_for(page, "window.__events.some((e) => e.type === 'session.created')")
    return out


def starts_of_a_call(page: Page, location: str, t0: float) -> dict[str, Any]:
    """What the call on ``page`` heard in the LISTEN s from ``t0`` (its clock), then ended."""
    events: list[dict[str, Any]] = page.evaluate("window.__events")
    status, view = page.evaluate("""async (loc) => {
        const r = await fetch(loc); return [r.status, await r.text()]; }""", location)
    assert status == 200, view
    page.evaluate("window.__pc.close()")
    page.evaluate("(loc) => fetch(loc, {method: 'DELETE'})", location)
    starts = [e for e in events if e["type"] == "input_audio_buffer.speech_started"
              and t0 <= e["__t"] <= t0 + LISTEN * 1000]
    return {"starts": len(starts), "media": json.loads(view)["media"]["media"],
            "types": [e["type"] for e in events]}


def test_noise_reduction_cuts_the_vads_false_starts(up: str, page: Page) -> None:
    # The two calls run side by side, each in its own page hearing the same looped room
    # (the counts are of what each call's VAD did; the scenario's length is waited once).
    other = page.context.new_page()
    calls = [(page, start_call(page, up, None)), (other, start_call(other, up, "far_field"))]
    t0 = [pg.evaluate("performance.now()") for pg, _ in calls]
    page.wait_for_timeout(LISTEN * 1000)  # the scenario's length: two loops of the room
    raw, clean = (starts_of_a_call(pg, out["location"], t)
                  for (pg, out), t in zip(calls, t0, strict=True))
    print(f"speech_started in {LISTEN:.0f} s (2 phrases): without noise reduction "
          f"{raw['starts']}, with far_field {clean['starts']}")
    assert "denoise" not in raw["media"]["in"]
    assert "denoise" in clean["media"]["in"], clean["media"]
    # Two loops: two phrases, and ~8 clatter bursts each. Without the stage the clatter
    # starts turns; with it the turns are (about) the phrases.
    assert raw["starts"] >= 6, raw
    assert 1 <= clean["starts"] <= raw["starts"] // 2, (raw["starts"], clean["starts"])
