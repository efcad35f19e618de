"""ICE-TCP interop (RFC 6544): real headless Chromium on a network that drops UDP to the
relay connects to `appliance up` over TCP, sends audio and gets the echo; the same page on
an open network picks UDP.

The network is a namespace of the test's own (``ip netns``): loopback plus a veth pair with
an address, so Chromium has a real interface to gather host candidates on. Everything runs
inside it — `appliance up` (``ip netns exec``) and Chromium (a wrapper script as
Playwright's ``executable_path``; Playwright talks to it over pipes, so the namespace does
not matter to the driver). "UDP blocked" is a rule inside the namespace: nftables when
``nft`` is installed (``udp dport PORT drop`` in an output chain), otherwise an
iproute2 policy rule (``ipproto udp dport PORT prohibit``, ahead of the local table), which
refuses every UDP datagram to the relay's port as a REJECTing firewall does. TCP, and UDP
between the relay and the transceivers (other ports), pass.

This needs root (network namespaces); without it the test fails, loudly — it is never
skipped. The namespace is deleted afterwards whatever happens.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser.helpers import BASE_ARGS, KEEP_PCS, write_tone_wav
from e2e.procs import Proc
from peers import chromium_executable
from playwright.sync_api import Page, sync_playwright

pytestmark = [pytest.mark.interop, pytest.mark.browser, pytest.mark.slow]

NS_ADDR = "10.231.0.1"

#: The selected candidate pair (RFC 8445 §8.1.1, W3C webrtc-stats candidate-pair) and the
#: inbound audio of the page's last RTCPeerConnection.
SELECTED = """async () => {
  const pc = window.__pcs[window.__pcs.length - 1];
  const all = {};
  (await pc.getStats()).forEach((s) => { all[s.id] = s; });
  const t = Object.values(all).find((s) => s.type === "transport");
  const pair = t && all[t.selectedCandidatePairId];
  const local = pair && all[pair.localCandidateId];
  const remote = pair && all[pair.remoteCandidateId];
  return {
    dtls: t ? t.dtlsState : null,
    local: local ? {protocol: local.protocol, tcpType: local.tcpType || null} : null,
    remote: remote ? {protocol: remote.protocol, port: remote.port,
                      address: remote.address || remote.ip} : null,
    inbound: Object.values(all).find((s) => s.type === "inbound-rtp" && s.kind === "audio")
      || null,
  };
}"""


def _run(*argv: str) -> None:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {out.stderr.strip() or out.stdout.strip()}")


class Netns:
    """A network namespace of our own with loopback and a veth pair (both ends inside)."""

    def __init__(self) -> None:
        self.name = f"apl-tcp-{uuid.uuid4().hex[:8]}"
        _run("ip", "netns", "add", self.name)
        try:
            self.exec("ip", "link", "set", "lo", "up")
            self.exec("ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1")
            self.exec("ip", "addr", "add", f"{NS_ADDR}/24", "dev", "v0")
            self.exec("ip", "link", "set", "v0", "up")
            self.exec("ip", "link", "set", "v1", "up")
        except BaseException:
            self.delete()
            raise

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def exec(self, *argv: str) -> None:
        _run(*self.prefix, *argv)

    def block_udp_to(self, port: int) -> str:
        """Drop/refuse UDP to ``port`` inside the namespace; says which mechanism."""
        if shutil.which("nft"):
            self.exec("nft", "add", "table", "inet", "apl")
            self.exec("nft", "add", "chain", "inet", "apl", "out",
                      "{ type filter hook output priority 0 ; }")
            self.exec("nft", "add", "rule", "inet", "apl", "out", "udp", "dport", str(port),
                      "drop")
            return "nft"
        # Policy routing runs the local table at preference 0, before any rule we add:
        # move it behind ours so datagrams to a local address are refused too.
        self.exec("ip", "rule", "add", "pref", "10", "ipproto", "udp", "dport", str(port),
                  "prohibit")
        self.exec("ip", "rule", "add", "pref", "20", "lookup", "local")
        self.exec("ip", "rule", "del", "pref", "0")
        return "ip-rule"

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30,
                       check=False)


@pytest.fixture
def netns() -> Iterator[Netns]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("the ICE-TCP interop test needs root and iproute2 (ip netns): it creates "
                    "a network namespace that drops UDP; run make test as root")
    try:
        ns = Netns()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"cannot create a network namespace for the ICE-TCP test: {exc}")
    try:
        yield ns
    finally:
        ns.delete()
        assert ns.name not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                             text=True, check=False).stdout


def _up(ns: Netns, tmp_path: Path) -> tuple[Proc, str, int]:
    # Port 0 everywhere: `up` picks a UDP port that is free for TCP too and prints both.
    proc = Proc(["up", "--http", "127.0.0.1:0", "--udp", "0.0.0.0:0",
                 "--public-address", NS_ADDR, "--state-dir", str(tmp_path / "state"),
                 "--transceivers", "1"], "appliance ready", timeout=60, prefix=ns.prefix)
    base = re.search(r"web UI (\S+)/ ", proc.ready)
    media = re.search(rf"media: UDP {re.escape(NS_ADDR)}:(\d+)", "".join(proc.stdout))
    tcp = re.search(rf"media: ICE-TCP {re.escape(NS_ADDR)}:(\d+)", "".join(proc.stdout))
    assert base and media and tcp, proc.stdout
    assert media.group(1) == tcp.group(1)  # one port number for both, by default
    return proc, base.group(1), int(media.group(1))


def _call(page: Page, base: str, proc: Proc) -> dict[str, Any]:
    page.goto(base + "/demo")
    page.get_by_role("button", name="Start", exact=True).click()
    page.wait_for_function("applianceDemo.state === 'connected'", timeout=40_000)
    st: dict[str, Any] = {}
    for _ in range(200):
        st = page.evaluate(SELECTED)
        inbound = st["inbound"]
        if inbound and inbound.get("packetsReceived", 0) > 25 \
                and inbound.get("totalAudioEnergy", 0) > 0.01:
            return st
        page.wait_for_timeout(100)  # a poll interval; the loop checks the state
    pytest.fail(f"no echoed audio: {st}\n{''.join(proc.stderr)[-3000:]}")


def _relay_metric(page: Page, name: str) -> float:
    text = page.evaluate("async () => (await fetch('/metrics')).text()")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f"appliance_relay_{name}"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("blocked", [True, False], ids=["udp-blocked", "open"])
def test_chromium_ice_tcp(netns: Netns, tmp_path: Path, blocked: bool) -> None:
    wrapper = tmp_path / "chromium-in-netns"
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {netns.name} '
                       f'"{chromium_executable()}" "$@"\n')
    wrapper.chmod(0o755)
    tone = write_tone_wav(tmp_path / "tone.wav")
    proc, base, port = _up(netns, tmp_path)
    try:
        how = netns.block_udp_to(port) if blocked else "none"
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=str(wrapper), headless=True,
                args=[*BASE_ARGS, "--use-fake-device-for-media-stream",
                      f"--use-file-for-fake-audio-capture={tone}",
                      "--use-fake-ui-for-media-stream"])
            try:
                ctx = browser.new_context(permissions=["microphone"])
                ctx.add_init_script(KEEP_PCS)
                page = ctx.new_page()
                page.set_default_timeout(20_000)
                st = _call(page, base, proc)
                print(f"UDP block: {how}; selected pair: {st['local']} -> {st['remote']}")
                assert st["dtls"] == "connected"
                want = "tcp" if blocked else "udp"
                assert st["local"]["protocol"] == want, st
                assert st["remote"]["protocol"] == want and st["remote"]["port"] == port, st
                if blocked:
                    assert st["local"]["tcpType"] == "active", st  # we are passive
                    assert _relay_metric(page, "tcp_established_total") >= 1
                # Open: UDP is the selected pair (above). No claim on TCP connections: Chromium
                # checks its TCP pairs in parallel and may connect one (and send a signed
                # Binding, which the relay counts as established) before UDP is nominated.
                ctx.close()
            finally:
                browser.close()
    finally:
        rc = proc.stop()
    assert rc == 0, "".join(proc.stderr)[-3000:]
