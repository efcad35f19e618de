"""Real headless Chromium, restricted to relayed candidates (``iceTransportPolicy:
"relay"``), calls `appliance up` through the appliance's own TURN server — on by default —
and gets the echo (issue 40 items 1, 2, 3 and 6).

Chromium allocates on the media port, pairs its relay candidate with the answer's host
candidate (our media address) and sends its checks, DTLS and SRTP through the allocation.
The relay delivers them to the transceiver in-process (item 2): the selected pair is
relay → our media port, the transceiver's echo comes back as TURN data, and the relay's
counters show every relayed datagram took the in-process path (``turn_relayed_in``/``_out``)
and none went out of a relayed socket (``turn_peer_sends``).

Loopback only: `up` on 127.0.0.1 with a media port ≥ 1024 (Chromium does not relay to
remote ports below 1024, issue 40 item 2). Chromium reaches the TURN server over UDP, then over TCP (the media port's TCP
listener), then over TLS on that listener (``turns:``; issue 40 item 4). The page is the
demo page opened with ``?relay=1``: it asks signaling for the TURN servers
(``GET /v1/ice_servers``: every URL `up` listens on, a credential minted for the call from a
secret derived from the routing secret) and makes its RTCPeerConnection with them and the
relay-only policy (item 3). An init script only narrows the page's servers to the one
transport under test, so each run proves that transport.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from browser.helpers import BASE_ARGS, KEEP_TURN, ONE_TRANSPORT, SELECTED_PAIR, write_tone_wav
from e2e.procs import Proc, free_udp_port
from peers import chromium_executable
from playwright.sync_api import Page, sync_playwright

pytestmark = [pytest.mark.interop, pytest.mark.browser, pytest.mark.slow]

def _metric(page: Page, name: str) -> float:
    text = page.evaluate("async () => (await fetch('/metrics')).text()")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(f"appliance_relay_{name}"))


@contextmanager
def relay_only_demo(base: str, transport: str, tmp_path: Path, query: str = ""
                    ) -> Iterator[Page]:
    """Headless Chromium on the demo page with ``?relay=1`` (``query`` appended), only
    ``transport``'s TURN URL kept (ONE_TRANSPORT), a tone as the microphone; Start clicked
    and the call connected."""
    tls = transport == "tls"
    tone = write_tone_wav(tmp_path / "tone.wav")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_executable(), headless=True,
            args=[*BASE_ARGS, "--use-fake-device-for-media-stream",
                  f"--use-file-for-fake-audio-capture={tone}",
                  "--use-fake-ui-for-media-stream",
                  # the self-signed certificate, for the page and for turns:
                  *(["--ignore-certificate-errors"] if tls else [])])
        try:
            print(f"chromium {browser.version}")
            ctx = browser.new_context(permissions=["microphone"], ignore_https_errors=tls)
            ctx.add_init_script(ONE_TRANSPORT % json.dumps(KEEP_TURN[transport]))
            page = ctx.new_page()
            page.set_default_timeout(20_000)
            page.goto(base + "/demo?relay=1" + query)
            page.get_by_role("button", name="Start", exact=True).click()
            page.wait_for_function("applianceDemo.state === 'connected'", timeout=40_000)
            yield page
            ctx.close()
        finally:
            browser.close()


def echoed(page: Page, proc: Proc) -> dict[str, Any]:
    """The selected pair once the echo is heard (> 25 packets with energy)."""
    st: dict[str, Any] = {}
    for _ in range(300):
        st = page.evaluate(SELECTED_PAIR)
        inbound = st["inbound"] or {}
        if st["local"] and inbound.get("packetsReceived", 0) > 25 \
                and inbound.get("totalAudioEnergy", 0) > 0.01:
            return st
        page.wait_for_timeout(100)  # a poll interval; the loop checks the state
    pytest.fail(f"no echoed audio: {st}\n{''.join(proc.stderr)[-3000:]}")


@pytest.mark.parametrize("transport", ["udp", "tcp", "tls"])
def test_chromium_relay_only_call_through_our_turn(tmp_path: Path, transport: str) -> None:
    """``transport``: how Chromium reaches the TURN server — UDP, or TCP to the same port
    number (the ICE-TCP listener tells TURN from ICE-TCP), or TLS to that port
    (``turns:``, with ``--tls self-signed --https-on-media-port``: the ClientHello's missing
    ALPN sends it to TURN/TLS, relay/tls.py); the relayed leg is UDP either way."""
    tls = ["--tls", "self-signed", "--https-on-media-port"] if transport == "tls" else []
    # TURN over UDP is served on the media port but not advertised by default (it would
    # break Chromium's direct UDP path, docs/turn.md): advertised here with --turn-url.
    port = free_udp_port()
    udp = ["--turn-url", f"turn:127.0.0.1:{port}?transport=udp"] if transport == "udp" else []
    proc = Proc(["up", "--http", "127.0.0.1:0", "--udp", f"127.0.0.1:{port}",
                 "--public-address", "127.0.0.1", "--state-dir", str(tmp_path / "state"),
                 "--transceivers", "1", *tls, *udp],
                "appliance ready", timeout=60)
    try:
        out = "".join(proc.stdout)
        base = re.search(r"web UI (\S+)/ ", proc.ready)
        turn = re.search(r"TURN: (turns?:127\.0\.0\.1:\d+\S*)", out)
        assert base and turn, out
        assert port >= 1024
        with relay_only_demo(base.group(1), transport, tmp_path) as page:
            st = echoed(page, proc)
            print(f"selected pair: {st['local']} -> {st['remote']}")
            # What the page asked for: signaling's servers, relayed candidates only.
            (config,) = page.evaluate("window.__configs")
            assert config["iceTransportPolicy"] == "relay"
            (server,) = config["iceServers"]
            assert any(re.match(KEEP_TURN[transport], u) for u in server["urls"]), server
            assert re.fullmatch(r"\d+:[\w-]+", server["username"]) and server["credential"]
            assert st["dtls"] == "connected"
            assert st["local"]["type"] == "relay"
            assert st["local"]["relayProtocol"] == transport
            assert st["remote"]["port"] == port  # our media port, reached through TURN
            relayed_in = _metric(page, "turn_relayed_in_total")
            relayed_out = _metric(page, "turn_relayed_out_total")
            print(f"relay: turn_relayed_in {relayed_in}, turn_relayed_out {relayed_out}")
            assert relayed_in > 25 and relayed_out > 25
            assert _metric(page, "turn_peer_sends_total") == 0  # never left the host
            if tls:  # the split gave Chromium's turns: connection to TURN/TLS
                assert _metric(page, "tcp_turn_tls_total") >= 1
    finally:
        rc = proc.stop()
    assert rc == 0, "".join(proc.stderr)[-3000:]


# -- a relay-worker kill mid-call through TURN over TCP or TLS ---------------------------------

#: Every 10 ms, on the page's clock: audio packets received so far (the caller's view).
SAMPLER = """(() => {
  const pc = window.__pcs[window.__pcs.length - 1];
  window.__rx = [];
  window.__sampler = setInterval(async () => {
    const t = performance.now();
    (await pc.getStats()).forEach((s) => {
      if (s.type === "inbound-rtp" && s.kind === "audio") window.__rx.push([t, s.packetsReceived]);
    });
  }, 10);
})()"""
#: The longest time between two samples that saw new packets (ms), from the sampler's log.
LONGEST_GAP = """(() => {
  clearInterval(window.__sampler);
  let gap = 0, from = null, lastT = null, lastN = null;
  for (const [t, n] of window.__rx) {
    if (lastN === null || n > lastN) {
      if (lastT !== null && t - lastT > gap) { gap = t - lastT; from = lastT; }
      lastT = t; lastN = n;
    }
  }
  return {gap, from};
})()"""
INBOUND = """async () => {
  const pc = window.__pcs[window.__pcs.length - 1];
  let n = 0, energy = 0;
  (await pc.getStats()).forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") { n = s.packetsReceived; energy = s.totalAudioEnergy; }
  });
  return {n, energy, restarts: window.applianceDemo.iceRestarts, state: window.applianceDemo.state,
          cs: pc.connectionState};
}"""


def _worker_pid(state: Path) -> int:
    import trio

    from appliance.control import control_request

    async def ask() -> dict[str, Any]:
        with trio.fail_after(5):
            return await control_request(str(state / "control" / "relay-0.sock"), {"op": "stats"})
    return int(trio.run(ask)["pid"])


@pytest.mark.parametrize("transport", ["tcp", "tls"])
def test_a_relay_worker_kill_mid_call_is_survived(tmp_path: Path, transport: str) -> None:
    """A SIGKILL of the relay worker that holds Chromium's TURN connection (docs/turn.md
    "A worker kill"):

    the connection is kept by the worker's standby and adopted by its successor with its
    allocation (relay/keeper.py) — over TLS too: the relay does the records itself after
    OpenSSL's handshake, with its keys in the keeper's record and its sequence numbers on
    a board the successor reads (relay/tls.py, relay/board.py). Chromium notices
    nothing: no ICE restart (the demo page would restart ICE if the path went; before the
    TLS records were ours, it did), the echo carries on over the same relay candidate.

    Printed: how long the echo was gone."""
    import os
    import signal
    import time

    tls = ["--tls", "self-signed", "--https-on-media-port"] if transport == "tls" else []
    port = free_udp_port()
    state = Path(tempfile.mkdtemp(prefix="tk-"))  # short: the control sockets' paths
    proc = Proc(["up", "--http", "127.0.0.1:0", "--udp", f"127.0.0.1:{port}",
                 "--public-address", "127.0.0.1", "--state-dir", str(state),
                 "--transceivers", "1", *tls],
                "appliance ready", timeout=60)
    try:
        base = re.search(r"web UI (\S+)/ ", proc.ready)
        assert base, proc.ready
        with relay_only_demo(base.group(1), transport, tmp_path,
                             "&restart_after_ms=200") as page:
            before = echoed(page, proc)
            assert before["local"]["relayProtocol"] == transport, before
            deadline = time.monotonic() + 60
            while "standby pid" not in "".join(proc.stderr) or \
                    " warm" not in "".join(proc.stderr):  # the successor is ready
                assert time.monotonic() < deadline, "no warm relay standby"
                page.wait_for_timeout(100)
            pid = _worker_pid(state)
            page.evaluate(SAMPLER)
            page.wait_for_timeout(300)  # the sampler's log before the kill
            got = page.evaluate(INBOUND)
            page_killed = page.evaluate("performance.now()")
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            resumed_with = None
            while time.monotonic() - killed < 45:  # a poll of the page's stats
                now = page.evaluate(INBOUND)
                if now["n"] > got["n"] + 50:
                    resumed_with = now  # a second of echo since the kill: the successor's
                    break
                page.wait_for_timeout(50)
            longest = page.evaluate(LONGEST_GAP)
            gap = longest["gap"]
            timeline = page.evaluate("applianceDemo.iceRestarts.last")
            assert resumed_with is not None, (
                f"the echo did not come back: {page.evaluate(INBOUND)}\n"
                f"{''.join(proc.stderr)[-3000:]}")
            after = page.evaluate(SELECTED_PAIR)
            restarts = resumed_with["restarts"]
            print(f"TURN/{transport} relay-worker kill: echo gone {gap:.0f} ms; path lost "
                  f"to back {restarts['lostMs']} ms, of it the ICE restart "
                  f"{restarts['tookMs']} ms ({restarts['attempts']} attempt(s)); "
                  f"after the kill (ms): last echo {longest['from'] - page_killed:.0f}, "
                  + ", ".join(f"{k} {v - page_killed:.0f}" for k, v in (timeline or {}).items())
                  + f", echo back {longest['from'] + gap - page_killed:.0f}")
            assert resumed_with["state"] == "connected", resumed_with
            # the same connection, taken over: nothing for the page to restart
            assert restarts["attempts"] == 0, restarts
            assert _worker_pid(state) != pid  # a new worker holds the port
            assert after["dtls"] == "connected"
            assert after["local"]["type"] == "relay"
            assert after["local"]["relayProtocol"] == transport
            assert after["remote"]["port"] == port
    finally:
        rc = proc.stop()
    assert rc == 0, "".join(proc.stderr)[-3000:]
