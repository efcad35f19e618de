"""Relay benchmark: K voice-sized flows, direct vs through the relay, in the same run.

    .venv/bin/python bench/relay_bench.py [--flows 1000] [--rate 50000] [--seconds 3]
                                          [--workers 1,2] [--io python,mmsg] [--no-pin]
                                          [--coalesce-us 0,20]

One process (this one, pinned to the last CPU) is both the load generator — K client UDP
sockets sending 172-byte RTP-like datagrams carrying a flow id, sequence number and send
timestamp — and the echoing stand-in transceiver (it returns every datagram, PROXY header
included, to the address it came from). The relay runs as ``python -m appliance.relay.cli``
with ``--pin`` (worker i on CPU i) and ``--io MODE`` for each mode of ``--io`` (default:
``python`` — one recvfrom_into/sendto per datagram — then ``mmsg`` — batched
recvmmsg/sendmmsg, when the C extension is built), so one run compares the two hot loops,
and ``--coalesce-us US`` for each value of ``--coalesce-us`` (default: the relay's own
default, 20; ``0,20`` compares coalescing off and on).
For each worker count and I/O mode it measures:

* fixed rate (``--rate`` datagrams/s from clients, spread over the flows) and max rate
  (closed loop, a window of datagrams in flight per flow), first on the direct path
  (client -> echo -> client), then through the relay (client -> relay -> echo -> relay ->
  client);
* the relay's forwarded datagrams/s (both directions, from its own counters), the same per
  second of relay CPU time (utime+stime from /proc: "per relay core"), the relay's CPU load,
  its datagrams per wake-up (received datagrams / hot-loop wake-ups, from its counters),
  loss, and round-trip latency p50/p99 with the *added* p50/p99 (relay minus direct).

Latency is measured with kernel receive timestamps (``SO_TIMESTAMPNS``), so that the load
generator's own delays do not count: RTT = (kernel arrival at the client socket - send
time) - (time the datagram sat in the echo: its kernel arrival there until the echo sent it
back, written into the payload by the echo). Both paths are measured the same way; the
generator's lateness (kernel arrival to when it read the datagram) is reported separately
as ``gen-late p50/p99`` — it used to inflate the direct path, whose echo and client reads
compete with the generator's send bursts, so that "relay minus direct" could go negative.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from appliance.proto.stun import binding_request  # noqa: E402
from appliance.proto.ufrag import UfragCodec  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from capacity import cpu_seconds  # noqa: E402  (bench scripts import their sibling)

SECRET = os.urandom(32)
PAYLOAD = 172
_HDR = struct.Struct("!BBHIQQ")  # 0x80 (RTP), PT, flow, seq, send time, echo hold (ns)
_HOLD = struct.Struct("!Q")
_HOLD_AT = _HDR.size - _HOLD.size  # offset of the echo hold time in the payload
_TS = struct.Struct("@qq")  # struct timespec
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; SCM_TIMESTAMPNS is the same
ANC = socket.CMSG_SPACE(_TS.size)
TICK = 0.0005
ALL_CPUS = os.sched_getaffinity(0)


def _udp(host: str = "127.0.0.1") -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # kernel arrival time (realtime)
    s.bind((host, 0))
    s.setblocking(False)
    return s


def _stamp(anc: list[tuple[int, int, bytes]]) -> int:
    """The kernel arrival time (ns, CLOCK_REALTIME) from SCM_TIMESTAMPNS, or 0."""
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TS.size:
            sec, nsec = _TS.unpack_from(data)
            return sec * 1_000_000_000 + nsec
    return 0


@dataclass
class Result:
    sent: int
    received: int
    seconds: float
    rtts: list[int]
    late: list[int]

    @property
    def loss(self) -> float:
        return 1 - self.received / self.sent if self.sent else 0.0

    def pct(self, q: float, what: str = "rtts") -> float:
        values = getattr(self, what)
        if not values:
            return float("nan")
        s = sorted(values)
        return s[min(len(s) - 1, int(q * len(s)))] / 1000.0  # µs


class Generator:
    def __init__(self, flows: int) -> None:
        self.echo = _udp()
        self.clients = [_udp() for _ in range(flows)]
        self.ep = select.epoll()
        self.by_fd: dict[int, int] = {}
        for i, c in enumerate(self.clients):
            self.ep.register(c.fileno(), select.EPOLLIN)
            self.by_fd[c.fileno()] = i
        self.ep.register(self.echo.fileno(), select.EPOLLIN)
        self.buf = bytearray(70000)
        self.mv = memoryview(self.buf)
        self.out = bytearray(PAYLOAD)
        self.out[_HDR.size:] = bytes(PAYLOAD - _HDR.size)

    @property
    def echo_addr(self) -> tuple[str, int]:
        a = self.echo.getsockname()
        return (a[0], a[1])

    def _drain_echo(self) -> None:
        recv, send, mv, buf = self.echo.recvmsg_into, self.echo.sendto, self.mv, self.buf
        bufs = [mv]
        now_ns, hold = time.time_ns, _HOLD.pack_into
        while True:
            try:
                n, anc, _, src = recv(bufs, ANC)
            except BlockingIOError:
                return
            if n >= PAYLOAD:  # a benchmark datagram: note how long it sat here
                arrived = _stamp(anc)
                hold(buf, n - PAYLOAD + _HOLD_AT, now_ns() - arrived if arrived else 0)
            try:
                send(mv[:n], src)
            except OSError:
                pass

    def handshake(self, target: tuple[str, int], codec: UfragCodec | None) -> None:
        """With a relay: one ICE-like check per flow (waiting for its echo) opens the flow."""
        if codec is None:
            return
        pending = set(range(len(self.clients)))
        for i in pending:
            req = binding_request(os.urandom(12), username=f"{codec.mint(cluster=0, transceiver=0)}:b{i}")
            self.clients[i].sendto(req, target)
        deadline = time.monotonic() + 10
        while pending and time.monotonic() < deadline:
            for fd, _ in self.ep.poll(0.01):
                if fd == self.echo.fileno():
                    self._drain_echo()
                    continue
                i = self.by_fd[fd]
                try:
                    while True:
                        self.clients[i].recvfrom_into(self.mv)
                        pending.discard(i)
                except BlockingIOError:
                    pass
        if pending:
            raise SystemExit(f"{len(pending)} flows did not open through the relay")

    def run(self, target: tuple[str, int], seconds: float, rate: float | None,
            window: int = 4) -> Result:
        """Fixed ``rate`` (datagrams/s from clients) or, with None, a closed loop with
        ``window`` datagrams in flight per flow."""
        clients, k = self.clients, len(self.clients)
        out, pack, unpack = self.out, _HDR.pack_into, _HDR.unpack_from
        mv, by_fd, echo_fd = self.mv, self.by_fd, self.echo.fileno()
        bufs = [mv]
        now_ns = time.time_ns  # the kernel's receive timestamps are CLOCK_REALTIME
        seqs = [0] * k
        rtts: list[int] = []
        late: list[int] = []
        sent = received = 0
        rr = 0

        def send(i: int) -> None:
            nonlocal sent
            pack(out, 0, 0x80, 0x6F, i, seqs[i], now_ns(), 0)
            seqs[i] += 1
            try:
                clients[i].sendto(out, target)
            except BlockingIOError:
                pass
            sent += 1

        start = time.perf_counter()
        end = start + seconds
        if rate is None:
            for _ in range(window):
                for i in range(k):
                    send(i)
        last_rx = start
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            if rate is not None:
                due = int((now - start) * rate) - sent
                for _ in range(due):
                    send(rr)
                    rr = rr + 1 if rr + 1 < k else 0
                timeout = TICK
            else:
                timeout = 0.01
                if now - last_rx > 0.05:  # everything in flight was lost: refill
                    for i in range(k):
                        send(i)
                    last_rx = now
            for fd, _ in self.ep.poll(timeout):
                if fd == echo_fd:
                    self._drain_echo()
                    continue
                # One datagram per event (epoll is level-triggered): draining until
                # BlockingIOError would raise an exception per packet on 1000 sockets.
                i = by_fd[fd]
                try:
                    n, anc, _, _ = clients[i].recvmsg_into(bufs, ANC)
                except BlockingIOError:
                    continue
                if n < _HDR.size:
                    continue  # a late STUN echo
                read = now_ns()
                arrived = _stamp(anc) or read
                fields = unpack(mv)
                rtts.append(arrived - fields[4] - fields[5])
                late.append(read - arrived)
                received += 1
                if rate is None:
                    send(i)
                    last_rx = now
        elapsed = time.perf_counter() - start
        # Grace period: let datagrams in flight arrive (they count as received, not lost).
        grace = time.perf_counter() + 0.2
        while time.perf_counter() < grace:
            for fd, _ in self.ep.poll(0.01):
                if fd == echo_fd:
                    self._drain_echo()
                    continue
                sock = clients[by_fd[fd]]
                try:
                    while True:
                        if sock.recv_into(mv) >= _HDR.size:
                            received += 1
                except BlockingIOError:
                    pass
        return Result(sent, received, elapsed, rtts, late)


def _control(path: str) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(b'{"op":"stats"}\n')
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            data += chunk
    out = json.loads(data)
    assert isinstance(out, dict)
    return out


def _worker_stats(path: str) -> tuple[list[int], dict[str, int]]:
    st = _control(path)
    workers = st.get("workers")
    per = workers if isinstance(workers, list) else [st]
    pids = [int(w["pid"]) for w in per]
    counters = st["counters"]
    assert isinstance(counters, dict)
    return pids, {k: int(v) for k, v in counters.items() if isinstance(v, int)}


def _start_relay(tmp: str, echo: tuple[str, int], workers: int, pin: bool,
                 flows: int, io: str, coalesce_us: str,
                 ) -> tuple[subprocess.Popen[bytes], tuple[str, int], str]:
    secret = os.path.join(tmp, "secret")
    Path(secret).write_bytes(SECRET.hex().encode() + b"\n")
    control = os.path.join(tmp, f"relay-{workers}.sock")
    argv = [sys.executable, "-m", "appliance.relay.cli", "--listen", "127.0.0.1:0",
            "--workers", str(workers), "--transceiver", f"0={echo[0]}:{echo[1]}",
            "--secret-file", secret, "--control", control, "--log-level", "warning",
            "--new-flow-rate", str(max(1000, flows * 10)), "--max-flows", str(flows * 2),
            "--io", io, "--coalesce-us", coalesce_us]
    if pin:
        argv.append("--pin")
    # The relay must not inherit this process's pinning (its --pin picks CPUs from what it
    # inherits): widen our own affinity while it forks, then narrow it again.
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, ALL_CPUS)
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, cwd=ROOT)
    finally:
        os.sched_setaffinity(0, mine)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("relay listening on "):
        proc.kill()
        raise SystemExit(f"relay did not start: {line!r}")
    public = line.split()[3]
    host, _, port = public.rpartition(":")
    return proc, (host, int(port)), control


def _row(name: str, r: Result, base: Result | None, fwd: float | None, cpu: float | None,
         per_wake: float | None = None) -> str:
    cols = [f"{name:<27}", f"{r.sent / r.seconds:>7.0f}", f"{r.received / r.seconds:>7.0f}",
            f"{100 * r.loss:>6.2f}%", f"{r.pct(0.5, 'late'):>8.1f}", f"{r.pct(0.99, 'late'):>8.1f}",
            f"{r.pct(0.5):>8.1f}", f"{r.pct(0.99):>8.1f}"]
    if base is not None:
        cols += [f"{r.pct(0.5) - base.pct(0.5):>+8.1f}", f"{r.pct(0.99) - base.pct(0.99):>+8.1f}"]
    else:
        cols += [f"{'':>8}", f"{'':>8}"]
    if fwd is not None and cpu is not None:
        cols += [f"{fwd:>10.0f}", f"{100 * cpu:>6.0f}%", f"{fwd / cpu if cpu else 0:>9.0f}",
                 f"{1e6 * cpu / fwd if fwd else 0:>7.2f}", f"{per_wake or 0:>6.1f}"]
    return " ".join(cols)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flows", type=int, default=1000, help="K flows (default 1000)")
    ap.add_argument("--rate", type=float, default=50_000,
                    help="fixed rate, datagrams/s from clients (default 50000 = 1000 x 50/s)")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each measurement")
    ap.add_argument("--workers", default="1,2", help="relay worker counts to run (default 1,2)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin relay workers/generator")
    ap.add_argument("--io", default=None,
                    help="relay I/O paths to compare, comma-separated: python, mmsg, auto "
                         "(default python,mmsg; python alone when the extension is not built)")
    ap.add_argument("--coalesce-us", default="20",
                    help="relay --coalesce-us values to compare, comma-separated (default 20)")
    args = ap.parse_args()
    if args.io is None:
        try:
            import appliance.netio._mmsg  # noqa: F401
            args.io = "python,mmsg"
        except ImportError:
            args.io = "python"
    pin = not args.no_pin
    cpus = sorted(os.sched_getaffinity(0))
    if pin:
        os.sched_setaffinity(0, {cpus[-1]})
    print(f"# machine: {os.cpu_count()} CPUs ({_cpu_model()}), Python {sys.version.split()[0]}, "
          f"generator on CPU {cpus[-1] if pin else 'any'}, {args.flows} flows x {PAYLOAD} B")
    print("# latency in µs; gen-late = the generator's read delay (excluded from p50/p99); "
          "µs/fwd = relay CPU per forwarded datagram; /wake = datagrams per relay wake-up")
    print(f"{'scenario':<27} {'sent/s':>7} {'recv/s':>7} {'loss':>7} {'gen-late':>8} "
          f"{'late p99':>8} {'p50':>8} {'p99':>8} {'+p50':>8} {'+p99':>8} {'relay fwd/s':>10} "
          f"{'cpu':>7} {'fwd/cpu-s':>9} {'µs/fwd':>7} {'/wake':>6}")
    codec = UfragCodec(SECRET)
    runs = [(int(w), io, cu) for w in args.workers.split(",") for io in args.io.split(",")
            for cu in args.coalesce_us.split(",")]
    for workers, io, coalesce_us in runs:
        gen = Generator(args.flows)
        tmp = tempfile.mkdtemp(prefix="relay-bench-")
        proc, public, control = _start_relay(tmp, gen.echo_addr, workers, pin, args.flows, io,
                                             coalesce_us)
        name = f"{io} c{float(coalesce_us):g}"
        try:
            gen.handshake(public, codec)
            for label, rate in ((f"{args.rate:.0f}/s", args.rate), ("max", None)):
                base = gen.run(gen.echo_addr, args.seconds, rate)
                print(_row(f"direct  {label}", base, None, None, None), flush=True)
                pids, c0 = _worker_stats(control)
                cpu0, t0 = cpu_seconds(pids), time.perf_counter()
                r = gen.run(public, args.seconds, rate)
                pids, c1 = _worker_stats(control)
                cpu = (cpu_seconds(pids) - cpu0)
                wall = time.perf_counter() - t0
                fwd = (c1["packets_out"] - c0["packets_out"]) / wall
                wakes = c1.get("wakeups", 0) - c0.get("wakeups", 0)
                per_wake = (c1["packets_in"] - c0["packets_in"]) / wakes if wakes else None
                print(_row(f"relay x{workers} {name} {label}", r, base, fwd, cpu / wall,
                           per_wake), flush=True)
            st = _control(control)
            print(f"#   relay x{workers} {name} (reports io {st.get('io')}): drops "
                  f"{st['counters']['drops']}")
        finally:
            proc.terminate()
            proc.wait(10)
            for c in gen.clients:
                c.close()
            gen.echo.close()
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
