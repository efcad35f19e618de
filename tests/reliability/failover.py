"""Relay failover harness (issue 20): one real ``appliance up``, real calls through its relay.

Used by ``tests/reliability/test_failover.py`` and ``bench/relay_failover.py``:

* :class:`Up` runs ``python -m appliance up`` (2 transceivers, echo agent, M relay workers,
  optionally ``--redis``) on ephemeral ports, with its state (and so the relay workers'
  control sockets, ``control/relay-W.sock``) in a short temporary directory; it finds a
  worker's pid over that socket, kills it, sends ``up`` SIGHUP;
* :class:`MediaCall` is our client (:class:`appliance.client.peer.ClientPeer`) set up with
  ``POST /v1/sessions``, bound to its own loopback address (127.0.1.N, so the relay's
  per-source-IP limits see N clients, as on the internet), sending 50 Opus packets/s and
  recording every echoed RTP packet's *kernel* arrival time (``SO_TIMESTAMPNS``: a test
  process busy elsewhere does not widen a gap) and RTP timestamp;
* :class:`AiortcCall` is an aiortc peer (full ICE agent, OpenSSL DTLS, libsrtp) in a thread
  of its own, recording each received packet's arrival (monotonic clock) and RTP timestamp.

The echo agent sends back what it hears, so the longest interval between two received
packets bounds the audio lost in *either* direction. :func:`longest_gap` measures it over a
window; :func:`longest_media_gap` measures the jump in RTP timestamps instead (audio that
never arrived, late or not).
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import trio
from e2e.procs import free_udp_port
from ports import TCP, free_port
from reliability.support import Proc, eventually, spawn

from appliance.client.call import enable_rx_timestamps, read_ready
from appliance.client.http import request
from appliance.client.peer import ClientPeer, Connected, Failed, RtpReceived
from appliance.control import ControlError, control_request
from appliance.proto.dtls import Certificate
from appliance.proto.stun import Method
from appliance.proto.turn import encode_channel_data, parse_channel_data_untrusted

RATE = 48_000
_ips = itertools.count(2)


def next_client_ip() -> str:
    n = next(_ips)
    return f"127.0.{1 + n // 250}.{n % 250 + 1}"


def free_tcp_port() -> int:
    return free_port(TCP)  # tests/ports.py says how it is picked


@dataclass
class Up:
    """One ``appliance up`` process and what the tests need to reach inside it."""

    proc: Proc
    base: str
    udp: int
    state: Path
    workers: int
    #: When :meth:`roll` saw each worker answer as a new process (trio time).
    replaced_at: list[float] = field(default_factory=list)

    @classmethod
    async def start(cls, tmp: Path, workers: int = 1, redis: str | None = None,
                    within: float = 90.0, extra: tuple[str, ...] = ()) -> Up:
        http, udp = free_tcp_port(), free_udp_port()
        # A short state dir: the control sockets' paths must stay under ~107 bytes.
        state = Path(tempfile.mkdtemp(prefix="fo-"))
        argv = ["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
                "--public-address", "127.0.0.1", "--state-dir", str(state),
                "--transceivers", "2", "--relay-workers", str(workers)]
        if redis:
            argv += ["--redis", redis]
        argv += list(extra)
        proc = await spawn(argv, tmp / "up.log", "appliance ready", within)
        scheme = "https" if "--tls" in extra else "http"  # (self-signed: verify_tls=False)
        up = cls(proc, f"{scheme}://127.0.0.1:{http}", udp, state, workers)
        # `up` is ready when every worker is; the standbys start right after.
        return up

    def control(self, w: int) -> str:
        return str(self.state / "control" / f"relay-{w}.sock")

    async def worker_stats(self, w: int) -> dict[str, Any] | None:
        try:
            with trio.fail_after(2):
                return await control_request(self.control(w), {"op": "stats"})
        except (ControlError, OSError, trio.TooSlowError):
            return None

    async def worker_pid(self, w: int) -> int | None:
        stats = await self.worker_stats(w)
        return None if stats is None else int(stats["pid"])

    async def counters(self) -> dict[str, Any]:
        """Every live worker's counters, summed (drops by reason too)."""
        total: dict[str, Any] = {"drops": {}}
        for w in range(self.workers):
            stats = await self.worker_stats(w)
            for key, value in (stats or {}).get("counters", {}).items():
                if key == "drops":
                    for reason, n in value.items():
                        total["drops"][reason] = total["drops"].get(reason, 0) + n
                else:
                    total[key] = total.get(key, 0) + value
        return total

    def standby_pids(self) -> list[int]:
        """The ``--standby`` processes (fork templates) of this ``up``: its children with
        that flag (the workers they forked carry the same command line, one level down)."""
        out = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if (b"--standby" in cmd and str(self.state).encode() in b" ".join(cmd)
                    and ppid == self.proc.popen.pid):
                out.append(int(pid))
        return out

    def standbys_warm(self) -> bool:
        """Every worker has a standby and each has said it is warm (imports done)."""
        pids = self.standby_pids()
        log = self.proc.log.read_text(errors="replace")
        return len(pids) >= self.workers and all(f"standby pid {pid} warm" in log for pid in pids)

    async def standbys_ready(self, within: float = 60.0) -> None:
        """Every worker has a warm standby (imports done: the supervisor logged it)."""
        await eventually(self.standbys_warm, within, "a warm standby per worker")

    async def kill_worker(self, w: int, within: float = 20.0) -> tuple[float, float]:
        """SIGKILL worker ``w``; wait until a new process answers on its control socket.
        Returns (killed at, back at) in trio time."""
        old = await self.worker_pid(w)
        assert old is not None, f"relay worker {w} is not answering"
        os.kill(old, signal.SIGKILL)
        killed = trio.current_time()
        await self._replaced(w, old, within)
        return killed, trio.current_time()

    async def _replaced(self, w: int, old: int, within: float) -> None:
        with trio.fail_after(within):
            while (pid := await self.worker_pid(w)) in (None, old):  # noqa: ASYNC110
                await trio.sleep(0.01)  # bounded polling of another process's state
        assert pid != old

    async def roll(self, within: float = 120.0) -> tuple[float, float]:
        """SIGHUP to ``up``; wait until every worker is a new process. (start, end)."""
        old = [await self.worker_pid(w) for w in range(self.workers)]
        os.kill(self.proc.popen.pid, signal.SIGHUP)
        start = trio.current_time()
        self.replaced_at = []
        for w, pid in enumerate(old):
            assert pid is not None
            await self._replaced(w, pid, within)
            self.replaced_at.append(trio.current_time())
        return start, trio.current_time()

    def stop(self) -> None:
        self.proc.stop()
        shutil.rmtree(self.state, ignore_errors=True)


def opus_frames() -> list[bytes]:
    from appliance.transceiver.opus import OpusEncoder

    enc = OpusEncoder()
    t = np.arange(RATE) / RATE
    pcm = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)
    return [enc.encode(pcm[i : i + 960].tobytes()) for i in range(0, RATE, 960)]


@dataclass
class MediaCall:
    """Our client through ``POST /v1/sessions``; see the module docstring."""

    name: str
    peer: ClientPeer
    sock: socket.socket
    stamped: bool
    connected: trio.Event = field(default_factory=trio.Event)
    rx: list[tuple[float, int]] = field(default_factory=list)  # (arrival, RTP timestamp)
    tx: list[float] = field(default_factory=list)  # when each RTP packet was sent
    #: The echo comes back stamped with the transceiver's clock (the echo agent), not the
    #: caller's timestamps (passthrough): a stall of ours as a sender shows as a jump.
    own_clock: bool = True
    failed: str | None = None
    opened_at: float = 0.0
    #: through a TURN allocation (our own media address its channel's peer): every datagram
    #: goes out as ChannelData to the relay, and ChannelData in is the media address's
    turn: TurnTunnel | None = None

    @property
    def rx_times(self) -> list[float]:
        return [t for t, _ in self.rx]

    async def run(self, frames: list[bytes]) -> None:
        peer, sock = self.peer, self.sock
        buf = bytearray(65536)
        next_media: float | None = None
        ts, i = 0, 0
        try:
            while not peer.closed:
                now = trio.current_time()
                deadlines = [d for d in (peer.poll_timeout(), next_media) if d is not None]
                with trio.move_on_at(min(deadlines) if deadlines else now + 0.05):
                    await trio.lowlevel.wait_readable(sock)
                now = trio.current_time()
                offset = now - time.time()
                for data, addr, at in read_ready(sock, buf, now, offset, self.stamped):
                    if self.turn is not None:
                        unwrapped = self.turn.unwrap(data)
                        if unwrapped is None:
                            continue  # a STUN answer of the TURN server's
                        data, addr = unwrapped
                    peer.handle_datagram(at, data, addr)
                peer.handle_timeout(now)
                if next_media is not None and now >= next_media and not peer.closed:
                    peer.send_rtp(frames[i % len(frames)], ts)
                    self.tx.append(now)
                    i, ts = i + 1, ts + 960
                    next_media += 0.02
                    if next_media < now:  # fell behind: do not burst
                        next_media = now + 0.02
                while (ev := peer.poll_event()) is not None:
                    if isinstance(ev, Connected):
                        self.connected.set()
                        next_media = now
                    elif isinstance(ev, RtpReceived):
                        self.rx.append((ev.at, ev.packet.timestamp))
                    elif isinstance(ev, Failed):
                        self.failed = ev.reason
                while (out := peer.poll_transmit()) is not None:
                    data, dest = out if self.turn is None else self.turn.wrap(*out)
                    with contextlib.suppress(OSError):
                        sock.sendto(data, dest)
                await trio.lowlevel.checkpoint()
        finally:
            sock.close()


async def open_media_call(nursery: trio.Nursery, up: Up, name: str,
                          frames: list[bytes], agent: str | None = None) -> MediaCall:
    peer = ClientPeer(Certificate.generate(time.time()))
    opened = trio.current_time()
    query = f"?agent={agent}" if agent else ""
    resp = await request("POST", up.base + "/v1/sessions" + query, body=peer.offer().encode(),
                         headers={"Content-Type": "application/sdp"})
    assert resp.status == 201, (resp.status, resp.body[:300])
    peer.accept_answer(resp.body.decode(), trio.current_time())
    assert peer.remote == ("127.0.0.1", up.udp), peer.remote
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((next_client_ip(), 0))
    sock.setblocking(False)
    call = MediaCall(name, peer, sock, enable_rx_timestamps(sock), opened_at=opened,
                     own_clock=agent != "passthrough")
    nursery.start_soon(call.run, frames)
    return call


@dataclass
class TurnTunnel:
    """A client's datagrams to our own media address ``media`` through its TURN allocation
    on ``server``, on channel ``channel`` (bound to ``media``)."""

    server: tuple[str, int]
    media: tuple[str, int]
    channel: int = 0x4001
    #: datagrams that came back as something else than ChannelData (STUN answers)
    other: list[bytes] = field(default_factory=list)

    def wrap(self, data: bytes, dest: tuple[str, int]) -> tuple[bytes, tuple[str, int]]:
        assert dest == self.media, dest
        return encode_channel_data(self.channel, data), self.server

    def unwrap(self, data: bytes) -> tuple[bytes, tuple[str, int]] | None:
        if not data or data[0] >> 6 != 1:
            self.other.append(data)
            return None
        number, length = parse_channel_data_untrusted(data)
        assert number == self.channel
        return data[4 : 4 + length], self.media


async def open_turn_media_call(nursery: trio.Nursery, up: Up, name: str,
                               frames: list[bytes]) -> tuple[MediaCall, list[Method]]:
    """A :class:`MediaCall` whose every datagram goes through a TURN/UDP allocation of the
    relay, to our own media address (what a browser with ``iceTransportPolicy: "relay"``
    does): Allocate and ChannelBind first (with the REST credential signaling would mint),
    then ICE, DTLS and SRTP inside ChannelData. Returns the call and the TURN requests it
    sent (a test checks that no new Allocate followed)."""
    from proto.turn.turn_client import Client

    from appliance.proto.stun import AttrType, Class, Message
    from appliance.proto.turn import derive_turn_secret, mint_rest_credential
    from appliance.proto.ufrag import load_secrets
    from appliance.statedir import SECRET_NAME

    routing = load_secrets((up.state / SECRET_NAME).read_bytes())[0]
    cred = mint_rest_credential(derive_turn_secret(routing), name, int(time.time()) + 3600)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((next_client_ip(), 0))
    server = ("127.0.0.1", up.udp)
    tunnel = TurnTunnel(server, server)
    client = Client(addr=sock.getsockname(), local=server, username=cred.username,
                    password=cred.password)
    asked: list[Method] = []
    tsock = trio.socket.from_stdlib_socket(sock)

    async def ask(method: Method, attrs: tuple[tuple[AttrType, object], ...]) -> None:
        for _ in range(2):  # one 401 round, as a client does
            asked.append(method)
            await tsock.sendto(client.request(method, attrs), server)  # type: ignore[arg-type]
            with trio.fail_after(5):
                data = await tsock.recv(65536)
            msg = client.learn(data)
            if msg.msg_class == Class.SUCCESS:
                return
        raise AssertionError(Message.parse_untrusted(data).error_code)

    await ask(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),))
    await ask(Method.CHANNEL_BIND, ((AttrType.CHANNEL_NUMBER, tunnel.channel),
                                    (AttrType.XOR_PEER_ADDRESS, server)))
    peer = ClientPeer(Certificate.generate(time.time()))
    opened = trio.current_time()
    resp = await request("POST", up.base + "/v1/sessions", body=peer.offer().encode(),
                         headers={"Content-Type": "application/sdp"})
    assert resp.status == 201, (resp.status, resp.body[:300])
    peer.accept_answer(resp.body.decode(), trio.current_time())
    assert peer.remote == server, peer.remote
    sock.setblocking(False)
    call = MediaCall(name, peer, sock, enable_rx_timestamps(sock), opened_at=opened,
                     turn=tunnel)
    nursery.start_soon(call.run, frames)
    return call, asked


# -- aiortc ------------------------------------------------------------------------------------


class AiortcCall:
    """An aiortc call in a thread of its own (asyncio loop), through ``POST /v1/sessions``.

    ``rx`` holds (arrival on trio's clock, RTP timestamp) of every audio packet received,
    taken from aiortc's RTP receiver as it hands the packet to its jitter buffer."""

    def __init__(self, base: str, trio_offset: float) -> None:
        self.base = base
        self.offset = trio_offset  # trio clock - time.perf_counter()
        self.rx: list[tuple[float, int]] = []
        self.tx: list[float] = []  # when each frame left the source, on trio's clock
        self.connected = threading.Event()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="aiortc-failover")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(20)
        assert not self._thread.is_alive(), "the aiortc call did not stop"

    @property
    def rx_times(self) -> list[float]:
        return [t for t, _ in self.rx]

    def _main(self) -> None:
        try:
            asyncio.run(self._call())
        except BaseException as exc:  # reported to the test's thread
            self.error = exc

    async def _call(self) -> None:
        import av
        from aiortc import (
            MediaStreamTrack,
            RTCConfiguration,
            RTCPeerConnection,
            RTCSessionDescription,
        )
        from aiortc.rtcrtpreceiver import RTCRtpReceiver

        rx, tx = self.rx, self.tx
        offset = self.offset

        class Tone(MediaStreamTrack):
            kind = "audio"

            def __init__(self) -> None:
                super().__init__()
                t = np.arange(RATE) / RATE
                self.pcm = (0.3 * 32767 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
                self.pts = 0
                self.t0: float | None = None

            async def recv(self) -> av.AudioFrame:
                loop = asyncio.get_running_loop()
                if self.t0 is None:
                    self.t0 = loop.time()
                delay = self.t0 + self.pts / RATE - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)  # real-time pacing of a media source
                tx.append(time.perf_counter() + offset)
                i = self.pts % RATE
                frame = av.AudioFrame.from_ndarray(self.pcm[i : i + 960].reshape(1, -1),
                                                   format="s16", layout="mono")
                frame.sample_rate, frame.pts = RATE, self.pts
                frame.time_base = fractions.Fraction(1, RATE)
                self.pts += 960
                return frame

        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTrack(Tone())
        real = RTCRtpReceiver._handle_rtp_packet

        async def spy(receiver: Any, packet: Any, arrival_time_ms: int) -> None:
            rx.append((time.perf_counter() + offset, packet.timestamp))
            await real(receiver, packet, arrival_time_ms)

        async def drain(track: Any) -> None:
            with contextlib.suppress(Exception):
                while True:
                    await track.recv()

        pc.on("track", lambda track: asyncio.ensure_future(drain(track)))
        RTCRtpReceiver._handle_rtp_packet = spy  # type: ignore[method-assign]
        try:
            await pc.setLocalDescription(await pc.createOffer())
            req = urllib.request.Request(self.base + "/v1/sessions",
                                         data=pc.localDescription.sdp.encode(), method="POST")
            req.add_header("Content-Type", "application/sdp")

            def post() -> bytes:
                with urllib.request.urlopen(req, timeout=20) as resp:
                    assert resp.status == 201
                    return bytes(resp.read())

            answer = (await asyncio.to_thread(post)).decode()
            await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
            while not self._stop.is_set():
                if pc.connectionState == "connected":
                    self.connected.set()
                if pc.connectionState in ("failed", "closed"):
                    raise AssertionError(f"aiortc call {pc.connectionState}")
                await asyncio.sleep(0.05)
        finally:
            RTCRtpReceiver._handle_rtp_packet = real  # type: ignore[method-assign]
            await pc.close()


# -- measuring ---------------------------------------------------------------------------------


def longest_gap(rx_times: list[float], start: float, end: float) -> float:
    """The longest time without a received packet between ``start`` and ``end``."""
    rx = sorted(t for t in rx_times if start <= t <= end)
    edges = [start, *rx, end]
    return max(b - a for a, b in itertools.pairwise(edges))


def longest_media_gap(rx: list[tuple[float, int]], start: float, end: float) -> float:
    """The longest run of audio (RTP timestamp jump, 48 kHz) that never arrived."""
    return media_gap_at(rx, start, end)[0]


def media_gap_at(rx: list[tuple[float, int]], start: float,
                 end: float) -> tuple[float, float]:
    """:func:`longest_media_gap` and the arrival time of the packet that ended it."""
    got = sorted({(t, at) for at, t in rx if start <= at <= end})
    if len(got) < 2:
        return end - start, end
    return max(((b - a) / RATE - 0.02, at) for (a, _), (b, at) in itertools.pairwise(got))


# -- a redis-server we can kill and bring back on the same port ----------------------------


class RedisProc:
    """A throwaway redis-server (no persistence) on a fixed ephemeral port: killable and
    restartable there, so a relay configured with its URL sees it go and come back."""

    def __init__(self) -> None:
        self.port = free_tcp_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self, within: float = 10.0) -> None:
        if shutil.which("redis-server") is None:
            raise AssertionError("redis-server is not installed (make sysdeps installs it)")
        self.popen = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--loglevel", "warning"], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + within
        while not self.ping():
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("redis-server did not start")
            time.sleep(0.02)  # bounded wait for another process to listen

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def keys(self) -> int:
        """How many relay flow entries it holds (``appliance:relay:*``), asked with
        redis-cli (Debian's redis-server depends on it): a redis-py client left a socket
        for the garbage collector when a read failed right after a restart, and the test
        failed on the ResourceWarning, not on the relay."""
        done = subprocess.run(["redis-cli", "-p", str(self.port), "--scan", "--pattern",
                               "appliance:relay:*"], capture_output=True, timeout=10,
                              check=False)
        if done.returncode != 0:
            raise AssertionError(f"redis-cli: {done.stderr.decode(errors='replace')[:200]}")
        return len(done.stdout.split())

    def kill9(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


async def open_stack_call(nursery: trio.Nursery, stack: Any, k: int, name: str,
                          frames: list[bytes]) -> MediaCall:
    """A :class:`MediaCall` on transceiver ``k`` of a ``reliability.support.Stack`` (an
    ``appliance relay`` and transceivers, sessions created over the control channel),
    passthrough agent."""
    peer = ClientPeer(Certificate.generate(time.time()))
    resp = await stack.ctl(k, op="create", session_id=name, offer=peer.offer(),
                           agent="passthrough", candidates=[list(stack.public)])
    assert resp["ok"], resp
    peer.accept_answer(resp["answer"], trio.current_time())
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((next_client_ip(), 0))
    sock.setblocking(False)
    call = MediaCall(name, peer, sock, enable_rx_timestamps(sock))
    nursery.start_soon(call.run, frames)
    return call
