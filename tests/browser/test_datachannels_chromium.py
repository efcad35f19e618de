"""Data channels with Chromium's own SCTP (usrsctp/dcsctp), through `appliance up` (relay,
transceiver, agents): a page served by the appliance makes its own RTCPeerConnection with the
fake microphone and channels (tests/browser/dc_harness.js) and POSTs its offer to
/v1/sessions, so audio and channels share one bundled DTLS transport, as in the demo.

* built-in ``echo``: a DCEP-opened ordered channel echoes 0 B, 1 B, 16 KiB, 64 KiB and
  256 KiB messages (string and ArrayBuffer; 262144 is both our and Chromium's
  a=max-message-size) and a burst of 1,000 in order; an unordered channel and a
  maxRetransmits:0 channel (RFC 8831 §6.6) work; ``dc.close()`` reaches "closed", which needs
  the transceiver's answering stream reset (RFC 8831 §6.7);
* tests/e2e/dc_agent.py: a pre-negotiated channel (id 10, no DCEP) both sides open, and a
  close the agent starts (``ctx.close_channel``) that the browser sees as ``onclose``.
Audio keeps flowing all along: inbound-rtp packetsReceived grows.

* the data-only variant (no microphone, an offer with only ``m=application``): answered
  with the application section alone, channels both ways with ``echo`` and with an agent
  task, and the session shows no codec and no SRTP."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from browser.helpers import PageErrors, running_appliance_up, screenshot
from browser.test_e2e_up import appliance_up
from peers import chromium_version
from playwright.sync_api import Page, expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]

__all__ = ["appliance_up"]  # the fixture, re-used
HARNESS = Path(__file__).with_name("dc_harness.js")
DC_AGENT = str(Path(__file__).resolve().parents[1] / "e2e" / "dc_agent.py") + ":agent"
KiB = 1024
#: Chromium's a=max-message-size (and ours): the largest message either side may send.
MAX = 262144


def harness(page: Page, base: str) -> None:
    print(f"chromium {chromium_version()}")
    page.goto(base + "/demo")  # any page of the appliance: same origin as the API
    page.add_script_tag(content=HARNESS.read_text())


def connect(page: Page, agent: str, channels: list[tuple[str, dict[str, Any]]],
            audio: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = page.evaluate("([a, c, au]) => dcHarness.connect(a, c, au)",
                                        [agent, channels, audio])
    assert "m=application" in out["answer"] and f"a=max-message-size:{MAX}" in out["answer"]
    return out


def round_trip(page: Page, label: str, specs: list[list[Any]], prefix: str = "") -> tuple[list[Any], list[Any]]:
    out = page.evaluate("([l, s, p]) => dcHarness.roundTrip(l, s, p)", [label, specs, prefix])
    return out["want"], out["got"]


def wait_for(page: Page, expr: str, timeout: float = 10.0) -> None:
    """Poll a JS expression that may be a Promise (``page.wait_for_function`` would take the
    Promise itself as truthy) until it is truthy, or fail with it."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(expr):
        if time.monotonic() > deadline:
            raise AssertionError(f"never true: {expr}")
        page.wait_for_timeout(100)  # a poll interval: the loop checks state


def session(page: Page, sid: str) -> dict[str, Any]:
    detail: dict[str, Any] = page.evaluate(
        "(sid) => fetch(`/v1/sessions/${sid}`).then((r) => r.json())", sid)
    return detail


def test_echo_channels_with_chromium(appliance_up: str, page: Page) -> None:
    errors = PageErrors(page)
    harness(page, appliance_up)
    out = connect(page, "echo", [
        ("chat", {}),
        ("unordered", {"ordered": False}),
        ("lossy", {"ordered": False, "maxRetransmits": 0}),
    ])
    assert out["maxMessageSize"] == MAX  # what Chromium took from our answer
    wait_for(page, "dcHarness.inbound().then((n) => n > 0)")
    audio_before = page.evaluate("dcHarness.inbound()")

    sizes = [0, 1, 16 * KiB, 64 * KiB, 256 * KiB]
    specs = [["s", "x" * n] for n in sizes] + [["b", n, n % 251] for n in sizes]
    want, got = round_trip(page, "chat", specs)
    assert got == want  # text stays text, binary stays binary, sizes and bytes intact
    want, got = round_trip(page, "chat", [["s", "é" * (MAX // 2)]])  # 256 KiB of UTF-8
    assert got == want
    want, got = round_trip(page, "chat", [["s", f"m{i}"] for i in range(1000)])
    assert got == want  # ordered: every one, in order

    want, got = round_trip(page, "unordered", [["s", f"u{i}"] for i in range(50)])
    assert sorted(got) == sorted(want)  # unordered: every one (loopback loses nothing)
    want, got = round_trip(page, "lossy", [["s", "fast"], ["b", 1200, 7]])
    assert sorted(got) == sorted(want)

    detail = session(page, out["sid"])["datachannels"]
    assert detail["sctp"] == "connected"
    by_label = {ch["label"]: ch for ch in detail["open"]}
    assert set(by_label) == {"chat", "unordered", "lossy"}
    assert by_label["lossy"]["ordered"] is False and by_label["lossy"]["max_retransmits"] == 0
    n = len(specs) + 1 + 1000 + 50 + 2
    assert detail["messages_in"] == detail["messages_out"] == n
    assert detail["bytes_in"] == detail["bytes_out"] > 2 * 256 * KiB

    # Close from the browser: "closed" only once our side has reset its stream too.
    assert page.evaluate("dcHarness.closeLocal('chat')") == "closed"
    assert page.evaluate("dcHarness.readyStates()") == {"chat": "closed", "unordered": "open", "lossy": "open"}
    wait_for(page, f"fetch('/v1/sessions/{out['sid']}').then((r) => r.json())"
                   ".then((s) => !s.datachannels.open.some((c) => c.label === 'chat'))")
    want, got = round_trip(page, "unordered", [["s", "still here"]])
    assert got == want

    wait_for(page, f"dcHarness.inbound().then((n) => n > {audio_before} + 25)")
    page.evaluate("dcHarness.close()")
    assert not errors.unexpected(), errors.errors


def test_negotiated_channel_and_server_close_with_chromium(appliance_up: str, page: Page) -> None:
    errors = PageErrors(page)
    harness(page, appliance_up)
    out = connect(page, DC_AGENT, [("chat", {}), ("pre", {"negotiated": True, "id": 10})])
    assert out["ids"]["pre"] == 10
    # RFC 8832 §6: the DTLS client's DCEP channels take even ids, the server's odd ones; we
    # answer a=setup:active (docs/adr-dtls-active.md), so Chromium is the server: odd.
    assert out["ids"]["chat"] % 2 == 1
    audio_before = page.evaluate("dcHarness.inbound()")

    want, got = round_trip(page, "pre", [["s", "negotiated"], ["b", 300, 1]], prefix="pre:")
    assert got == want
    want, got = round_trip(page, "chat", [["s", "hi"], ["s", ""]], prefix="chat:")
    assert got == want
    detail = session(page, out["sid"])["datachannels"]
    assert {ch["label"]: ch["negotiated"] for ch in detail["open"]} == {"chat": False, "pre": True}

    # The agent closes "chat" when asked: the browser sees onclose, "pre" lives on.
    assert page.evaluate("dcHarness.closedByPeer('chat', 'close-me')") == "closed"
    assert page.evaluate("dcHarness.readyStates()") == {"chat": "closed", "pre": "open"}
    want, got = round_trip(page, "pre", [["s", "after"]], prefix="pre:")
    assert got == want
    wait_for(page, f"dcHarness.inbound().then((n) => n > {audio_before} + 25)")
    page.evaluate("dcHarness.close()")
    assert not errors.unexpected(), errors.errors


def test_channels_over_dtls12_with_false_start(tmp_path: Path, page: Page) -> None:
    """``--dtls-versions 1.2``: Chromium negotiates DTLS 1.2 and we, the client, False Start
    (RFC 7918; docs/sctp.md "Setup latency"): our SCTP INIT goes behind our Finished, before
    Chromium's Finished makes the call connected. Chromium takes it; DCEP and pre-negotiated
    channels carry data both ways."""
    errors = PageErrors(page)
    with running_appliance_up(tmp_path, "--dtls-versions", "1.2", name="dtls12") as base:
        harness(page, base)
        out = connect(page, DC_AGENT, [("chat", {}), ("pre", {"negotiated": True, "id": 10})])
        want, got = round_trip(page, "pre", [["s", "negotiated"], ["b", 300, 1]], prefix="pre:")
        assert got == want
        want, got = round_trip(page, "chat", [["s", "hi"], ["s", ""]], prefix="chat:")
        assert got == want
        s = session(page, out["sid"])
        assert s["cipher_suite"].startswith("TLS_ECDHE_"), s["cipher_suite"]  # DTLS 1.2
        tl = s["timeline"]
        # INIT no later than DTLS done (strictly earlier on a quiet box). Under a CPU hog
        # (clean-clone `make test-stress`, 2026-12-02) both marks read 19.78 ms: the marks are
        # the times the call took DTLS's events, not wire times, and that run took False
        # Start's and the handshake's in one pass (why the pass merged them is not found).
        # The wire order, INIT one round trip early, is asserted on a fake clock in
        # tests/transceiver/test_call_datachannel.py; this test is that Chromium takes it.
        assert tl["sctp_init_sent"] <= tl["dtls_done"] <= tl["sctp_established"], tl
        page.evaluate("dcHarness.close()")
    assert not errors.unexpected(), errors.errors


@pytest.mark.parametrize("agent", ["echo", DC_AGENT], ids=["echo", "task-agent"])
def test_data_only_session_with_chromium(appliance_up: str, page: Page, agent: str) -> None:
    errors = PageErrors(page)
    harness(page, appliance_up)
    out = connect(page, agent, [("chat", {})], audio=False)
    assert "m=audio" not in out["offer"] and "m=audio" not in out["answer"]
    m_lines = [x for x in out["answer"].splitlines() if x.startswith("m=")]
    assert len(m_lines) == 1 and m_lines[0].startswith("m=application ")
    assert m_lines[0].endswith(" UDP/DTLS/SCTP webrtc-datachannel")
    assert "a=group:BUNDLE 0" in out["answer"] and "a=sctp-port:5000" in out["answer"]
    prefix = "" if agent == "echo" else "chat:"
    # 200 KiB: room for the task agent's "chat:" prefix under the 256 KiB max-message-size.
    specs = [["s", "hi"], ["s", ""], ["b", 64 * KiB, 3], ["s", "x" * (200 * KiB)]]
    want, got = round_trip(page, "chat", specs, prefix=prefix)
    assert got == want
    want, got = round_trip(page, "chat", [["s", f"m{i}"] for i in range(1000)], prefix=prefix)
    assert got == want
    s = session(page, out["sid"])
    assert s["state"] == "connected" and s["codec"] is None and s["srtp_profile"] is None
    assert s["packets_out"] == 0 and s["datachannels"]["sctp"] == "connected"
    tl = s["timeline"]  # the SCTP milestones (appliance/transceiver/datachannels.py)
    assert tl["dtls_done"] <= tl["sctp_init_sent"] <= tl["sctp_established"], tl
    assert tl["first_channel_message_out"] is not None, tl
    assert page.evaluate("dcHarness.closeLocal('chat')") == "closed"
    page.evaluate("dcHarness.close()")
    assert not errors.unexpected(), errors.errors


def test_demo_chat_through_appliance_up(appliance_up: str, page: Page) -> None:
    """The demo's message box (webui/demo.js): after Start its "chat" channel opens, what is
    typed shows as "you: …" and the echo agent's answer as "agent: …"."""
    errors = PageErrors(page)
    page.goto(appliance_up + "/demo")
    expect(page.locator("#chat-state")).to_have_text("closed")
    expect(page.get_by_role("textbox", name="Message")).to_be_disabled()
    page.get_by_role("button", name="Start", exact=True).click()
    expect(page.locator("#state")).to_have_text("connected", timeout=20_000)
    expect(page.locator("#chat-state")).to_have_text("open", timeout=20_000)
    box = page.get_by_role("textbox", name="Message")
    expect(box).to_be_enabled()
    box.fill("hello, agent")
    page.get_by_role("button", name="Send", exact=True).click()
    log = page.locator("#chat-log li")
    expect(log).to_have_text(["you: hello, agent", "agent: hello, agent"])
    expect(box).to_have_value("")
    box.fill("second")
    box.press("Enter")  # the form submits on Enter too
    expect(log).to_have_count(4)
    expect(log.nth(3)).to_have_text("agent: second")
    screenshot(page, "e2e-demo-chat")
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#chat-state")).to_have_text("closed")
    assert not errors.unexpected(), errors.errors
