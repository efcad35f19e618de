"""``appliance loadgen``: open N real WebRTC voice sessions against a WHIP-style endpoint.

The lead wires this into :mod:`appliance.cli` as a role (``add_arguments`` + ``run``);
until then ``python -m appliance.loadgen`` runs it.
"""

from __future__ import annotations

import argparse
import json
import sys

import trio

from ..heap import settle_heap
from .runner import PATTERNS, LoadConfig, run_load, stderr_progress
from .stats import format_summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, metavar="URL",
                        help="base URL of the endpoint; offers go to URL/v1/sessions")
    parser.add_argument("-n", "--sessions", type=int, default=10, metavar="N",
                        help="sessions to open (default 10)")
    parser.add_argument("--rate", type=float, default=5.0, metavar="R",
                        help="new sessions per second while ramping (default 5)")
    parser.add_argument("--duration", type=float, default=10.0, metavar="S",
                        help="seconds of media per session, from its connection (default 10)")
    parser.add_argument("--agent", default=None, metavar="NAME",
                        help="agent to ask for (?agent=NAME on the POST)")
    parser.add_argument("--token", default=None, metavar="TOKEN",
                        help="bearer token for the HTTP API")
    parser.add_argument("--insecure", action="store_true",
                        help="do not verify the server's TLS certificate (self-signed)")
    parser.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                        help="POST → ICE+DTLS up, after which a session fails (default 10)")
    parser.add_argument("--drain", type=float, default=0.5, metavar="S",
                        help="wait after the last packet for the echo's tail (default 0.5)")
    parser.add_argument("--rtt", choices=("auto", "tag", "onset"), default="auto",
                        help="echo round-trip method: tags in Opus padding (passthrough "
                             "servers), tone onset (re-encoding servers), or auto (default)")
    parser.add_argument("--false-start", action="store_true",
                        help="DTLS False Start (RFC 7918): send media from our Finished on, "
                             "half a round trip early (browsers do not; off by default)")
    parser.add_argument("--pattern", choices=PATTERNS, default="continuous",
                        help="continuous: a tone with a 100 ms gap every second (echoes, "
                             "capacity); turns: talk --talk s, then listen --listen s, and "
                             "report when the agent answered (turn-taking agents such as "
                             "examples/parrot.py, which reply only after you stop); "
                             "conversational: a conversation's duty cycle against an echo "
                             "(talk 40 %% of --cycle, then silence: caller 40 %%, agent 40 %%, "
                             "both silent 20 %%), measured as continuous")
    parser.add_argument("--talk", type=float, default=1.0, metavar="S",
                        help="with --pattern turns: seconds of tone per turn (default 1)")
    parser.add_argument("--listen", type=float, default=2.5, metavar="S",
                        help="with --pattern turns: seconds of silence after it, waiting "
                             "for the answer (default 2.5); make --duration a multiple of "
                             "talk + listen")
    parser.add_argument("--cycle", type=float, default=2.5, metavar="S",
                        help="with --pattern conversational: seconds per talk-then-listen "
                             "cycle (default 2.5: 1.0 s of tone, 1.5 s of silence)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="write the full report (summary + per session) as JSON; '-' = stdout")
    parser.add_argument("--progress", action="store_true",
                        help="progress line on stderr even when it is not a terminal")


def run(args: argparse.Namespace) -> int:
    cfg = LoadConfig(
        url=args.url, sessions=args.sessions, rate=args.rate, duration=args.duration,
        agent=args.agent, token=args.token, insecure=args.insecure,
        connect_timeout=args.connect_timeout, drain=args.drain, rtt=args.rtt,
        false_start=args.false_start, pattern=args.pattern, talk=args.talk,
        listen=args.listen, cycle=args.cycle,
    )
    tty = sys.stderr.isatty()
    progress = stderr_progress(tty) if (tty or args.progress) else None
    try:
        report = trio.run(lambda: run_load(cfg, progress=progress))
    except ValueError as exc:
        print(f"appliance loadgen: {exc}", file=sys.stderr)
        return 2
    if progress is not None and tty:
        sys.stderr.write("\n")
    summary = report.summary()
    text = format_summary(summary)
    if args.json == "-":
        print(text, file=sys.stderr)
        json.dump(report.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        print(text)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report.to_json(), f, indent=1)
    # Non-zero when any session failed, so scripts can tell.
    return 1 if summary["failed"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="appliance loadgen", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    settle_heap()  # the same start-up freeze as `appliance loadgen`
    return run(args)
