"""Sessions per core: the appliance (passthrough and PCM agent) and aiortc, in one run.

For each server the load generator (``python -m appliance.loadgen``, its own process) opens
N real WebRTC voice sessions, ramping at ``--rate``, and holds them all for ``--steady`` s.
N climbs a ladder (doubling) until a step fails, then bisects. A step passes when

* no session failed, end-to-end loss < 1 %, and
* p99 echo round trip − the baseline p50 (the same server at N = 1) ≤ 20 ms
  ("round trip added by the server under load").

Server CPU is read from /proc (utime + stime of the server process and its children) over
the steady window only, when all N sessions are up; resident memory per session is the RSS
growth from idle to N sessions, divided by N. The appliance runs with one transceiver
(``appliance up --transceivers 1``), so its figure is what *one transceiver core* carries;
the aiortc server is one asyncio process, likewise one core.

    .venv/bin/python bench/capacity.py                       # all three servers
    .venv/bin/python bench/capacity.py --servers aiortc --max 64 --json out.json

On a small machine the load generator competes with the server for CPU: its own CPU share is
printed for every step, and a step where it exceeds ``--loadgen-limit`` of a core is marked
"LG" (the figure then says more about the load generator than the server).

For the appliance each step also reads the transceiver's own headroom figures from
``/metrics`` at the end of its steady window (issue 23): ``busy`` (its CPU share, the
admission signal), the worst loop lag of its last window, the Opus complexity its calls run
at, and what signaling would still admit. **Overload** (``--overload 2.5``): after the
ladder (or at ``--fits N`` without one), each server is offered that many times what fitted;
reported are the calls admitted and their loss and round trip against the step that fitted
(``Δp99``), and the refused calls' 503 latency. aiortc admits everything, so its row shows
what happens without admission.

    .venv/bin/python bench/capacity.py --servers aiortc,pcm --overload 2.5
    .venv/bin/python bench/capacity.py --servers pcm --fits 60 --overload 2.5   # no ladder
"""

from __future__ import annotations

import argparse
import json
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

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
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError):
            pass
    return total / CLK_TCK


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
                    transceivers: int = 1) -> Iterator[Server]:
    """``python -m appliance up`` on loopback with its own state directory."""
    http = free_port()
    state = tempfile.mkdtemp(prefix="capacity-")
    # --udp port 0: `up` picks one free for UDP and TCP alike (ICE-TCP shares the number).
    args = [PY, "-m", "appliance", "up", "--http", f"127.0.0.1:{http}",
            "--udp", "127.0.0.1:0", "--public-address", "127.0.0.1", "--state-dir", state,
            "--transceivers", str(transceivers), *(extra or [])]
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
    server_cpu: float  # cores (1.0 = one core busy) over the steady window, measured process
    server_cpu_all: float  # the same for the whole process tree
    rss_per_session: float  # bytes
    us_per_packet: float | None
    loadgen_cpu: float  # cores, whole run
    headroom: dict[str, float] = field(default_factory=dict)  # the appliance's /metrics
    passed: bool = False
    why: list[str] = field(default_factory=list)


def measure(server: Server, n: int, *, rate: float, steady: float,
            agent: str | None = None) -> Step:
    ramp = n / rate
    duration = ramp + steady + 1.0
    rss_idle = rss_bytes(server.core_pids())
    t0, proc = run_loadgen(server.url, n, rate=rate, duration=duration, agent=agent)
    # The steady window: every session is connected (ramp + 1 s of setup slack) and none has
    # stopped (the first session stops at ~duration after its own connection).
    win_start, win_end = t0 + ramp + 1.0, t0 + duration - 0.5
    samples: dict[str, float] = {}
    headroom: dict[str, float] = {}

    def sampler() -> None:
        while time.monotonic() < win_start:
            time.sleep(0.05)
        core, tree = server.core_pids(), server.pids()
        samples.update(t0=time.monotonic(), c0=cpu_seconds(core), a0=cpu_seconds(tree))
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
        headroom=headroom,
    )


_HEADROOM = {"appliance_transceiver_busy_ratio": "busy",
             "appliance_transceiver_cpu_ratio": "cpu",
             "appliance_transceiver_loop_lag_max_seconds": "lag",
             "appliance_transceiver_opus_complexity": "complexity",
             "appliance_transceiver_room_calls": "room",
             "appliance_transceiver_call_cost_ratio": "call_cost"}


def read_headroom(url: str) -> dict[str, float]:
    """Transceiver 0's headroom gauges from signaling's /metrics (one transceiver here)."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name in _HEADROOM and 'transceiver="0"' in rest:
            out[_HEADROOM[name]] = float(rest.rsplit(" ", 1)[1])
    return out

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


def pin_server(server: Server, server_cpu: int, other_cpu: int) -> None:
    """The measured process(es) alone on ``server_cpu``; the rest of the tree elsewhere."""
    core = set(server.core_pids())
    for pid in server.pids():
        subprocess.run(["taskset", "-a", "-p", "-c",
                        str(server_cpu if pid in core else other_cpu), str(pid)],
                       capture_output=True, check=False)


def find_capacity(server: Server, args: argparse.Namespace, agent: str | None,
                  log: list[Step]) -> tuple[int, float | None]:
    """Ladder then bisect; returns (largest passing N, baseline RTT p50 in ms)."""
    if args.pin:
        pin_server(server, 0, 1)
    # A throwaway call first: the first session on a fresh server pays for imports and
    # codec initialisation, which is not what the baseline should hold.
    measure(server, 1, rate=args.rate, steady=1.0, agent=agent)
    base = measure(server, 1, rate=args.rate, steady=min(args.steady, 5.0), agent=agent)
    baseline = base.summary["rtt_p50_ms"]
    # The baseline defines "added" round trip, so it is judged on failures and loss only.
    judge(base, None, max_loss=args.max_loss, max_added=args.max_added,
          loadgen_limit=args.loadgen_limit)
    log.append(base)
    print_step(server.name, base, baseline)
    if not base.passed:
        return 0, baseline
    good, bad = 1, None
    n = args.start
    while n <= args.max:
        step = measure(server, n, rate=args.rate, steady=args.steady, agent=agent)
        judge(step, baseline, max_loss=args.max_loss, max_added=args.max_added,
              loadgen_limit=args.loadgen_limit)
        log.append(step)
        print_step(server.name, step, baseline)
        if step.passed:
            good = n
            n *= 2
        else:
            bad = n
            break
    for _ in range(args.bisect if bad is not None else 0):
        if bad - good <= max(2, good // 10):
            break
        mid = (good + bad) // 2
        step = measure(server, mid, rate=args.rate, steady=args.steady, agent=agent)
        judge(step, baseline, max_loss=args.max_loss, max_added=args.max_added,
              loadgen_limit=args.loadgen_limit)
        log.append(step)
        print_step(server.name, step, baseline)
        good, bad = (mid, bad) if step.passed else (good, mid)
    return good, baseline


def skip_ladder(server: Server, args: argparse.Namespace,
                log: list[Step]) -> tuple[int, float | None]:
    """``--fits N``: the baseline (N = 1) and one step at N, no search."""
    if args.pin:
        pin_server(server, 0, 1)
    measure(server, 1, rate=args.rate, steady=1.0)  # warm-up, as find_capacity
    base = measure(server, 1, rate=args.rate, steady=min(args.steady, 5.0))
    baseline = base.summary["rtt_p50_ms"]
    judge(base, None, max_loss=args.max_loss, max_added=args.max_added,
          loadgen_limit=args.loadgen_limit)
    log.append(base)
    print_step(server.name, base, baseline)
    step = measure(server, args.fits, rate=args.rate, steady=args.steady)
    judge(step, baseline, max_loss=args.max_loss, max_added=args.max_added,
          loadgen_limit=args.loadgen_limit)
    log.append(step)
    print_step(server.name, step, baseline)
    return args.fits, baseline


# -- output --------------------------------------------------------------------------

HEAD = (f"{'server':<22} {'N':>4} {'cpu':>6} {'µs/pkt':>7} {'KiB/ses':>8} {'loss %':>7} "
        f"{'rtt p50':>8} {'rtt p99':>8} {'setup p50':>9} {'echo p50':>9} {'LG cpu':>6}  verdict"
        "  [busy lag cx refused]")


def _f(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def print_step(name: str, st: Step, baseline: float | None) -> None:
    s = st.summary
    print(f"{name:<22} {st.n:>4} {100 * st.server_cpu:>5.1f}% {_f(st.us_per_packet, '{:.0f}'):>7} "
          f"{st.rss_per_session / 1024:>8.0f} {_f(None if s['loss'] is None else 100 * s['loss'], '{:.2f}'):>7} "
          f"{_f(s['rtt_p50_ms']):>8} {_f(s['rtt_p99_ms']):>8} {_f(s['setup_connected_p50_ms']):>9} "
          f"{_f(s['setup_first_echo_p50_ms']):>9} {100 * st.loadgen_cpu:>5.0f}%  "
          f"{'pass' if st.passed else 'FAIL ' + ', '.join(st.why)}"
          f"{_headroom_text(st)}", flush=True)


def _headroom_text(st: Step) -> str:
    h, s = st.headroom, st.summary
    parts = []
    if "busy" in h:
        parts.append(f"busy {100 * h['busy']:.0f}%")
    if "lag" in h:
        parts.append(f"lag {1000 * h['lag']:.1f}ms")
    if "complexity" in h:
        parts.append(f"cx {h['complexity']:.0f}")
    if s.get("refused"):
        parts.append(f"refused {s['refused']} ({_f(s.get('refused_p50_ms'))}/"
                     f"{_f(s.get('refused_p99_ms'))} ms)")
    return "  [" + ", ".join(parts) + "]" if parts else ""


def overload_step(server: Server, args: argparse.Namespace, fits: int,
                  baseline: float | None, fitted: Step | None) -> dict[str, Any]:
    """Offer ``args.overload`` x ``fits`` sessions; judge the admitted ones."""
    n = max(2, round(args.overload * fits))
    st = measure(server, n, rate=args.rate, steady=args.steady)
    s = st.summary
    admitted = s["completed"]
    other = s["failed"] - s.get("refused", 0)
    added = None if s["rtt_p99_ms"] is None or baseline is None else s["rtt_p99_ms"] - baseline
    growth = (None if s["rtt_p99_ms"] is None or fitted is None
              or fitted.summary["rtt_p99_ms"] is None
              else s["rtt_p99_ms"] - fitted.summary["rtt_p99_ms"])
    st.why = [f"overload x{args.overload:g}"]
    print_step(server.name, st, baseline)
    return {"offered": n, "fits": fits, "admitted": admitted, "refused": s.get("refused", 0),
            "failed_other": other, "loss": s["loss"], "loss_worst_session": s["loss_worst_session"],
            "rtt_p99_ms": s["rtt_p99_ms"], "rtt_p99_added_ms": added,
            "rtt_p99_growth_vs_fit_ms": growth,
            "refused_p50_ms": s.get("refused_p50_ms"), "refused_p99_ms": s.get("refused_p99_ms"),
            "refused_codes": s.get("refused_codes"), "headroom": st.headroom,
            "server_cpu": st.server_cpu}


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--servers", default="aiortc,pcm,passthrough",
                   help="comma list of aiortc, pcm, passthrough (default all three); "
                   "pcm-cN is the PCM agent with --opus-complexity N (e.g. pcm-c3)")
    p.add_argument("--rate", type=float, default=25.0, help="sessions/s while ramping")
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
    p.add_argument("--json", default=None, metavar="PATH", help="write every step as JSON")
    p.add_argument("--overload", type=float, default=0.0, metavar="F",
                   help="after the ladder, offer F x what fitted (e.g. 2.5; issue 23)")
    p.add_argument("--fits", type=int, default=None, metavar="N",
                   help="with --overload: skip the ladder, take N as what fits (baseline "
                   "N=1 still measured)")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction,
                   default=(os.cpu_count() or 1) >= 2,
                   help="measured server process on CPU 0, everything else (its helpers, "
                   "this script, the load generator) on CPU 1 (default on with ≥ 2 CPUs)")
    args = p.parse_args(argv)
    if args.pin:
        os.sched_setaffinity(0, {1})  # we and the load generators we start

    print(f"machine: {machine()}")
    print(f"criteria: loss < {100 * args.max_loss:g} %, p99 RTT ≤ baseline p50 + "
          f"{args.max_added:g} ms, no failed sessions; {args.steady:g} s steady per step\n")
    print(HEAD)
    results: dict[str, dict[str, Any]] = {}
    up = appliance_up_available()
    for name in [s.strip() for s in args.servers.split(",") if s.strip()]:
        log: list[Step] = []
        if name == "aiortc":
            ctx = start_aiortc()
        elif name in ("pcm", "passthrough") or re.fullmatch(r"pcm-c\d+", name):
            if not up:
                print(f"{'appliance ' + name:<22} skipped: `python -m appliance up` is not "
                      "available in this tree yet")
                continue
            mode, _, complexity = name.partition("-c")
            extra = getattr(args, f"up_args_{mode}").split()
            if complexity:
                extra += ["--opus-complexity", complexity]
            ctx = start_appliance(name, extra)
        else:
            p.error(f"unknown server {name!r}")
        over: dict[str, Any] | None = None
        with ctx as server:
            if args.fits is not None and args.overload:
                cap, baseline = skip_ladder(server, args, log)
            else:
                cap, baseline = find_capacity(server, args, None, log)
            best = next((st for st in reversed(log) if st.n == cap), None)
            if args.overload and cap:
                over = overload_step(server, args, cap, baseline, best)
        results[name] = {
            "capacity": cap, "baseline_rtt_p50_ms": baseline,
            "cpu_at_capacity": best.server_cpu if best else None,
            "overload": over,
            "setup_p50_ms": best.summary["setup_first_echo_p50_ms"] if best else None,
            "steps": [{"n": st.n, "server_cpu": st.server_cpu,
                       "server_cpu_tree": st.server_cpu_all, "us_per_packet": st.us_per_packet,
                       "rss_per_session": st.rss_per_session, "loadgen_cpu": st.loadgen_cpu,
                       "passed": st.passed, "why": st.why, "summary": st.summary,
                       "headroom": st.headroom}
                      for st in log],
        }
    print("\nsessions per core (largest N passing, one core):")
    print(f"{'server':<14} {'N max':>6} {'cpu at N':>9} {'N/core (extrapolated)':>22} "
          f"{'setup→echo p50':>15} {'× aiortc':>9}")
    ref = results.get("aiortc", {}).get("capacity")
    for name, r in results.items():
        cpu = r["cpu_at_capacity"]
        per_core = r["capacity"] / cpu if cpu else None
        ratio = (r["capacity"] / ref) if ref else None
        print(f"{name:<14} {r['capacity']:>6} {_f(None if cpu is None else 100 * cpu):>8}% "
              f"{_f(per_core, '{:.0f}'):>22} {_f(r['setup_p50_ms']):>12} ms "
              f"{_f(ratio, '{:.1f}'):>9}")
    if args.overload:
        print(f"\noverload: offered {args.overload:g} x what fitted (admitted calls judged):")
        print(f"{'server':<14} {'fits':>5} {'offered':>8} {'admitted':>9} {'refused':>8} "
              f"{'loss %':>7} {'worst %':>8} {'Δp99 vs fit':>12} {'503 p50/p99 ms':>15}")
        for name, r in results.items():
            o = r.get("overload")
            if not o:
                continue
            loss = None if o["loss"] is None else 100 * o["loss"]
            worst = None if o["loss_worst_session"] is None else 100 * o["loss_worst_session"]
            print(f"{name:<14} {o['fits']:>5} {o['offered']:>8} {o['admitted']:>9} "
                  f"{o['refused']:>8} {_f(loss, '{:.2f}'):>7} {_f(worst, '{:.2f}'):>8} "
                  f"{_f(o['rtt_p99_growth_vs_fit_ms']):>9} ms "
                  f"{_f(o['refused_p50_ms'])}/{_f(o['refused_p99_ms']):>6}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "args": vars(args), "results": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
