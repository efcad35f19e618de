"""Soak (issue 9 item 3): N calls held for T minutes through a real ``appliance up``, plus a
small lane of short calls that come and go (create/delete paths), while every process of the
appliance is sampled from /proc.

::

    .venv/bin/python bench/soak.py                       # 200 calls x 10 min
    .venv/bin/python bench/soak.py --calls 40 --minutes 10 --agent passthrough --json soak.json

Calls are made by ``python -m appliance loadgen`` (real ICE + DTLS + SRTP, 50 packets/s each
way) in its own process. Every ``--sample`` seconds, for the supervisor (which also runs
signaling) and each child (transceivers, relay workers): RSS, open fds, threads — the
transceiver/relay ``stats`` ops and signaling expose no trio task count, so threads are the
only "tasks" visible from outside — and the transceivers' live sessions from their control
sockets. Growth is measured after ``--warmup`` seconds: the median of the last 20 % of
samples minus the median of the first 20 % after warm-up (robust to one noisy sample), and
after the load ends, idle fds against idle fds before it started.

Prints a JSON report (also to ``--json``); exit status 1 when a call failed or a bound
(``--max-rss-growth-mib``, ``--max-fd-growth``) was exceeded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from security.support import Up, proc_sample  # noqa: E402


def control_stats(state_dir: Path) -> dict[str, Any]:
    """Live sessions per transceiver and flows per relay worker, from their control sockets."""
    import trio

    from appliance.control import control_request

    out: dict[str, Any] = {}

    async def main() -> None:
        for sock in sorted((state_dir / "control").glob("*.sock")):
            try:
                with trio.fail_after(1):
                    resp = await control_request(str(sock), {"op": "stats"})
            except Exception:  # noqa: BLE001 - a child restarting: no sample this round
                continue
            key = sock.stem
            if "sessions_by_state" in resp:
                out[key] = {"sessions": resp["sessions_by_state"]}
            elif "flows" in resp:
                out[key] = {"flows": resp["flows"]}

    trio.run(main)
    return out


def sample(up: Up) -> dict[str, Any]:
    procs = {}
    for role, pid in up.pids().items():
        s = proc_sample(pid)
        if s is not None:
            procs[role] = {"pid": pid, **s}
    return {"t": time.monotonic(), "procs": procs, "control": control_stats(up.state_dir)}


def loadgen(base: str, n: int, seconds: float, rate: float, out: Path, agent: str | None,
            connect_timeout: float) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "appliance", "loadgen", "--url", base, "-n", str(n),
            "--rate", str(rate), "--duration", str(seconds), "--json", str(out),
            "--connect-timeout", str(connect_timeout)]
    if agent:
        argv += ["--agent", agent]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def growth(samples: list[dict[str, Any]], role: str, key: str) -> dict[str, Any]:
    values = [s["procs"][role][key] for s in samples if role in s["procs"]]
    if len(values) < 2:
        return {"n": len(values)}
    k = max(1, len(values) // 5)
    first, last = statistics.median(values[:k]), statistics.median(values[-k:])
    return {"n": len(values), "start": first, "end": last, "growth": last - first,
            "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=200, help="calls held for the whole run")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=10.0, help="new calls per second while ramping")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds not counted for growth")
    p.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--agent", default="echo", help="agent of the appliance (echo, passthrough)")
    p.add_argument("--transceivers", type=int, default=2)
    p.add_argument("--churn-calls", type=int, default=4,
                   help="short calls per churn round, repeated for the whole run (0: none)")
    p.add_argument("--churn-seconds", type=float, default=10.0)
    p.add_argument("--connect-timeout", type=float, default=20.0)
    p.add_argument("--max-rss-growth-mib", type=float, default=20.0)
    p.add_argument("--max-fd-growth", type=int, default=8)
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="soak-"))
    up = Up.start(work, "--agent", args.agent, "--transceivers", str(args.transceivers),
                  "--log-level", "warning")
    samples: list[dict[str, Any]] = []
    reports: list[dict[str, Any]] = []
    try:
        time.sleep(1.0)
        idle_before = sample(up)
        seconds = args.minutes * 60
        ramp = args.calls / args.rate
        t0 = time.monotonic()
        main_out = work / "main.json"
        main_lg = loadgen(up.base, args.calls, seconds, args.rate, main_out, None,
                          args.connect_timeout)
        churn: subprocess.Popen[bytes] | None = None
        churn_out: Path | None = None
        rounds = 0
        next_sample = t0
        while main_lg.poll() is None:
            now = time.monotonic()
            if churn is not None and churn.poll() is not None and churn_out is not None:
                reports.append(json.loads(churn_out.read_text())["summary"])
                churn = None
            if (churn is None and args.churn_calls and now - t0 > ramp
                    and now - t0 + args.churn_seconds + 5 < seconds):
                rounds += 1
                churn_out = work / f"churn-{rounds}.json"
                churn = loadgen(up.base, args.churn_calls, args.churn_seconds, 10.0, churn_out,
                                None, args.connect_timeout)
            if now >= next_sample:
                s = sample(up)
                s["t"] -= t0
                samples.append(s)
                next_sample += args.sample
                live = sum(v.get("sessions", {}).get("connected", 0)
                           for v in s["control"].values())
                rss = sum(v["rss_kib"] for v in s["procs"].values()) // 1024
                fds = sum(v["fds"] for v in s["procs"].values())
                print(f"t={s['t']:6.0f}s connected={live:4d} rss={rss} MiB fds={fds}",
                      file=sys.stderr, flush=True)
            time.sleep(0.2)
        if churn is not None and churn_out is not None:
            churn.wait()
            reports.append(json.loads(churn_out.read_text())["summary"])
        main_summary = json.loads(main_out.read_text())["summary"]
        time.sleep(3.0)  # sessions end, sockets close
        idle_after = sample(up)
    finally:
        up.stop()
    post = [s for s in samples if s["t"] >= args.warmup + ramp]
    roles = sorted({r for s in samples for r in s["procs"]})
    per_role = {}
    problems = []
    for role in roles:
        rss = growth(post, role, "rss_kib")
        fds = growth(post, role, "fds")
        thr = growth(post, role, "threads")
        fd_idle = (idle_after["procs"].get(role, {}).get("fds", 0)
                   - idle_before["procs"].get(role, {}).get("fds", 0))
        per_role[role] = {"rss_kib": rss, "fds": fds, "threads": thr, "idle_fd_delta": fd_idle}
        if rss.get("growth", 0) > args.max_rss_growth_mib * 1024:
            problems.append(f"{role}: RSS grew {rss['growth'] / 1024:.1f} MiB after warm-up")
        if fds.get("growth", 0) > args.max_fd_growth or fd_idle > args.max_fd_growth:
            problems.append(f"{role}: fds grew {fds.get('growth')} (idle delta {fd_idle})")
    churn_failed = sum(r["failed"] for r in reports)
    failed = main_summary["failed"] + churn_failed
    if failed:
        problems.append(f"{failed} failed calls")
    restarts = "exited with status" in up.text()
    if restarts:
        problems.append("a child process exited during the soak")
    report = {
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "keep")},
        "host_cpus": __import__("os").cpu_count(),
        "calls": {"main": {k: main_summary[k] for k in (
            "requested", "completed", "failed", "failures", "max_concurrent", "loss",
            "loss_worst_session", "rtt_p50_ms", "rtt_p99_ms", "setup_connected_p99_ms",
            "packets_sent")},
                  "churn_rounds": len(reports), "churn_calls": sum(r["requested"] for r in reports),
                  "churn_failed": churn_failed,
                  "churn_loss_max": max((r["loss"] or 0.0 for r in reports), default=None)},
        "growth_after_warmup": per_role,
        "samples": len(samples),
        "problems": problems,
        "ok": not problems,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
        Path(args.json).with_suffix(".samples.json").write_text(json.dumps(samples))
    if args.keep:
        print(f"work directory: {work}", file=sys.stderr)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
