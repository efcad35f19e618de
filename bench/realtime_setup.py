"""Setup time through the OpenAI-Realtime surface beside the plain WHIP route (issue 17):
POST -> first event on the ``oai-events`` channel, with DCEP and with ``?dcid=``.

Real Chromium (Debian's, headless, fake microphone) against ``appliance up`` on loopback.
Each round one page makes one call per mode, one after the other:

* ``whip``: ``POST /v1/sessions`` (agent ``echo``) with a DCEP channel: POST -> connected
  (ICE + DTLS) and POST -> the channel open (the baseline: what a data channel costs today);
* ``realtime``: ``POST /v1/realtime/calls`` with ``createDataChannel("oai-events")`` (DCEP):
  POST -> connected and POST -> the agent's first event on the channel;
* ``realtime-dcid``: the same with ``?dcid=0`` and a pre-negotiated channel (no DCEP).

The issue's budget: the channel adds at most one round trip after DTLS (DCEP's OPEN/ACK) and
none with ``?dcid=``, so "first event - connected" is the figure to read, beside the WHIP
route's "channel open - connected". The first event is ``session.created`` from the
``realtime`` agent when it is installed, else the report of
tests/e2e/realtime_params_agent.py (sent the moment the channel opens, as session.created
is): the printout names which.

With ``--rtt-ms`` (a list, e.g. ``0,50,100``) each RTT above 0 puts bench/wan_proxy.py
between the page and ``appliance up`` (HTTP and UDP alike, RTT/2 each way; ``up``
advertises the proxy's address 127.0.0.2, as in bench/wan_setup.py), so the extra round
trip of DCEP shows in milliseconds rather than in loopback scheduling noise: the printout
gives each "- connected" figure in round trips too, and the difference from the WHIP
route's, which is what the issue bounds (<= 1 RTT with DCEP, ~0 with ``?dcid=``).

    .venv/bin/python bench/realtime_setup.py --rounds 20
    .venv/bin/python bench/realtime_setup.py --rounds 10 --rtt-ms 0,50,100
    .venv/bin/python bench/realtime_setup.py --rounds 10 --rtt-ms 50 --dtls-versions 1.2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from playwright.sync_api import sync_playwright

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))
from capacity import machine, start_appliance  # noqa: E402  (bench scripts import their sibling)
from peers import chromium_executable  # noqa: E402  (tests/peers.py: the one place Chromium is found)
from wan_setup import start_appliance as start_wan_appliance  # noqa: E402
from wan_setup import start_proxy  # noqa: E402

from appliance.agents import AgentError, resolve  # noqa: E402

PARAMS_AGENT = str(REPO / "tests" / "e2e" / "realtime_params_agent.py") + ":agent"

# One call, timed in the page from just before the POST (performance.now(), ms).
TIMED = r"""
window.timedCall = async ({ url, dcid, key }) => {
  const pc = new RTCPeerConnection();
  const ms = await navigator.mediaDevices.getUserMedia({ audio: true });
  pc.addTrack(ms.getTracks()[0]);
  const dc = dcid === null ? pc.createDataChannel("oai-events")
                           : pc.createDataChannel("oai-events", { negotiated: true, id: dcid });
  const t = {};
  let t0 = 0;
  // Done when the first figure and "connected" are both in: on a loaded box the
  // connectionstatechange task can run after the channel's first event.
  let finish;
  const done = new Promise((resolve) => { finish = resolve; });
  const whip = url.includes("/v1/sessions");
  const check = () => {
    if (t.connected !== undefined && (whip ? t.open : t.event) !== undefined) finish();
  };
  dc.onopen = () => { t.open = performance.now() - t0; check(); };
  dc.onmessage = () => { if (t.event === undefined) { t.event = performance.now() - t0; check(); } };
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "connected") { t.connected = performance.now() - t0; check(); }
  };
  await pc.setLocalDescription(await pc.createOffer());
  t0 = performance.now();
  const r = await fetch(url, { method: "POST", body: pc.localDescription.sdp,
    headers: { "Content-Type": "application/sdp", Authorization: `Bearer ${key}` } });
  t.post = performance.now() - t0;
  const answer = await r.text();
  if (r.status !== 201) throw new Error(`${url}: ${r.status} ${answer}`);
  await pc.setRemoteDescription({ type: "answer", sdp: answer });
  await Promise.race([done, new Promise((_, no) => setTimeout(() => no(new Error("timeout")), 10000))]);
  const location = r.headers.get("Location");
  pc.close();
  await fetch(location, { method: "DELETE", headers: { Authorization: `Bearer ${key}` } });
  return t;
};
"""


def p50(values: list[float]) -> float:
    return statistics.median(values)


def p90(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.9 * len(values)) - 1)]


@contextmanager
def served(rtt_ms: float, agent: str, args: argparse.Namespace) -> Iterator[str]:
    """The base URL the page talks to: ``up`` itself at RTT 0, else the proxy in front."""
    extra = ["--realtime-agent", agent]
    if args.dtls_versions:
        extra += ["--dtls-versions", args.dtls_versions]
    with ExitStack() as stack:
        if rtt_ms <= 0:
            yield stack.enter_context(start_appliance("realtime", extra)).url
            return
        url, udp = stack.enter_context(start_wan_appliance(1, tuple(extra)))
        proxied = stack.enter_context(start_proxy(rtt_ms, args, appliance=(url, udp), aiortc=None))
        yield proxied["appliance"]


def measure(base: str, rounds: int, chromium: str) -> dict[str, dict[str, list[float]]]:
    results: dict[str, dict[str, list[float]]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=[
            "--no-sandbox", "--headless=new", "--use-fake-device-for-media-stream",
            "--use-fake-ui-for-media-stream", "--allow-loopback-in-peer-connection"])
        page = browser.new_page()
        page.goto(base + "/healthz")
        page.add_script_tag(content=TIMED)
        modes = {"whip": (f"{base}/v1/sessions?agent=echo", None),
                 "realtime": (f"{base}/v1/realtime/calls", None),
                 "realtime-dcid": (f"{base}/v1/realtime/calls?dcid=0", 0)}
        for r in range(rounds + 1):  # round 0 warms up (imports, codec states)
            for mode, (url, dcid) in modes.items():
                t = page.evaluate("(a) => timedCall(a)", {"url": url, "dcid": dcid, "key": "x"})
                if r == 0:
                    continue
                first = t["open"] if mode == "whip" else t["event"]
                row = results.setdefault(mode, {"post": [], "connected": [], "first": [], "after": []})
                row["post"].append(t["post"])
                row["connected"].append(t["connected"])
                row["first"].append(first)
                row["after"].append(first - t["connected"])
        browser.close()
    return results


def report(rtt_ms: float, rounds: int, results: dict[str, dict[str, list[float]]]) -> None:
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"\nRTT {rtt_ms:g} ms: {rounds} rounds, one call per mode per round, load average {load}")
    print(f"{'mode':<15}{'POST p50':>10}{'connected p50':>15}{'first p50/p90':>16}"
          f"{'first - connected p50/p90':>28}")
    for mode, row in results.items():
        what = "channel open" if mode == "whip" else "first event"
        rtts = f"  = {p50(row['after']) / rtt_ms:.2f} RTT" if rtt_ms > 0 else ""
        print(f"{mode:<15}{p50(row['post']):>8.1f}ms{p50(row['connected']):>13.1f}ms"
              f"{p50(row['first']):>9.1f}/{p90(row['first']):<5.1f}ms"
              f"{p50(row['after']):>17.1f}/{p90(row['after']):<5.1f}ms  ({what}){rtts}")
    base = p50(results["whip"]["after"])
    for mode in ("realtime", "realtime-dcid"):
        after = p50(results[mode]["after"])
        extra = (f", {(after - base) / rtt_ms:+.2f} RTT beside it" if rtt_ms > 0 else "")
        print(f"{mode}: first event - connected = {after:.1f} ms p50, "
              f"{after / base if base else float('nan'):.2f}x the WHIP "
              f"route's channel open - connected{extra}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--rtt-ms", default="0", help="comma-separated RTTs; > 0 runs through the proxy")
    ap.add_argument("--dtls-versions", default=None,
                    help="passed to `appliance up` (e.g. 1.2: Chromium then negotiates DTLS 1.2)")
    ap.add_argument("--realtime-agent", default=None,
                    help="default: realtime if installed, else the params test agent")
    args = ap.parse_args(argv)
    args.jitter_ms, args.loss, args.seed = 0.0, 0.0, 1  # what start_proxy reads
    agent = args.realtime_agent
    if agent is None:
        try:
            resolve("realtime")
            agent = "realtime"
        except AgentError:
            agent = PARAMS_AGENT
    chromium = chromium_executable()
    print(f"realtime agent: {agent}")
    print(machine())
    for rtt in (float(x) for x in args.rtt_ms.split(",")):
        with served(rtt, agent, args) as base:
            results = measure(base, args.rounds, chromium)
        report(rtt, args.rounds, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
