"""One transceiver under a fixed load: CPU µs per packet, wake-ups, loss, and optionally a py-spy
profile.

Starts ``appliance up --transceivers 1 --relay-workers 1`` (its own state directory), pins
the **transceiver process alone to one CPU** (``--server-cpu``, default 0) and every other
process — supervisor, signaling, relay, and the load generator — to the other
(``--other-cpu``, default 1), then runs ``appliance loadgen`` with N sessions and reads the
transceiver's utime+stime from /proc over the window in which all N are up.

    .venv/bin/python bench/transceiver_profile.py -n 50 --agent echo
    .venv/bin/python bench/transceiver_profile.py -n 50 --agent echo --opus-complexity 3
    .venv/bin/python bench/transceiver_profile.py -n 200 --agent passthrough \\
        --profile /tmp/pt.txt      # py-spy (raw, --idle off) over the steady window

"µs/pkt" is transceiver CPU divided by packets *received* per second (N × 50); each received
packet also produces one sent packet, so it is the cost of one echo, both directions.
"wake-ups" are the transceiver's voluntary context switches per second (each time it slept in
`epoll_wait` and was woken again), from /proc/PID/task/*/status.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capacity import (  # noqa: E402  (bench scripts import their sibling)
    PY,
    REPO,
    cmdline,
    cpu_seconds,
    machine,
    rss_bytes,
    run_loadgen,
    start_appliance,
)


def pin(pid: int, cpu: int) -> None:
    subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], capture_output=True,
                   check=False)


def sleeps(pid: int) -> int:
    """Times the process's threads went to sleep voluntarily (``voluntary_ctxt_switches``
    summed over /proc/PID/task): with one busy thread, its wake-ups."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total


def top_frames(raw: str, k: int = 15) -> list[tuple[str, float, float]]:
    """(function, self %, total %) from py-spy's ``--format raw`` (collapsed stacks)."""
    self_c: Counter[str] = Counter()
    total_c: Counter[str] = Counter()
    n = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        n += c
        frames = stack.split(";")
        self_c[frames[-1]] += c
        for f in set(frames):
            total_c[f] += c
    return [(f, 100 * c / n, 100 * total_c[f] / n) for f, c in self_c.most_common(k)] if n else []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=50, help="sessions (default 50)")
    p.add_argument("--agent", default="echo", help="agent asked for per session (default echo)")
    p.add_argument("--rate", type=float, default=25.0)
    p.add_argument("--steady", type=float, default=10.0)
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--other-cpu", type=int, default=1)
    p.add_argument("--profile", default=None, metavar="PATH",
                   help="py-spy record the transceiver over the steady window (raw stacks)")
    p.add_argument("--perf", default=None, metavar="PATH",
                   help="perf record -F 999 -g of the transceiver over the steady window "
                        "(perf.data at PATH; read with perf report -i PATH --sort dso,sym)")
    p.add_argument("--opus-complexity", type=int, default=None, metavar="N",
                   help="passed to `appliance up` (default: the transceiver's default)")
    p.add_argument("--json", default=None, metavar="PATH")
    args = p.parse_args(argv)

    print(f"machine: {machine()}", flush=True)
    os.sched_setaffinity(0, {args.other_cpu})  # we and the load generator: the other CPU
    extra = ["--relay-workers", "1"]
    if args.opus_complexity is not None:
        extra += ["--opus-complexity", str(args.opus_complexity)]
    with start_appliance(args.agent, extra) as server:
        tree = server.pids()
        trans = [pid for pid in tree if "appliance transceiver " in cmdline(pid)]
        if len(trans) != 1:
            raise SystemExit(f"expected one transceiver process, found {trans}")
        tpid = trans[0]
        for pid in tree:
            pin(pid, args.server_cpu if pid == tpid else args.other_cpu)
        ramp = args.n / args.rate
        duration = ramp + args.steady + 2.0
        t0, proc = run_loadgen(server.url, args.n, rate=args.rate, duration=duration,
                               agent=args.agent, connect_timeout=20)
        win = (t0 + ramp + 1.5, t0 + ramp + 1.5 + args.steady)
        got: dict[str, float] = {}

        def sampler() -> None:
            time.sleep(max(0.0, win[0] - time.monotonic()))
            spy = None
            if args.profile:
                spy = subprocess.Popen(
                    [str(Path(PY).parent / "py-spy"), "record", "--pid", str(tpid),
                     "--format", "raw", "--rate", "200", "--duration",
                     str(int(args.steady)), "--output", args.profile, "--nonblocking"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            perf = None
            if args.perf:
                perf = subprocess.Popen(
                    ["perf", "record", "-F", "999", "-g", "-o", args.perf, "-p", str(tpid),
                     "--", "sleep", str(int(args.steady))],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            got.update(t0=time.monotonic(), c0=cpu_seconds([tpid]), w0=sleeps(tpid))
            time.sleep(max(0.0, win[1] - time.monotonic()))
            got.update(t1=time.monotonic(), c1=cpu_seconds([tpid]), rss=rss_bytes([tpid]),
                       w1=sleeps(tpid))
            if spy is not None:
                spy.wait(30)
            if perf is not None:
                perf.wait(60)

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        out, _ = proc.communicate(timeout=duration + 120)
        th.join(40)
    s = json.loads(out)["summary"]
    cpu = (got["c1"] - got["c0"]) / (got["t1"] - got["t0"])
    live = s["completed"] or args.n
    us = cpu / (live * 50) * 1e6
    loss = s["loss"]
    wakes = (got["w1"] - got["w0"]) / (got["t1"] - got["t0"])
    print(f"agent {args.agent} n {args.n}: transceiver cpu {100 * cpu:.1f} % "
          f"({us:.0f} µs/pkt, ~{live / cpu if cpu else 0:.0f} sessions/core by CPU), "
          f"loss {'-' if loss is None else f'{100 * loss:.2f} %'}, "
          f"rtt p50/p99 {s['rtt_p50_ms']}/{s['rtt_p99_ms']} ms, failed {s['failed']}, "
          f"loadgen cpu {100 * s['loadgen_cpu_s'] / max(s['wall_s'], 1e-9):.0f} %, "
          f"rss {got['rss'] / 2**20:.0f} MiB, wake-ups {wakes:.0f}/s "
          f"({wakes / (live * 50) if live else 0:.2f} per packet)", flush=True)
    if args.profile and Path(args.profile).exists():
        print(f"{'self %':>7} {'total %':>7}  function (py-spy, {args.profile})")
        for f, sp, tp in top_frames(Path(args.profile).read_text()):
            print(f"{sp:>7.1f} {tp:>7.1f}  {f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu, "us_per_packet": us,
                                               "wakeups_per_s": wakes,
                                               "summary": s}, indent=1))
    return 0


if __name__ == "__main__":
    assert REPO.exists()
    sys.exit(main())
