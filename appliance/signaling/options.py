"""Command-line options that ``appliance signaling`` and ``appliance up`` share: TLS, the
API token and advertised addresses, and where the web UI is.

Both commands serve the same HTTP API, so both take these flags with the same meaning;
they live here, not in either command's module, so neither imports the other.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..statedir import default_state_dir
from .tls import ensure_self_signed
from .webhooks import Endpoint, parse_endpoint


def default_webui_dir() -> Path:
    """``webui/`` next to the package (a source checkout or an editable install)."""
    return Path(__file__).resolve().parent.parent.parent / "webui"


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls", choices=["self-signed"], default=None,
                        help="serve HTTPS with a self-signed certificate kept in the state "
                             "directory (its SHA-256 is printed); browsers need HTTPS for the "
                             "microphone anywhere but localhost")
    parser.add_argument("--tls-cert", metavar="PEM", default=None,
                        help="serve HTTPS with this certificate chain (needs --tls-key)")
    parser.add_argument("--tls-key", metavar="PEM", default=None,
                        help="private key for --tls-cert")


def add_auth_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-token", metavar="TOKEN", default=None,
                        help="bearer token the API requires when bound to a non-loopback "
                             "address (default: generated and printed at start)")
    parser.add_argument("--public-address", action="append", metavar="IP", default=None,
                        help="media address to advertise in SDP answers, IPv4 or IPv6; "
                             "repeatable (default: the default-route interface's address)")


#: The agent of ``/v1/realtime/calls`` unless set: the appliance's Realtime event state
#: machine with the built-in echo backend (appliance/realtime/).
DEFAULT_REALTIME_AGENT = "realtime"


def add_realtime_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--realtime-agent", metavar="SPEC", default=None,
                        help="agent for OpenAI-Realtime-style calls (POST /v1/realtime/calls; "
                             f"default {DEFAULT_REALTIME_AGENT}: the built-in event state "
                             "machine with its echo backend; realtime:module:attr for your "
                             "own RealtimeAgent, realtime+wss://host/v1/realtime?model=… for "
                             "an upstream Realtime WebSocket service)")


def add_webhook_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--webhook-url", action="append", metavar="URL[,secret-file=PATH|"
                        ",secret-env=NAME]", default=None,
                        help="POST call events (realtime.call.started / .ended, with the "
                             "end-of-call report) here, signed per Standard Webhooks with "
                             "the endpoint's whsec_ secret, read from PATH or the variable "
                             "NAME (default APPLIANCE_WEBHOOK_SECRET); repeatable")


def webhook_endpoints(args: argparse.Namespace) -> list[Endpoint]:
    """The parsed ``--webhook-url`` endpoints (WebhookConfigError, a ValueError, if bad)."""
    return [parse_endpoint(spec) for spec in getattr(args, "webhook_url", None) or []]


def tls_settings(args: argparse.Namespace, hosts: list[str]) -> tuple[str | None, str | None, str | None]:
    """(cert, key, fingerprint-if-self-signed) from --tls / --tls-cert / --tls-key."""
    if args.tls == "self-signed":
        if args.tls_cert or args.tls_key:
            raise ValueError("--tls self-signed and --tls-cert/--tls-key are exclusive")
        cert, key, fp = ensure_self_signed(Path(args.state_dir or default_state_dir()), hosts)
        return cert, key, fp
    if args.tls is not None:
        raise ValueError(f"unknown --tls mode {args.tls!r}")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    for path in (args.tls_cert, args.tls_key):
        if path and not Path(path).is_file():
            raise ValueError(f"TLS file {path} does not exist")
    return args.tls_cert, args.tls_key, None
