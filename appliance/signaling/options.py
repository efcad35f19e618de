"""Command-line options that ``appliance signaling`` and ``appliance up`` share: TLS, the
API token and advertised addresses, and where the web UI is.

Both commands serve the same HTTP API, so both take these flags with the same meaning;
they live here, not in either command's module, so neither imports the other.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..proto.turn.credentials import check_turn_url
from ..statedir import default_state_dir
from .sip_config import SipSettings, parse_networks
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


def add_turn_arguments(parser: argparse.ArgumentParser, *, role: str) -> None:
    """TURN for clients (issue 40 item 3, docs/turn.md): ``up`` runs it in its relays and
    advertises it; ``signaling`` advertises the relays' (it mints credentials with their
    secret)."""
    if role == "up":
        on = ("TURN server on the relays' media port — UDP, TCP where ICE-TCP listens, TLS "
              "where --https-on-media-port serves TLS — for clients restricted to relayed "
              "candidates (their media to this appliance never leaves the host); signaling "
              "hands out its URLs and a credential per session (WHIP Link headers, "
              "ice_servers). On by default; this flag only makes a missing public address an "
              "error")
    else:
        on = ("advertise the relays' TURN servers with a credential per session (WHIP Link "
              "headers, ice_servers): on by default when a TURN secret is known "
              "(--secret-file or --turn-secret-file)")
    parser.add_argument("--turn", action="store_true", default=None, help=on)
    parser.add_argument("--no-turn", dest="turn", action="store_false", default=None,
                        help="no TURN (config file: turn = false)" + (
                            ": the relays drop TURN requests and clients are given no "
                            "TURN server" if role == "up" else ": clients are given no "
                            "TURN server"))
    parser.add_argument("--turn-secret-file", metavar="F", default=None,
                        help="the TURN REST API shared secret(s), one per line (coturn's "
                             "static-auth-secret form; the first mints, all verify; "
                             "default: derived from the routing secret)")
    parser.add_argument("--turn-url", action="append", metavar="URL", default=None,
                        help="advertise this TURN URL instead of the media port's (repeatable; "
                             "e.g. turns:turn.example.com:443?transport=tcp when a proxy "
                             "in front takes 443)")
    parser.add_argument("--turn-credential-ttl", type=float, metavar="S", default=None,
                        help="how long a TURN credential handed out lasts from when its call "
                             "may start: a call through TURN longer than this loses its "
                             "relay at the next refresh (default 7200)")
    if role == "signaling":
        parser.add_argument("--secret-file", metavar="F", default=None,
                            help="the routing secret file the relays have: the TURN secret "
                                 "is derived from it unless --turn-secret-file is given")


def turn_url_overrides(args: argparse.Namespace) -> list[str]:
    """``--turn-url``, each checked (ValueError names the bad one)."""
    urls = getattr(args, "turn_url", None) or []
    return [check_turn_url(str(u)) for u in (urls if isinstance(urls, list | tuple) else [urls])]


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


#: The agent of GPT-Live sessions (``GET /v1/live/sessions``) unless set: the offline
#: assistant, so a fresh ``appliance up`` hears and answers words with no key.
DEFAULT_LIVE_AGENT = "assistant"


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--live-agent", metavar="SPEC", default=None,
                        help="agent for GPT-Live WebSocket sessions (GET /v1/live/sessions, "
                             "OpenAI's client.live.connect(); default "
                             f"{DEFAULT_LIVE_AGENT}: the offline assistant, assistant?llm=… "
                             "for a model; realtime for the echo agent, "
                             "realtime:module:attr for your own RealtimeAgent)")


def checked_live_agent(spec: object) -> str:
    """``--live-agent``, loaded once now when it is not the default, so a typo fails the
    command at start (AgentError is a ValueError) instead of every session. The default is
    resolved at the first session: a box without the speech extra still starts, and its
    Live sessions are refused with the reason."""
    live = str(spec or DEFAULT_LIVE_AGENT)
    if live != DEFAULT_LIVE_AGENT:
        from ..live.agent import live_factory

        live_factory(live)
    return live


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


def add_sip_arguments(parser: argparse.ArgumentParser) -> None:
    """Phone calls (docs/sip.md): off unless ``--sip`` is given."""
    parser.add_argument("--sip", metavar="HOST:PORT", default=None,
                        help="serve SIP for phone trunks on UDP and TCP at this address "
                             "(e.g. 0.0.0.0:5060); incoming calls ring, POST "
                             "realtime.call.incoming to --webhook-url and are answered with "
                             "POST /v1/realtime/calls/{call_id}/accept (default: off)")
    parser.add_argument("--sip-tls", metavar="HOST:PORT", default=None,
                        help="also serve SIP over TLS here (e.g. 0.0.0.0:5061), with "
                             "--tls-cert/--tls-key or a self-signed certificate kept in the "
                             "state directory")
    parser.add_argument("--sip-allow", action="append", metavar="CIDR", default=None,
                        help="trunk networks allowed to send SIP; repeatable (default: "
                             "loopback only); others get a minimal 403")
    parser.add_argument("--sip-drop-refused", action="store_true", default=None,
                        help="send nothing at all to sources outside --sip-allow (scanners)")
    parser.add_argument("--sip-agent", metavar="SPEC", default=None,
                        help="without --webhook-url: answer every trunk call at once with "
                             "this agent (a dev box's way to call an agent from a softphone)")
    parser.add_argument("--sip-trunks", metavar="FILE", default=None,
                        help="trunks for outbound calls (POST /v1/realtime/calls/sip): a "
                             "TOML or JSON file, credentials from it or the environment "
                             "(docs/sip.md)")
    parser.add_argument("--sip-rate", metavar="PER_SECOND", type=float, default=None,
                        help="new SIP transactions per second per source IP (default 20)")
    parser.add_argument("--sip-max-invites", metavar="N", type=int, default=None,
                        help="incoming calls ringing at once; beyond, 503 (default 64)")
    parser.add_argument("--sip-answer-timeout", metavar="SECONDS", type=float, default=None,
                        help="a call neither accepted nor rejected by then gets 480 "
                             "(default 30)")


def sip_settings(args: argparse.Namespace, public: list[str]) -> SipSettings | None:
    """The SIP settings from ``--sip*`` (None when ``--sip`` is not given); ``public`` are
    the advertised addresses (our Via/Contact host when bound to any address)."""
    from ..config import parse_hostport

    spec = getattr(args, "sip", None)
    if not spec:
        for flag in ("sip_tls", "sip_allow", "sip_agent", "sip_trunks"):
            if getattr(args, flag, None):
                raise ValueError(f"--{flag.replace('_', '-')} needs --sip")
        return None
    udp_tcp = parse_hostport(spec, default_host="0.0.0.0")
    tls = parse_hostport(args.sip_tls, default_host=udp_tcp[0]) \
        if getattr(args, "sip_tls", None) else None
    settings = SipSettings(udp_tcp=udp_tcp, tls=tls,
                           drop_refused=bool(getattr(args, "sip_drop_refused", False)),
                           agent=getattr(args, "sip_agent", None) or None)
    allow = getattr(args, "sip_allow", None)
    if isinstance(allow, str):
        allow = [allow]
    if allow:
        settings.allow = parse_networks(allow)
    trunks = getattr(args, "sip_trunks", None)
    if trunks:
        from .sip_trunks import load_trunks
        settings.trunks = load_trunks(trunks)  # TrunkError is a ValueError naming no secret
    rate = getattr(args, "sip_rate", None)
    if rate is not None:
        if not 0.1 <= float(rate) <= 10_000:
            raise ValueError("--sip-rate must be 0.1..10000 per second")
        settings.rate = float(rate)
    invites = getattr(args, "sip_max_invites", None)
    if invites is not None:
        if not 1 <= int(invites) <= 100_000:
            raise ValueError("--sip-max-invites must be 1..100000")
        settings.max_invites = int(invites)
    timeout = getattr(args, "sip_answer_timeout", None)
    if timeout is not None:
        if not 1 <= float(timeout) <= 600:
            raise ValueError("--sip-answer-timeout must be 1..600 seconds")
        settings.answer_timeout = float(timeout)
    if tls is not None:
        if getattr(args, "tls_cert", None) and getattr(args, "tls_key", None):
            settings.tls_cert, settings.tls_key = args.tls_cert, args.tls_key
        else:
            d = Path(getattr(args, "state_dir", None) or default_state_dir()) / "sip"
            settings.tls_cert, settings.tls_key, _ = ensure_self_signed(d, [*public, tls[0]])
    if udp_tcp[0] in ("0.0.0.0", "::", "") and public:
        settings.sip_host = public[0]  # the address trunks reach, in our Via/Contact
    return settings
