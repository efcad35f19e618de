"""Issue 29 item 6: a browser call made with the official ``@openai/agents-realtime``
(``RealtimeSession``, WebRTC transport, real headless Chromium) and a backend attached to it
by call id with openai-agents' call-id model (``OpenAIRealtimeSIPModel``, a subprocess: its
``agents`` package shadows tests/agents). The backend locks ``tools`` and ``instructions``
and declares a Python tool; the page types the built-in agent's tool trigger; the backend's
tool runs, the page hears (reads) the answer and never sees the function call; the page's
``session.update`` of a locked field is refused with an ``error``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser.helpers import PageErrors, launch
from browser.realtime_support import PageServer, appliance_up, speech_wav
from browser.test_realtime_clients import events_of, mint, wait_for
from playwright.sync_api import Browser, Page, Playwright
from realtime.test_sideband import BACKEND

pytestmark = [pytest.mark.browser, pytest.mark.slow]
AGENTS_SDK = Path(__file__).resolve().parents[2] / ".venv" / "openai-agents"
ANSWER = "tool get_weather returned: sunny in Oslo"


@pytest.fixture(scope="module")
def browser(playwright_instance: Playwright, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Browser]:
    b = launch(playwright_instance, speech_wav(tmp_path_factory.mktemp("audio") / "s.wav"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def pages() -> Iterator[PageServer]:
    with PageServer() as server:
        yield server


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with appliance_up(tmp_path_factory.mktemp("up"), name="sideband") as base:
        yield base


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    p = context.new_page()
    yield p
    context.close()


@pytest.mark.skipif(not AGENTS_SDK.is_dir(), reason="openai-agents not installed (make "
                    "install-test puts it in .venv/openai-agents)")
def test_backend_tool_answers_the_browser_and_locks_hold(up: str, pages: PageServer,
                                                          page: Page) -> None:
    errors = PageErrors(page)
    page.goto(pages.base + "/sideband.html")
    out = page.evaluate("(a) => sb.connect(a)", {"base": up, "key": mint(up)})
    assert out["ok"], out
    call_id = out["callId"]
    url = up.replace("http", "ws", 1) + f"/v1/realtime?call_id={call_id}&lock=tools,instructions"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(AGENTS_SDK)
    env["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    proc = subprocess.Popen([sys.executable, "-c", BACKEND, url, call_id], env=env, cwd="/",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ATTACHED"
        # the backend's tools reached the call: the page sees its session.updated
        wait_for(page, "sb.state.events.some((e) => e.type === 'session.updated' && "
                       "e.session.tools.some((t) => t.name === 'get_weather'))", timeout=30)
        page.evaluate("sb.send({type: 'session.update', event_id: 'evt_lock', session: "
                      "{type: 'realtime', instructions: 'ignore the backend'}})")
        wait_for(page, "sb.types().includes('error')")
        [err] = [e for e in events_of(page, "sb") if e["type"] == "error"]
        assert (err["error"]["code"], err["error"]["param"], err["error"]["event_id"]) == (
            "session_field_locked", "session.instructions", "evt_lock")
        page.evaluate("(t) => sb.say(t)", 'call tool get_weather {"city": "Oslo"}')
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr.decode()[-3000:]
        result = json.loads(stdout.decode().strip().splitlines()[-1])
        assert result["ran"] == ["Oslo"]  # the backend's Python tool ran
        wait_for(page, "(a) => sb.state.events.some((e) => e.type === "
                       "'response.output_audio_transcript.done' && e.transcript === a)",
                 ANSWER, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = events_of(page, "sb")
    assert not any(e["type"].startswith("response.function_call_arguments") for e in events)
    for e in events:
        if e["type"] == "response.done":
            assert all(o["type"] != "function_call" for o in e["response"]["output"])
    # the session stays the browser's where it was not locked; the instructions the backend's
    updated = [e for e in events if e["type"] == "session.updated"][-1]
    assert updated["session"]["instructions"] == "the backend's"
    page.evaluate("sb.close()")
    assert errors.unexpected() == []
