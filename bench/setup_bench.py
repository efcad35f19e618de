"""Setup time: POST → connected and POST → first echoed audio packet, S concurrent setups.

Our own client (``appliance.client``, built on ``appliance.proto``) opens ``--concurrent``
sessions at once, ``--rounds`` times, against ``appliance up`` (started here on loopback with
its own state directory and ``--transceivers`` transceivers, default 2 as ``up`` itself) and,
side by side in the same run, the aiortc echo server of bench/aiortc_echo_server.py. Issue 5
target for the appliance on loopback with 20 concurrent setups: p50 ≤ 25 ms and p99 ≤ 60 ms
to the first echoed packet.

    .venv/bin/python bench/setup_bench.py                   # both servers
    .venv/bin/python bench/setup_bench.py --servers appliance --rounds 10
    .venv/bin/python bench/setup_bench.py --url http://127.0.0.1:8080   # an existing server
    .venv/bin/python bench/setup_bench.py --servers appliance --http-only --rounds 20

``--http-only`` measures signaling's share alone: each round POSTs ``--concurrent`` real
offers at once (each on its own TCP connection, as browsers do), then DELETEs them all at
once, with no ICE, DTLS or media; it prints POST and DELETE latency p50/p99 and the CPU per
POST + DELETE pair of each server process. Far less noisy than a whole setup.

Each session sends media for ``--hold`` s (enough for the first echo to come back), then
hangs up (DELETE); rounds are spaced so sessions from one round are gone before the next.

For an appliance it also prints where the time went on the server: the p50/p99 of each step
of the transceivers' own setup timelines (``GET /v1/sessions``, milliseconds from the moment
the transceiver got the offer), so POST → first echo minus the server's share is the HTTP
round trip, the client's own work and the scheduling of everything on the same CPUs. The
load average is printed too: on a shared machine it explains most of the spread.

And the CPU each process used per session (setup, ``--hold`` s of media, DELETE), from
``/proc`` for the server's processes and ``getrusage`` for this client: with S setups at once
on C CPUs, S × (total CPU per setup) / C is a floor under the time the last one can take.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capacity import (  # noqa: E402  (bench scripts import their sibling)
    Server,
    appliance_up_available,
    cmdline,
    cpu_seconds,
    machine,
    start_aiortc,
    start_appliance,
)

from appliance.client.http import HttpError, request  # noqa: E402
from appliance.loadgen import LoadConfig, run_load  # noqa: E402
from appliance.loadgen.media import encode_tone  # noqa: E402
from appliance.loadgen.stats import percentile  # noqa: E402
from appliance.proto.dtls import Certificate  # noqa: E402


async def http_rounds(url: str, *, concurrent: int, n_rounds: int
                      ) -> tuple[list[float], list[float], list[str]]:
    """POST ``concurrent`` offers at once, then DELETE them at once; ``n_rounds`` times."""
    from appliance.client.peer import ClientPeer

    certificate = Certificate.generate(trio.current_time())
    offers = [ClientPeer(certificate).offer().encode() for _ in range(concurrent)]
    base = url.rstrip("/")
    posts: list[float] = []
    deletes: list[float] = []
    failures: list[str] = []
    for _ in range(n_rounds):
        locations: list[str] = []

        async def post(offer: bytes, locations: list[str]) -> None:
            t0 = trio.current_time()
            resp = await request("POST", base + "/v1/sessions", body=offer,
                                 headers={"Content-Type": "application/sdp"})
            posts.append(trio.current_time() - t0)
            if resp.status != 201:
                failures.append(f"POST → {resp.status}")
            else:
                locations.append(resp.header("location") or "")

        async def delete(location: str) -> None:
            t0 = trio.current_time()
            resp = await request("DELETE", base + location)
            deletes.append(trio.current_time() - t0)
            if resp.status != 200:
                failures.append(f"DELETE → {resp.status}")

        async with trio.open_nursery() as nursery:
            for offer in offers:
                nursery.start_soon(post, offer, locations)
        async with trio.open_nursery() as nursery:
            for location in locations:
                nursery.start_soon(delete, location)
    return posts, deletes, failures


async def rounds(url: str, *, concurrent: int, n_rounds: int, hold: float,
                 agent: str | None, false_start: bool = False,
                 ) -> tuple[list[float], list[float], list[str]]:
    # Encoded once and one DTLS certificate for every round, as a browser keeps its own:
    # neither belongs in the setup CPU or time we measure.
    stream = encode_tone()
    certificate = Certificate.generate(trio.current_time())
    connected: list[float] = []
    first_echo: list[float] = []
    failures: list[str] = []
    ANSWERS.clear()
    for _ in range(n_rounds):
        # rate so high that every session of the round is started in the same instant
        report = await run_load(
            LoadConfig(url, sessions=concurrent, rate=1e6, duration=hold, agent=agent,
                       drain=0.1, false_start=false_start),
            stream=stream, certificate=certificate)
        for s in report.sessions:
            if s.failure:
                failures.append(s.failure)
            if s.setup_connected is not None:
                connected.append(s.setup_connected)
            if getattr(s, "setup_answer", None) is not None:  # absent in older trees
                ANSWERS.append(s.setup_answer)
            if s.setup_first_echo is not None:
                first_echo.append(s.setup_first_echo)
        await trio.sleep(0.5)
    return connected, first_echo, failures


ANSWERS: list[float] = []  # POST → 201 read, of the last rounds() call

TIMELINE = ("answer_sent", "first_stun", "ice_nominated", "dtls_done", "first_rtp_in",
            "first_rtp_out")


async def server_timelines(url: str) -> dict[str, list[float]]:
    """Each setup step in ms from the transceivers' timelines of the sessions they still
    remember (the last 256 ended ones each); empty for a server without this API."""
    try:
        resp = await request("GET", url.rstrip("/") + "/v1/sessions")
        sessions = json.loads(resp.body)["sessions"] if resp.status == 200 else []
    except (HttpError, ValueError, KeyError, TypeError):
        return {}
    steps: dict[str, list[float]] = {k: [] for k in TIMELINE}
    if not isinstance(sessions, list):
        return {}  # not the appliance's API (the aiortc baseline answers a count)
    for s in sessions:
        timeline = (s.get("timeline") if isinstance(s, dict) else None) or {}
        if timeline.get("first_rtp_out") is None:
            continue  # not one of ours (or never got media)
        for k in TIMELINE:
            if isinstance(timeline.get(k), int | float):
                steps[k].append(float(timeline[k]) / 1000)
    return steps


async def measure(url: str, *, concurrent: int, n_rounds: int, hold: float,
                  agent: str | None, false_start: bool = False,
                  ) -> tuple[list[float], list[float], list[str], dict[str, list[float]]]:
    conn, echo, fails = await rounds(url, concurrent=concurrent, n_rounds=n_rounds, hold=hold,
                                     agent=agent, false_start=false_start)
    return conn, echo, fails, await server_timelines(url)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


@contextmanager
def _existing(url: str) -> Iterator[Server | str]:
    yield url


def _roles(server: Server) -> dict[str, list[int]]:
    """The server's processes by role (``appliance up`` = supervisor + signaling)."""
    roles: dict[str, list[int]] = {}
    for pid in server.pids():
        cmd = cmdline(pid).split()
        role = next((r for r in ("transceiver", "relay", "up") if r in cmd[2:4]), "other")
        roles.setdefault("signaling+supervisor" if role == "up" else role, []).append(pid)
    return roles


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=None, help="measure this endpoint only (no servers started)")
    p.add_argument("--servers", default="appliance,aiortc")
    p.add_argument("--concurrent", type=int, default=20, help="setups at once (default 20)")
    p.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--hold", type=float, default=1.0, help="media seconds per session")
    p.add_argument("--agent", default=None)
    p.add_argument("--transceivers", type=int, default=2,
                   help="transceivers of the appliance started here (default 2, as `up`)")
    p.add_argument("--false-start", action="store_true",
                   help="the client uses DTLS False Start (RFC 7918; browsers do not)")
    p.add_argument("--http-only", action="store_true",
                   help="POST then DELETE only (no ICE/DTLS/media): signaling's share")
    args = p.parse_args(argv)
    if args.http_only:
        return http_main(args)

    print(f"machine: {machine()}")
    print("load average at start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{args.rounds} rounds × {args.concurrent} concurrent setups, loopback"
          + (", client DTLS False Start" if args.false_start else "")
          + ("" if args.url else f", appliance with {args.transceivers} transceiver(s)") + "\n")
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
                targets.append((name, start_appliance("pcm", [],
                                                      transceivers=args.transceivers)))
            elif name == "aiortc":
                targets.append((name, start_aiortc()))
    breakdowns: list[tuple[str, dict[str, list[float]]]] = []
    verdicts: list[str] = []
    cpu_lines: list[str] = []
    for name, ctx in targets:
        with ctx as server:
            url = server if isinstance(server, str) else server.url
            roles = _roles(server) if isinstance(server, Server) else {}
            before = {role: cpu_seconds(pids) for role, pids in roles.items()}
            me = _self_cpu()
            conn, echo, fails, steps = trio.run(lambda u=url: measure(
                u, concurrent=args.concurrent, n_rounds=args.rounds, hold=args.hold,
                agent=args.agent, false_start=args.false_start))
            n = args.rounds * args.concurrent
            used = {role: (cpu_seconds(pids) - before[role]) / n for role, pids in roles.items()}
            used["client (this process)"] = (_self_cpu() - me) / n
            cpu_lines.append(f"{name}: " + ", ".join(f"{role} {v * 1000:.1f}"
                                                     for role, v in used.items())
                             + f"; total {sum(used.values()) * 1000:.1f}")
        print(f"{name:<12} {len(echo):>4} {_ms(percentile(conn, 50)):>14} "
              f"{_ms(percentile(conn, 99)):>7} {_ms(percentile(echo, 50)):>15} "
              f"{_ms(percentile(echo, 99)):>7}  "
              f"{len(fails)}{': ' + fails[0] if fails else ''}", flush=True)
        if ANSWERS:
            print(f"{'':<12} POST → answer read p50 {_ms(percentile(ANSWERS, 50))} / "
                  f"p99 {_ms(percentile(ANSWERS, 99))} ms", flush=True)
        if any(steps.values()):
            breakdowns.append((name, steps))
        p50, p99 = percentile(echo, 50), percentile(echo, 99)
        if name != "aiortc" and p50 is not None and p99 is not None:
            met = p50 <= 0.025 and p99 <= 0.060 and not fails
            verdicts.append(f"{name}: POST → first echo p50 {p50 * 1000:.1f} ms (≤ 25), "
                            f"p99 {p99 * 1000:.1f} ms (≤ 60): {'met' if met else 'NOT met'}")
    for name, steps in breakdowns:
        print(f"\n{name}: transceiver timeline, ms after it got the offer (p50 / p99)")
        for k in TIMELINE:
            print(f"  {k:<14} {_ms(percentile(steps[k], 50)):>7} / "
                  f"{_ms(percentile(steps[k], 99))}")
    if cpu_lines:
        print(f"\nCPU ms per session (setup + {args.hold:g} s of media + DELETE), by process:")
        for line in cpu_lines:
            print("  " + line)
    if verdicts:
        print(f"\ntarget (issue 5: 20 concurrent setups on loopback; this run "
              f"{args.concurrent}):")
        for line in verdicts:
            print("  " + line)
    print("load average at end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


def http_main(args: argparse.Namespace) -> int:
    print(f"machine: {machine()}")
    print("load average at start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{args.rounds} rounds × {args.concurrent} concurrent POSTs, then as many DELETEs; "
          f"loopback, no ICE/DTLS/media\n")
    ctx: AbstractContextManager[Server | str] = (
        _existing(args.url) if args.url
        else start_appliance("pcm", [], transceivers=args.transceivers))
    with ctx as server:
        url = server if isinstance(server, str) else server.url
        roles = _roles(server) if isinstance(server, Server) else {}
        trio.run(lambda: http_rounds(url, concurrent=args.concurrent, n_rounds=1))  # warm-up
        before = {role: cpu_seconds(pids) for role, pids in roles.items()}
        me = _self_cpu()
        posts, deletes, fails = trio.run(lambda: http_rounds(
            url, concurrent=args.concurrent, n_rounds=args.rounds))
        n = args.rounds * args.concurrent
        used = {role: (cpu_seconds(pids) - before[role]) / n for role, pids in roles.items()}
        used["client (this process)"] = (_self_cpu() - me) / n
    print(f"POST   n {len(posts)}  p50 {_ms(percentile(posts, 50))}  "
          f"p99 {_ms(percentile(posts, 99))} ms")
    print(f"DELETE n {len(deletes)}  p50 {_ms(percentile(deletes, 50))}  "
          f"p99 {_ms(percentile(deletes, 99))} ms")
    print(f"failures {len(fails)}{': ' + fails[0] if fails else ''}")
    print("CPU ms per POST + DELETE: " + ", ".join(f"{role} {v * 1000:.2f}"
                                                    for role, v in used.items()))
    print("load average at end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
