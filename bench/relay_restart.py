"""Issue 9 item 1 at full scale: relay worker restarts during 50 live calls.

Real processes: ``appliance relay --workers M`` (a supervisor and M workers sharing the public
port with ``SO_REUSEPORT``) and two ``appliance transceiver`` (echo agent); the calls are
``ClientPeer``s in this process (``tests/reliability/support.py``) whose only candidate is the
relay's public address, 50 RTP packets/s each, consent checks every ``--consent-interval`` s.

Per mode (without Redis; with ``--redis`` against a throwaway redis-server):

* ``kill9``   ``kill -9`` of worker 0; the supervisor restarts it.
* ``rolling`` SIGTERM to each worker in turn; the next one only once the restarted worker
              answers the supervisor and every call has media again.

Measured per call: the longest gap between two received (echoed, so both directions)
packets from just before the event until every call has media again, and lost calls (failed,
or no media by then). Relay counter deltas show how flows came back (``flows_created`` by
STUN, ``flows_recovered`` from Redis, ``no-flow`` drops in between).

    .venv/bin/python bench/relay_restart.py --calls 50 --workers 2 --json restart.json
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from reliability.support import (  # noqa: E402
    Call,
    Stack,
    eventually,
    max_gap,
    media_settled,
    open_call,
    opus_frame,
    restart_worker,
)


def _counters(stats: dict[str, Any]) -> dict[str, int]:
    c = stats["counters"]
    return {"flows_created": c.get("flows_created", 0),
            "flows_recovered": c.get("flows_recovered", 0),
            "redis_lookups": c.get("redis_lookups", 0),
            "no_flow_drops": c.get("drops", {}).get("no-flow", 0)}


async def _event(stack: Stack, calls: list[Call], steps: list[tuple[int, int]],
                 settle_within: float) -> dict[str, Any]:
    start = trio.current_time()
    step_times = []
    for index, sig in steps:
        t0 = trio.current_time()
        back = await restart_worker(stack, index, sig)
        await media_settled(calls, back, settle_within)
        step_times.append({"worker": index, "signal": signal.Signals(sig).name,
                           "back_after_s": round(back - t0, 3),
                           "settled_after_s": round(trio.current_time() - t0, 3),
                           # summed over the live workers; a restarted worker starts at 0
                           "counters_after": _counters(await stack.relay_stats())})
    end = trio.current_time()
    gaps = sorted(max_gap(c, start - 0.1, end) for c in calls)
    lost = [c.sid for c in calls if c.failed is not None or not c.rx_after(end - 0.5)]
    return {
        "steps": step_times,
        "lost_calls": len(lost), "lost": lost,
        "gap_max_s": round(gaps[-1], 3),
        "gap_p50_s": round(statistics.median(gaps), 3),
        "gap_p95_s": round(gaps[int(0.95 * (len(gaps) - 1))], 3),
        "calls_with_gap_over_100ms": sum(g > 0.1 for g in gaps),
    }


async def run_mode(tmp: Path, args: argparse.Namespace, redis_url: str | None) -> dict[str, Any]:
    stack = Stack.make(tmp)
    try:
        await stack.start_transceiver(0)
        await stack.start_transceiver(1)
        extra = ["--workers", str(args.workers), "--new-flow-rate", "1000"]
        if redis_url:
            extra += ["--redis", redis_url]
        await stack.start_relay(*extra)
        payload = opus_frame()
        async with trio.open_nursery() as nursery:
            calls = [await open_call(nursery, stack, i % 2, f"call-{i}", payload,
                                     consent_interval=args.consent_interval,
                                     consent_timeout=args.consent_timeout)
                     for i in range(args.calls)]
            await eventually(lambda: all(c.received >= 25 for c in calls), 60,
                             "media on every call")
            if redis_url:
                import redis as redislib

                db = redislib.Redis.from_url(redis_url)
                try:
                    await eventually(
                        lambda: len(list(db.scan_iter("appliance:relay:*"))) >= args.calls,
                        15, "flows written to Redis")
                finally:
                    db.close()
            settle = 3 * args.consent_interval + 10
            out = {
                "kill9": await _event(stack, calls, [(0, signal.SIGKILL)], settle),
                "rolling": await _event(stack, calls,
                                        [(i, signal.SIGTERM) for i in range(args.workers)],
                                        settle),
            }
            nursery.cancel_scope.cancel()
        return out
    finally:
        stack.close()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "calls": args.calls, "workers": args.workers, "transceivers": 2,
        "consent_interval_s": args.consent_interval, "consent_timeout_s": args.consent_timeout,
    }
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory(prefix=f"relay-restart-{mode}-") as d:
            if mode == "plain":
                results[mode] = await run_mode(Path(d), args, None)
            elif mode == "redis":
                from relay.support import redis_server

                gen = redis_server()
                url = next(gen)
                try:
                    results[mode] = await run_mode(Path(d), args, url)
                finally:
                    gen.close()
            else:
                raise SystemExit(f"unknown mode {mode!r}")
        print(mode, json.dumps(results[mode]), file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--modes", default="plain,redis", help="plain (no Redis), redis")
    p.add_argument("--consent-interval", type=float, default=5.0,
                   help="client consent check interval, s (browsers: ~5 s)")
    p.add_argument("--consent-timeout", type=float, default=30.0)
    p.add_argument("--json", metavar="FILE", help="also write the results here")
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
