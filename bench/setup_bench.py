"""Setup time: POST → connected and POST → first echoed audio packet, S concurrent setups.

Our own client (``appliance.client``, built on ``appliance.proto``) opens ``--concurrent``
sessions at once, ``--rounds`` times, against ``appliance up`` (started here on loopback with
its own state directory, one transceiver) and, side by side in the same run, the aiortc echo
server of bench/aiortc_echo_server.py. Issue 5 target for the appliance on loopback with 20
concurrent setups: p50 ≤ 25 ms and p99 ≤ 60 ms to the first echoed packet.

    .venv/bin/python bench/setup_bench.py                   # both servers
    .venv/bin/python bench/setup_bench.py --url http://127.0.0.1:8080   # an existing server

Each session sends media for ``--hold`` s (enough for the first echo to come back), then
hangs up (DELETE); rounds are spaced so sessions from one round are gone before the next.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capacity import (  # noqa: E402  (bench scripts import their sibling)
    Server,
    appliance_up_available,
    machine,
    start_aiortc,
    start_appliance,
)

from appliance.loadgen import LoadConfig, run_load  # noqa: E402
from appliance.loadgen.media import encode_tone  # noqa: E402
from appliance.loadgen.stats import percentile  # noqa: E402


async def rounds(url: str, *, concurrent: int, n_rounds: int, hold: float,
                 agent: str | None) -> tuple[list[float], list[float], list[str]]:
    stream = encode_tone()
    connected: list[float] = []
    first_echo: list[float] = []
    failures: list[str] = []
    for _ in range(n_rounds):
        # rate so high that every session of the round is started in the same instant
        report = await run_load(
            LoadConfig(url, sessions=concurrent, rate=1e6, duration=hold, agent=agent,
                       drain=0.1),
            stream=stream)
        for s in report.sessions:
            if s.failure:
                failures.append(s.failure)
            if s.setup_connected is not None:
                connected.append(s.setup_connected)
            if s.setup_first_echo is not None:
                first_echo.append(s.setup_first_echo)
        await trio.sleep(0.5)
    return connected, first_echo, failures


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


@contextmanager
def _existing(url: str) -> Iterator[Server | str]:
    yield url


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=None, help="measure this endpoint only (no servers started)")
    p.add_argument("--servers", default="appliance,aiortc")
    p.add_argument("--concurrent", type=int, default=20, help="setups at once (default 20)")
    p.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--hold", type=float, default=1.0, help="media seconds per session")
    p.add_argument("--agent", default=None)
    args = p.parse_args(argv)

    print(f"machine: {machine()}")
    print(f"{args.rounds} rounds × {args.concurrent} concurrent setups, loopback\n")
    print(f"{'server':<12} {'n':>4} {'connected p50':>14} {'p99':>7} {'first echo p50':>15} "
          f"{'p99':>7}  failures")
    targets: list[tuple[str, AbstractContextManager[Server | str]]] = []
    if args.url:
        targets.append((args.url, _existing(args.url)))
    else:
        for name in [s.strip() for s in args.servers.split(",")]:
            if name == "appliance":
                if not appliance_up_available():
                    print(f"{'appliance':<12} skipped: `python -m appliance up` is not "
                          "available in this tree yet")
                    continue
                targets.append((name, start_appliance("pcm", [])))
            elif name == "aiortc":
                targets.append((name, start_aiortc()))
    for name, ctx in targets:
        with ctx as server:
            url = server if isinstance(server, str) else server.url
            conn, echo, fails = trio.run(lambda u=url: rounds(
                u, concurrent=args.concurrent, n_rounds=args.rounds, hold=args.hold,
                agent=args.agent))
        print(f"{name:<12} {len(echo):>4} {_ms(percentile(conn, 50)):>14} "
              f"{_ms(percentile(conn, 99)):>7} {_ms(percentile(echo, 50)):>15} "
              f"{_ms(percentile(echo, 99)):>7}  "
              f"{len(fails)}{': ' + fails[0] if fails else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
