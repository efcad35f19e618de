"""Data channels: round trips per second and MB/s over one channel through the relay, CPU per
message, memory per idle channel, and audio jitter during a bulk transfer on the same call.

Two servers answer the same peers in the same run: ``appliance up`` (relay + one transceiver,
the built-in ``echo`` agent, which echoes every message on the channel it came from) and
aiortc's own server (bench/aiortc_echo_server.py: an ``RTCPeerConnection`` per offer whose
``datachannel`` handler echoes each message). Two peers talk to each: real headless Chromium
(a page from the server's origin, its own ``RTCPeerConnection``; the loops run in the page)
and our own client (``appliance.client.open_call(datachannel=True)``: the transceiver's SCTP
core in the DTLS client role). Issue 16 target: ≥ 10x aiortc's round-trip MB/s with the
same peer, and no audio packet delayed by a bulk transfer on the same call.

    .venv/bin/python bench/datachannel.py                       # everything
    .venv/bin/python bench/datachannel.py --peers ours --servers appliance --mb 5

Figures, per (peer, server):

* ``rt/s``: ping-pong, one 16-byte message in flight, for ``--seconds``;
* ``MB/s``: ``--mb`` MB echoed in ``--size``-byte messages with ``--window`` bytes in
  flight (sent and not yet echoed back), counted when the echo arrives: round-trip MB/s;
* ``CPU µs/msg``: the server's core process (transceiver / aiortc server) CPU time over
  the bulk phase, divided by the messages it echoed;
* ``KiB/channel`` (ours only): RSS growth of the server process per idle channel, with
  ``--channels`` channels opened on one data-only call;
* audio (ours only): one call with audio and a channel; 20 ms Opus packets both ways; the
  echoed stream's RFC 3550 interarrival jitter and its worst delay (arrival minus RTP
  timestamp, above the fastest packet), for 3 s idle and then during a 10 MB transfer.

The box is shared: the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from capacity import (  # noqa: E402  (bench scripts import their sibling)
    Server,
    cpu_seconds,
    machine,
    rss_bytes,
    start_aiortc,
    start_appliance,
)

from appliance.client.call import Call, open_call  # noqa: E402
from appliance.loadgen.media import encode_tone  # noqa: E402

MB = 1_000_000

# -- our client -----------------------------------------------------------------------------


async def _open_channel(call: Call, label: str = "bench") -> int:
    cid = call.open_channel(label)
    with trio.fail_after(15):
        await call.channel_open(cid)
    return cid


async def ping_pong(call: Call, cid: int, seconds: float) -> float:
    """Round trips per second, one 16-byte message in flight."""
    msg = b"x" * 16
    n = 0
    t0 = trio.current_time()
    while trio.current_time() - t0 < seconds:
        call.send_message_nowait(cid, msg)
        await call.receive_message()
        n += 1
    return n / (trio.current_time() - t0)


async def bulk(call: Call, cid: int, total: int, size: int, window: int) -> tuple[float, int]:
    """(round-trip MB/s, messages echoed): ``total`` bytes in ``size``-byte messages, at
    most ``window`` bytes sent and not yet echoed."""
    payload = bytes(size)
    count = math.ceil(total / size)
    in_flight = max(1, window // size)
    progress = trio.Event()
    got = 0

    async def receiver() -> None:
        nonlocal got, progress
        while got < count:
            await call.receive_message()
            got += 1
            progress.set()

    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        for sent in range(count):
            while sent - got >= in_flight:
                progress = trio.Event()
                await progress.wait()
            call.send_message_nowait(cid, payload)
    elapsed = trio.current_time() - t0
    return count * size / elapsed / MB, count


async def idle_channels(server: Server, n: int) -> float:
    """RSS growth of the server's core process per idle channel (bytes)."""
    async with open_call(server.url, audio=False, datachannel=True) as call:
        first = await _open_channel(call)
        await trio.sleep(0.5)
        before = rss_bytes(server.core_pids())
        ids = [call.open_channel(f"idle{i}") for i in range(n)]
        with trio.fail_after(30):
            for cid in ids:
                await call.channel_open(cid)
        call.send_message_nowait(first, b"sync")  # every OPEN was handled before this echo
        await call.receive_message()
        await trio.sleep(0.5)
        return (rss_bytes(server.core_pids()) - before) / n


def _jitter(packets: list[tuple[float, int]]) -> tuple[float, float, int]:
    """RFC 3550 §6.4.1 interarrival jitter (ms) and the worst delay above the fastest packet
    (ms) of ``(arrival s, rtp timestamp)`` pairs at 48 kHz; and how many there were."""
    if len(packets) < 2:
        return math.nan, math.nan, len(packets)
    transit = [at - ts / 48000 for at, ts in packets]
    j = 0.0
    for a, b in zip(transit, transit[1:], strict=False):
        j += (abs(b - a) - j) / 16
    return j * 1000, (max(transit) - min(transit)) * 1000, len(packets)


async def audio_during_transfer(server: Server, mb: float, size: int, window: int
                                ) -> dict[str, Any]:
    tone = encode_tone()
    async with open_call(server.url, datachannel=True) as call:
        cid = await _open_channel(call)
        arrivals: list[tuple[float, int]] = []
        phase = {"name": "warmup"}
        by_phase: dict[str, list[tuple[float, int]]] = {"idle": [], "bulk": []}

        async def talk() -> None:
            ts, i = 0, 0
            t = trio.current_time()
            while True:
                call.send_rtp(tone.plain[i % tone.cycle], ts, marker=i == 0)
                ts, i = (ts + 960) & 0xFFFFFFFF, i + 1
                t += 0.020
                await trio.sleep_until(t)

        async def listen() -> None:
            while True:
                pkt = await call.receive()
                if phase["name"] in by_phase:
                    by_phase[phase["name"]].append((pkt.at, pkt.packet.timestamp))
                arrivals.append((pkt.at, pkt.packet.timestamp))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(talk)
            nursery.start_soon(listen)
            await trio.sleep(1.0)  # the echo's jitter buffer fills, its pacer settles
            phase["name"] = "idle"
            await trio.sleep(3.0)
            counts0 = await _rtp_counts(server, call)
            phase["name"] = "bulk"
            t0 = trio.current_time()
            mbps, _ = await bulk(call, cid, int(mb * MB), size, window)
            seconds = trio.current_time() - t0
            phase["name"] = "after"
            counts1 = await _rtp_counts(server, call)
            nursery.cancel_scope.cancel()
    idle, during = _jitter(by_phase["idle"]), _jitter(by_phase["bulk"])
    # Where audio went during the transfer: sent by us, taken in and sent by the server
    # (appliance only: its session counters), echoed back to us; 50 a second is all of it.
    flow = {k: (counts1[k] - counts0[k]) / seconds for k in counts0 if k in counts1}
    return {"idle": idle, "bulk": during, "mbps": mbps, "flow": flow}


async def _rtp_counts(server: Server, call: Call) -> dict[str, int]:
    out = {"client_sent": call.peer.rtp_sent, "client_received": call.peer.rtp_received}
    if server.name.startswith("appliance"):
        def get() -> dict[str, Any]:
            with urllib.request.urlopen(call.session_url, timeout=5) as r:
                return json.loads(r.read())  # type: ignore[no-any-return]
        s = await trio.to_thread.run_sync(get)
        out.update(server_in=s["packets_in"], server_out=s["packets_out"])
    return out


async def ours(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with open_call(server.url, audio=False, datachannel=True) as call:
        cid = await _open_channel(call)
        await bulk(call, cid, 2 * args.size * 8, args.size, args.window)  # warm up
        out["rt_s"] = await ping_pong(call, cid, args.seconds)
        cpu0 = cpu_seconds(server.core_pids())
        out["mbps"], n = await bulk(call, cid, int(args.mb * MB), args.size, args.window)
        out["cpu_us_msg"] = (cpu_seconds(server.core_pids()) - cpu0) / n * 1e6
    out["rss_channel"] = await idle_channels(server, args.channels)
    if args.audio_mb > 0:
        out["audio"] = await audio_during_transfer(server, args.audio_mb, args.size,
                                                   args.window)
    return out


# -- Chromium ---------------------------------------------------------------------------------

PAGE = """<!doctype html><meta charset="utf-8"><title>dc bench</title><script>
async function bench(size, total, windowBytes, seconds) {
  const pc = new RTCPeerConnection();
  const dc = pc.createDataChannel("bench");
  dc.binaryType = "arraybuffer";
  await pc.setLocalDescription(await pc.createOffer());
  const resp = await fetch("/v1/sessions", { method: "POST",
    headers: { "Content-Type": "application/sdp" }, body: pc.localDescription.sdp });
  if (resp.status !== 201) throw new Error(`POST ${resp.status}: ${await resp.text()}`);
  const location = resp.headers.get("Location");
  await pc.setRemoteDescription({ type: "answer", sdp: await resp.text() });
  await new Promise((ok, no) => { dc.onopen = ok; setTimeout(() => no(new Error("open")), 15000); });
  let got = 0, waiter = null;
  dc.onmessage = () => { got++; if (waiter) { const w = waiter; waiter = null; w(); } };
  const next = () => new Promise((ok) => { waiter = ok; });
  // ping-pong: one 16-byte message in flight
  const small = new Uint8Array(16);
  let n = 0; got = 0;
  const t0 = performance.now();
  while (performance.now() - t0 < seconds * 1000) { dc.send(small); while (got <= n) await next(); n++; }
  const rtps = n / ((performance.now() - t0) / 1000);
  // bulk: windowBytes in flight, counted when echoed
  const payload = new Uint8Array(size), count = Math.ceil(total / size);
  const inFlight = Math.max(1, Math.floor(windowBytes / size));
  got = 0;
  const t1 = performance.now();
  for (let sent = 0; sent < count; sent++) {
    while (sent - got >= inFlight) await next();
    dc.send(payload);
  }
  while (got < count) await next();
  const mbps = count * size / ((performance.now() - t1) / 1000) / 1e6;
  pc.close();
  return { rtps, mbps, count, location };
}
</script>"""


def chromium(servers: list[Server], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(REPO / "tests"))
    from browser.helpers import BASE_ARGS  # type: ignore[import-not-found]
    from peers import chromium_executable, chromium_version  # type: ignore[import-not-found]

    print(f"chromium {chromium_version()}")
    results: dict[str, dict[str, Any]] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_executable(), args=BASE_ARGS,
                                     headless=True)
        try:
            for server in servers:
                page = browser.new_page()
                page.route(server.url + "/__dc_bench", lambda route: route.fulfill(
                    status=200, content_type="text/html", body=PAGE))
                page.goto(server.url + "/__dc_bench")
                cpu0 = cpu_seconds(server.core_pids())
                r = page.evaluate("([s, t, w, d]) => bench(s, t, w, d)",
                                  [args.size, int(args.mb * MB), args.window, args.seconds])
                cpu = cpu_seconds(server.core_pids()) - cpu0
                # CPU over both phases, per message echoed in either.
                msgs = r["count"] + r["rtps"] * args.seconds
                results[server.name] = {"rt_s": r["rtps"], "mbps": r["mbps"],
                                        "cpu_us_msg": cpu / msgs * 1e6}
                page.close()
                if r.get("location"):
                    req = urllib.request.Request(server.url + r["location"], method="DELETE")
                    try:
                        urllib.request.urlopen(req, timeout=5).close()
                    except OSError:
                        pass
        finally:
            browser.close()
    return results


# -- the run ------------------------------------------------------------------------------------


@contextmanager
def servers(names: list[str]) -> Iterator[list[Server]]:
    with ExitStack() as stack:
        out = []
        for name in names:
            if name == "appliance":
                out.append(stack.enter_context(start_appliance("echo", ["--agent", "echo"])))
            elif name == "aiortc":
                out.append(stack.enter_context(start_aiortc()))
            else:
                raise SystemExit(f"unknown server {name!r}")
        yield out


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--servers", default="appliance,aiortc")
    p.add_argument("--peers", default="ours,chromium")
    p.add_argument("--size", type=int, default=16384, help="bulk message size (16 KiB)")
    p.add_argument("--window", type=int, default=256 * 1024, help="bytes in flight")
    p.add_argument("--mb", type=float, default=20.0, help="MB per bulk run")
    p.add_argument("--seconds", type=float, default=3.0, help="ping-pong seconds")
    p.add_argument("--channels", type=int, default=200, help="idle channels for memory")
    p.add_argument("--audio-mb", type=float, default=10.0, help="MB sent beside audio (0: skip)")
    args = p.parse_args(argv)
    peers = args.peers.split(",")
    print(machine())
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    results: dict[tuple[str, str], dict[str, Any]] = {}
    with servers(args.servers.split(",")) as running:
        if "ours" in peers:
            for server in running:
                results[("ours", server.name)] = trio.run(ours, server, args)
        if "chromium" in peers:
            for name, r in chromium(running, args).items():
                results[("chromium", name)] = r
    load = os.getloadavg()
    print(f"\n{args.mb:g} MB in {args.size} B messages, {args.window // 1024} KiB in flight; "
          f"ping-pong {args.seconds:g} s; load after: {load[0]:.2f} {load[1]:.2f}")
    print(f"{'peer':9} {'server':14} {'rt/s':>8} {'MB/s':>7} {'x aiortc':>8} "
          f"{'CPU µs/msg':>10} {'KiB/channel':>11}")
    for (peer, server), r in results.items():
        base = results.get((peer, "aiortc"))
        ratio = r["mbps"] / base["mbps"] if base and server != "aiortc" else None
        print(f"{peer:9} {server:14} {r['rt_s']:8.0f} {r['mbps']:7.2f} {_fmt(ratio, '8.1f')} "
              f"{r['cpu_us_msg']:10.0f} {_fmt(r.get('rss_channel', math.nan) / 1024, '11.1f')}")
    audio = [(server, r["audio"]) for (peer, server), r in results.items() if "audio" in r]
    if audio:
        print(f"\naudio echo beside a {args.audio_mb:g} MB transfer (our client, one call): "
              "RFC 3550 jitter ms / worst delay above the fastest packet ms / packets")
        for server, a in audio:
            (ji, wi, ni), (jb, wb, nb) = a["idle"], a["bulk"]
            print(f"  {server:14} idle {ji:5.2f} / {wi:6.1f} / {ni:4d}   during transfer "
                  f"{jb:5.2f} / {wb:6.1f} / {nb:4d}   ({a['mbps']:.2f} MB/s)")
            print("  " + " " * 14 + " packets/s during the transfer: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in a["flow"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
