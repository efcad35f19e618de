"""Issue 7 item 4, end to end: real Chromium talks through `appliance up` (relay, transceiver,
echo agent), the dashboard shows the session live, and End on the dashboard ends it in the demo.

Skipped (with the reason) only while the `up` subcommand does not exist; once it does, every
step here must pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser.helpers import PageErrors, running_appliance_up, screenshot, wait_for_stats
from playwright.sync_api import BrowserContext, Page, expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]

READY_TIMEOUT = 30.0


@pytest.fixture
def appliance_up(tmp_path: Path) -> Iterator[str]:
    with running_appliance_up(tmp_path, name="e2e", ready_timeout=READY_TIMEOUT) as base:
        yield base


def test_demo_through_appliance_up(appliance_up: str, page: Page, context: BrowserContext) -> None:
    errors = PageErrors(page)
    base = appliance_up

    # 1. The demo connects through the relay and the echo agent sends the tone back.
    page.goto(base + "/demo")
    expect(page.get_by_label("Agent", exact=True)).to_have_value("echo")
    page.get_by_role("button", name="Start", exact=True).click()
    expect(page.locator("#state")).to_have_text("connected", timeout=20_000)
    page.wait_for_function("applianceDemo.setupMs !== null", timeout=20_000)
    setup_ms = page.evaluate("applianceDemo.setupMs")
    assert 0 < setup_ms < 10_000, setup_ms
    expect(page.locator("#setup-ms")).to_have_text(f"{setup_ms} ms")
    stats = wait_for_stats(
        page, "s.inbound && s.inbound.packetsReceived > 25 && s.inbound.totalAudioEnergy > 0.01")
    assert stats["inbound"]["totalAudioEnergy"] > 0.01, stats
    # The server's own timeline reached first audio (GET /v1/sessions/{id}).
    page.wait_for_function(
        "applianceDemo.serverTimeline && applianceDemo.serverTimeline.dtls_done !== null"
        " && applianceDemo.serverTimeline.first_rtp_out !== null",
        timeout=10_000,
    )
    sid = page.evaluate("applianceDemo.sessionId")
    assert sid
    screenshot(page, "e2e-demo")

    # 2. The dashboard shows the session live, with counters moving, and process health.
    dash = context.new_page()
    dash_errors = PageErrors(dash)
    dash.goto(base + "/")
    expect(dash.locator("#live")).to_have_attribute("data-status", "live")
    row = dash.locator(f'tr[data-session-id="{sid}"]')
    expect(row.locator(".state")).to_have_text("connected")
    expect(row.locator('td[data-label="Agent"]')).to_have_text("echo")
    first = int(row.locator('td[data-label="Packets in"]').inner_text().replace(",", ""))
    dash.wait_for_timeout(2500)
    assert int(row.locator('td[data-label="Packets in"]').inner_text().replace(",", "")) > first
    dash.get_by_role("button", name=f"Details of session {sid}").click()
    expect(dash.locator("#detail .tl-seg[data-phase='audio']")).to_have_count(1)
    expect(dash.locator("#procs article.proc[data-up='true']")).not_to_have_count(0)
    screenshot(dash, "e2e-dashboard")

    # 3. End on the dashboard ends the call in the demo.
    dash.get_by_role("button", name=f"End session {sid}").click()
    expect(row.locator(".state")).to_have_text("ended", timeout=10_000)
    expect(page.locator("#state")).to_have_text("ended", timeout=10_000)
    expect(page.get_by_role("alert")).to_contain_text("Session ended")
    screenshot(page, "e2e-demo-ended")
    assert not errors.unexpected(), errors.errors
    assert not dash_errors.unexpected(), dash_errors.errors
