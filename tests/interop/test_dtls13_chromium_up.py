"""Interop through the product: real headless Chromium calls `appliance up` (relay,
transceiver, echo agent) from the demo page and negotiates DTLS 1.3 (RFC 9147) under the
default ``--dtls-versions 1.2,1.3``, or 1.2 under ``--dtls-versions 1.2``; either way the
echo agent's audio comes back (inbound-rtp with audio energy).

The demo page does not expose its RTCPeerConnection's transport stats, so an init script
(test-only) keeps every RTCPeerConnection the page makes in ``window.__pcs``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser.helpers import KEEP_PCS, launch, write_tone_wav
from e2e.procs import Proc, free_tcp_port, free_udp_port
from interop.test_dtls_chromium import TLS_VERSION
from playwright.sync_api import Browser, Page, sync_playwright

pytestmark = [pytest.mark.interop, pytest.mark.browser, pytest.mark.slow]

TRANSPORT_STATS = """async () => {
  const pc = window.__pcs[window.__pcs.length - 1];
  const all = {};
  (await pc.getStats()).forEach((s) => { all[s.id] = s; });
  const of = (type) => Object.values(all).filter((s) => s.type === type);
  return {transport: of("transport")[0] || null,
          inbound: of("inbound-rtp").find((s) => s.kind === "audio") || null};
}"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    tone = write_tone_wav(tmp_path_factory.mktemp("audio") / "tone.wav")
    with sync_playwright() as p:
        b = launch(p, tone)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(permissions=["microphone"])
    ctx.add_init_script(KEEP_PCS)
    pg = ctx.new_page()
    pg.set_default_timeout(20_000)
    yield pg
    ctx.close()


def up(tmp_path: Path, *flags: str) -> tuple[Proc, str]:
    http, udp = free_tcp_port(), free_udp_port()
    proc = Proc(["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
                 "--public-address", "127.0.0.1", "--state-dir", str(tmp_path / "state"),
                 "--transceivers", "1", *flags], "appliance ready", timeout=60)
    return proc, f"http://127.0.0.1:{http}"


@pytest.mark.parametrize(("flags", "version"), [
    ((), "1.3"),  # the default, 1.2,1.3: Chromium offers 1.3, so 1.3
    (("--dtls-versions", "1.2"), "1.2"),
    (("--dtls-versions", "1.3"), "1.3"),
], ids=["default", "1.2", "1.3"])
def test_chromium_through_up(tmp_path: Path, page: Page, flags: tuple[str, ...],
                             version: str) -> None:
    proc, base = up(tmp_path, *flags)
    try:
        page.goto(base + "/demo")
        page.get_by_role("button", name="Start", exact=True).click()
        page.wait_for_function("applianceDemo.state === 'connected'")
        # Audio flows: the echo agent returns the tone (polled: getStats is a Promise).
        deadline_ms = 15_000
        st: dict[str, Any] = {}
        for _ in range(deadline_ms // 100):
            st = page.evaluate(TRANSPORT_STATS)
            inbound = st["inbound"]
            if inbound and inbound.get("packetsReceived", 0) > 25 \
                    and inbound.get("totalAudioEnergy", 0) > 0.01:
                break
            page.wait_for_timeout(100)  # a poll interval; the loop checks the state
        else:
            pytest.fail(f"no echoed audio: {st}\n{''.join(proc.stderr)[-3000:]}")
        transport = st["transport"]
        assert transport["dtlsState"] == "connected"
        assert transport["tlsVersion"] == TLS_VERSION[version], transport
    finally:
        rc = proc.stop()
    assert rc == 0, "".join(proc.stderr)[-3000:]
