"""Setup time and first audio through TURN beside the direct path, in one run (issue 40
item 7), measured the way a caller would: in headless Chromium, on the page's own clock.

One `appliance up` on loopback (``--tls self-signed --https-on-media-port``: TURN over TCP
and TLS on the media port's TCP listener, advertised by signaling; ``--turn-url`` adds TURN
over UDP, which is served but not advertised by default) with the echo agent. For each path
the demo page makes ``--calls`` calls one after another:

* ``direct``: the demo with no ICE servers (host candidates; UDP wins on loopback);
* ``turn-udp`` / ``turn-tcp`` / ``turn-tls``: ``/demo?relay=1`` (``iceTransportPolicy:
  "relay"``) with the page's TURN servers filtered to that transport by an init script.

Per call: **setup** — Start → the peer connection is connected (the demo's own
``setupMs``: microphone, ICE servers, offer/answer, ICE and DTLS); **first audio** — Start
→ the first inbound RTP packet of the echo (``getStats``, polled every 5 ms in the page).
p50 / p90 per path and the ratio of each p50 to the direct path's. The relay's TURN counters
confirm each relayed call went through the gate. Loopback, so the differences are the TURN
hops' own cost (an extra TLS handshake and allocation round trips), not WAN latency.

    .venv/bin/python bench/turn_setup.py --calls 10 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from browser.helpers import (  # noqa: E402
    BASE_ARGS,
    KEEP_TURN,
    ONE_TRANSPORT,
    write_tone_wav,
)
from e2e.procs import Proc  # noqa: E402
from peers import chromium_executable  # noqa: E402
from playwright.sync_api import Browser, sync_playwright  # noqa: E402

PATHS = ("direct", "turn-udp", "turn-tcp", "turn-tls")

#: Click Start and time, on the page's clock, the first echoed RTP packet.
FIRST_AUDIO = """async () => {
  const t0 = performance.now();
  document.querySelector('#start').click();
  for (;;) {
    const pc = window.__pcs[window.__pcs.length - 1];
    if (pc && pc.connectionState !== 'closed') {
      for (const s of (await pc.getStats()).values()) {
        if (s.type === 'inbound-rtp' && s.kind === 'audio' && s.packetsReceived > 0) {
          return performance.now() - t0;
        }
      }
    }
    if (window.applianceDemo.state === 'failed') return -1;
    await new Promise((r) => setTimeout(r, 5));
  }
}"""

#: The direct path: the page's RTCPeerConnections get no ICE servers at all (a TURN server
#: on our media address would take the direct UDP path's packets, docs/turn.md).
NO_TURN = """(() => {
  const Native = window.RTCPeerConnection;
  window.__pcs = [];
  window.RTCPeerConnection = function (config) {
    const pc = new Native({...(config || {}), iceServers: []});
    window.__pcs.push(pc);
    return pc;
  };
  window.RTCPeerConnection.prototype = Native.prototype;
})();"""

PAIR = """async () => {
  const pc = window.__pcs[window.__pcs.length - 1];
  const all = {};
  (await pc.getStats()).forEach((s) => { all[s.id] = s; });
  const t = Object.values(all).find((s) => s.type === 'transport');
  const pair = t && all[t.selectedCandidatePairId];
  const local = pair && all[pair.localCandidateId];
  return local ? `${local.candidateType}/${local.relayProtocol || local.protocol}` : null;
}"""


def free_port_pair() -> int:
    """A port number free for UDP and TCP on 127.0.0.1 (the media port serves both)."""
    import socket

    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            port = int(u.getsockname()[1])
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(f"appliance_relay_{name}"))


def one_path(browser: Browser, base: str, path: str, calls: int) -> dict[str, Any]:
    ctx = browser.new_context(permissions=["microphone"], ignore_https_errors=True)
    ctx.add_init_script(NO_TURN if path == "direct"
                        else ONE_TRANSPORT % json.dumps(KEEP_TURN[path.split("-")[1]]))
    page = ctx.new_page()
    page.set_default_timeout(30_000)
    setups: list[float] = []
    firsts: list[float] = []
    pairs: set[str] = set()
    failed = 0
    errors: list[str] = []
    try:
        for _ in range(calls):
            page.goto(base + ("/demo" if path == "direct" else "/demo?relay=1"))
            first = float(page.evaluate(FIRST_AUDIO))
            if first < 0:
                failed += 1
                errors.append(str(page.evaluate("applianceDemo.message")))
                continue
            page.wait_for_function("applianceDemo.setupMs !== null")
            setups.append(float(page.evaluate("applianceDemo.setupMs")))
            firsts.append(first)
            pairs.add(str(page.evaluate(PAIR)))
            page.get_by_role("button", name="Stop").click()
            page.wait_for_function("applianceDemo.state === 'ended'")
    finally:
        ctx.close()
    return {"path": path, "calls": len(setups), "failed": failed, "pairs": sorted(pairs),
            "setup_ms": setups, "first_audio_ms": firsts, "errors": errors}


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=10, help="calls per path (default 10)")
    ap.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset of "
                    + ", ".join(PATHS))
    ap.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = ap.parse_args()
    paths = [p for p in args.paths.split(",") if p]
    with tempfile.TemporaryDirectory() as tmp:
        tone = write_tone_wav(Path(tmp) / "tone.wav")
        port = free_port_pair()  # the TURN-over-UDP URL needs the number up front
        up = Proc(["up", "--http", "127.0.0.1:0", "--udp", f"127.0.0.1:{port}",
                   "--public-address", "127.0.0.1", "--state-dir", f"{tmp}/state",
                   "--tls", "self-signed", "--https-on-media-port", "--transceivers", "1",
                   "--turn-url", f"turn:127.0.0.1:{port}?transport=udp",
                   "--turn-url", f"turn:127.0.0.1:{port}?transport=tcp",
                   "--turn-url", f"turns:127.0.0.1:{port}?transport=tcp"],
                  "appliance ready", timeout=90)
        results = []
        load0 = os.getloadavg()[0]
        try:
            base = f"https://127.0.0.1:{port}"
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=chromium_executable(), headless=True,
                    args=[*BASE_ARGS, "--use-fake-device-for-media-stream",
                          f"--use-file-for-fake-audio-capture={tone}",
                          "--use-fake-ui-for-media-stream", "--ignore-certificate-errors"])
                try:
                    version = browser.version
                    for path in paths:
                        results.append(one_path(browser, base, path, args.calls))
                    page = browser.new_page(ignore_https_errors=True)
                    page.goto(base + "/demo")
                    metrics = page.evaluate("async () => (await fetch('/metrics')).text()")
                finally:
                    browser.close()
        finally:
            up.stop()
    load1 = os.getloadavg()[0]
    counters = {n: metric(metrics, n) for n in ("turn_relayed_in_total",
                                                "turn_relayed_out_total",
                                                "turn_peer_sends_total", "tcp_turn_tls_total")}
    out = {"when": time.strftime("%Y-%m-%d %H:%M"), "chromium": version, "load": [load0, load1],
           "calls_per_path": args.calls, "paths": results, "relay": counters}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    direct = next((r for r in results if r["path"] == "direct"), None)
    d_setup = statistics.median(direct["setup_ms"]) if direct and direct["setup_ms"] else None
    d_first = (statistics.median(direct["first_audio_ms"])
               if direct and direct["first_audio_ms"] else None)
    print(f"{out['when']}, Chromium {version}, load {load0:.1f}-{load1:.1f}, "
          f"{args.calls} calls per path (ms, the page's clock)")
    print("| path | calls | setup p50 | p90 | first audio p50 | p90 | vs direct (setup / audio) "
          "| selected |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in results:
        s50, f50 = statistics.median(r["setup_ms"] or [float("nan")]), \
            statistics.median(r["first_audio_ms"] or [float("nan")])
        ratio = (f"x{s50 / d_setup:.2f} / x{f50 / d_first:.2f}"
                 if d_setup and d_first and r["path"] != "direct" else "")
        failed = f" ({r['failed']} failed)" if r["failed"] else ""
        print(f"| {r['path']} | {r['calls']}{failed} "
              f"| {s50:.0f} | {pct(r['setup_ms'], 0.9):.0f} | {f50:.0f} "
              f"| {pct(r['first_audio_ms'], 0.9):.0f} | {ratio} | {', '.join(r['pairs'])} |")
    print(f"relay: {json.dumps(counters)}")
    for r in results:
        for e in r["errors"]:
            print(f"{r['path']} failed: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
