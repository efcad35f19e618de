"""Helpers for the browser tests: Chromium launch flags, the fake-microphone WAV, page
error capture and screenshots.

Screenshots go to ``test-artifacts/`` (gitignored), so a test run leaves the tree clean.
The README's pictures in ``docs/screenshots/`` come from a real ``appliance up``, not from
the tests' fake backend: ``make screenshots`` (tests/browser/readme_screenshots.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser.artifacts import BrowserRecorder
from e2e.procs import free_udp_port
from peers import chromium_executable
from playwright.sync_api import Browser, Page, Playwright
from ports import BOTH
from ports import free_port as _free_port

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
DOCS_SCREENSHOTS = REPO / "docs" / "screenshots"

BASE_ARGS = [
    "--no-sandbox",
    "--headless=new",
    "--allow-loopback-in-peer-connection",
    "--autoplay-policy=no-user-gesture-required",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


#: An init script (``page.add_init_script``) that keeps every RTCPeerConnection the page
#: makes in ``window.__pcs``, so a test can read the stats of one a page script created.
KEEP_PCS = """(() => {
  const Native = window.RTCPeerConnection;
  window.__pcs = [];
  window.RTCPeerConnection = function (...args) {
    const pc = new Native(...args);
    window.__pcs.push(pc);
    return pc;
  };
  window.RTCPeerConnection.prototype = Native.prototype;
})();"""


def write_tone_wav(path: Path, *, seconds: float = 3.0, freq: float = 440.0, rate: int = 48000) -> Path:
    """A mono 16-bit sine at -6 dBFS; Chromium's fake capture device loops it."""
    n = int(seconds * rate)
    amp = 0.5 * 32767
    frames = b"".join(struct.pack("<h", int(amp * math.sin(2 * math.pi * freq * i / rate))) for i in range(n))
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames)
    return path


def write_turns_wav(path: Path, *, freq: float = 440.0, rate: int = 48000) -> Path:
    """A caller taking turns, 5 s looped: 1 s of tone, 0.6 s pause, 1 s of tone (talking
    over the answer to the first), 2.4 s pause (listening to the answer)."""
    amp = 0.5 * 32767
    plan = [(1.0, True), (0.6, False), (1.0, True), (2.4, False)]
    out = bytearray()
    i0 = 0
    for secs, tone in plan:
        n = int(secs * rate)
        for i in range(i0, i0 + n):
            out += struct.pack("<h", int(amp * math.sin(2 * math.pi * freq * i / rate)) if tone else 0)
        i0 += n
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(out))
    return path


def launch(p: Playwright, tone_wav: Path, *, fake_ui: bool = True) -> Browser:
    """Chromium with a fake microphone; fake_ui=False leaves permission prompts unanswered
    (headless Chromium then denies the microphone), which is how the denial test runs."""
    args = [*BASE_ARGS, "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={tone_wav}"]
    if fake_ui:
        args.append("--use-fake-ui-for-media-stream")
    browser = p.chromium.launch(executable_path=chromium_executable(), args=args, headless=True)
    BrowserRecorder(browser)  # a failing test's console and getStats go to .ci/artifacts/
    return browser


class PageErrors:
    """Uncaught page errors and console errors, so a JS exception fails the test that caused it."""

    def __init__(self, page: Page) -> None:
        self.errors: list[str] = []
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)

    def unexpected(self, *allowed: str) -> list[str]:
        return [e for e in self.errors if not any(a in e for a in allowed)]


def screenshot(page: Page, name: str, *, full_page: bool = True) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def assert_no_horizontal_scroll(page: Page) -> None:
    widths = page.evaluate(
        "() => ({doc: document.documentElement.scrollWidth, body: document.body.scrollWidth, view: window.innerWidth})"
    )
    assert widths["doc"] <= widths["view"] and widths["body"] <= widths["view"], widths


# An approximation of the accessible-name computation, enough to catch an unlabelled control.
NAMELESS_CONTROLS_JS = """() => {
  const name = (el) => {
    if (el.getAttribute('aria-label')) return el.getAttribute('aria-label');
    const by = el.getAttribute('aria-labelledby');
    if (by) return by.split(/\\s+/).map((id) => document.getElementById(id)?.textContent || '').join(' ');
    if (el.labels && el.labels.length) return [...el.labels].map((l) => l.textContent).join(' ');
    if (el.tagName === 'BUTTON' || el.tagName === 'A') return el.textContent;
    return el.getAttribute('title') || '';
  };
  return [...document.querySelectorAll('button, a[href], input, select, textarea, meter, [role=button]')]
    .filter((el) => el.offsetParent !== null || el.getClientRects().length)
    .filter((el) => !name(el).trim())
    .map((el) => el.outerHTML.slice(0, 120));
}"""


def assert_controls_named(page: Page) -> None:
    nameless = page.evaluate(NAMELESS_CONTROLS_JS)
    assert nameless == [], nameless


def wait_for_stats(page: Any, condition: str, *, timeout: float = 15.0) -> dict[str, Any]:
    """Poll ``applianceDemo.stats()`` (a Promise: ``page.wait_for_function`` would take the
    Promise object itself as truthy and return at once) until ``condition`` — a JS expression
    over ``s`` — holds, or fail with the last stats seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last, ok = page.evaluate(
            f"applianceDemo.stats().then(s => [s, !!(s && ({condition}))])")
        if ok:
            return dict(last)
        if time.monotonic() > deadline:
            raise AssertionError(f"stats never satisfied {condition!r}: {last}")
        page.wait_for_timeout(100)  # a poll interval, not synchronisation: the loop checks state


def free_port(kind: int) -> int:
    """Free for ``kind`` and for the other kind too (tests/ports.py says why)."""
    return _free_port(BOTH)


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@contextlib.contextmanager
def running_appliance_up(tmp_path: Path, *extra: str, name: str = "up",
                         ready_timeout: float = 45.0) -> Iterator[str]:
    """A real ``appliance up`` on ephemeral ports with ``extra`` flags; yields its base URL
    once it printed it and /readyz is 200 (DESIGN.md); stops it with SIGINT and keeps its
    log as ``test-artifacts/e2e-appliance-up-<name>.log``."""
    http_port = free_port(socket.SOCK_STREAM)
    udp_port = free_udp_port()
    base = f"http://127.0.0.1:{http_port}"
    log_path = tmp_path / f"appliance-up-{name}.log"
    cmd = [sys.executable, "-m", "appliance", "up", "--http", f"127.0.0.1:{http_port}",
           "--udp", f"127.0.0.1:{udp_port}", "--state-dir", str(tmp_path / f"state-{name}"),
           *extra]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + ready_timeout
        while not (base in log_path.read_text() and http_status(base + "/readyz") == 200):
            if proc.poll() is not None:
                pytest.fail(f"`{' '.join(cmd[2:])}` exited with {proc.returncode}:\n"
                            f"{log_path.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"`appliance up` not ready in {ready_timeout:.0f} s:\n"
                            f"{log_path.read_text()[-4000:]}")
            time.sleep(0.1)  # a poll interval: readiness is checked, not assumed
        yield base
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / f"e2e-appliance-up-{name}.log").write_text(log_path.read_text())


#: An init script (``% json.dumps(ice_server)``): every RTCPeerConnection the page makes gets
#: that TURN server and the relay-only policy, and is kept in ``window.__pcs``.
RELAY_ONLY = """(() => {
  const Native = window.RTCPeerConnection;
  const turn = %s;
  window.__pcs = [];
  window.RTCPeerConnection = function (config) {
    const pc = new Native({...(config || {}), iceServers: [turn], iceTransportPolicy: "relay"});
    window.__pcs.push(pc);
    return pc;
  };
  window.RTCPeerConnection.prototype = Native.prototype;
})();"""

SELECTED_PAIR = """async () => {
  const pc = window.__pcs[window.__pcs.length - 1];
  const all = {};
  (await pc.getStats()).forEach((s) => { all[s.id] = s; });
  const t = Object.values(all).find((s) => s.type === "transport");
  const pair = t && all[t.selectedCandidatePairId];
  const local = pair && all[pair.localCandidateId];
  const remote = pair && all[pair.remoteCandidateId];
  return {
    dtls: t ? t.dtlsState : null,
    local: local ? {type: local.candidateType, relayProtocol: local.relayProtocol || null,
                    port: local.port} : null,
    remote: remote ? {type: remote.candidateType, port: remote.port,
                      address: remote.address || remote.ip} : null,
    inbound: Object.values(all).find((s) => s.type === "inbound-rtp" && s.kind === "audio")
      || null,
  };
}"""
