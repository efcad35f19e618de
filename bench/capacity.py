"""Sessions per core and admission under overload: the appliance and aiortc, in one run.

One command prints the whole table (issue 32 items 2-3); the lead runs it on a quiet box:

    .venv/bin/python bench/capacity.py --placement a,b,c --pattern continuous,conversational \
        --ramps 5,15,25 --overload 1.5,2.5 --json /tmp/capacity.json
    .venv/bin/python bench/capacity.py --quick --servers pcm --placement b   # validation

**Placements** (``--placement``, a comma list; CPU numbers of a 2-CPU box, see
:func:`affinity_plan`):

* ``a`` the transceiver alone on a core: the transceiver process on CPU 0; relay, signaling,
  the supervisor, the load generator and this script on CPU 1;
* ``b`` the whole ``appliance up`` (supervisor, signaling, relay, transceiver) on CPU 0, the
  load generator on CPU 1: a user's one-core VM;
* ``c`` the default ``appliance up`` (its default transceiver count) unpinned on both CPUs,
  with a busy-loop process pinned on CPU 0 for the whole placement, the load generator
  unpinned: a box with a noisy neighbour.

aiortc's echo server (one asyncio process) is on CPU 0 for a and b (the same plan, so it is
measured once and quoted for both) and is not run in c. The appliance runs with one
transceiver in a and b (``appliance up --transceivers 1``), so its figure is what one core
carries. **Sessions per core** are reported for a and b as ``N passing / CPU at N`` of the
measured core (the transceiver in a, the whole tree in b), and as a ratio to aiortc's
measured in the same run, by N and by CPU.

**Finding what fits**: for each server the load generator (``python -m appliance.loadgen``,
its own process) opens N real WebRTC voice sessions, ramping at ``--rate``, and holds them
all for ``--steady`` s. N climbs a ladder (doubling) until a step fails, then bisects. A step
passes when no session failed, end-to-end loss < 1 %, and p99 echo round trip − the baseline
p50 (the same server at N = 1) ≤ ``--max-added`` ms. CPU is read from /proc (utime + stime)
over the steady window only; resident memory per session is the RSS growth from idle to N.

**Patterns** (``--pattern``, a comma list): ``continuous`` is the all-echo worst case (a tone
with a 100 ms gap every second, both directions busy all the time); ``conversational`` is a
conversation's duty cycle, caller 40 %, agent 40 %, both silent 20 %: against an echo the
caller talks 40 % of a ``--cycle`` and then listens, so each direction carries speech 40 % of
the time, as in the conversation (``appliance.loadgen.media.conversational_frames``). Its
steady window is rounded up to whole cycles.

**Overload** (``--overload 1.5,2.5`` x ``--ramps 5,15,25``): after the fit (continuous, the
first pattern listed), each appliance server is offered F x what fitted at each ramp rate,
and every (placement, server, ramp, F) row is judged (:func:`judge_overload`): every admitted
call < 1 % loss (its worst session) and no delay growth (p99 RTT − the fit step's p99 ≤
``--max-growth`` ms), at least 85 % of the calls that fit admitted, refusals 503 with p99
latency < 50 ms and ``Retry-After``. The load generator keeps each refused call's
``Retry-After`` (every one must have it); and once the ramp is over, the script POSTs a few
offers that are not SDP: admission decides before the offer is read, so a saturated
appliance answers 503 (checked for ``Retry-After`` too) and one with room answers 4xx (no
call made).
aiortc has no admission and gets no overload rows.

On a small machine the load generator competes with the server for CPU: its own CPU share is
printed for every step, and a step where it exceeds ``--loadgen-limit`` of a core is marked
"LG" (the figure then says more about the load generator than the server). For the appliance
each step also reads the transceivers' headroom gauges from ``/metrics`` (issue 23).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PY = sys.executable
PAGE = os.sysconf("SC_PAGE_SIZE")
ALL_CPUS = frozenset(os.sched_getaffinity(0))  # what this script may use, as started

# How each appliance mode is asked for. Passthrough is an agent choice in `appliance up`;
# override with --up-args-* if the flag lands under another name.
DEFAULT_UP_ARGS = {
    "passthrough": ["--agent", "passthrough"],
    "pcm": ["--agent", "echo"],
}


# -- processes -----------------------------------------------------------------------


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def process_tree(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += _children(p)
    return seen


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of the processes, to the nanosecond: each one's process CPU-time clock
    (clock_getcpuclockid(3); Linux encodes it as ``(~pid << 3) | CPUCLOCK_SCHED``), which
    counts threads that have already exited, as /proc/PID/stat's utime + stime do, but is
    not rounded to 10 ms clock ticks (a short window of a light process read as 0 there).
    A process that has gone counts 0."""
    total = 0.0
    for pid in pids:
        try:
            total += time.clock_gettime((~pid << 3) | 2)
        except OSError:
            pass  # ended between the listing and the read
    return total


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, IndexError):
            pass
    return total


def wait_http(url: str, timeout: float, proc: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            urllib.request.urlopen(url + "/v1/sessions", timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers HTTP: ready enough
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} not ready within {timeout} s")


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen[Any]
    measure: str  # substring of the cmdline of the process(es) whose CPU is "the core"

    def pids(self) -> list[int]:
        return process_tree(self.proc.pid)

    def core_pids(self) -> list[int]:
        tree = self.pids()
        core = [p for p in tree if self.measure in cmdline(p)]
        return core or tree


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(8)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def appliance_up_available() -> bool:
    r = subprocess.run([PY, "-m", "appliance", "--help"], capture_output=True, text=True,
                       cwd=REPO)
    return any(line.split()[:1] == ["up"] for line in r.stdout.splitlines())


@contextmanager
def start_appliance(mode: str, extra: list[str] | None = None, *,
                    transceivers: int | None = 1, keep_log: Path | None = None
                    ) -> Iterator[Server]:
    """``python -m appliance up`` on loopback with its own state directory
    (``transceivers=None``: up's default count); ``keep_log``: a directory its log is
    copied into when it stops (the state directory is removed)."""
    http = free_port()
    state = tempfile.mkdtemp(prefix="capacity-")
    # --udp port 0: `up` picks one free for UDP and TCP alike (ICE-TCP shares the number).
    args = [PY, "-m", "appliance", "up", "--http", f"127.0.0.1:{http}",
            "--udp", "127.0.0.1:0", "--public-address", "127.0.0.1", "--state-dir", state,
            *([] if transceivers is None else ["--transceivers", str(transceivers)]),
            *(extra or [])]
    log = open(Path(state) / "appliance.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        # 30 s used to be plenty; on a shared machine at load 15-20, `up` took 66 s to import
        # and start its children (2026-12-01).
        wait_http(f"http://127.0.0.1:{http}", 180, proc)
        yield Server(f"appliance {mode}", f"http://127.0.0.1:{http}", proc,
                     "appliance transceiver ")
    finally:
        _stop(proc)
        log.close()
        if keep_log is not None:
            keep_log.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(state) / "appliance.log",
                        keep_log / f"{mode}-{time.strftime('%H%M%S')}.log")
        shutil.rmtree(state, ignore_errors=True)


@contextmanager
def start_aiortc() -> Iterator[Server]:
    proc = subprocess.Popen([PY, str(HERE / "aiortc_echo_server.py"), "--port", "0"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening "):
            raise RuntimeError(f"aiortc server did not start: {line!r}")
        yield Server("aiortc", line.split()[1], proc, "aiortc_echo_server")
    finally:
        _stop(proc)
        if proc.stdout is not None:
            proc.stdout.close()


# -- the pure parts: placement -> affinity, steady window, judging ------------------------

PLACEMENTS = ("a", "b", "c")
PATTERNS = ("continuous", "conversational")
HOG_CPU = 0  # placement c: the busy loop's core


@dataclass(frozen=True, slots=True)
class Affinity:
    """Where each process of one server's measurement runs; ``None`` = unpinned (every
    CPU this script may use). ``measured`` is the server's core process (the transceiver, or
    the aiortc process); ``rest`` the rest of its tree (supervisor, signaling, relay)."""

    measured: frozenset[int] | None
    rest: frozenset[int] | None
    loadgen: frozenset[int] | None  # the load generator, and this script
    hog: frozenset[int] | None  # a busy loop for the whole placement (c)
    core: str  # whose CPU is "the core": "transceiver" (the measured process) or "tree"
    per_core: bool  # sessions per core means something: the server has one core to itself
    transceivers: int | None  # `appliance up --transceivers`; None = up's default


def affinity_plan(placement: str, server: str, ncpu: int) -> Affinity | None:
    """The CPUs for ``server`` ("aiortc" or "appliance") in ``placement``; None when that
    server is not measured there (aiortc in c: it has no admission and no core of its own)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}")
    if server not in ("aiortc", "appliance"):
        raise ValueError(f"server must be aiortc or appliance, not {server!r}")
    if ncpu < 2:
        raise ValueError(f"placements need two CPUs (0 and 1); this script may use {ncpu}")
    zero, one = frozenset({0}), frozenset({1})
    if server == "aiortc":
        # One process: on CPU 0 for a and b alike (the same plan, measured once).
        return None if placement == "c" else Affinity(zero, zero, one, None, "tree", True, None)
    if placement == "a":
        return Affinity(zero, one, one, None, "transceiver", True, 1)
    if placement == "b":
        return Affinity(zero, zero, one, None, "tree", True, 1)
    return Affinity(None, None, None, frozenset({HOG_CPU}), "tree", False, None)


def steady_for(pattern: str, steady: float, cycle: float) -> float:
    """The steady window: for ``conversational``, rounded up to whole talk-listen cycles so
    the CPU figure averages over whole cycles, not a talking or a silent stretch."""
    if pattern == "conversational":
        return cycle * math.ceil(steady / cycle - 1e-9)
    return steady


@dataclass(frozen=True, slots=True)
class Criteria:
    """Issue 32 item 2's acceptance of one overload row."""

    max_loss: float = 0.01  # every admitted call: loss below this
    max_growth_ms: float = 20.0  # p99 RTT over the fit step's p99 ("no delay growth")
    min_admitted: float = 0.85  # of the calls that fit
    refused_p99_ms: float = 50.0  # the 503s' latency
    loadgen_limit: float = 0.9  # load generator cores above which the row is not trusted


def judge_overload(row: dict[str, Any], c: Criteria) -> list[str]:
    """Why ``row`` (an :func:`overload_row`) fails; empty = PASS. A criterion that could not
    be checked (no RTT, no probe refused) fails too: nothing unverified passes."""
    why: list[str] = []
    if not row["fit_passed"]:  # then "no growth against the fit" compares with a failure
        why.append(f"the fit step (N = {row['fits']}) failed")
    if row["failed_admitted"]:
        why.append(f"{row['failed_admitted']} admitted failed")
    if row["completed"]:
        worst = row["loss_worst_session"]
        if worst is None or worst >= c.max_loss:
            why.append(f"worst loss {100 * (1.0 if worst is None else worst):.2f} %")
        growth = row["rtt_p99_growth_vs_fit_ms"]
        if growth is None:
            why.append("no RTT")
        elif growth > c.max_growth_ms:
            why.append(f"p99 +{growth:.0f} ms vs fit")
    need = math.ceil(c.min_admitted * row["fits"] - 1e-9)
    if row["admitted"] < need:
        why.append(f"admitted {row['admitted']} < {need}")
    if row["refused"]:
        p99 = row["refused_p99_ms"]
        if p99 is None or p99 >= c.refused_p99_ms:
            why.append(f"503 p99 {'-' if p99 is None else f'{p99:.0f}'} ms")
        # Every refused call's own 503 (the load generator keeps its Retry-After), and the
        # probes' where they were refused; a load generator that does not say, and no
        # probe refused, leaves it unchecked.
        with_ra = row.get("refused_with_retry_after")
        refused = [pr for pr in row["probes"] if pr["status"] == 503]
        if with_ra is None and not refused:
            why.append("Retry-After unchecked (no probe refused)")
        elif ((with_ra is not None and with_ra < row["refused"])
              or any(not pr["retry_after"] for pr in refused)):
            why.append("503 without Retry-After")
    if row["loadgen_cpu"] > c.loadgen_limit:
        why.append("LG")
    return why


def overload_row(summary: dict[str, Any], *, fits: int, fit_rtt_p99: float | None,
                 probes: list[dict[str, Any]], loadgen_cpu: float,
                 fit_passed: bool = True) -> dict[str, Any]:
    """One overload step's figures from the load generator's summary. Admitted = offered −
    refused with 503 (a call that got past admission); of those, ``completed`` ran clean.
    ``fit_passed``: the step at ``fits`` met its own criteria (``--fits N`` may not)."""
    refused = summary.get("refused", 0)
    admitted = summary["requested"] - refused
    p99 = summary["rtt_p99_ms"]
    return {
        "offered": summary["requested"], "fits": fits, "fit_passed": fit_passed,
        "admitted": admitted,
        "completed": summary["completed"], "failed_admitted": admitted - summary["completed"],
        "refused": refused, "loss": summary["loss"],
        "loss_worst_session": summary["loss_worst_session"], "rtt_p99_ms": p99,
        "fit_rtt_p99_ms": fit_rtt_p99,
        "rtt_p99_growth_vs_fit_ms": None if p99 is None or fit_rtt_p99 is None
        else p99 - fit_rtt_p99,
        "refused_p50_ms": summary.get("refused_p50_ms"),
        "refused_p99_ms": summary.get("refused_p99_ms"),
        "refused_codes": summary.get("refused_codes"),
        "refused_with_retry_after": summary.get("refused_with_retry_after"), "probes": probes,
        "loadgen_cpu": loadgen_cpu,
    }


def parse_list(text: str, kind: type[float] | type[str] = str) -> list[Any]:
    """A comma list from the command line ("5,15,25")."""
    return [kind(x.strip()) for x in text.split(",") if x.strip()]


# -- placing processes ---------------------------------------------------------------


def _cpus(cpus: frozenset[int] | None) -> str:
    """taskset's list; unpinned is every CPU this script started with."""
    return ",".join(str(c) for c in sorted(cpus if cpus is not None else ALL_CPUS))


def apply_affinity(server: Server, plan: Affinity) -> None:
    """Pin the server's tree by ``plan``, every thread (``taskset -a``). Run before each
    step: a child the supervisor restarted inherits the supervisor's CPUs, not its own."""
    core = set(server.core_pids())
    for pid in server.pids():
        subprocess.run(["taskset", "-a", "-p", "-c",
                        _cpus(plan.measured if pid in core else plan.rest), str(pid)],
                       capture_output=True, check=False)


@contextmanager
def cpu_hog(cpus: frozenset[int] | None) -> Iterator[subprocess.Popen[Any] | None]:
    """A busy loop pinned on ``cpus`` while the block runs (placement c's neighbour)."""
    if cpus is None:
        yield None
        return
    pinned = set(cpus)
    proc = subprocess.Popen([PY, "-c", "while True: pass"],
                            preexec_fn=lambda: os.sched_setaffinity(0, pinned))  # noqa: PLW1509
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


# -- one step ------------------------------------------------------------------------


def run_loadgen(url: str, n: int, *, rate: float, duration: float, agent: str | None = None,
                connect_timeout: float = 10.0, extra: list[str] | None = None,
                ) -> tuple[float, subprocess.Popen[str]]:
    """Start the load generator in its own process; returns (start time, process)."""
    cmd = [PY, "-m", "appliance.loadgen", "--url", url, "-n", str(n), "--rate", str(rate),
           "--duration", str(duration), "--connect-timeout", str(connect_timeout),
           "--json", "-", *(["--agent", agent] if agent else []), *(extra or [])]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    return time.monotonic(), proc


@dataclass
class Step:
    n: int
    summary: dict[str, Any]
    server_cpu: float  # cores (1.0 = one core busy) over the steady window: "the core"
    server_cpu_all: float  # the same for the whole process tree
    rss_per_session: float  # bytes
    us_per_packet: float | None
    loadgen_cpu: float  # cores, whole run
    headroom: dict[str, float] = field(default_factory=dict)  # the appliance's /metrics
    probes: list[dict[str, Any]] = field(default_factory=list)  # overload: POSTs not SDP
    passed: bool = False
    why: list[str] = field(default_factory=list)


@dataclass
class Run:
    """What every step of one (placement, server, pattern) shares."""

    server: Server
    plan: Affinity
    pattern: str
    args: argparse.Namespace
    rest_complexity: float | None = None  # the transceivers' Opus complexity before any load

    def loadgen_args(self) -> list[str]:
        if self.pattern == "conversational":
            return ["--pattern", "conversational", "--cycle", str(self.args.cycle)]
        return []

    def steady(self, steady: float) -> float:
        return steady_for(self.pattern, steady, self.args.cycle)

    def core_pids(self) -> list[int]:
        """The processes whose CPU (and memory) is "the core" in this placement."""
        return self.server.core_pids() if self.plan.core == "transceiver" else self.server.pids()


def probe(url: str) -> dict[str, Any]:
    """POST an offer that is not SDP: a saturated appliance refuses it (503) before it reads
    the offer; one with room passes it on and the transceiver rejects it (4xx, no call)."""
    req = urllib.request.Request(url + "/v1/sessions", data=b"v=0\r\n", method="POST",
                                 headers={"Content-Type": "application/sdp"})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            status, headers = r.status, r.headers
    except urllib.error.HTTPError as exc:
        status, headers = exc.code, exc.headers
    except OSError as exc:
        return {"status": None, "retry_after": None, "ms": None, "error": str(exc)}
    return {"status": status, "retry_after": headers.get("Retry-After"),
            "ms": round(1000 * (time.monotonic() - t), 1)}


def wait_rested(run: Run, limit: float = 60.0) -> float:
    """Wait (up to ``limit`` s) until the transceivers encode at the complexity they had
    before any load; returns the seconds waited. The complexity controller steps back up
    one step per 5 s of low load (transceiver/degrade.py) and admits only up to 0.5 while
    degraded, so a step started right after one that degraded the calls would be judged on
    that step's hysteresis (refusals under 85 % of the fit), not on its own offer."""
    if not run.server.name.startswith("appliance"):
        return 0.0
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        cx = read_headroom(run.server.url).get("complexity")
        if cx is not None:
            if run.rest_complexity is None:
                run.rest_complexity = cx  # the first read comes before the first step's load
            if cx >= run.rest_complexity:
                break
        time.sleep(0.5)
    return time.monotonic() - t0


def measure(run: Run, n: int, *, rate: float, steady: float, probes: int = 0) -> Step:
    server = run.server
    rested = wait_rested(run)
    if rested > 1.0:
        print(f"  (waited {rested:.0f} s for the calls' complexity to recover)", flush=True)
    apply_affinity(server, run.plan)
    steady = run.steady(steady)
    ramp = n / rate
    duration = ramp + steady + 1.0
    rss_idle = rss_bytes(run.core_pids())
    t0, proc = run_loadgen(server.url, n, rate=rate, duration=duration,
                           extra=run.loadgen_args())
    # The steady window: every session is connected (ramp + 1 s of setup slack) and none has
    # stopped (the first session stops at ~duration after its own connection).
    win_start, win_end = t0 + ramp + 1.0, t0 + duration - 0.5
    samples: dict[str, float] = {}
    headroom: dict[str, float] = {}
    probed: list[dict[str, Any]] = []

    def sampler() -> None:
        while time.monotonic() < win_start:
            time.sleep(0.05)
        core, tree = run.core_pids(), server.pids()
        samples.update(t0=time.monotonic(), c0=cpu_seconds(core), a0=cpu_seconds(tree))
        # Every call has been offered: a saturated appliance now refuses the probes.
        for _ in range(probes):
            probed.append(probe(server.url))
            time.sleep(0.1)
        while time.monotonic() < win_end:
            time.sleep(0.05)
        samples.update(t1=time.monotonic(), c1=cpu_seconds(core), a1=cpu_seconds(tree),
                       rss=rss_bytes(core))
        if server.name.startswith("appliance"):
            headroom.update(read_headroom(server.url))

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    out, _ = proc.communicate(timeout=duration + 120)
    th.join(5)
    report = json.loads(out)
    summary = report["summary"]
    # Per-session setup times, for the distribution plot (bench/plots.py).
    summary["setup_first_echo_ms"] = [r.get("setup_first_echo_ms") for r in report["sessions"]
                                      if r.get("setup_first_echo_ms") is not None]
    span = samples.get("t1", 0) - samples.get("t0", 0)
    cpu = (samples.get("c1", 0) - samples.get("c0", 0)) / span if span > 0 else 0.0
    cpu_all = (samples.get("a1", 0) - samples.get("a0", 0)) / span if span > 0 else 0.0
    live = summary["completed"] or n
    pps = live * 50  # packets in per second (each is also one packet out)
    return Step(
        n=n, summary=summary, server_cpu=cpu, server_cpu_all=cpu_all,
        rss_per_session=max(0.0, samples.get("rss", rss_idle) - rss_idle) / max(live, 1),
        us_per_packet=(cpu / pps * 1e6) if pps and cpu else None,
        loadgen_cpu=summary["loadgen_cpu_s"] / max(summary["wall_s"], 1e-9),
        headroom=headroom, probes=probed,
    )


_HEADROOM: dict[str, tuple[str, Callable[[list[float]], float]]] = {
    "appliance_transceiver_busy_ratio": ("busy", max),
    "appliance_transceiver_cpu_ratio": ("cpu", max),
    "appliance_transceiver_loop_lag_max_seconds": ("lag", max),
    "appliance_transceiver_opus_complexity": ("complexity", min),
    "appliance_transceiver_room_calls": ("room", sum),
    "appliance_transceiver_call_cost_ratio": ("call_cost", max),
    "appliance_transceiver_frame_late_p90_seconds": ("late", max),
    "appliance_transceiver_available_cores": ("avail", min),
    "appliance_transceiver_receive_backlog_max_seconds": ("backlog", max),
}


def read_headroom(url: str) -> dict[str, float]:
    """The transceivers' headroom gauges from signaling's /metrics: the busiest one's busy,
    CPU, lag, frame lateness (p90) and call cost, the lowest Opus complexity and available
    cores, the room left in all of them."""
    seen: dict[str, list[float]] = {}
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name in _HEADROOM and 'transceiver="' in rest:
            seen.setdefault(name, []).append(float(rest.rsplit(" ", 1)[1]))
    return {_HEADROOM[k][0]: float(_HEADROOM[k][1](v)) for k, v in seen.items()}


def judge(step: Step, baseline_rtt: float | None, *, max_loss: float, max_added: float,
          loadgen_limit: float) -> None:
    s = step.summary
    if s["failed"]:
        step.why.append(f"{s['failed']} failed")
    if s["loss"] is None or s["loss"] >= max_loss:
        step.why.append(f"loss {100 * (s['loss'] or 1):.2f} %")
    if s["rtt_p99_ms"] is None:
        step.why.append("no RTT")
    elif baseline_rtt is not None and s["rtt_p99_ms"] - baseline_rtt > max_added:
        step.why.append(f"p99 +{s['rtt_p99_ms'] - baseline_rtt:.0f} ms")
    if step.loadgen_cpu > loadgen_limit:
        step.why.append("LG")
    step.passed = not step.why


def _judged(run: Run, n: int, baseline: float | None, steady: float, log: list[Step],
            label: str) -> Step:
    a = run.args
    step = measure(run, n, rate=a.rate, steady=steady)
    judge(step, baseline, max_loss=a.max_loss, max_added=a.max_added,
          loadgen_limit=a.loadgen_limit)
    log.append(step)
    print_step(label, step, baseline)
    return step


def find_capacity(run: Run, log: list[Step], label: str) -> tuple[int, float | None]:
    """Ladder then bisect (or ``--fits N``: one step at N); returns (largest passing N,
    baseline RTT p50 in ms)."""
    a = run.args
    # A throwaway call first: the first session on a fresh server pays for imports and
    # codec initialisation, which is not what the baseline should hold.
    measure(run, 1, rate=a.rate, steady=1.0)
    # The baseline defines "added" round trip, so it is judged on failures and loss only.
    base = _judged(run, 1, None, min(a.steady, 5.0), log, label)
    baseline = base.summary["rtt_p50_ms"]
    if a.fits is not None:
        _judged(run, a.fits, baseline, a.steady, log, label)
        return a.fits, baseline
    if not base.passed:
        return 0, baseline
    good, bad = 1, None
    n = a.start
    while n <= a.max:
        if _judged(run, n, baseline, a.steady, log, label).passed:
            good = n
            n *= 2
        else:
            bad = n
            break
    for _ in range(a.bisect if bad is not None else 0):
        assert bad is not None
        if bad - good <= max(2, good // 10):
            break
        mid = (good + bad) // 2
        passed = _judged(run, mid, baseline, a.steady, log, label).passed
        good, bad = (mid, bad) if passed else (good, mid)
    return good, baseline


def overload_step(run: Run, fits: int, factor: float, ramp: float, fitted: Step | None,
                  baseline: float | None, label: str, crit: Criteria) -> dict[str, Any]:
    """Offer ``factor`` x ``fits`` sessions at ``ramp``/s; judge the row."""
    n = max(2, round(factor * fits))
    st = measure(run, n, rate=ramp, steady=run.args.steady, probes=run.args.probes)
    row = overload_row(st.summary, fits=fits,
                       fit_rtt_p99=None if fitted is None else fitted.summary["rtt_p99_ms"],
                       probes=st.probes, loadgen_cpu=st.loadgen_cpu,
                       fit_passed=fitted is not None and fitted.passed)
    row.update(ramp=ramp, factor=factor, headroom=st.headroom, server_cpu=st.server_cpu,
               server_cpu_tree=st.server_cpu_all)
    row["why"] = judge_overload(row, crit)
    row["verdict"] = "FAIL" if row["why"] else "PASS"
    # The step line says what it was; its verdict is the overload judgement (the table).
    st.passed = False
    st.why = [f"overload x{factor:g} at {ramp:g}/s: {row['verdict']}", *row["why"]]
    print_step(label, st, baseline)
    return row


# -- output --------------------------------------------------------------------------

HEAD = (f"{'placement server pattern':<28} {'N':>4} {'cpu':>6} {'µs/pkt':>7} {'KiB/ses':>8} "
        f"{'loss %':>7} {'rtt p50':>8} {'rtt p99':>8} {'setup p50':>9} {'echo p50':>9} "
        f"{'LG cpu':>6}  verdict  [busy lag cx refused]")


def _f(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def print_step(name: str, st: Step, baseline: float | None) -> None:
    s = st.summary
    loss = None if s["loss"] is None else 100 * s["loss"]
    print(f"{name:<28} {st.n:>4} {100 * st.server_cpu:>5.1f}% "
          f"{_f(st.us_per_packet, '{:.0f}'):>7} {st.rss_per_session / 1024:>8.0f} "
          f"{_f(loss, '{:.2f}'):>7} {_f(s['rtt_p50_ms']):>8} {_f(s['rtt_p99_ms']):>8} "
          f"{_f(s['setup_connected_p50_ms']):>9} {_f(s['setup_first_echo_p50_ms']):>9} "
          f"{100 * st.loadgen_cpu:>5.0f}%  "
          f"{_verdict(st)}"
          f"{_headroom_text(st)}", flush=True)


def _verdict(st: Step) -> str:
    if st.passed:
        return "pass"
    if st.why and st.why[0].startswith("overload"):  # judged as a row: PASS/FAIL inside
        return ", ".join(st.why)
    return "FAIL " + ", ".join(st.why)


def _headroom_text(st: Step) -> str:
    h, s = st.headroom, st.summary
    parts = []
    if "busy" in h:
        parts.append(f"busy {100 * h['busy']:.0f}%")
    if "lag" in h:
        parts.append(f"lag {1000 * h['lag']:.1f}ms")
    if "late" in h:
        parts.append(f"late90 {1000 * h['late']:.1f}ms")
    if "avail" in h:
        parts.append(f"avail {h['avail']:.2f}")
    if h.get("backlog"):
        parts.append(f"backlog {1000 * h['backlog']:.0f}ms")
    if "complexity" in h:
        parts.append(f"cx {h['complexity']:.0f}")
    if s.get("refused"):
        parts.append(f"refused {s['refused']} ({_f(s.get('refused_p50_ms'))}/"
                     f"{_f(s.get('refused_p99_ms'))} ms)")
    return "  [" + ", ".join(parts) + "]" if parts else ""


def print_per_core(fits: list[dict[str, Any]]) -> None:
    print("\nsessions per core (placements a and b; × aiortc measured in the same run):")
    print(f"{'placement':<9} {'pattern':<14} {'server':<12} {'N max':>6} {'cpu at N':>9} "
          f"{'N/core by cpu':>14} {'× aiortc by N':>14} {'× by cpu':>9}")
    for r in fits:
        if not r["core_own"]:
            continue
        ref = next((x for x in fits if x["server"] == "aiortc" and x["core_own"]
                    and x["placement"] == r["placement"] and x["pattern"] == r["pattern"]),
                   None)
        print(f"{r['placement']:<9} {r['pattern']:<14} {r['server']:<12} {r['capacity']:>6} "
              f"{_f(None if r['cpu_at_capacity'] is None else 100 * r['cpu_at_capacity']):>8}%"
              f" {_f(r['per_core'], '{:.0f}'):>14} "
              f"{_f(ratio(r, ref, 'capacity'), '{:.2f}'):>14} "
              f"{_f(ratio(r, ref, 'per_core'), '{:.2f}'):>9}")


def ratio(r: dict[str, Any], ref: dict[str, Any] | None, key: str) -> float | None:
    """``r[key] / ref[key]``; None without a reference or a figure."""
    if ref is None or not ref.get(key) or r.get(key) is None:
        return None
    return float(r[key]) / float(ref[key])


def print_overload(rows: list[dict[str, Any]]) -> None:
    print("\noverload (issue 32 item 2; admitted calls < 1 % loss, Δp99 vs fit ≤ max growth, "
          "≥ 85 % of fits admitted, 503 p99 < 50 ms with Retry-After):")
    print(f"{'placement':<9} {'server':<12} {'ramp/s':>6} {'x':>4} {'fits':>5} {'offered':>8} "
          f"{'admitted':>9} {'refused':>8} {'worst %':>8} {'Δp99 ms':>8} {'503 p99':>8} "
          f"{'RA':>4} {'LG cpu':>6}  verdict")
    for o in rows:
        worst = None if o["loss_worst_session"] is None else 100 * o["loss_worst_session"]
        refused = [p for p in o["probes"] if p["status"] == 503]
        with_ra = o.get("refused_with_retry_after")
        ra = (f"{sum(1 for p in refused if p['retry_after'])}/{len(refused)}" if with_ra is None
              else f"{with_ra}/{o['refused']}")
        print(f"{o['placement']:<9} {o['server']:<12} {o['ramp']:>6g} {o['factor']:>4g} "
              f"{o['fits']:>5} {o['offered']:>8} {o['admitted']:>9} {o['refused']:>8} "
              f"{_f(worst, '{:.2f}'):>8} {_f(o['rtt_p99_growth_vs_fit_ms']):>8} "
              f"{_f(o['refused_p99_ms']):>8} {ra:>4} {100 * o['loadgen_cpu']:>5.0f}%  "
              f"{o['verdict']}{'' if not o['why'] else ' ' + ', '.join(o['why'])}")


def machine() -> str:
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{model}, {os.cpu_count()} vCPU, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


def _load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def _server(name: str, args: argparse.Namespace, plan: Affinity
            ) -> AbstractContextManager[Server]:
    if name == "aiortc":
        return start_aiortc()
    mode, _, complexity = name.partition("-c")
    extra = getattr(args, f"up_args_{mode}").split()
    if complexity:
        extra += ["--opus-complexity", complexity]
    if args.keep_logs is not None:
        extra += ["--log-level", "debug"]  # admission's every decision (admission.py)
    return start_appliance(name, extra, transceivers=plan.transceivers,
                           keep_log=None if args.keep_logs is None else Path(args.keep_logs))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--servers", default="aiortc,pcm,passthrough",
                   help="comma list of aiortc, pcm (echo agent), passthrough (default all "
                   "three); pcm-cN is the echo agent with --opus-complexity N (e.g. pcm-c3)")
    p.add_argument("--placement", default="a",
                   help="comma list of a (transceiver alone on CPU 0), b (all of `appliance "
                   f"up` on CPU 0), c (unpinned, a busy loop on CPU {HOG_CPU}); default a")
    p.add_argument("--pattern", default="continuous",
                   help="comma list of continuous (all-echo worst case) and conversational "
                   "(caller 40 %%, agent 40 %%, both silent 20 %%); default continuous")
    p.add_argument("--cycle", type=float, default=2.5,
                   help="conversational: seconds per talk-then-listen cycle (default 2.5)")
    p.add_argument("--rate", type=float, default=25.0, help="sessions/s while finding the fit")
    p.add_argument("--steady", type=float, default=8.0, help="seconds at full N per step")
    p.add_argument("--start", type=int, default=4, help="first N after the baseline N=1")
    p.add_argument("--max", type=int, default=512, help="largest N tried")
    p.add_argument("--bisect", type=int, default=3, help="bisection steps after the ladder")
    p.add_argument("--max-loss", type=float, default=0.01)
    p.add_argument("--max-added", type=float, default=20.0, help="ms of p99 RTT over baseline")
    p.add_argument("--loadgen-limit", type=float, default=0.9,
                   help="load generator CPU (cores) above which a step is not trusted")
    p.add_argument("--up-args-pcm", default=" ".join(DEFAULT_UP_ARGS["pcm"]))
    p.add_argument("--up-args-passthrough", default=" ".join(DEFAULT_UP_ARGS["passthrough"]))
    p.add_argument("--json", default=None, metavar="PATH", help="write everything as JSON")
    p.add_argument("--overload", default="", metavar="F,F",
                   help="after the fit, offer each F x what fitted (e.g. 1.5,2.5; issue 32)")
    p.add_argument("--ramps", default="25", metavar="R,R",
                   help="with --overload: the ramp rates (sessions/s) each F is offered at "
                   "(e.g. 5,15,25; default 25)")
    p.add_argument("--max-growth", type=float, default=20.0,
                   help="overload: ms of p99 RTT over the fit step's p99 that still counts "
                   "as no delay growth (default 20)")
    p.add_argument("--probes", type=int, default=3,
                   help="overload: POSTs that are not SDP, sent once every call is offered, "
                   "to read the 503's Retry-After (default 3)")
    p.add_argument("--fits", type=int, default=None, metavar="N",
                   help="skip the ladder, take N as what fits (baseline N=1 still measured)")
    p.add_argument("--keep-logs", default=None, metavar="DIR",
                   help="run `up` at --log-level debug and keep its log in DIR: each "
                   "admission decision with the figures it was made on")
    p.add_argument("--quick", action="store_true",
                   help="validation: N 2-4, one bisection, 2 s steady (figures mean nothing)")
    args = p.parse_args(argv)
    if args.quick:
        args.start, args.max, args.bisect, args.steady = 2, 4, 1, 2.0
    try:
        args.placements = parse_list(args.placement)
        args.patterns = parse_list(args.pattern)
        args.ramp_list = parse_list(args.ramps, float)
        args.factors = [f for f in parse_list(args.overload, float) if f > 0]
    except ValueError as exc:
        p.error(str(exc))
    for pl in args.placements:
        if pl not in PLACEMENTS:
            p.error(f"unknown placement {pl!r} (a, b or c)")
    for pat in args.patterns:
        if pat not in PATTERNS:
            p.error(f"unknown pattern {pat!r} ({', '.join(PATTERNS)})")
    for name in parse_list(args.servers):
        if name not in ("aiortc", "pcm", "passthrough") and not re.fullmatch(r"pcm-c\d+", name):
            p.error(f"unknown server {name!r}")
    if not {0, 1} <= ALL_CPUS:
        p.error(f"placements pin CPUs 0 and 1; this process may use {sorted(ALL_CPUS)}")
    if not args.ramp_list:
        p.error("--ramps needs at least one rate")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    crit = Criteria(max_loss=args.max_loss, max_growth_ms=args.max_growth,
                    loadgen_limit=args.loadgen_limit)
    print(f"machine: {machine()}; {_load()} (a shared box: figures here are validation only)")
    print(f"criteria: loss < {100 * args.max_loss:g} %, p99 RTT ≤ baseline p50 + "
          f"{args.max_added:g} ms, no failed sessions; {args.steady:g} s steady per step\n")
    print(HEAD)
    up = appliance_up_available()
    fits: list[dict[str, Any]] = []
    overload: list[dict[str, Any]] = []
    done: dict[tuple[str, str, Affinity], dict[str, Any]] = {}  # aiortc: same plan in a and b
    for placement in args.placements:
        hog = affinity_plan(placement, "appliance", len(ALL_CPUS))
        assert hog is not None
        with cpu_hog(hog.hog):
            for name in parse_list(args.servers):
                kind = "aiortc" if name == "aiortc" else "appliance"
                plan = affinity_plan(placement, kind, len(ALL_CPUS))
                if plan is None:
                    print(f"{placement} {name:<26} not run: no admission, no core of its own")
                    continue
                if kind == "appliance" and not up:
                    print(f"{placement} {name:<26} skipped: `python -m appliance up` is not "
                          "available in this tree")
                    continue
                # This script and the load generators it starts.
                os.sched_setaffinity(0, plan.loadgen if plan.loadgen is not None else ALL_CPUS)
                for pattern in args.patterns:
                    key = (name, pattern, plan)
                    if key in done:
                        fits.append(dict(done[key], placement=placement,
                                         measured_in=done[key]["placement"]))
                        print(f"{placement} {name} {pattern}: the same CPUs as in placement "
                              f"{done[key]['placement']}, measured there")
                        continue
                    fits.append(measure_server(name, placement, pattern, plan, args, crit,
                                               overload))
                    done[key] = fits[-1]
        os.sched_setaffinity(0, ALL_CPUS)
    print(f"\n{_load()} at the end")
    print_per_core(fits)
    if overload:
        print_overload(overload)
    if args.json:
        results = {f"{r['placement']}/{r['pattern']}/{r['server']}": r for r in fits}
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "args": vars(args), "results": results,
                       "overload": overload}, f, indent=1, default=sorted)
    return 0


def measure_server(name: str, placement: str, pattern: str, plan: Affinity,
                   args: argparse.Namespace, crit: Criteria,
                   overload: list[dict[str, Any]]) -> dict[str, Any]:
    """Fit, then (appliance, first pattern) the overload rows; returns the fit's record."""
    label = f"{placement} {name} {pattern[:5]}"
    log: list[Step] = []
    with _server(name, args, plan) as server:
        run = Run(server, plan, pattern, args)
        cap, baseline = find_capacity(run, log, label)
        best = next((st for st in reversed(log) if st.n == cap), None)
        if name != "aiortc" and pattern == args.patterns[0] and cap and args.factors:
            for ramp in args.ramp_list:
                for factor in args.factors:
                    row = overload_step(run, cap, factor, ramp, best, baseline, label, crit)
                    row.update(placement=placement, server=name, pattern=pattern)
                    overload.append(row)
    cpu = best.server_cpu if best else None
    return {
        "placement": placement, "pattern": pattern, "server": name, "capacity": cap,
        "core": plan.core, "core_own": plan.per_core,
        "baseline_rtt_p50_ms": baseline, "cpu_at_capacity": cpu,
        "per_core": cap / cpu if plan.per_core and cpu else None,
        "setup_p50_ms": best.summary["setup_first_echo_p50_ms"] if best else None,
        "steps": [{"n": st.n, "server_cpu": st.server_cpu,
                   "server_cpu_tree": st.server_cpu_all, "us_per_packet": st.us_per_packet,
                   "rss_per_session": st.rss_per_session, "loadgen_cpu": st.loadgen_cpu,
                   "passed": st.passed, "why": st.why, "summary": st.summary,
                   "headroom": st.headroom}
                  for st in log],
    }


if __name__ == "__main__":
    sys.exit(main())
