"""The microphone demo (webui/demo.html) against a fake backend, in real Chromium: the
messages for a denied microphone, an unreachable server, a refused token and a failed
media connection; the agent choice; the narrow layout; keyboard use."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser.fake_backend import API_TOKEN, FakeBackend
from browser.helpers import (
    PageErrors,
    assert_controls_named,
    assert_no_horizontal_scroll,
    launch,
    screenshot,
    wait_for_stats,
)
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, expect

pytestmark = pytest.mark.browser


@pytest.fixture
def backend() -> Iterator[FakeBackend]:
    with FakeBackend() as b:
        yield b


def demo_state(page: Page) -> dict[str, object]:
    return page.evaluate("() => ({state: applianceDemo.state, error: applianceDemo.error, message: applianceDemo.message})")


def test_idle_page(page: Page, backend: FakeBackend) -> None:
    errors = PageErrors(page)
    page.goto(backend.url + "/demo")
    expect(page.locator("#state")).to_have_text("idle")
    expect(page.get_by_label("Agent", exact=True)).to_have_value("echo")
    expect(page.get_by_role("button", name="Start", exact=True)).to_be_enabled()
    expect(page.get_by_role("button", name="Stop")).to_be_disabled()
    expect(page.get_by_role("meter", name="Microphone level")).to_be_visible()
    expect(page.get_by_role("meter", name="Agent level")).to_be_visible()
    assert_controls_named(page)
    assert not errors.unexpected()


def test_microphone_denied(playwright_instance: Playwright, tone_wav: Path, backend: FakeBackend) -> None:
    # No --use-fake-ui-for-media-stream and no granted permission: headless Chromium denies.
    browser = launch(playwright_instance, tone_wav, fake_ui=False)
    try:
        page = browser.new_page()
        page.goto(backend.url + "/demo")
        page.get_by_role("button", name="Start", exact=True).click()
        expect(page.locator("#state")).to_have_text("failed")
        alert = page.get_by_role("alert")
        expect(alert).to_contain_text("Microphone access was denied")
        expect(alert).to_contain_text("press Start again")
        assert demo_state(page)["error"] == "mic-denied"
        assert backend.offers == []  # nothing was sent to the server
        expect(page.get_by_role("button", name="Start", exact=True)).to_be_enabled()
        screenshot(page, "demo-mic-denied")
    finally:
        browser.close()


def test_server_unreachable(page: Page, backend: FakeBackend) -> None:
    page.goto(backend.url + "/demo")
    backend.stop()
    page.get_by_role("button", name="Start", exact=True).click()
    expect(page.locator("#state")).to_have_text("failed")
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("The server is unreachable")
    expect(alert).to_contain_text(f"Cannot reach the appliance at {backend.url}")
    assert demo_state(page)["error"] == "unreachable"
    # The microphone is released after a failure.
    expect(page.locator("#level-in-db")).to_have_text("–")
    screenshot(page, "demo-unreachable")


def test_token_required_then_client_token(page: Page) -> None:
    """Off loopback: Start without a token explains what is needed; with the API token pasted,
    the page mints a short-lived client token and creates the session with that."""
    with FakeBackend(auth=True) as backend:
        page.goto(backend.url + "/demo?connect_timeout_ms=60000")
        page.get_by_role("button", name="Start", exact=True).click()
        expect(page.locator("#state")).to_have_text("failed")
        expect(page.get_by_role("alert")).to_contain_text("Access token required")
        assert demo_state(page)["error"] == "auth"
        assert backend.offers == []
        page.get_by_label("Access token").fill(API_TOKEN)
        page.get_by_role("button", name="Use token and start").click()
        expect(page.locator("#state-detail")).to_contain_text("connecting media")
        posts = [r for r in backend.requests if r[:2] == ("POST", "/v1/sessions")]
        assert posts[-1][2] and posts[-1][2].startswith("Bearer ct1."), posts
        # Minted for the agent picked (a client token may not name another; the real
        # appliance's side: tests/interop/test_one_port_chromium.py).
        assert backend.minted == [{"agent": "echo"}]
        # Stop ends the session with the same client token.
        page.get_by_role("button", name="Stop").click()
        expect(page.locator("#state")).to_have_text("ended")
        assert len(backend.deleted) == 1


def test_connection_failed_and_custom_agent(page: Page, backend: FakeBackend) -> None:
    page.goto(backend.url + "/demo?connect_timeout_ms=2500")
    page.get_by_label("Agent", exact=True).select_option("custom")
    custom = page.get_by_label("Agent name")
    expect(custom).to_be_focused()
    custom.fill("examples.weather:agent")
    page.get_by_role("button", name="Start", exact=True).click()
    expect(page.locator("#state")).to_have_text("connecting")
    expect(page.locator("#state-detail")).to_contain_text(f"127.0.0.1:{backend.blackhole_port}")
    assert backend.offers[-1]["agent"] == "examples.weather:agent"
    offer = backend.offers[-1]["sdp"]
    assert "m=audio" in offer and "opus/48000/2" in offer
    expect(page.locator("#state")).to_have_text("failed", timeout=10_000)
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("The connection failed")
    expect(alert).to_contain_text(f"127.0.0.1:{backend.blackhole_port}")
    assert demo_state(page)["error"] == "connection-failed"
    # The page tidies up the session it could not use.
    sid = page.evaluate("applianceDemo.sessionId")
    assert sid and sid in backend.deleted
    screenshot(page, "demo-connection-failed")


def test_ended_by_server_while_connecting(page: Page, backend: FakeBackend) -> None:
    """DELETE from elsewhere (the dashboard) is noticed by polling GET /v1/sessions/{id}."""
    page.goto(backend.url + "/demo?connect_timeout_ms=60000")
    page.get_by_role("button", name="Start", exact=True).click()
    expect(page.locator("#state-detail")).to_contain_text("connecting media")
    sid = page.evaluate("applianceDemo.sessionId")
    session = backend.find(sid)
    assert session is not None
    with backend.lock:
        session["state"] = "ended"
        session["end_reason"] = "deleted"
    expect(page.locator("#state")).to_have_text("ended")
    expect(page.get_by_role("alert")).to_contain_text("The session was ended: deleted")
    expect(page.get_by_role("button", name="Start", exact=True)).to_be_enabled()


def test_stop_deletes_session(page: Page, backend: FakeBackend) -> None:
    page.goto(backend.url + "/demo?connect_timeout_ms=60000")
    page.get_by_role("button", name="Start", exact=True).click()
    expect(page.locator("#state-detail")).to_contain_text("connecting media")
    sid = page.evaluate("applianceDemo.sessionId")
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#state")).to_have_text("ended")
    assert backend.deleted == [sid]
    expect(page.get_by_role("alert")).to_contain_text("You stopped the session")


def test_keyboard_only(page: Page, backend: FakeBackend) -> None:
    page.goto(backend.url + "/demo?connect_timeout_ms=60000")
    # Tab from the top: skip link, nav links, agent select, then Start.
    for _ in range(12):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "start":
            break
    assert page.evaluate("document.activeElement.id") == "start"
    page.keyboard.press("Enter")
    expect(page.locator("#state")).to_have_text("connecting")
    page.get_by_role("button", name="Stop").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#state")).to_have_text("ended")


def test_stop_while_the_offer_is_in_flight(page: Page, backend: FakeBackend) -> None:
    """Stop pressed before the answer arrives wins: the page stays "ended" (not "failed" when
    the late answer meets a closed peer connection), and the session the late answer names
    is deleted rather than left to the consent timeout."""
    backend.answer_gate = threading.Event()
    page.goto(backend.url + "/demo?connect_timeout_ms=60000")
    with page.expect_request(lambda req: req.method == "POST" and "/v1/sessions" in req.url):
        page.get_by_role("button", name="Start", exact=True).click()
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#state")).to_have_text("ended")
    with page.expect_request(lambda req: req.method == "DELETE"):
        backend.answer_gate.set()
    expect(page.locator("#state")).to_have_text("ended")
    expect(page.get_by_role("alert")).to_contain_text("You stopped the session")
    assert page.evaluate("document.querySelector('#message').dataset.code") == "stopped"


def test_narrow_layout(browser: Browser, backend: FakeBackend) -> None:
    ctx = browser.new_context(viewport={"width": 360, "height": 740}, permissions=["microphone"])
    try:
        page = ctx.new_page()
        page.goto(backend.url + "/demo")
        page.get_by_label("Agent", exact=True).select_option("custom")
        assert_no_horizontal_scroll(page)
        assert_controls_named(page)
        screenshot(page, "demo-360px")
    finally:
        ctx.close()


def test_talk_to_echo_peer_then_end_from_dashboard(page: Page, context: BrowserContext) -> None:
    """The whole demo media path against an independent WebRTC peer (aiortc echoing the
    tone): connected, a setup time, audio energy coming back, level meters moving; then End
    on the dashboard (a second tab) ends it in the demo."""
    errors = PageErrors(page)
    with FakeBackend(echo=True) as backend:
        page.goto(backend.url + "/demo")
        page.get_by_role("button", name="Start", exact=True).click()
        expect(page.locator("#state")).to_have_text("connected", timeout=20_000)
        page.wait_for_function("applianceDemo.setupMs !== null", timeout=20_000)
        setup_ms = page.evaluate("applianceDemo.setupMs")
        assert 0 < setup_ms < 10_000
        expect(page.locator("#setup-ms")).to_have_text(f"{setup_ms} ms")
        # The tone comes back: inbound audio energy grows, and both meters show signal.
        wait_for_stats(page, "s.inbound && s.inbound.totalAudioEnergy > 0.01"
                             " && s.inbound.packetsReceived > 10 && s.outbound.packetsSent > 10")
        page.wait_for_function("applianceDemo.levels.input > 0.3 && applianceDemo.levels.output > 0.3", timeout=10_000)
        sid = page.evaluate("applianceDemo.sessionId")
        # The server's setup timeline comes from polling GET /v1/sessions/{id}.
        page.wait_for_function("applianceDemo.serverTimeline && applianceDemo.serverTimeline.dtls_done !== null")
        expect(page.locator("#server-timeline .tl-seg")).to_have_count(4)
        page.wait_for_timeout(1200)  # one more stats refresh for the screenshot
        screenshot(page, "demo-fake-backend")

        dash = context.new_page()
        dash.goto(backend.url + "/")
        end = dash.get_by_role("button", name=f"End session {sid}")
        end.click()
        expect(page.locator("#state")).to_have_text("ended", timeout=10_000)
        expect(page.get_by_role("alert")).to_contain_text("Session ended")
        assert backend.deleted == [sid]
    assert not errors.unexpected()
