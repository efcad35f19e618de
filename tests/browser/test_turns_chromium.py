"""Issue 38 items 5 and 8(c) in real Chromium through ``appliance up``: an agent that reports
its turns (tests/agents/turn_agent.py: the assistant's ``turn.metrics`` without the speech
models, and no audio at all) gets a bar per turn on the demo page and in the dashboard's
call detail; the demo's "Setup time" is connect time, which a silent agent cannot hold up;
and /metrics has the turn in ``appliance_turn_*_seconds``."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser.helpers import REPO, PageErrors, running_appliance_up, screenshot
from playwright.sync_api import BrowserContext, Page, expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]

AGENT = f"{REPO / 'tests' / 'agents' / 'turn_agent.py'}:agent"
#: The agent's turn: 520 ms of the detector's wait and 31.2 ms to the first frame sent.
HEADLINE = "Turn 1: reply sent 551 ms after the speech ended"


@pytest.fixture
def appliance_up(tmp_path: Path) -> Iterator[str]:
    with running_appliance_up(tmp_path, "--agent", AGENT, "--transceivers", "1",
                              name="turns") as base:
        yield base


def test_a_turn_is_drawn_and_setup_is_connect_time(appliance_up: str, page: Page,
                                                   context: BrowserContext) -> None:
    errors = PageErrors(page)
    base = appliance_up
    page.goto(base + "/demo?agent=")  # the server's default: the turn agent
    expect(page.get_by_label("Agent", exact=True)).to_have_value("")
    page.get_by_role("button", name="Start", exact=True).click()
    expect(page.locator("#state")).to_have_text("connected", timeout=20_000)

    # 1. Setup is connect time: shown once connected, though the agent never sends audio.
    page.wait_for_function("applianceDemo.setupMs !== null")
    setup_ms = page.evaluate("applianceDemo.setupMs")
    expect(page.locator("#setup-ms")).to_have_text(f"{setup_ms} ms")
    expect(page.locator("#setup-what")).to_contain_text("to connected")
    expect(page.locator("#setup-parts")).to_contain_text("ICE and DTLS")

    # 2. The turn, from the session object's turns (polled once a second): one bar with a
    # segment per phase, and its marks listed from the end of speech.
    turn = page.locator("#turns .turn[data-turn='1']")
    expect(turn.locator("h4")).to_have_text(HEADLINE, timeout=15_000)
    phases = turn.locator(".tl-seg").evaluate_all("els => els.map((e) => e.dataset.phase)")
    assert phases == ["speech", "wait", "stt", "llm", "tts", "send"], phases
    steps = turn.locator(".tl-steps")
    expect(steps).to_contain_text("Speech 1.32 s")
    expect(steps).to_contain_text("End of turn +520 ms")
    expect(steps).to_contain_text("First token +460 ms")  # begun at the pause: under the wait
    expect(steps).to_contain_text("First frame sent +551 ms")
    assert page.evaluate("applianceDemo.waterfalls.length") == 1
    # The server timeline there stops at the connect steps: no "first audio out".
    expect(page.locator("#server-timeline .tl-steps")).not_to_contain_text("First audio out")
    # A silent agent: no audio came back, so what the panel shows is not first-audio time.
    stats = page.evaluate("applianceDemo.stats()")
    assert not stats["inbound"] or stats["inbound"]["packetsReceived"] == 0, stats
    screenshot(page, "demo-turns")

    # 3. The dashboard's call detail draws the same turn.
    sid = page.evaluate("applianceDemo.sessionId")
    dash = context.new_page()
    dash_errors = PageErrors(dash)
    dash.goto(base + "/")
    dash.get_by_role("button", name=f"Details of session {sid}").click()
    expect(dash.locator("#detail-turns h3")).to_have_text("Turns (1)")
    expect(dash.locator("#detail-turns .turn h4")).to_have_text(HEADLINE)
    expect(dash.locator("#detail-turns .turn .tl-seg")).to_have_count(6)
    screenshot(dash, "dashboard-turns")

    # 4. /metrics: one turn, 551.2 ms from the end of speech to the first frame sent.
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert 'appliance_turn_first_sent_seconds_bucket{le="0.6"} 1' in text, text
    assert "appliance_turn_first_sent_seconds_count 1" in text
    assert "appliance_turn_end_of_turn_seconds_count 1" in text
    assert not errors.unexpected(), errors.errors
    assert not dash_errors.unexpected(), dash_errors.errors
