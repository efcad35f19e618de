"""Fixtures for the browser tests: Debian's Chromium under Playwright (sync API) with a fake
microphone playing a 440 Hz tone.

The tests are plain ``def`` functions: Playwright's sync API runs its own event loop, which
must not be nested inside pytest-trio's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser.helpers import launch, write_tone_wav
from peers import chromium_executable
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright


@pytest.fixture(scope="session")
def tone_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tone_wav(tmp_path_factory.mktemp("audio") / "tone-440.wav")


# Module scope: Playwright's sync API keeps an asyncio loop running on this thread while it
# is open, which breaks any later test that starts its own (aiortc's asyncio.run, or another
# sync_playwright). Each browser module opens and closes its own.
@pytest.fixture(scope="module")
def playwright_instance() -> Iterator[Playwright]:
    chromium_executable()  # fails the module at once, saying how to get one
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright_instance: Playwright, tone_wav: Path) -> Iterator[Browser]:
    b = launch(playwright_instance, tone_wav)
    yield b
    b.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, permissions=["microphone"])
    yield ctx
    ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    return pg
