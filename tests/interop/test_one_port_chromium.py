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
delivers what Chromium relays to it in-process, never out of a relayed socket. The page is
the demo as a user opens it with ``?relay=1`` (``iceTransportPolicy: "relay"``) and the API
token: it mints a client token, takes the TURN servers and a credential from ``GET
/v1/ice_servers`` (issue 40 item 3) — an init script keeps only the ``turns:`` one — so the
only way the call can work is TURN/TLS on 443.

Needs root (network namespaces, nft); without it the test fails, never skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser.helpers import BASE_ARGS, KEEP_TURN, ONE_TRANSPORT, SELECTED_PAIR, write_tone_wav
from peers import chromium_executable
from playwright.sync_api import Page, sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multihost"))
from netns import Net, NetnsUnavailable, NsProc  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.browser, pytest.mark.slow]

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


@dataclass
class Site:
    """A client host that can reach nothing of the appliance host's but TCP 443."""

    net: Net
    app_ip: str
    client_ip: str
    tmp: Path

    @property
    def client_ns(self) -> str:
        return self.net.ns("client")

    def client_python(self, code: str) -> str:
        r = subprocess.run(["ip", "netns", "exec", self.client_ns, sys.executable, "-c", code],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout


@contextmanager
def tcp_443_only(tmp_path: Path, tag: str) -> Iterator[Site]:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nft") is None:
        pytest.fail("this test needs root, iproute2 and nftables (network namespaces and a "
                    "client firewall); run make test as root", pytrace=False)
    os.chmod(tmp_path, 0o755)
    sub = os.getpid() % 200 + 20
    app_ip, client_ip = f"10.202.{sub}.1", f"10.202.{sub}.2"
    net: Net | None = None
    try:
        try:
            net = Net(f"{tag}{os.getpid() % 100000}")
            net.host("app", {"lan": f"{app_ip}/24"})
            net.host("client", {"lan": f"{client_ip}/24"})
        except NetnsUnavailable as exc:
            pytest.fail(f"cannot create network namespaces here: {exc}", pytrace=False)
        for rule in (
            ["add", "table", "inet", "apl"],
            ["add", "chain", "inet", "apl", "out", "{ type filter hook output priority 0 ; }"],
            ["add", "rule", "inet", "apl", "out", "ip", "daddr", app_ip, "meta", "l4proto",
             "udp", "counter", "drop", "comment", '"udp"'],
            ["add", "rule", "inet", "apl", "out", "ip", "daddr", app_ip, "tcp", "dport",
             "!=", "443", "counter", "drop", "comment", '"tcp-not-443"'],
        ):
            subprocess.run(["ip", "netns", "exec", net.ns("client"), "nft", *rule], check=True,
                           capture_output=True, text=True)
        yield Site(net, app_ip, client_ip, tmp_path)
        # The firewall was live: a datagram to the media port and a connection to another
        # TCP port from the client host are dropped (a drop in the output hook fails the
        # send with EPERM: the probe ignores errors).
        before = _dropped(net, "client")
        Site(net, app_ip, client_ip, tmp_path).client_python(
            f"import socket\n"
            f"u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"try: u.sendto(b'x', ('{app_ip}', 443))\nexcept OSError: pass\n"
            f"t = socket.socket()\nt.setblocking(False)\n"
            f"t.connect_ex(('{app_ip}', {RELAYED_MEDIA_PORT}))\n")
        after = _dropped(net, "client")
        print(f"client firewall drops: during the call {before}, after the probe {after}")
        assert after["udp"] > before["udp"] and after["tcp-not-443"] > before["tcp-not-443"]
    finally:
        if net is not None:
            errors = net.close()
            assert not errors, errors


def call_through_443(site: Site, app: NsProc, token: str) -> dict[str, Any]:
    """The demo at https://APP:443 with ?relay=1 and the API token, its TURN servers kept
    to ``turns:``; Start, then the echo heard. Returns the selected pair and the relay's
    TURN counters."""
    wrapper = site.tmp / "chromium-in-netns"
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {site.client_ns} '
                       f'"{chromium_executable()}" "$@"\n')
    wrapper.chmod(0o755)
    tone = write_tone_wav(site.tmp / "tone.wav")
    app_ip = site.app_ip
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(wrapper), headless=True,
            args=[*BASE_ARGS, "--use-fake-device-for-media-stream",
                  f"--use-file-for-fake-audio-capture={tone}",
                  "--use-fake-ui-for-media-stream", "--ignore-certificate-errors"])
        try:
            ctx = browser.new_context(permissions=["microphone"], ignore_https_errors=True)
            ctx.add_init_script(ONE_TRANSPORT % json.dumps(KEEP_TURN["tls"]))
            page = ctx.new_page()
            page.set_default_timeout(20_000)
            page.goto(f"https://{app_ip}:443/demo?relay=1#token={token}")
            page.get_by_role("button", name="Start", exact=True).click()
            try:
                page.wait_for_function("applianceDemo.state === 'connected'", timeout=40_000)
            except Exception:
                print(page.evaluate(ICE_REPORT))
                print(f"client firewall drops: {_dropped(site.net, 'client')}")
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
            (config,) = page.evaluate("window.__configs")
            assert config["iceTransportPolicy"] == "relay"
            assert [u for s in config["iceServers"] for u in s["urls"]
                    if u.startswith("turns:")] == [f"turns:{app_ip}:443?transport=tcp"]
            st["relay"] = {n: _metric(page, token, n) for n in (
                "tcp_turn_tls_total", "turn_relayed_in_total", "turn_relayed_out_total",
                "turn_peer_sends_total", "tcp_proxied_total")}
            ctx.close()
        finally:
            browser.close()
    return st


def _token(app: NsProc) -> str:
    out = "".join(app.stdout)
    token = re.search(r"API token \(generated\): (\S+)", out)
    assert token, out
    return token.group(1)


def test_a_whole_call_through_tcp_443_only(tmp_path: Path) -> None:
    """Media on 443 itself: HTTPS, ICE-TCP and TURN/TLS split by the relay."""
    with tcp_443_only(tmp_path, "ap443") as site:
        app = site.net.run("app", ["-m", "appliance", "up", "--http", "127.0.0.1:8080",
                                   "--udp", f"{site.app_ip}:443",
                                   "--public-address", site.app_ip,
                                   "--tls", "self-signed", "--https-on-media-port",
                                   "--transceivers", "1", "--state-dir", str(tmp_path / "state")],
                           "appliance ready", timeout=90)
        assert f"media: UDP port {RELAYED_MEDIA_PORT} too" in "".join(app.stdout)
        st = call_through_443(site, app, _token(app))
        assert st["dtls"] == "connected"
        assert st["local"]["type"] == "relay" and st["local"]["relayProtocol"] == "tls"
        # The relayed-media port: Chromium never checks the pair to 443.
        assert st["remote"]["port"] == RELAYED_MEDIA_PORT, st
        assert st["remote"]["address"] == site.app_ip, st
        relay = st["relay"]
        assert relay["tcp_turn_tls_total"] >= 1
        assert relay["turn_relayed_in_total"] > 25 and relay["turn_relayed_out_total"] > 25
        assert relay["turn_peer_sends_total"] == 0  # never left the host
        rc = app.stop()
        assert rc == 0, "".join(app.stderr)[-3000:]


#: HAProxy owns 443 and passes TLS through, with a PROXY v2 header, to the media port's TCP
#: listener on loopback — the deployment that, without the header, made every remote caller
#: look local to the API (docs/turn.md "A proxy in front").
HAPROXY = """global
  maxconn 200
defaults
  mode tcp
  timeout connect 5s
  timeout client 120s
  timeout server 120s
frontend tls443
  bind {app_ip}:443
  tcp-request inspect-delay 5s
  tcp-request content accept if {{ req_ssl_hello_type 1 }}
  use_backend elsewhere if {{ req_ssl_sni -i www.example.com }}
  default_backend appliance
backend appliance
  server media 127.0.0.1:{media} send-proxy-v2
backend elsewhere
  server web 127.0.0.1:9 send-proxy-v2
"""

#: From the client host: the API's answer through 443 without a token and with one.
API_PROBE = """import json, ssl, sys, urllib.request
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["http/1.1"])  # as curl and browsers do: a hello with none is TURN's
out = {{}}
for name, headers in (("none", {{}}), ("token", {{"Authorization": "Bearer {token}"}})):
    req = urllib.request.Request("https://{app_ip}:443/v1/sessions", headers=headers)
    try:
        out[name] = urllib.request.urlopen(req, context=ctx, timeout=10).status
    except urllib.error.HTTPError as e:
        out[name] = e.code
print(json.dumps(out))
"""


def test_a_proxy_in_front_of_443_passes_the_real_client(tmp_path: Path) -> None:
    """HAProxy (Debian's) owns 443 with SNI passthrough and ``send-proxy-v2`` to the media
    port's TCP listener on loopback; `up --tcp-proxy-from 127.0.0.1/32 --turn-url
    turns:APP:443 --public-tcp-port 443`. The demo calls the echo through TURN/TLS across
    the proxy, and the API judges the client by the header: from the client host, no token
    is 401 and the token 200 — although every connection reaches the relay from loopback."""
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.path.exists(haproxy):
        pytest.fail("this test needs HAProxy (Debian haproxy; make test installs it)",
                    pytrace=False)
    with tcp_443_only(tmp_path, "aphap") as site:
        media = 3478
        cfg = tmp_path / "haproxy.cfg"
        cfg.write_text(HAPROXY.format(app_ip=site.app_ip, media=media))
        app = site.net.run("app", ["-m", "appliance", "up", "--http", "127.0.0.1:8080",
                                   "--udp", f"0.0.0.0:{media}", "--public-address", site.app_ip,
                                   "--tls", "self-signed", "--https-on-media-port",
                                   "--public-tcp-port", "443",
                                   "--turn-url", f"turns:{site.app_ip}:443?transport=tcp",
                                   "--tcp-proxy-from", "127.0.0.1/32",
                                   "--transceivers", "1", "--state-dir", str(tmp_path / "state")],
                           "appliance ready", timeout=90)
        # -V: its last start-up line ("Using epoll() as the polling mechanism.") comes after
        # its listeners are bound.
        site.net.run("app", [haproxy, "-f", str(cfg), "-db", "-V"], "polling mechanism",
                     python=False)
        token = _token(app)
        codes = json.loads(site.client_python(API_PROBE.format(token=token, app_ip=site.app_ip)))
        assert codes == {"none": 401, "token": 200}, codes
        st = call_through_443(site, app, token)
        assert st["dtls"] == "connected"
        assert st["local"]["type"] == "relay" and st["local"]["relayProtocol"] == "tls"
        assert st["remote"]["port"] == media and st["remote"]["address"] == site.app_ip, st
        relay = st["relay"]
        assert relay["tcp_proxied_total"] >= 3  # the API probes, the page, its TURN/TLS
        assert relay["tcp_turn_tls_total"] >= 1 and relay["turn_relayed_in_total"] > 25
        assert relay["turn_peer_sends_total"] == 0
        rc = app.stop()
        assert rc == 0, "".join(app.stderr)[-3000:]
