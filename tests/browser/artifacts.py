"""What a failing browser test leaves behind (issue 33 item 5): every page's console and
page errors since the test began, and a ``getStats()`` dump of each RTCPeerConnection still
open, under ``.ci/artifacts/<test>/`` — so a red CI run can be read after the fact.

``browser.helpers.launch`` wraps every Chromium it starts in a recorder, so every context
and page a test opens (through the fixtures or by itself) is recorded; the hooks in
``tests/conftest.py`` reset the live recorders before each test and dump them when its call
fails (the call's report comes before the fixtures' teardown, so its pages are still open); an init script keeps a list of the
page's peer connections (``window.__appliancePcs``) for the stats dump. The wrapper keeps
``instanceof RTCPeerConnection`` and the class's static methods working.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, BrowserContext, Error, Page

ARTIFACTS = Path(__file__).resolve().parents[2] / ".ci" / "artifacts"

_TRACK_PCS = """(() => {
  const Orig = window.RTCPeerConnection;
  if (!Orig || Orig.__applianceTracked) return;
  const pcs = [];
  Object.defineProperty(window, "__appliancePcs", {value: pcs});
  const Tracked = function (...args) {
    const pc = new Orig(...args);
    pcs.push(pc);
    return pc;
  };
  Tracked.prototype = Orig.prototype;
  Object.setPrototypeOf(Tracked, Orig);
  Object.defineProperty(Tracked, "__applianceTracked", {value: true});
  window.RTCPeerConnection = Tracked;
})();"""

_DUMP_STATS = """async () => {
  const out = [];
  for (const pc of (window.__appliancePcs || [])) {
    const entry = {connectionState: pc.connectionState, iceConnectionState: pc.iceConnectionState,
                   signalingState: pc.signalingState, stats: []};
    try {
      const report = await pc.getStats();
      report.forEach((s) => entry.stats.push(s));
    } catch (e) { entry.error = String(e); }
    out.push(entry);
  }
  return out;
}"""


#: The recorders of the browsers still running (a browser leaves when it disconnects).
LIVE: list[BrowserRecorder] = []


class BrowserRecorder:
    """Console lines and pages of the current test, for :meth:`dump` when it fails."""

    def __init__(self, browser: Browser) -> None:
        self.lines: list[str] = []
        self.pages: list[Page] = []
        LIVE.append(self)
        browser.on("disconnected", lambda _: LIVE.remove(self) if self in LIVE else None)
        new_context, new_page = browser.new_context, browser.new_page

        def tracked_context(*args: Any, **kwargs: Any) -> BrowserContext:
            ctx = new_context(*args, **kwargs)
            self.attach(ctx)
            return ctx

        def tracked_page(*args: Any, **kwargs: Any) -> Page:
            page = new_page(*args, **kwargs)
            page.context.add_init_script(_TRACK_PCS)
            self._page(page)
            return page

        browser.new_context = tracked_context  # type: ignore[method-assign]
        browser.new_page = tracked_page  # type: ignore[method-assign]

    def attach(self, ctx: BrowserContext) -> None:
        ctx.add_init_script(_TRACK_PCS)
        ctx.on("page", self._page)

    def _page(self, page: Page) -> None:
        n = len(self.pages)
        self.pages.append(page)
        page.on("console", lambda m: self.lines.append(f"[page {n}] console.{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.lines.append(f"[page {n}] pageerror: {e}"))
        page.on("framenavigated",
                lambda f: self.lines.append(f"[page {n}] navigated: {f.url}")
                if f == page.main_frame else None)

    def reset(self) -> None:
        self.lines.clear()
        self.pages.clear()

    def dump(self, where: Path, browser_no: int) -> None:
        where.mkdir(parents=True, exist_ok=True)
        (where / f"browser-{browser_no}-console.txt").write_text("\n".join(self.lines) + "\n")
        for n, page in enumerate(self.pages):
            if page.is_closed():
                continue
            try:
                stats = page.evaluate(_DUMP_STATS)
                url = page.url
            except Error as e:  # a crashed or navigating page: say so, keep the rest
                stats, url = {"error": str(e)}, "?"
            (where / f"browser-{browser_no}-page-{n}-getstats.json").write_text(
                json.dumps({"url": url, "peer_connections": stats}, indent=1, default=str))


def reset_all() -> None:
    for recorder in LIVE:
        recorder.reset()


def dump_all(test_id: str) -> Path | None:
    """Every live browser's record of the failed test, under .ci/artifacts/<test id>/."""
    if not LIVE:
        return None
    where = ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]+", "_", test_id)[-150:]
    for n, recorder in enumerate(LIVE):
        recorder.dump(where, n)
    return where
