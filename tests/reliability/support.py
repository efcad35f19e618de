"""Helpers for the reliability tests and ``bench/flood.py``-driven experiments.

Everything here runs the real product as processes (``python -m appliance relay`` and
``python -m appliance transceiver``) and drives real calls with :class:`ClientPeer` over
loopback UDP: the relay's public address is the only candidate a transceiver advertises, so
every datagram of every call goes through the relay.
"""

from __future__ import annotations

import os
import signal
import socket as stdsocket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import trio
from e2e.procs import free_udp_port

from appliance.client.peer import ClientPeer, Connected, Failed, RtpReceived
from appliance.control import control_request
from appliance.proto.dtls import Certificate

SECRET = b"reliability-secret-0123456789abcdef"
Addr = tuple[str, int]


async def eventually(pred: Callable[[], bool], within: float = 10.0, what: str = "") -> None:
    """Poll observable state (it lives in other tasks and processes) until ``pred()``."""
    try:
        with trio.fail_after(within):
            while not pred():  # noqa: ASYNC110 - bounded polling of observable state
                await trio.sleep(0.01)
    except trio.TooSlowError:
        raise AssertionError(f"timed out after {within} s waiting for {what or pred}") from None


@dataclass
class Proc:
    """A product process whose stdout/stderr go to ``log`` (read for the ready line)."""

    popen: subprocess.Popen[bytes]
    log: Path
    line: str = ""

    def kill9(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:  # pragma: no cover - a wedged process
                self.kill9()


async def spawn(argv: list[str], log: Path, prefix: str, within: float = 20.0) -> Proc:
    """Start ``python -m appliance ARGV`` and wait (bounded) for its ready line."""
    with log.open("wb") as out:
        popen = subprocess.Popen([sys.executable, "-m", "appliance", *argv],  # noqa: ASYNC220
                                 stdout=out, stderr=subprocess.STDOUT)
    proc = Proc(popen, log)

    def ready() -> bool:
        for text in log.read_text(errors="replace").splitlines():
            if text.startswith(prefix):
                proc.line = text
                return True
        if popen.poll() is not None:
            raise AssertionError(f"{argv[0]} exited: {log.read_text(errors='replace')[-2000:]}")
        return False

    await eventually(ready, within, f"{argv[0]} ready line")
    return proc


@dataclass
class Stack:
    """A relay and its transceivers, as processes; restartable."""

    tmp: Path
    secret_file: Path
    transceivers: dict[int, Proc] = field(default_factory=dict)
    taddrs: dict[int, Addr] = field(default_factory=dict)
    tcontrol: dict[int, str] = field(default_factory=dict)
    relay: Proc | None = None
    public: Addr = ("127.0.0.1", 0)
    relay_control: str = ""
    relay_extra: list[str] = field(default_factory=list)
    restarts: int = 0

    @classmethod
    def make(cls, tmp: Path) -> Stack:
        secret = tmp / "routing.secret"
        secret.write_bytes(SECRET + b"\n")
        return cls(tmp, secret)

    async def start_transceiver(self, k: int, *extra: str) -> None:
        ctl = str(self.tmp / f"t{k}.sock")
        proc = await spawn(["transceiver", "--id", str(k), "--listen", "127.0.0.1:0",
                            "--control", ctl, "--secret-file", str(self.secret_file), *extra],
                           self.tmp / f"t{k}.log", f"transceiver {k} listening on ")
        host, port = proc.line.split(" listening on ")[1].split()[0].rsplit(":", 1)
        self.transceivers[k] = proc
        self.taddrs[k] = (host, int(port))
        self.tcontrol[k] = ctl

    async def start_relay(self, *extra: str) -> None:
        if extra:
            self.relay_extra = list(extra)
        port = self.public[1] or free_udp_port()
        self.relay_control = str(self.tmp / "relay.sock")
        argv = ["relay", "--listen", f"127.0.0.1:{port}", "--secret-file",
                str(self.secret_file), "--control", self.relay_control,
                "--log-level", "warning", *self.relay_extra]
        for k, (host, tport) in self.taddrs.items():
            argv += ["--transceiver", f"{k}={host}:{tport}"]
        self.relay = await spawn(argv, self.tmp / f"relay-{self.restarts}.log",
                                 "relay listening on ")
        self.restarts += 1
        self.public = ("127.0.0.1", port)

    async def relay_stats(self) -> dict[str, Any]:
        return await control_request(self.relay_control, {"op": "stats"})

    async def ctl(self, k: int, **req: Any) -> dict[str, Any]:
        return await control_request(self.tcontrol[k], req)

    def close(self) -> None:
        for proc in [self.relay, *self.transceivers.values()]:
            if proc is not None:
                proc.stop()


def opus_frame() -> bytes:
    from appliance.transceiver.opus import OpusEncoder

    t = np.arange(960) / 48_000
    pcm = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16).tobytes()
    return OpusEncoder().encode(pcm)


@dataclass
class Call:
    """One live call: a ClientPeer on its own UDP socket, sending 50 packets/s."""

    sid: str
    transceiver: int
    peer: ClientPeer
    sock: stdsocket.socket
    connected: trio.Event = field(default_factory=trio.Event)
    rx_times: list[float] = field(default_factory=list)
    stun_sent: list[float] = field(default_factory=list)
    failed: str | None = None
    sending: bool = True
    done: trio.Event = field(default_factory=trio.Event)

    @property
    def received(self) -> int:
        return len(self.rx_times)

    def rx_after(self, t: float) -> list[float]:
        return [x for x in self.rx_times if x > t]

    async def run(self, payload: bytes) -> None:
        peer, sock = self.peer, self.sock
        next_media: float | None = None
        ts = 0
        try:
            while not peer.closed:
                now = trio.current_time()
                deadlines = [d for d in (peer.poll_timeout(), next_media) if d is not None]
                wake = min(deadlines) if deadlines else now + 0.05
                with trio.move_on_at(wake):
                    await trio.lowlevel.wait_readable(sock)
                now = trio.current_time()
                while True:
                    try:
                        data, addr = sock.recvfrom(65536)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        continue  # an ICMP error (relay restarting)
                    peer.handle_datagram(now, data, (addr[0], addr[1]))
                peer.handle_timeout(now)
                if next_media is not None and now >= next_media:
                    # handle_timeout may just have failed the call (consent expired): a
                    # failed peer is closed and send_rtp would raise.
                    if self.sending and not peer.closed:
                        peer.send_rtp(payload, ts)
                        ts += 960
                    next_media += 0.02
                    if next_media < now:  # the loop fell behind: do not burst
                        next_media = now + 0.02
                while (ev := peer.poll_event()) is not None:
                    if isinstance(ev, Connected):
                        self.connected.set()
                        next_media = now
                    elif isinstance(ev, RtpReceived):
                        self.rx_times.append(ev.at)
                    elif isinstance(ev, Failed):
                        self.failed = ev.reason
                while (out := peer.poll_transmit()) is not None:
                    if out[0] and out[0][0] < 2:
                        self.stun_sent.append(now)
                    try:
                        sock.sendto(out[0], out[1])
                    except OSError:
                        pass
                await trio.lowlevel.checkpoint()
        finally:
            sock.close()
            self.done.set()


async def open_call(nursery: trio.Nursery, stack: Stack, k: int, sid: str, payload: bytes, *,
                    consent_interval: float = 5.0, consent_timeout: float = 30.0) -> Call:
    peer = ClientPeer(Certificate.generate(time.time()))
    resp = await stack.ctl(k, op="create", session_id=sid, offer=peer.offer(), agent=None,
                           candidates=[list(stack.public)])
    assert resp["ok"], resp
    peer.accept_answer(resp["answer"], trio.current_time())
    assert peer.ice is not None and peer.remote == stack.public
    peer.ice.consent_interval = consent_interval
    peer.ice.consent_timeout = consent_timeout
    sock = stdsocket.socket(stdsocket.AF_INET, stdsocket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    call = Call(sid, k, peer, sock)
    nursery.start_soon(call.run, payload)
    return call


# -- relay worker restarts (`appliance relay --workers M`) ---------------------------------


async def worker_pids(stack: Stack) -> dict[int, int]:
    """Worker index -> pid of the workers the supervisor can reach right now."""
    stats = await stack.relay_stats()
    return {int(w["worker"]): int(w["pid"]) for w in stats.get("workers", []) if w.get("ok")}


async def restart_worker(stack: Stack, index: int, sig: int, within: float = 15.0) -> float:
    """Send ``sig`` to worker ``index``; wait (bounded) until the supervisor has a new worker
    ``index`` answering; the trio time it was seen back."""
    old = (await worker_pids(stack))[index]
    os.kill(old, sig)
    with trio.fail_after(within):
        while (await worker_pids(stack)).get(index, old) == old:  # noqa: ASYNC110
            await trio.sleep(0.02)  # bounded polling of the supervisor's state
    return trio.current_time()


async def media_settled(calls: list[Call], since: float, within: float) -> None:
    """Every call has had 0.5 s of media after ``since`` (>= 20 packets) and a packet in the
    last 0.2 s: the calls a restart interrupted have resumed."""
    def settled() -> bool:
        now = trio.current_time()
        return all(len(c.rx_after(since)) >= 20 and c.rx_times[-1] > now - 0.2
                   for c in calls if c.failed is None)

    await eventually(settled, within, "media to resume on every call")


def max_gap(call: Call, start: float, end: float) -> float:
    """The longest time without a received packet between ``start`` and ``end``."""
    rx = [t for t in call.rx_times if start <= t <= end]
    edges = [start, *rx, end]
    return max(b - a for a, b in zip(edges, edges[1:], strict=False))
