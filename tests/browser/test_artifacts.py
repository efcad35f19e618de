"""A failing browser test leaves its pages' console and getStats() behind (issue 33 item 5):
the recorder that ``launch`` attaches is exercised here on a real page with a real
RTCPeerConnection, since the hook only runs when some other test fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from browser import artifacts
from playwright.sync_api import Browser

PAGE = """<!doctype html><script>
const pc = new RTCPeerConnection();
pc.createDataChannel("probe");
console.log("probe page up", pc instanceof RTCPeerConnection);
</script>"""


def test_a_failure_dump_has_console_and_getstats(browser: Browser, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(artifacts, "ARTIFACTS", tmp_path)
    page = browser.new_page()
    try:
        page.route("http://probe.invalid/", lambda route: route.fulfill(
            body=PAGE, content_type="text/html"))
        page.goto("http://probe.invalid/")
        page.wait_for_function("() => (window.__appliancePcs || []).length > 0")
        where = artifacts.dump_all("tests/x.py::test_y[a b]")
    finally:
        page.close()
    assert where is not None and where.parent == tmp_path
    console = "".join(p.read_text() for p in where.glob("browser-*-console.txt"))
    assert "probe page up true" in console
    dumps = [json.loads(p.read_text()) for p in where.glob("browser-*-page-*-getstats.json")]
    pcs = [pc for d in dumps for pc in d["peer_connections"]]
    assert pcs and any(s.get("type") == "peer-connection" for pc in pcs for s in pc["stats"])
