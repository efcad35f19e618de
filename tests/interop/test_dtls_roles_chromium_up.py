"""Interop through the product in both DTLS roles (issue 19 items 2 and 4;
docs/adr-dtls-active.md): real headless Chromium calls `appliance up` (relay, transceiver,
echo agent) with its own ``a=setup:actpass`` offer — the transceiver answers ``active``
and is the DTLS client, so Chromium's ``getStats()`` transport says ``dtlsRole: "server"``
— and with the offer munged to ``a=setup:active`` before it is POSTed (the page's local
description stays actpass), which makes the transceiver fall back to passive and Chromium
the DTLS client. Each under the default ``--dtls-versions 1.2,1.3`` (Chromium offers 1.3:
``tlsVersion "FEFC"``) and under ``--dtls-versions 1.2`` (``"FEFD"``); the echo agent's
audio comes back every time (inbound-rtp with audio energy).

The page is served by the test (``page.route`` on the appliance's origin, so its fetch of
``/v1/sessions`` is same-origin and needs no token on loopback).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser.helpers import launch, write_tone_wav
from interop.test_dtls13_chromium_up import up
from interop.test_dtls_chromium import TLS_VERSION
from playwright.sync_api import Browser, Page, sync_playwright

pytestmark = [pytest.mark.interop, pytest.mark.browser, pytest.mark.slow]

PAGE = """<!doctype html><meta charset="utf-8"><title>dtls roles</title><script>
async function runCall(munge) {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  const pc = new RTCPeerConnection({ bundlePolicy: "max-bundle", rtcpMuxPolicy: "require" });
  pc.addTrack(stream.getAudioTracks()[0], stream);
  // Play what comes back, as the demo page does: Chromium decodes (and counts audio energy
  // of) a remote track only while something plays it.
  pc.ontrack = (ev) => {
    const audio = new Audio();
    audio.srcObject = ev.streams[0] || new MediaStream([ev.track]);
    audio.play();
    window.__audio = audio;
  };
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((resolve) => {
    if (pc.iceGatheringState === "complete") return resolve();
    const t = setTimeout(resolve, 1000);
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") { clearTimeout(t); resolve(); }
    });
  });
  let sdp = pc.localDescription.sdp;
  if (munge) sdp = sdp.replaceAll("a=setup:actpass", "a=setup:" + munge);
  const resp = await fetch("/v1/sessions", {
    method: "POST", headers: { "Content-Type": "application/sdp" }, body: sdp });
  const answer = await resp.text();
  if (resp.status !== 201) throw new Error(`POST -> ${resp.status}: ${answer.slice(0, 300)}`);
  await pc.setRemoteDescription({ type: "answer", sdp: answer });
  window.__pc = pc;
  return answer;
}
async function stats() {
  const all = {};
  (await window.__pc.getStats()).forEach((s) => { all[s.id] = s; });
  const of = (type) => Object.values(all).filter((s) => s.type === type);
  return { transport: of("transport")[0] || null,
           inbound: of("inbound-rtp").find((s) => s.kind === "audio") || null };
}
</script>"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    tone = write_tone_wav(tmp_path_factory.mktemp("audio") / "tone.wav")
    with sync_playwright() as p:
        b = launch(p, tone)
        print(f"Chromium {b.version}")
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(permissions=["microphone"])
    pg = ctx.new_page()
    pg.set_default_timeout(20_000)
    yield pg
    ctx.close()


@pytest.mark.parametrize("version", ["1.3", "1.2"])
@pytest.mark.parametrize(("munge", "our_setup", "chromium_role"), [
    (None, "active", "server"),  # actpass -> we are the DTLS client
    ("active", "passive", "client"),  # the offer says active -> we fall back to passive
], ids=["we-client", "we-server"])
def test_chromium_in_both_dtls_roles(tmp_path: Path, page: Page, munge: str | None,
                                     our_setup: str, chromium_role: str, version: str) -> None:
    flags = () if version == "1.3" else ("--dtls-versions", "1.2")
    proc, base = up(tmp_path, *flags)
    try:
        page.route(base + "/__roles", lambda route: route.fulfill(
            status=200, content_type="text/html", body=PAGE))
        page.goto(base + "/__roles")
        answer = page.evaluate("(m) => runCall(m)", munge)
        assert f"a=setup:{our_setup}" in answer
        st: dict[str, Any] = {}
        for _ in range(150):  # 15 s of 100 ms polls (getStats is a Promise)
            st = page.evaluate("stats()")
            inbound, transport = st["inbound"], st["transport"]
            if (transport and transport.get("dtlsState") == "connected" and inbound
                    and inbound.get("packetsReceived", 0) > 25
                    and inbound.get("totalAudioEnergy", 0) > 0.01):
                break
            page.wait_for_timeout(100)  # a poll interval; the loop checks the state
        else:
            pytest.fail(f"no echoed audio: {st}\n{''.join(proc.stderr)[-3000:]}")
        transport = st["transport"]
        assert transport["dtlsRole"] == chromium_role, transport
        assert transport["tlsVersion"] == TLS_VERSION[version], transport
        print(f"{version} we={our_setup}: {transport['tlsVersion']} {transport['dtlsCipher']} "
              f"{transport['srtpCipher']} Chromium dtlsRole={transport['dtlsRole']}")
    finally:
        rc = proc.stop()
    assert rc == 0, "".join(proc.stderr)[-3000:]
