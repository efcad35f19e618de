"""Issue 20: relay worker failover under 50 live calls, SIGKILL at random moments.

One real ``appliance up`` (2 transceivers, M relay workers with warm standbys, optionally
``--redis`` against a throwaway redis-server), N calls of our client through the relay
(``tests/reliability/failover.py``: each on its own loopback address, 50 packets/s,
passthrough agent so every received RTP timestamp is the caller's own and a loss in either
direction is a jump). Then K times, after a random pause (``--pause`` MIN..MAX s, the
standby may or may not be warm again: a random moment), SIGKILL of a random worker; the
supervisor's standby (or, if none is warm, a fresh process) takes over.

With ``--pairs P``, P of the kills are the second of a back-to-back pair: the same worker
killed again ``--back-to-back`` s (0.3) after the first kill, once its successor answers; a
pair is one event (its window spans both kills). ``forked`` says whether each successor
was a fork of the standby (issue 32) rather than a fresh process.

Printed, over every call and event: the longest run of audio missing from the received RTP
timestamps around each kill (``media gap``: the issue's measure) and the longest interval
between two received packets (``arrival gap``: adds this process's own send stalls),
p50/p99/max, calls lost (failed or without media at the end), and the same for a baseline
window of the same length with no kill (what the loaded box alone costs).

With ``--aiortc N`` (issue 41 item 2), N aiortc callers in a process of their own
(``bench/aiortc_callers.py``; the default agent, echo) ride through the same kills, and per
call and event the bench reports what their *listener* heard: the longest interval
between two decoded frames aiortc's track handed out (``heard gap``: a missing sequence
number holds aiortc's 16-packet audio jitter buffer, ~320 ms), beside the RTP-timestamp
media gap and the sequence numbers that never arrived (``holes``). ``--timeline`` runs
``up`` at debug level and adds, per event, when the flows' first datagrams reached the new
worker and when their routes were re-seeded (the relay's "re-seeded" lines), and when each
aiortc call's echo resumed.

    .venv/bin/python bench/relay_failover.py --calls 50 --kills 10 --workers 2
    .venv/bin/python bench/relay_failover.py --calls 40 --kills 20 --workers 1 \
        --pairs 6 --pause 0.3 3 [--redis]
    .venv/bin/python bench/relay_failover.py --calls 8 --aiortc 8 --kills 20 --workers 1 \
        --pause 1 4 --timeline [--redis]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from reliability.failover import (  # noqa: E402
    RedisProc,
    Up,
    longest_gap,
    longest_media_gap,
    media_gap_at,
    open_media_call,
    opus_frames,
)
from reliability.support import eventually  # noqa: E402

from appliance.control import control_request  # noqa: E402

WINDOW_BEFORE = 0.5
WINDOW_AFTER = 1.5


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def _kill_pair(pid: int, standbys: list[int], apart: float) -> tuple[float, float, int]:
    """In a thread: SIGKILL ``pid``, find its successor (a standby's new child, from /proc),
    SIGKILL it ``apart`` s after the first kill. (perf_counter of both kills, the second.)"""
    before = {c for sb in standbys for c in _children(sb)}
    os.kill(pid, signal.SIGKILL)
    t1 = time.perf_counter()
    while True:
        new = [c for sb in standbys for c in _children(sb) if c not in before and c != pid]
        if new:
            break
        if time.perf_counter() - t1 > 30:
            raise RuntimeError("no successor forked within 30 s")
        time.sleep(0.002)
    time.sleep(max(0.0, t1 + apart - time.perf_counter()))
    os.kill(new[0], signal.SIGKILL)
    return t1, time.perf_counter(), new[0]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            out += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    except OSError:
        pass
    return out


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p * (len(s) - 1))))]


def _summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(1000 * statistics.median(values), 1),
            "p99_ms": round(1000 * _pct(values, 0.99), 1),
            "max_ms": round(1000 * max(values), 1)}


class AiortcCallers:
    """``bench/aiortc_callers.py`` as a child process: started, waited for, stopped."""

    def __init__(self, base: str, n: int, out: Path) -> None:
        self.out = out
        self.popen = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "aiortc_callers.py"), base, str(n), str(out)],
            stdout=subprocess.PIPE, text=True)

    async def connected(self) -> None:
        assert self.popen.stdout is not None
        line = await trio.to_thread.run_sync(self.popen.stdout.readline)
        if not line.startswith("connected"):
            raise RuntimeError(f"aiortc callers did not connect: {line!r}")

    async def stop(self) -> dict[str, Any]:
        """SIGTERM; what they recorded (module docstring of aiortc_callers.py)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        await trio.to_thread.run_sync(self.popen.wait, 30)
        result: dict[str, Any] = json.loads(self.out.read_text())
        return result


def _heard_gap(heard: list[float], start: float, end: float) -> float:
    """The longest time between two frames a listener got (the window's edges count)."""
    times = [start, *(t for t in heard if start <= t <= end), end]
    return max(b - a for a, b in itertools.pairwise(times))


def _holes(rx: list[list[float]], start: float, end: float) -> int:
    """Sequence numbers never received among those around the window (uint16 order)."""
    seqs = sorted({int(s) for t, _, s in rx if start <= t <= end})
    return sum(b - a - 1 for a, b in itertools.pairwise(seqs) if 1 < b - a < 1000)


_RESEEDED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .* re-seeded by "
                       r"transceiver \d+, ([\d.]+) ms after it was asked")


def _reseeds(log: str) -> list[tuple[float, float]]:
    """Every re-seeded flow in ``up``'s log at debug level: (wall time of the route's
    return, wall time of the look-up it answered)."""
    out = []
    for line in log.splitlines():
        m = _RESEEDED.match(line)
        if m:
            at = datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((at, at - float(m[2]) / 1000))
    return out


def _aiortc_report(data: dict[str, Any], events: list[dict[str, Any]],
                   base: tuple[float, float], reseeds: list[tuple[float, float]] | None
                   ) -> dict[str, Any]:
    """Per call and event: heard gap, media gap, holes, echo resumed (module docstring)."""
    heard_all: list[float] = []
    media_all: list[float] = []
    holes = 0
    for ev in events:
        k = ev["_mono"]
        start, end = k - WINDOW_BEFORE, k + WINDOW_AFTER
        row = {}
        for name, rx in data["rx"].items():
            heard = _heard_gap(data["heard"][name], start, end)
            media = media_gap_at([(t, int(ts)) for t, ts, _ in rx], start, end)[0]
            n = _holes(rx, start, end)
            # the echo resumed: the end of the longest silence that began around the kill
            times = sorted(t for t, _, _ in rx if start <= t <= end)
            resumed = max(((b - a, b) for a, b in itertools.pairwise([start, *times, end])
                           if k - 0.05 <= a <= k + 0.5), default=(0.0, k))[1]
            heard_all.append(heard)
            media_all.append(media)
            holes += n
            row[name] = {"heard_ms": round(1000 * heard), "media_ms": round(1000 * media),
                         "holes": n, "echo_resumed_ms": round(1000 * (resumed - k))}
        ev["aiortc"] = row
        ev["aiortc_heard_max_ms"] = max(r["heard_ms"] for r in row.values())
        if reseeds is not None:
            wall = ev["_wall"]
            mine = [(at - wall, asked - wall) for at, asked in reseeds
                    if wall <= asked <= wall + WINDOW_AFTER]
            ev["first_datagram_ms"] = ([round(1000 * min(a for _, a in mine)),
                                        round(1000 * max(a for _, a in mine))] if mine else None)
            ev["reseeded_ms"] = ([round(1000 * min(r for r, _ in mine)),
                                  round(1000 * max(r for r, _ in mine))] if mine else None)
            ev["flows_reseeded"] = len(mine)
    baseline = [_heard_gap(h, *base) for h in data["heard"].values()]
    return {"calls": len(data["rx"]), "heard_gap": _summary(heard_all),
            "media_gap": _summary(media_all), "holes": holes,
            "call_events_over_250ms": sum(g > 0.25 for g in heard_all),
            "baseline_heard_gap": _summary(baseline),
            "lost": [k for k, v in data["states"].items() if v != "connected"]}


async def run(args: argparse.Namespace, redis_url: str | None) -> dict[str, Any]:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="relay-failover-") as d:
        up = await Up.start(Path(d), workers=args.workers, redis=redis_url,
                            extra=("--log-level", "debug") if args.timeline else ())
        callers: AiortcCallers | None = None
        aiortc: dict[str, Any] | None = None
        # trio's clock against CLOCK_MONOTONIC (the aiortc callers') and the wall clock
        # (up's log lines)
        mono = trio.current_time() - time.monotonic()
        wall = trio.current_time() - time.time()
        try:
            async with trio.open_nursery() as nursery:
                frames = opus_frames()
                calls = [await open_media_call(nursery, up, f"call-{i}", frames, args.agent)
                         for i in range(args.calls)]
                if args.aiortc:
                    callers = AiortcCallers(up.base, args.aiortc, Path(d) / "aiortc.json")
                    await callers.connected()
                await eventually(lambda: all(len(c.rx) >= 50 for c in calls), 120,
                                 "media on every call")
                await up.standbys_ready()
                # Baseline: the same window with no event (load, GC, the client itself).
                t0 = trio.current_time()
                await trio.sleep(WINDOW_BEFORE + WINDOW_AFTER)  # a measurement window
                base_window = (t0 - mono, trio.current_time() - mono)
                base_media = [longest_media_gap(c.rx, t0, trio.current_time()) for c in calls]
                base_arrival = [longest_gap(c.rx_times, t0, trio.current_time()) for c in calls]
                events = []
                media: list[float] = []
                warm_media: list[float] = []
                cold_media: list[float] = []
                pair_media: list[float] = []
                arrival: list[float] = []
                # Which kills come back to back: --pairs of them are the second of a pair,
                # --back-to-back s after the first (once its successor answers).
                seconds = set(rng.sample(range(1, args.kills), min(args.pairs, args.kills - 1))
                              if args.kills > 1 else [])
                kills_done = 0
                while kills_done < args.kills:
                    await trio.sleep(rng.uniform(*args.pause))  # a random moment
                    w = rng.randrange(args.workers)
                    burst = 2 if kills_done + 1 in seconds and kills_done + 1 < args.kills else 1
                    first_kill: float | None = None
                    backs: list[float | None] = []
                    warms, forks = [], []
                    pid = await up.worker_pid(w)
                    if pid is None:  # still coming back from the last kill
                        continue
                    warms.append(up.standbys_warm())
                    if burst == 2 and args.workers == 1:
                        # Both kills from a thread: this process's trio loop, busy with the
                        # calls at load 15, overshot a 0.3 s sleep by 0.1-0.2 s.
                        standbys = up.standby_pids()
                        offset = trio.current_time() - time.perf_counter()
                        t1, t2, second = await trio.to_thread.run_sync(
                            _kill_pair, pid, standbys, args.back_to_back)
                        first_kill, killed = t1 + offset, t2 + offset
                        kills_done += 2
                        warms.append(up.standbys_warm())
                        forks.append(True)  # found among the standbys' children
                        backs.append(None)
                        pid = second
                    else:
                        os.kill(pid, signal.SIGKILL)
                        first_kill = killed = trio.current_time()
                        kills_done += 1
                    await up._replaced(w, pid, 30)  # its control socket answers
                    backs.append(round(1000 * (trio.current_time() - killed), 1))
                    new = await up.worker_pid(w)
                    forks.append(new is not None and _ppid(new) in up.standby_pids())
                    if first_kill is None:
                        continue
                    await trio.sleep(WINDOW_AFTER)  # the measurement window after the kill
                    end = trio.current_time()
                    m = [longest_media_gap(c.rx, first_kill - WINDOW_BEFORE, end) for c in calls]
                    a = [longest_gap(c.rx_times, first_kill - WINDOW_BEFORE, end) for c in calls]
                    media += m
                    arrival += a
                    (warm_media if all(warms) else cold_media).extend(m)
                    if len(backs) > 1:
                        pair_media.extend(m)
                    events.append({"worker": w, "kills": len(backs), "standby_warm": warms,
                                   "second_kill_after_ms": (
                                       round(1000 * (killed - first_kill), 1)
                                       if len(backs) > 1 else None),
                                   "forked": forks, "back_after_ms": backs,
                                   "media_gap_max_ms": round(1000 * max(m), 1),
                                   "load": round(os.getloadavg()[0], 1),
                                   "_mono": first_kill - mono, "_wall": first_kill - wall})
                    print(json.dumps(events[-1]), file=sys.stderr, flush=True)
                # Lost: failed, or no media after the last event (waited for: with 50 calls
                # on a loaded box this process may read its sockets late).
                end = trio.current_time()
                with contextlib.suppress(AssertionError):  # the lost ones are reported
                    await eventually(lambda: all(any(t > end for t in c.rx_times)
                                                 for c in calls), 10, "media at the end")
                lost = [c.name for c in calls if c.failed is not None or
                        not any(t > end for t in c.rx_times)]
                counters = await up.counters()
                resent = 0
                for k in range(2):  # the transceivers' "sent again on a move" (vouch.py)
                    with contextlib.suppress(Exception), trio.fail_after(5):
                        st = await control_request(str(up.state / "control" /
                                                       f"transceiver-{k}.sock"), {"op": "stats"})
                        resent += int(st.get("counters", {}).get("vouch_resent", 0))
                if callers is not None:
                    data = await callers.stop()
                    callers = None
                    log = up.proc.log.read_text(errors="replace") if args.timeline else None
                    aiortc = _aiortc_report(data, events, base_window,
                                            None if log is None else _reseeds(log))
                nursery.cancel_scope.cancel()
        finally:
            if callers is not None:
                callers.popen.kill()
            up.stop()
    for ev in events:
        ev.pop("_mono", None)
        ev.pop("_wall", None)
    return {
        "calls": args.calls, "kills": kills_done, "events_measured": len(events),
        "back_to_back_pairs": sum(e["kills"] > 1 for e in events), "workers": args.workers,
        "redis": redis_url is not None, "agent": args.agent,
        "media_gap": _summary(media), "arrival_gap": _summary(arrival),
        "media_gap_standby_warm": _summary(warm_media) if warm_media else None,
        "media_gap_standby_cold": _summary(cold_media) if cold_media else None,
        "media_gap_back_to_back": _summary(pair_media) if pair_media else None,
        "baseline_media_gap": _summary(base_media), "baseline_arrival_gap": _summary(base_arrival),
        "calls_over_250ms": sum(g > 0.25 for g in media),
        "calls_lost": len(lost), "lost": lost, "aiortc": aiortc, "events": events,
        "flows_vouched": counters.get("flows_vouched", 0), "transceivers_resent": resent,
        "load": os.getloadavg()[0],
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    if not args.redis:
        return await run(args, None)
    r = RedisProc()
    r.start()
    try:
        return await run(args, r.url)
    finally:
        r.kill9()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--redis", action="store_true", help="with a throwaway redis-server")
    p.add_argument("--agent", default="passthrough")
    p.add_argument("--pause", type=float, nargs=2, default=(1.0, 6.0), metavar=("MIN", "MAX"),
                   help="random pause before each kill, s")
    p.add_argument("--pairs", type=int, default=0,
                   help="how many kills are the second of a back-to-back pair")
    p.add_argument("--back-to-back", type=float, default=0.3, metavar="S",
                   help="a pair's second kill S seconds after its first (default 0.3)")
    p.add_argument("--aiortc", type=int, default=0, metavar="N",
                   help="N aiortc callers (echo agent) in a process of their own, measured "
                        "by what their listener hears (module docstring)")
    p.add_argument("--timeline", action="store_true",
                   help="up at debug level: per event, first datagrams and re-seeds")
    p.add_argument("--seed", type=int, default=20)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    started = time.monotonic()
    results = trio.run(main_async, args)
    results["seconds"] = round(time.monotonic() - started, 1)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
