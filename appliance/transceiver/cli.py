"""``appliance transceiver``: run one transceiver (the process ``appliance up`` starts N of).

Flags override the ``[transceiver]`` table of ``--config``, which overrides the defaults.
When ready it prints one line, ``transceiver K listening on HOST:PORT control ADDRESS``,
which the supervisor (and humans) wait for.
"""

from __future__ import annotations

import argparse
import signal
import sys
from functools import partial

import trio

from appliance.agents import AgentError
from appliance.agents import resolve as resolve_agent
from appliance.config import ConfigError, format_hostport, load_config, parse_hostport, resolve
from appliance.logs import add_logging_flags, configure
from appliance.proto.ufrag import load_secrets

from .server import TransceiverConfig, serve_transceiver

DEFAULTS = {"id": 0, "cluster": 0, "agent": "echo", "max_sessions": 500, "listen": None,
            "control": None}


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
    parser.add_argument("--max-sessions", type=int, default=None, metavar="N",
                        help="refuse new sessions beyond N (503 full; default 500)")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="TOML config file ([transceiver] table and shared keys)")
    add_logging_flags(parser)


def run(args: argparse.Namespace) -> int:
    try:
        resolve(args, load_config(args.config), "transceiver", DEFAULTS)
    except ConfigError as exc:
        print(f"appliance transceiver: {exc}", file=sys.stderr)
        return 2
    configure(level=args.log_level, fmt=args.log_format, role=f"transceiver{args.id}")
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
        tid = int(args.id)
        listen = parse_hostport(args.listen or f"127.0.0.1:{4000 + tid}", default_host="127.0.0.1")
        if not 0 <= tid <= 0xFFFF:
            raise ValueError("--id must be 0..65535")
        config = TransceiverConfig(
            id=tid, secrets=tuple(secrets), listen=listen, control=args.control,
            cluster=int(args.cluster), agent=str(args.agent),
            max_sessions=int(args.max_sessions),
        )
        resolve_agent(config.agent)  # fail now, not at the first session
    except (ValueError, AgentError) as exc:
        print(f"appliance transceiver: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        # SIGTERM/SIGINT: cancel everything; sessions end with "shutdown" (close_notify sent).
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                ready = await nursery.start(partial(serve_transceiver, config))
                print(f"transceiver {config.id} listening on {format_hostport(ready.udp)} "
                      f"control {ready.control or '-'}", flush=True)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(main)
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"appliance transceiver: {exc}", file=sys.stderr)
        return 1
    return 0
