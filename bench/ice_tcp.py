"""ICE-TCP beside UDP, in one run (issue 18 #7): call setup time, audio round trip, and the
relay's CPU per forwarded frame on each path.

Starts a relay (one worker, ``--tcp`` on the UDP port's number) and one transceiver
(``--agent passthrough``: each caller's RTP comes straight back after SRTP
unprotect/protect, so the round trip is the transport's plus SRTP, not a codec's) as real
processes; the calls are our ClientPeer in this process (ICE, DTLS 1.2, SRTP), over UDP or
over an RFC 4571 framed TCP connection to the relay.

* setup: ``--setups`` calls per transport one after another; from the moment the client has
  the answer (TCP: before its connect) to ICE + DTLS done, median and p90;
* round trip: each of those calls sends 50 packets at 50/s carrying a counter; the time
  from sending packet n to receiving its echo, median and p90 over every packet;
* relay CPU: ``--calls`` concurrent calls per transport at 50 packets/s each way for
  ``--duration`` s; the relay process's user+system CPU (``/proc/PID/stat``) over the
  relay's ``packets_in`` in that window (client frames and transceiver returns alike),
  in µs per frame; the TCP/UDP ratio is the figure.

Loopback only: no WAN delay, so the round trips show the processing cost, not TCP's
head-of-line blocking under loss. The machine's load is printed with the figures.

    .venv/bin/python bench/ice_tcp.py --setups 10 --calls 20 --duration 5
"""

from __future__ import annotations

import argparse
import json
import os
import socket as stdsocket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from reliability.support import Stack, opus_frame  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from capacity import cpu_seconds  # noqa: E402  (bench scripts import their sibling)

from appliance.client.peer import ClientPeer, Connected, Failed, RtpReceived  # noqa: E402
from appliance.proto.dtls import Certificate  # noqa: E402
from appliance.proto.framing import Deframer, encode_frame  # noqa: E402

_SEQ = struct.Struct("!I")


class Probe:
    """One call (UDP or TCP) that stamps a counter into each payload and times its echo."""

    def __init__(self, peer: ClientPeer, sock: stdsocket.socket, tcp: bool) -> None:
        self.peer, self.sock, self.tcp = peer, sock, tcp
        self.deframer = Deframer()
        self.connected: float | None = None
        self.failed: str | None = None
        self.sent: dict[int, float] = {}
        self.rtts: list[float] = []
        self.received = 0
        self.sending = 0  # packets still to send (at 50/s); -1: until cancelled
        self.frame = opus_frame()

    def _send(self, data: bytes) -> None:
        try:
            if self.tcp:
                self.sock.sendall(encode_frame(data))
            else:
                assert self.peer.remote is not None
                self.sock.sendto(data, self.peer.remote)
        except OSError:
            pass

    def _receive(self) -> list[bytes]:
        out: list[bytes] = []
        while True:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return out
            if self.tcp:
                if not data:
                    self.failed = "closed"
                    return out
                self.deframer.handle_input(data)
                while (f := self.deframer.poll_output()) is not None:
                    out.append(f)
            else:
                out.append(data)

    async def run(self) -> None:
        peer = self.peer
        assert peer.remote is not None
        n = 0
        next_media: float | None = None
        try:
            while not peer.closed and self.failed is None:
                now = trio.current_time()
                deadlines = [d for d in (peer.poll_timeout(), next_media) if d is not None]
                with trio.move_on_at(min(deadlines) if deadlines else now + 0.05):
                    await trio.lowlevel.wait_readable(self.sock)
                now = trio.current_time()
                for data in self._receive():
                    peer.handle_datagram(now, data, peer.remote)
                peer.handle_timeout(now)
                if next_media is not None and now >= next_media and self.sending:
                    self.sent[n] = time.perf_counter()
                    peer.send_rtp(self.frame + _SEQ.pack(n), n * 960)
                    n += 1
                    self.sending -= 1 if self.sending > 0 else 0
                    next_media = max(next_media + 0.02, now)
                while (ev := peer.poll_event()) is not None:
                    if isinstance(ev, Connected):
                        self.connected = time.perf_counter()
                        next_media = now
                    elif isinstance(ev, RtpReceived):
                        self.received += 1
                        payload = bytes(ev.packet.payload)
                        sent = self.sent.pop(_SEQ.unpack(payload[-4:])[0], None)
                        if sent is not None:
                            self.rtts.append(time.perf_counter() - sent)
                    elif isinstance(ev, Failed):
                        self.failed = ev.reason
                while (out := peer.poll_transmit()) is not None:
                    self._send(out[0])
                await trio.lowlevel.checkpoint()
        finally:
            self.sock.close()


async def start_call(nursery: trio.Nursery, stack: Stack, tcp_addr: tuple[str, int] | None,
                     sid: str, packets: int) -> tuple[Probe, float]:
    """A call on UDP (``tcp_addr`` None) or ICE-TCP; returns it and its start time."""
    peer = ClientPeer(Certificate.generate(time.time()))
    resp = await stack.ctl(0, op="create", session_id=sid, offer=peer.offer(), agent=None,
                           candidates=[list(stack.public)],
                           **({} if tcp_addr is None else {"tcp_candidates": [list(tcp_addr)]}))
    assert resp["ok"], resp
    t0 = time.perf_counter()
    if tcp_addr is None:
        sock = stdsocket.socket(stdsocket.AF_INET, stdsocket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
    else:
        sock = stdsocket.create_connection(tcp_addr)
        sock.setsockopt(stdsocket.IPPROTO_TCP, stdsocket.TCP_NODELAY, 1)
    sock.setblocking(False)
    peer.accept_answer(resp["answer"], trio.current_time())
    probe = Probe(peer, sock, tcp_addr is not None)
    probe.sending = packets
    nursery.start_soon(probe.run)
    return probe, t0


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"load": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="ice-tcp-bench-") as tmp:
        stack = Stack.make(Path(tmp))
        try:
            await stack.start_transceiver(0, "--agent", "passthrough")
            await stack.start_relay("--tcp", "127.0.0.1:0")
            assert stack.relay is not None and stack.relay.popen.pid
            host, port = stack.relay.line.split(" tcp ")[1].split(",")[0].rsplit(":", 1)
            tcp_addr = (host, int(port))
            pid = stack.relay.popen.pid
            n = 0
            for name, addr in (("udp", None), ("tcp", tcp_addr)):
                setups: list[float] = []
                rtts: list[float] = []
                for _ in range(args.setups):
                    async with trio.open_nursery() as nursery:
                        n += 1
                        probe, t0 = await start_call(nursery, stack, addr, f"s{n}", 50)
                        def done(p: Probe = probe) -> bool:
                            # Connected, all 50 sent, the last echo in (or 0.5 s passed).
                            return p.connected is not None and not p.sending and (
                                not p.sent or time.perf_counter() - max(p.sent.values()) > 0.5)

                        with trio.fail_after(20):
                            while not done():  # noqa: ASYNC110 - state of the call's task
                                await trio.sleep(0.01)
                        assert probe.failed is None, probe.failed
                        setups.append(probe.connected - t0)
                        rtts += probe.rtts
                        nursery.cancel_scope.cancel()
                # Concurrent calls: relay CPU per frame.
                async with trio.open_nursery() as nursery:
                    probes = []
                    for _ in range(args.calls):
                        n += 1
                        probes.append((await start_call(nursery, stack, addr, f"c{n}", -1))[0])
                    with trio.fail_after(30):
                        while not all(p.received > 10 for p in probes):  # noqa: ASYNC110
                            await trio.sleep(0.05)
                    before = (await stack.relay_stats())["counters"]["packets_in"]
                    cpu0 = cpu_seconds([pid])
                    await trio.sleep(args.duration)
                    cpu1 = cpu_seconds([pid])
                    after = (await stack.relay_stats())["counters"]["packets_in"]
                    nursery.cancel_scope.cancel()
                frames = after - before
                out[name] = {
                    "setup_ms_median": 1e3 * statistics.median(setups),
                    "setup_ms_p90": 1e3 * pct(setups, 0.9),
                    "rtt_ms_median": 1e3 * statistics.median(rtts),
                    "rtt_ms_p90": 1e3 * pct(rtts, 0.9),
                    "rtt_samples": len(rtts),
                    "relay_frames": frames,
                    "relay_us_per_frame": 1e6 * (cpu1 - cpu0) / max(frames, 1),
                }
            out["tcp_over_udp_cpu_per_frame"] = (out["tcp"]["relay_us_per_frame"]
                                                 / out["udp"]["relay_us_per_frame"])
        finally:
            stack.close()
    out["load_after"] = os.getloadavg()
    return out


def table(r: dict[str, Any]) -> str:
    rows = ["| | UDP | ICE-TCP |", "|---|---|---|"]
    for key, label in (("setup_ms_median", "setup, median (ms)"),
                       ("setup_ms_p90", "setup, p90 (ms)"),
                       ("rtt_ms_median", "audio round trip, median (ms)"),
                       ("rtt_ms_p90", "audio round trip, p90 (ms)"),
                       ("relay_us_per_frame", "relay CPU per frame (µs)")):
        rows.append(f"| {label} | {r['udp'][key]:.2f} | {r['tcp'][key]:.2f} |")
    rows.append(f"\nrelay CPU per frame, TCP / UDP: {r['tcp_over_udp_cpu_per_frame']:.2f}; "
                f"load average {r['load'][0]:.1f} -> {r['load_after'][0]:.1f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setups", type=int, default=10, help="sequential calls per transport")
    parser.add_argument("--calls", type=int, default=20, help="concurrent calls for the CPU figure")
    parser.add_argument("--duration", type=float, default=5.0, help="CPU window, seconds")
    parser.add_argument("--json", action="store_true", help="print the JSON only")
    args = parser.parse_args(argv)
    result = trio.run(measure, args)
    if not args.json:
        print(table(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
