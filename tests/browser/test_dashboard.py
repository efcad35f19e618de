"""The sessions dashboard (webui/index.html) against a fake backend, in real Chromium."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from browser.fake_backend import API_TOKEN, FakeBackend, sample_session
from browser.helpers import (
    PageErrors,
    assert_controls_named,
    assert_no_horizontal_scroll,
    screenshot,
)
from playwright.sync_api import Browser, Page, expect

pytestmark = pytest.mark.browser


@pytest.fixture
def backend() -> Iterator[FakeBackend]:
    with FakeBackend() as b:
        yield b


def test_table_renders_and_updates_live(page: Page, backend: FakeBackend) -> None:
    errors = PageErrors(page)
    backend.sessions[:] = [sample_session(1), sample_session(2, state="connecting", age=2)]
    page.goto(backend.url + "/")
    expect(page.locator("#live")).to_have_attribute("data-status", "live")
    rows = page.locator("#session-rows tr[data-session-id]")
    expect(rows).to_have_count(2)
    first = page.locator(f'tr[data-session-id="{backend.sessions[0]["id"]}"]')
    expect(first.locator('td[data-label="State"]')).to_have_text("connected")
    expect(first.locator('td[data-label="Client"]')).to_have_text("192.0.2.11:50001")
    expect(first.locator('td[data-label="Codec"]')).to_have_text("opus/48000/2")
    expect(first.locator('td[data-label="RTT"]')).to_have_text("3.0 ms")
    expect(first.locator('td[data-label="Loss"]')).to_have_text("0.40 %")
    # Bitrate is derived from byte-counter deltas between snapshots.
    with backend.lock:
        backend.sessions[0]["packets_in"] += 1000
    expect(first.locator('td[data-label="Packets in"]')).to_have_text("2,500")
    bitrate = first.locator('td[data-label="Bitrate in"]')
    deadline = time.monotonic() + 30  # a hang guard: until two polls have seen it move
    while "kbit/s" not in bitrate.inner_text():
        assert time.monotonic() < deadline, bitrate.inner_text()
        with backend.lock:
            backend.sessions[0]["bytes_in"] += 1000  # 1000 bytes per 0.25 s = 32 kbit/s
        time.sleep(0.25)  # pacing: the counter moves between the dashboard's polls
    assert bitrate.inner_text() != "–"

    # A new session appears, a session ends, and one disappears: no reload.
    with backend.lock:
        backend.sessions.append(sample_session(3, age=1))
        backend.sessions[1]["state"] = "ended"
    expect(rows).to_have_count(3)
    expect(page.locator(f'tr[data-session-id="{backend.sessions[1]["id"]}"] .state')).to_have_text("ended")
    with backend.lock:
        del backend.sessions[1]
    expect(rows).to_have_count(2)
    assert not errors.unexpected()


def test_detail_timeline_sparklines_and_processes(page: Page, backend: FakeBackend) -> None:
    errors = PageErrors(page)
    s = sample_session(1)
    backend.sessions[:] = [s, sample_session(2, state="new", age=1)]
    page.goto(backend.url + "/")
    page.get_by_role("button", name=f"Details of session {s['id']}").click()
    detail = page.locator("#detail")
    expect(detail).to_be_visible()
    expect(detail.get_by_role("heading", name=f"Session {s['id']}")).to_be_visible()
    # The timeline bar has one segment per step reached, proportional to its duration.
    segs = detail.locator(".tl-seg")
    expect(segs).to_have_count(4)
    phases = [segs.nth(i).get_attribute("data-phase") for i in range(4)]
    assert phases == ["answer", "ice", "dtls", "audio"]
    # ICE took 10.1 - 1.4 = 8.7 ms of 32.2: its segment is about 27 % of the bar.
    # Read the widths once the bar is laid out: the dashboard re-renders the detail on every
    # poll, and a read between two renders saw all-zero rectangles (flaked once in make test).
    widths = page.wait_for_function(
        """() => {
            const w = [...document.querySelectorAll('#detail .tl-seg')]
                .map(e => e.getBoundingClientRect().width);
            return w.length === 4 && w.every(x => x > 0) ? w : null;
        }""").json_value()
    assert abs(widths[1] / sum(widths) - 8.7 / 32.2) < 0.02, widths
    expect(detail.locator(".timeline h3")).to_have_text("Setup timeline: 32.2 ms")
    expect(detail.locator("ol.tl-steps")).to_contain_text("DTLS done 16.7 ms")
    # Sparklines fill in as samples arrive.
    for n in range(4):
        with backend.lock:
            s["rtt_ms"] = 3.0 + n
            backend.sessions[0]["rtt_ms"] = 3.0 + n
        time.sleep(0.3)  # pacing: samples between the dashboard's polls; none is asserted
    expect(page.locator("#spark-rtt polyline")).to_have_count(1)
    # Waits until a poll has seen the last value (read at once, it raced the poll).
    expect(page.locator("#spark-rtt svg")).to_have_attribute(
        "aria-label", re.compile(r"^RTT: now 6\.0 ms, min 3\.0 ms, max 6\.0 ms"))
    expect(page.locator("#spark-jitter polyline")).to_have_count(1)
    expect(page.locator("#spark-loss polyline")).to_have_count(1)
    # The URL remembers the selection.
    assert page.url.endswith(f"#session={s['id']}")

    # Relay and transceiver health, one card per process, drops by reason.
    procs = page.locator("#procs article.proc")
    expect(procs).to_have_count(4)
    expect(page.locator('article.proc[data-process="signaling-0"]')).to_contain_text("Uptime1:02:05")
    relay = page.locator('article.proc[data-process="relay-0"]')
    expect(relay).to_contain_text("Flows3")
    expect(relay.get_by_role("list", name="Drops by reason, relay-0")).to_contain_text("bad_ufrag4")
    with backend.lock:
        backend.processes[1]["counters"]["packets_in"] += 100  # type: ignore[index]
    expect(relay.locator("dd").nth(4)).not_to_have_text("–")
    tx = page.locator('article.proc[data-process="transceiver-1"]')
    expect(tx).to_contain_text("Restarts1")
    expect(tx).to_contain_text("connected 1")
    # Headroom (issue 23): measured load, complexity, and what admission would still place.
    tx0 = page.locator('article.proc[data-process="transceiver-0"]')
    expect(tx0).to_contain_text("Load42 % of a core, loop lag ≤ 1.3 ms")
    expect(tx0).to_contain_text("Headroom43 % (34 more calls)")
    expect(tx).to_contain_text("Opus complexity3")
    expect(tx).to_contain_text("Headroomfull: new calls refused, calls degraded: admitting up to 50 %")
    # Issue 32: a core shared with other processes — the load admission decides on is the
    # share of what the core has left, beside the process's own CPU and its frames' lateness.
    expect(tx).to_contain_text("Load90 % of the 0.50 core left, loop lag ≤ 4.0 ms")
    expect(tx).to_contain_text("Own CPU45 % of a core (the rest taken by other processes, 10 % stolen)")
    expect(tx).to_contain_text("Frames late (p90)6.2 ms")
    # A process that is down is flagged.
    with backend.lock:
        backend.processes[3].update(up=False, error="process exited (status 1)")  # type: ignore[index]
    expect(tx).to_have_attribute("data-up", "false")
    expect(tx).to_contain_text("Statusdown")
    expect(tx).to_contain_text("process exited (status 1)")

    # Escape closes the detail panel and returns focus to the row's button.
    page.keyboard.press("Escape")
    expect(detail).to_be_hidden()
    expect(page.get_by_role("button", name=f"Details of session {s['id']}")).to_be_focused()
    assert not errors.unexpected()


def test_busy_dashboard_layout(page: Page) -> None:
    """A busy dashboard with counters moving, one session open, fits a desktop width (the
    README's picture is taken from a real `appliance up`: make screenshots)."""
    with FakeBackend(animate=True) as backend:
        backend.sessions[:] = [
            sample_session(1, age=95), sample_session(2, age=42), sample_session(3, state="connecting", age=1),
            sample_session(4, state="ended", age=300),
        ]
        page.goto(backend.url + "/")
        page.get_by_role("button", name=f"Details of session {backend.sessions[0]['id']}").click()
        time.sleep(4)  # let the sparklines and bitrates fill in: for the picture, not asserted
        expect(page.locator("#spark-rtt polyline")).to_have_count(1)
        assert_no_horizontal_scroll(page)
        # At desktop width the whole table fits: no scrolling inside its wrapper either.
        assert page.locator(".table-wrap").evaluate("e => e.scrollWidth <= e.clientWidth")
        screenshot(page, "dashboard-fake-backend")


def test_end_button_sends_delete(page: Page, backend: FakeBackend) -> None:
    backend.sessions[:] = [sample_session(1), sample_session(2)]
    target = backend.sessions[1]["id"]
    page.goto(backend.url + "/")
    end = page.get_by_role("button", name=f"End session {target}")
    expect(end).to_be_enabled()
    # Keyboard only: focus the button and press Enter.
    end.focus()
    page.keyboard.press("Enter")
    expect(end).to_be_disabled()
    expect(end).to_have_text("Ended")
    assert backend.deleted == [target]
    expect(page.locator(f'tr[data-session-id="{target}"] .state')).to_have_text("ended")
    # The other session is untouched.
    expect(page.get_by_role("button", name=f"End session {backend.sessions[0]['id']}")).to_be_enabled()


def test_empty_state(page: Page, backend: FakeBackend) -> None:
    backend.processes = []
    page.goto(backend.url + "/")
    expect(page.locator("#empty-cell")).to_contain_text("No sessions right now")
    expect(page.locator("#empty-cell").get_by_role("link", name="demo")).to_have_attribute("href", "demo")
    expect(page.locator("#procs")).to_contain_text("No relay or transceiver processes reported")
    screenshot(page, "dashboard-empty")


def test_server_unreachable_then_back(page: Page, backend: FakeBackend) -> None:
    backend.sessions[:] = [sample_session(1)]
    page.goto(backend.url + "/")
    expect(page.locator("#session-rows tr[data-session-id]")).to_have_count(1)
    backend.stop()
    expect(page.locator("#live")).to_have_attribute("data-status", "offline", timeout=10_000)
    banner = page.get_by_role("alert")
    expect(banner).to_contain_text("Live updates stopped")
    expect(banner).to_contain_text("Cannot reach the appliance")
    # The last known values stay on screen.
    expect(page.locator("#session-rows tr[data-session-id]")).to_have_count(1)
    screenshot(page, "dashboard-unreachable")


def test_polls_when_server_has_no_event_stream(page: Page, backend: FakeBackend) -> None:
    backend.events_status = 404
    backend.sessions[:] = [sample_session(1)]
    page.goto(backend.url + "/")
    expect(page.locator("#live")).to_have_attribute("data-status", "polling")
    expect(page.locator("#session-rows tr[data-session-id]")).to_have_count(1)
    with backend.lock:
        backend.sessions.append(sample_session(2))
    expect(page.locator("#session-rows tr[data-session-id]")).to_have_count(2)


def test_token_required_then_pasted(page: Page) -> None:
    """Bound off loopback the API wants a token: the dashboard says so, takes the API token in
    a form, and then follows the event stream with it."""
    with FakeBackend(auth=True) as backend:
        backend.sessions[:] = [sample_session(1)]
        page.goto(backend.url + "/")
        expect(page.locator("#live")).to_have_attribute("data-status", "auth")
        banner = page.get_by_role("alert")
        expect(banner).to_contain_text("Access token required")
        expect(banner).to_contain_text("requires an access token")
        screenshot(page, "dashboard-token-required")
        page.get_by_label("Access token").fill(API_TOKEN)
        page.get_by_role("button", name="Use token").press("Enter")
        expect(page.locator("#live")).to_have_attribute("data-status", "live")
        expect(banner).to_be_hidden()
        expect(page.locator("#session-rows tr[data-session-id]")).to_have_count(1)
        events = [r for r in backend.requests if r[1] == "/v1/events"]
        assert events[-1][2] == f"Bearer {API_TOKEN}", events


def test_token_from_url_fragment(page: Page) -> None:
    with FakeBackend(auth=True) as backend:
        backend.sessions[:] = [sample_session(1)]
        page.goto(f"{backend.url}/#token={API_TOKEN}")
        expect(page.locator("#live")).to_have_attribute("data-status", "live")
        assert "token" not in page.url  # not left in the address bar or history
        page.get_by_role("button", name=f"End session {backend.sessions[0]['id']}").click()
        expect(page.locator(f'tr[data-session-id="{backend.sessions[0]["id"]}"] .state')).to_have_text("ended")
        assert backend.deleted == [backend.sessions[0]["id"]]


def test_narrow_layout_and_accessible_names(browser: Browser, backend: FakeBackend) -> None:
    backend.sessions[:] = [sample_session(1), sample_session(2)]
    ctx = browser.new_context(viewport={"width": 360, "height": 740})
    try:
        page = ctx.new_page()
        page.goto(backend.url + "/")
        expect(page.locator("#session-rows tr[data-session-id]")).to_have_count(2)
        page.get_by_role("button", name=f"Details of session {backend.sessions[0]['id']}").click()
        expect(page.locator("#detail .tl-seg")).to_have_count(4)
        assert_no_horizontal_scroll(page)
        # In the card layout every value still carries its label.
        row = page.locator(f'tr[data-session-id="{backend.sessions[0]["id"]}"]')
        before = row.locator('td[data-label="Client"]').evaluate("e => getComputedStyle(e, '::before').content")
        assert before == '"Client"'
        assert_controls_named(page)
        screenshot(page, "dashboard-360px")
    finally:
        ctx.close()


def test_detail_shows_data_channels(page: Page, backend: FakeBackend) -> None:
    errors = PageErrors(page)
    with_dc, without = sample_session(2), sample_session(1)
    backend.sessions[:] = [with_dc, without]
    page.goto(backend.url + "/")
    page.get_by_role("button", name=f"Details of session {with_dc['id']}").click()
    fields = page.locator("#detail-fields")
    expect(fields).to_contain_text("SCTP connected · 1 open: chat #1")
    expect(fields).to_contain_text("Messages in / out12 / 12")
    # The counters follow the feed.
    with backend.lock:
        with_dc["datachannels"].update(messages_in=1500, messages_out=1499, messages_dropped=1,
                                       bytes_in=2_000_000)
    expect(fields).to_contain_text("Messages in / out1,500 / 1,499 (1 dropped)")
    expect(fields).to_contain_text("Message bytes in / out2,000,000 / 340")
    page.get_by_role("button", name=f"Details of session {without['id']}").click()
    expect(fields).to_contain_text("Data channelsnone offered")
    screenshot(page, "dashboard-datachannels")
    assert not errors.unexpected()


def test_detail_draws_a_bar_per_turn(page: Page, backend: FakeBackend) -> None:
    """Issue 38 item 5: a voice agent's turns (the session object's ``turns``) as bars like
    the setup timeline's, each segment proportional to its phase."""
    from agents.turn_agent import TURN

    errors = PageErrors(page)
    voice, other = sample_session(3), sample_session(1)
    # Turn 2: cut short (no first frame sent), from an agent that does not report the pause.
    voice["turns"] = [TURN, {"turn": 2, "speech_start_ms": None, "speech_end_ms": None,
                             "transcript_ms": 40.0, "stt_ms": 40.0, "first_token_ms": 300.0,
                             "first_audio_ms": None, "first_sent_ms": None}]
    backend.sessions[:] = [voice, other]
    page.goto(backend.url + "/")
    page.get_by_role("button", name=f"Details of session {voice['id']}").click()
    turns = page.locator("#detail-turns")
    expect(turns.locator("h3")).to_have_text("Turns (2)")
    first, second = turns.locator(".turn[data-turn='1']"), turns.locator(".turn[data-turn='2']")
    expect(first.locator("h4")).to_have_text("Turn 1: reply sent 551 ms after the speech ended")
    expect(second.locator("h4")).to_have_text("Turn 2: no reply sent")
    expect(second.locator(".tl-seg")).to_have_count(3)  # wait (0 ms), transcript, LLM
    expect(second.locator(".tl-steps")).to_contain_text("First token +300 ms")
    # The caller's 1.32 s of speech beside the detector's 520 ms wait (the small segments'
    # padding keeps them readable, so the two big ones are compared).
    widths = page.wait_for_function(
        """() => {
            const w = [...document.querySelectorAll("#detail-turns .turn[data-turn='1'] .tl-seg")]
                .map(e => e.getBoundingClientRect().width);
            return w.length === 6 && w[0] > 0 ? w : null;
        }""").json_value()
    assert abs(widths[0] / widths[1] / (1320 / 520) - 1) < 0.03, widths
    screenshot(page, "dashboard-turn-bars")
    # A session whose agent reports no turns has no Turns section.
    page.get_by_role("button", name=f"Details of session {other['id']}").click()
    expect(turns).to_be_hidden()
    assert not errors.unexpected()
