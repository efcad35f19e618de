"""One TCP port 443 for a whole call (issue 40 items 2, 4 and 6): real headless Chromium on
a client host whose firewall lets nothing reach the appliance but TCP to port 443 loads the
demo page over HTTPS on 443, posts its offer there, and talks to the echo through TURN over
TLS on that same port.

Two hosts are network namespaces joined by a bridge (tests/multihost/netns.py). The
appliance host runs `appliance up --udp APP:443 --tls self-signed --https-on-media-port
--turn`: the relays' TCP listener on 443 splits each connection by its first bytes and its
ClientHello (HTTPS to signaling, ``turns:`` to the TURN server). The client host's nftables
output chain drops every UDP datagram to the appliance and every TCP segment to a port
other than 443, and counts what it drops.

Media on 443 is the case item 2 is about: Chromium will not relay to a peer port below 1024
(it gathers the relay candidate and never checks a pair whose remote port is 443), so the
answer also offers the relayed-media port (3478 by default, lower priority) and the relay
delivers what Chromium relays to it in-process, never out of a relayed socket. The page
gets the TURN server from an init script (credentials minted here from the secret file
given to `up`) with ``iceTransportPolicy: "relay"``, so the only way the call can work is
TURN/TLS on 443.

Needs root (network namespaces, nft); without it the test fails, never skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from browser.helpers import BASE_ARGS, RELAY_ONLY, SELECTED_PAIR, write_tone_wav
from peers import chromium_executable
from playwright.sync_api import Page, sync_playwright

from appliance.proto.turn import mint_rest_credential

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multihost"))
from netns import Net, NetnsUnavailable  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.browser, pytest.mark.slow]

SECRET = b"one-port-turn-test-secret"
RELAYED_MEDIA_PORT = 3478  # appliance.supervisor.RELAYED_MEDIA_PORT, the default


def _metric(page: Page, token: str, name: str) -> float:
    """A relay counter, read through the page (same origin, so the same 443)."""
    text = page.evaluate(
        "async (t) => (await fetch('/metrics', {headers: {Authorization: `Bearer ${t}`}}))"
        ".text()", token)
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(f"appliance_relay_{name}"))


#: What the page's last RTCPeerConnection saw: for the failure message.
ICE_REPORT = """async () => {
  const pc = window.__pcs[window.__pcs.length - 1];
  if (!pc) return "no RTCPeerConnection";
  const rows = [`ice ${pc.iceConnectionState} gathering ${pc.iceGatheringState}`,
                `state ${applianceDemo.state}: ${document.querySelector("#message-text").textContent}`];
  (await pc.getStats()).forEach((s) => {
    if (s.type === "local-candidate" || s.type === "remote-candidate")
      rows.push(`${s.type} ${s.candidateType} ${s.protocol} ${s.address}:${s.port} ${s.relayProtocol || ""}`);
    if (s.type === "candidate-pair")
      rows.push(`pair ${s.state} req ${s.requestsSent} resp ${s.responsesReceived}`);
  });
  return rows.join("\\n");
}"""


def _dropped(net: Net, host: str) -> dict[str, int]:
    """The client firewall's drop counters, by rule comment."""
    out = subprocess.run(["ip", "netns", "exec", net.ns(host), "nft", "-j", "list", "table",
                          "inet", "apl"], capture_output=True, text=True, check=True).stdout
    counts: dict[str, int] = {}
    for item in json.loads(out)["nftables"]:
        rule = item.get("rule")
        if rule is None:
            continue
        name = rule.get("comment", "")
        for expr in rule["expr"]:
            if "counter" in expr:
                counts[name] = int(expr["counter"]["packets"])
    return counts


def test_a_whole_call_through_tcp_443_only(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nft") is None:
        pytest.fail("this test needs root, iproute2 and nftables (network namespaces and a "
                    "client firewall); run make test as root", pytrace=False)
    os.chmod(tmp_path, 0o755)
    sub = os.getpid() % 200 + 20
    app_ip, client_ip = f"10.202.{sub}.1", f"10.202.{sub}.2"
    secret_file = tmp_path / "turn.secret"
    secret_file.write_bytes(SECRET + b"\n")
    net: Net | None = None
    try:
        try:
            net = Net(f"ap443{os.getpid() % 100000}")
            net.host("app", {"lan": f"{app_ip}/24"})
            net.host("client", {"lan": f"{client_ip}/24"})
        except NetnsUnavailable as exc:
            pytest.fail(f"cannot create network namespaces here: {exc}", pytrace=False)
        client_ns = net.ns("client")
        for rule in (
            ["add", "table", "inet", "apl"],
            ["add", "chain", "inet", "apl", "out", "{ type filter hook output priority 0 ; }"],
            ["add", "rule", "inet", "apl", "out", "ip", "daddr", app_ip, "meta", "l4proto",
             "udp", "counter", "drop", "comment", '"udp"'],
            ["add", "rule", "inet", "apl", "out", "ip", "daddr", app_ip, "tcp", "dport",
             "!=", "443", "counter", "drop", "comment", '"tcp-not-443"'],
        ):
            subprocess.run(["ip", "netns", "exec", client_ns, "nft", *rule], check=True,
                           capture_output=True, text=True)
        app = net.run("app", ["-m", "appliance", "up", "--http", "127.0.0.1:8080",
                              "--udp", f"{app_ip}:443", "--public-address", app_ip,
                              "--tls", "self-signed", "--https-on-media-port",
                              "--turn", "--turn-secret-file", str(secret_file),
                              "--transceivers", "1", "--state-dir", str(tmp_path / "state")],
                      "appliance ready", timeout=90)
        out = "".join(app.stdout)
        token = re.search(r"API token \(generated\): (\S+)", out)
        assert token, out
        assert f"media: UDP port {RELAYED_MEDIA_PORT} too" in out, out

        wrapper = tmp_path / "chromium-in-netns"
        wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {client_ns} '
                           f'"{chromium_executable()}" "$@"\n')
        wrapper.chmod(0o755)
        tone = write_tone_wav(tmp_path / "tone.wav")
        cred = mint_rest_credential(SECRET, "one-port", int(time.time()) + 3600)
        server = {"urls": f"turns:{app_ip}:443?transport=tcp",
                  "username": cred.username, "credential": cred.password}
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=str(wrapper), headless=True,
                args=[*BASE_ARGS, "--use-fake-device-for-media-stream",
                      f"--use-file-for-fake-audio-capture={tone}",
                      "--use-fake-ui-for-media-stream", "--ignore-certificate-errors"])
            try:
                ctx = browser.new_context(permissions=["microphone"], ignore_https_errors=True)
                ctx.add_init_script(RELAY_ONLY % json.dumps(server))
                page = ctx.new_page()
                page.set_default_timeout(20_000)
                page.goto(f"https://{app_ip}:443/demo#token={token.group(1)}")
                page.get_by_role("button", name="Start", exact=True).click()
                try:
                    page.wait_for_function("applianceDemo.state === 'connected'",
                                           timeout=40_000)
                except Exception:
                    print(page.evaluate(ICE_REPORT))
                    print(f"client firewall drops: {_dropped(net, 'client')}")
                    print("".join(app.stderr)[-3000:])
                    raise
                st: dict[str, Any] = {}
                for _ in range(200):
                    st = page.evaluate(SELECTED_PAIR)
                    inbound = st["inbound"]
                    if inbound and inbound.get("packetsReceived", 0) > 25 \
                            and inbound.get("totalAudioEnergy", 0) > 0.01:
                        break
                    page.wait_for_timeout(100)  # a poll interval; the loop checks the state
                else:
                    pytest.fail(f"no echoed audio: {st}\n{''.join(app.stderr)[-3000:]}")
                print(f"chromium {browser.version}; selected pair: {st['local']} -> "
                      f"{st['remote']}")
                assert st["dtls"] == "connected"
                assert st["local"]["type"] == "relay" and st["local"]["relayProtocol"] == "tls"
                # The relayed-media port: Chromium never checks the pair to 443.
                assert st["remote"]["port"] == RELAYED_MEDIA_PORT, st
                assert st["remote"]["address"] == app_ip, st
                tok = token.group(1)
                assert _metric(page, tok, "tcp_turn_tls_total") >= 1
                assert _metric(page, tok, "turn_relayed_in_total") > 25
                assert _metric(page, tok, "turn_relayed_out_total") > 25
                assert _metric(page, tok, "turn_peer_sends_total") == 0  # never left the host
                ctx.close()
            finally:
                browser.close()
        # The firewall was live: a datagram to the media port and a connection to the
        # relayed-media port (no TCP listener there) from the client host are dropped (a
        # drop in the output hook fails the send with EPERM: the probe ignores errors).
        before = _dropped(net, "client")
        probe = (f"import socket\n"
                 f"u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                 f"try: u.sendto(b'x', ('{app_ip}', 443))\nexcept OSError: pass\n"
                 f"t = socket.socket()\nt.setblocking(False)\n"
                 f"t.connect_ex(('{app_ip}', {RELAYED_MEDIA_PORT}))\n")
        subprocess.run(["ip", "netns", "exec", client_ns, sys.executable, "-c", probe],
                       check=True, capture_output=True, text=True)
        after = _dropped(net, "client")
        print(f"client firewall drops: during the call {before}, after the probe {after}")
        assert after["udp"] > before["udp"] and after["tcp-not-443"] > before["tcp-not-443"]
        rc = app.stop()
        assert rc == 0, "".join(app.stderr)[-3000:]
    finally:
        if net is not None:
            errors = net.close()
            assert not errors, errors
