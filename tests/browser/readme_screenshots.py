"""Regenerate the README's screenshots (docs/screenshots/) from a real `appliance up`.

    make screenshots        # = .venv/bin/python tests/browser/readme_screenshots.py

Starts `appliance up` on free loopback ports, keeps a few load-generator calls open through
it (two echo calls for the length of the run, one passthrough call that ends early so the
table shows an ended row), talks to the echo agent from Playwright-driven Chromium
(tests/peers.py finds it; a fake microphone plays a 440 Hz tone), and screenshots the demo
page and the dashboard with that call's details open. Everything on the pictures is what
today's code serves: real counter names, states and timings, nothing staged.

Not a test (the suite's browser tests use artifacts in test-artifacts/); run it after a UI
change and commit the two PNGs.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

import trio  # noqa: E402
from browser.helpers import DOCS_SCREENSHOTS, launch, write_tone_wav  # noqa: E402
from e2e.procs import Proc, free_tcp_port, free_udp_port  # noqa: E402
from peers import chromium_version  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402

from appliance.loadgen import LoadConfig, run_load  # noqa: E402


def background_calls(base: str) -> list[threading.Thread]:
    def run(cfg: LoadConfig) -> None:
        trio.run(run_load, cfg)

    configs = [
        LoadConfig(base, sessions=2, rate=2, duration=40, agent="echo"),
        LoadConfig(base, sessions=1, rate=1, duration=2, agent="passthrough"),
    ]
    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in configs]
    for t in threads:
        t.start()
    return threads


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="appliance-screens-") as tmp_dir:
        tmp = Path(tmp_dir)
        http, udp = free_tcp_port(), free_udp_port()
        base = f"http://127.0.0.1:{http}"
        up = Proc(["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
                   "--public-address", "127.0.0.1", "--state-dir", str(tmp / "state")],
                  "appliance ready", timeout=60)
        calls: list[threading.Thread] = []
        try:
            calls = background_calls(base)
            tone = write_tone_wav(tmp / "tone.wav")
            with sync_playwright() as p:
                browser = launch(p, tone)
                ctx = browser.new_context(viewport={"width": 1280, "height": 900},
                                          permissions=["microphone"])
                demo = ctx.new_page()
                demo.set_default_timeout(20_000)
                demo.goto(base + "/demo")
                demo.get_by_role("button", name="Start", exact=True).click()
                expect(demo.locator("#state")).to_have_text("connected")
                demo.wait_for_function(
                    "applianceDemo.serverTimeline && applianceDemo.serverTimeline.first_rtp_out"
                    " !== null && applianceDemo.levels.output > 0.3")
                demo.wait_for_timeout(1500)  # a few stats refreshes: the counters settle
                sid = demo.evaluate("applianceDemo.sessionId")
                DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                demo.screenshot(path=str(DOCS_SCREENSHOTS / "demo.png"), full_page=True)

                dash = ctx.new_page()
                dash.set_default_timeout(20_000)
                dash.goto(base + "/")
                expect(dash.locator("#live")).to_have_attribute("data-status", "live")
                expect(dash.locator("tr[data-session-id] .state", has_text="ended")).not_to_have_count(0)
                # RTT needs Chromium's first receiver report on our sender report (RFC 3550
                # §6.4.1: RR every ~5 s), ~10 s into the call.
                row = dash.locator(f'tr[data-session-id="{sid}"]')
                expect(row.locator('td[data-label="RTT"]')).not_to_have_text("–", timeout=40_000)
                dash.get_by_role("button", name=f"Details of session {sid}").click()
                dash.wait_for_timeout(6000)  # the RTT/jitter/loss sparklines fill in
                dash.screenshot(path=str(DOCS_SCREENSHOTS / "dashboard.png"), full_page=True)
                browser.close()
        finally:
            up.stop()  # the calls still open end with it (DTLS close_notify)
            for t in calls:
                t.join(15)
    print(f"wrote {DOCS_SCREENSHOTS}/demo.png and dashboard.png (Chromium {chromium_version()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
