"""The ``appliance`` command.

Subcommands: ``up`` (everything on one host), ``relay``, ``transceiver``, ``signaling``
(one role each), ``ufrag mint|decode`` (inspect routing hints). Each role lives in a module
with ``add_arguments(parser)`` and ``run(args) -> int``; this file only wires them up.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .heap import settle_heap
from .proto.ufrag import UfragCodec, UfragError, load_secrets
from .statedir import SECRET_NAME, default_state_dir

# (subcommand, module, one-line help). A role appears here only once it really runs.
ROLES: list[tuple[str, str, str]] = [
    ("up", "appliance.supervisor",
     "run everything on one host: signaling + web UI, relay workers, transceivers"),
    ("signaling", "appliance.signaling.cli",
     "run the HTTP API alone (WHIP-style signaling, web UI, metrics)"),
    ("relay", "appliance.relay.cli",
     "run the relay: one public UDP port, flows routed by server ufrag"),
    ("transceiver", "appliance.transceiver.cli",
     "run one transceiver: ICE-lite, DTLS, SRTP and Opus for agent sessions"),
    ("loadgen", "appliance.loadgen.cli",
     "open N real WebRTC voice sessions against a WHIP-style endpoint and measure them"),
]


def _secret_path(args: argparse.Namespace) -> str:
    """``--secret-file``, else the routing secret ``appliance up`` keeps in its state directory
    (``--state-dir``, default as for ``up``), so the two commands agree with no flags."""
    if args.secret_file:
        return str(args.secret_file)
    return str(Path(args.state_dir or default_state_dir()) / SECRET_NAME)


def _read_secrets(args: argparse.Namespace) -> list[bytes]:
    path = _secret_path(args)
    try:
        with open(path, "rb") as f:
            return load_secrets(f.read())
    except FileNotFoundError:
        if args.secret_file:
            raise SystemExit(f"appliance: cannot read secret file {path}: no such file") from None
        raise SystemExit(f"appliance: no routing secret at {path}: `appliance up` creates it on "
                         "first start (in --state-dir); or pass --secret-file F") from None
    except OSError as exc:
        raise SystemExit(f"appliance: cannot read secret file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise SystemExit(f"appliance: {path}: {exc}") from None


def _ufrag_mint(args: argparse.Namespace) -> int:
    codec = UfragCodec(_read_secrets(args))
    try:
        print(codec.mint(cluster=args.cluster, transceiver=args.transceiver))
    except ValueError as exc:
        print(f"appliance ufrag mint: {exc}", file=sys.stderr)
        return 2
    return 0


def _ufrag_decode(args: argparse.Namespace) -> int:
    codec = UfragCodec(_read_secrets(args))
    # Accept a whole STUN USERNAME ("server:client") too: the server ufrag is before ':'.
    ufrag = args.ufrag.split(":", 1)[0]
    try:
        hint = codec.decode_untrusted(ufrag)
    except UfragError as exc:
        print(f"invalid ufrag ({exc.hint}): {exc}", file=sys.stderr)
        return 1
    fields = {
        "version": hint.version,
        "cluster": hint.cluster,
        "transceiver": hint.transceiver,
        "nonce": hint.nonce.hex(),
    }
    if args.json:
        print(json.dumps(fields))
    else:
        for k, v in fields.items():
            print(f"{k}: {v}")
    return 0


def _add_secret_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--secret-file", default=None, metavar="F",
                   help="routing secret file (one secret per line, hex or text; default: "
                        f"{SECRET_NAME} in the state directory, the one `appliance up` uses)")
    p.add_argument("--state-dir", default=None, metavar="DIR",
                   help="the state directory of `appliance up` (default $XDG_STATE_HOME/"
                        "appliance or ./.appliance-state); ignored with --secret-file")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command``, only that role's module is imported (every
    other role is listed by its help line): ``appliance transceiver`` imported signaling, the
    relay and the load generator too, ~0.8 s of CPU and ~40 MiB per process it started."""
    parser = argparse.ArgumentParser(
        prog="appliance",
        description=(
            "A self-hosted WebRTC voice front door for AI agents: one public UDP port, "
            "packets routed by ICE ufrag to the transceiver that owns the session."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    for name, module, help_text in ROLES:
        p = sub.add_parser(name, help=help_text, description=help_text)
        if command is None or command == name:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(func=mod.run)

    uf = sub.add_parser("ufrag", help="mint or decode server ufrags (routing hints)",
                        description="Mint or decode server ufrags (routing hints).")
    ufsub = uf.add_subparsers(dest="ufrag_command", metavar="ACTION", required=True)
    mint = ufsub.add_parser("mint", help="print a fresh server ufrag",
                            description="Print a fresh server ufrag for a transceiver.")
    mint.add_argument("--transceiver", type=int, required=True, metavar="K",
                      help="transceiver id (0..65535)")
    mint.add_argument("--cluster", type=int, default=0, metavar="C",
                      help="cluster id (0..65535, default 0)")
    _add_secret_arguments(mint)
    mint.set_defaults(func=_ufrag_mint)
    dec = ufsub.add_parser("decode", help="print a ufrag's fields, or why it is invalid",
                           description="Verify a server ufrag and print its fields; exits 1 "
                           "with a one-line reason when it is invalid.")
    dec.add_argument("ufrag", help="the server ufrag (or a whole 'server:client' USERNAME)")
    _add_secret_arguments(dec)
    dec.add_argument("--json", action="store_true", help="print the fields as JSON")
    dec.set_defaults(func=_ufrag_decode)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The subcommand is the first word (the top level takes no option but -h): import only
    # its module. Anything else (no command, -h, a typo) gets the full parser's answer.
    roles = {name for name, _, _ in ROLES}
    command = argv[0] if argv and argv[0] in roles | {"ufrag"} else None
    parser = build_parser(command)
    args = parser.parse_args(argv)
    settle_heap()
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
