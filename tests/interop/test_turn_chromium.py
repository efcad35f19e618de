"""Real headless Chromium, restricted to relayed candidates (``iceTransportPolicy:
"relay"``), calls `appliance up --turn` through the appliance's own TURN server and gets the
echo (issue 40 items 1, 2 and 6).

Chromium allocates on the media port, pairs its relay candidate with the answer's host
candidate (our media address) and sends its checks, DTLS and SRTP through the allocation.
The relay delivers them to the transceiver in-process (item 2): the selected pair is
relay → our media port, the transceiver's echo comes back as TURN data, and the relay's
counters show every relayed datagram took the in-process path (``turn_relayed_in``/``_out``)
and none went out of a relayed socket (``turn_peer_sends``).

Loopback only: `up` on 127.0.0.1 with a media port ≥ 1024 (Chromium does not relay to
remote ports below 1024, issue 40 item 2). Chromium reaches the TURN server over UDP, then over TCP (the media port's TCP
listener), then over TLS on that listener (``turns:``; issue 40 item 4). The page is the demo page, unchanged; an init
script puts the TURN server (credentials minted here from the secret file given to `up`,
as signaling will once item 3 is done) and the relay-only policy into every
RTCPeerConnection it makes.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from browser.helpers import BASE_ARGS, RELAY_ONLY, SELECTED_PAIR, write_tone_wav
from e2e.procs import Proc
from peers import chromium_executable
from playwright.sync_api import Page, sync_playwright

from appliance.proto.turn import mint_rest_credential

pytestmark = [pytest.mark.interop, pytest.mark.browser, pytest.mark.slow]

SECRET = b"chromium-turn-test-secret"

def _metric(page: Page, name: str) -> float:
    text = page.evaluate("async () => (await fetch('/metrics')).text()")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(f"appliance_relay_{name}"))


@pytest.mark.parametrize("transport", ["udp", "tcp", "tls"])
def test_chromium_relay_only_call_through_our_turn(tmp_path: Path, transport: str) -> None:
    """``transport``: how Chromium reaches the TURN server — UDP, or TCP to the same port
    number (the ICE-TCP listener tells TURN from ICE-TCP), or TLS to that port
    (``turns:``, with ``--tls self-signed --https-on-media-port``: the ClientHello's missing
    ALPN sends it to TURN/TLS, relay/tls.py); the relayed leg is UDP either way."""
    secret_file = tmp_path / "turn.secret"
    secret_file.write_bytes(SECRET + b"\n")
    tls = ["--tls", "self-signed", "--https-on-media-port"] if transport == "tls" else []
    proc = Proc(["up", "--http", "127.0.0.1:0", "--udp", "127.0.0.1:0",
                 "--public-address", "127.0.0.1", "--state-dir", str(tmp_path / "state"),
                 "--transceivers", "1", "--turn", "--turn-secret-file", str(secret_file),
                 *tls],
                "appliance ready", timeout=60)
    try:
        out = "".join(proc.stdout)
        base = re.search(r"web UI (\S+)/ ", proc.ready)
        turn = re.search(r"TURN \(UDP\): turn:127\.0\.0\.1:(\d+)", out)
        assert base and turn, out
        port = int(turn.group(1))
        assert port >= 1024
        cred = mint_rest_credential(SECRET, "chromium-test", int(time.time()) + 3600)
        url = (f"turns:127.0.0.1:{port}?transport=tcp" if transport == "tls"
               else f"turn:127.0.0.1:{port}?transport={transport}")
        server = {"urls": url,
                  "username": cred.username,
                  "credential": cred.password}
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
                ctx = browser.new_context(permissions=["microphone"],
                                          ignore_https_errors=bool(tls))
                ctx.add_init_script(RELAY_ONLY % json.dumps(server))
                page = ctx.new_page()
                page.set_default_timeout(20_000)
                page.goto(base.group(1) + "/demo")
                page.get_by_role("button", name="Start", exact=True).click()
                page.wait_for_function("applianceDemo.state === 'connected'", timeout=40_000)
                st: dict[str, Any] = {}
                for _ in range(200):
                    st = page.evaluate(SELECTED_PAIR)
                    inbound = st["inbound"]
                    if inbound and inbound.get("packetsReceived", 0) > 25 \
                            and inbound.get("totalAudioEnergy", 0) > 0.01:
                        break
                    page.wait_for_timeout(100)  # a poll interval; the loop checks the state
                else:
                    pytest.fail(f"no echoed audio: {st}\n{''.join(proc.stderr)[-3000:]}")
                print(f"selected pair: {st['local']} -> {st['remote']}")
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
                ctx.close()
            finally:
                browser.close()
    finally:
        rc = proc.stop()
    assert rc == 0, "".join(proc.stderr)[-3000:]
