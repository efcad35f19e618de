"""``appliance signaling``: the HTTP API alone, for multi-host deployments.

Under ``appliance up`` the supervisor runs the same :func:`serve_signaling` in its own nursery;
this entry point is for a signaling host that reaches transceivers and relay workers over
their control addresses (``host:port`` TCP or Unix socket paths).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import trio

from .. import plugins  # noqa: F401  (registers realtime/ and speech/: appliance/plugins.py)
from ..config import (
    ADMISSION_LIMIT,
    ConfigError,
    format_hostport,
    load_config,
    parse_admission_limit,
    parse_hostport,
    resolve,
)
from ..logs import add_logging_flags, configure
from ..proto.turn.credentials import derive_turn_secret, parse_turn_secrets, turn_urls
from ..proto.ufrag import load_secrets
from .geo import parse_ingress_map
from .ice_servers import DEFAULT_TTL as DEFAULT_TURN_TTL
from .ice_servers import TurnAdvert, check_ttl
from .options import (
    DEFAULT_LIVE_AGENT,
    DEFAULT_REALTIME_AGENT,
    add_auth_arguments,
    add_live_arguments,
    add_realtime_arguments,
    add_sip_arguments,
    add_tls_arguments,
    add_turn_arguments,
    add_webhook_arguments,
    checked_live_agent,
    default_webui_dir,
    sip_settings,
    tls_settings,
    turn_url_overrides,
    webhook_endpoints,
)
from .server import (
    check_public_address,
    default_public_addresses,
    ensure_api_token,
    run_until_signalled,
    serve_signaling,
)
from .state import SignalingConfig

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "http": "127.0.0.1:8080",
    "udp_port": 3478,
    "public_tcp_port": None,
    "relayed_media_port": None,
    "relay_https": None,
    "admission_limit": ADMISSION_LIMIT,
    "transceiver_control": [],
    "relay_control": [],
    "public_address": [],
    "ingress": [],
    "ingress_prefix": [],
    "region_header": None,
    "trusted_proxy": [],
    "realtime_agent": DEFAULT_REALTIME_AGENT,
    "live_agent": DEFAULT_LIVE_AGENT,
    "turn": None,
    "secret_file": None,
    "turn_secret_file": None,
    "turn_url": [],
    "turn_credential_ttl": DEFAULT_TURN_TTL,
}


def add_geo_arguments(parser: argparse.ArgumentParser) -> None:
    """Geo-steered ingress (appliance/signaling/geo.py); config file keys: ingress (a table
    REGION = "HOST:PORT,..." or a list), ingress_prefix (a table "CIDR" = "REGION"),
    region_header, trusted_proxy (a list)."""
    parser.add_argument("--ingress", action="append", metavar="REGION=HOST:PORT[,HOST:PORT]",
                        default=None,
                        help="relay ingress addresses (IP literals) advertised to clients "
                             "steered to REGION; repeatable")
    parser.add_argument("--ingress-prefix", action="append", metavar="CIDR=REGION", default=None,
                        help="clients whose address is in CIDR get REGION's ingress "
                             "(longest prefix wins); repeatable")
    parser.add_argument("--region-header", metavar="NAME", default=None,
                        help="request header set by a CDN/load balancer naming the client's "
                             "region (e.g. X-Region); it wins over --ingress-prefix")
    parser.add_argument("--trusted-proxy", action="append", metavar="CIDR", default=None,
                        help="proxies whose X-Forwarded-For (and region header) is believed; "
                             "repeatable. Without one the HTTP peer address is the client's")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML config file ([signaling] table)")
    parser.add_argument("--http", metavar="HOST:PORT", default=None,
                        help="HTTP(S) listen address (default 127.0.0.1:8080; loopback needs "
                             "no token, any other address requires the API token)")
    parser.add_argument("--transceiver-control", action="append", metavar="K=ADDR", default=None,
                        help="control address of transceiver K (Unix socket path or "
                             "host:port); repeatable")
    parser.add_argument("--relay-control", action="append", metavar="ADDR", default=None,
                        help="control address of a relay worker (NAME=ADDR or ADDR); repeatable")
    parser.add_argument("--udp-port", type=int, metavar="PORT", default=None,
                        help="the relays' public UDP port, advertised in answers (default 3478)")
    parser.add_argument("--public-tcp-port", type=int, metavar="PORT", default=None,
                        help="the relays' public ICE-TCP port (relay --tcp, or the port a load "
                             "balancer maps to it, e.g. 443): answers then list a TCP passive "
                             "candidate per address beside the UDP one (default: none)")
    parser.add_argument("--relayed-media-port", type=int, metavar="PORT", default=None,
                        help="a second relay UDP port (>= 1024) answered as a lower-priority "
                             "candidate beside each UDP one: what TURN clients relay to when "
                             "--udp-port is below 1024 (Chromium will not relay to such ports; "
                             "relay: a second --listen and --media-address at this port)")
    parser.add_argument("--relay-https", metavar="HOST:PORT", default=None,
                        help="accept the relays' spliced HTTPS connections here (relay "
                             "--tcp-https points at it): each opens with a PROXY v2 header "
                             "naming the real client, whose address decides whether the API "
                             "token is needed (docs/security.md). Needs --tls; generates an "
                             "API token if none is configured")
    add_auth_arguments(parser)
    add_realtime_arguments(parser)
    add_live_arguments(parser)
    add_webhook_arguments(parser)
    add_sip_arguments(parser)
    add_turn_arguments(parser, role="signaling")
    add_geo_arguments(parser)
    add_tls_arguments(parser)
    parser.add_argument("--state-dir", metavar="DIR", default=None,
                        help="where a self-signed certificate is kept (default "
                             "./.appliance-state or $XDG_STATE_HOME/appliance)")
    parser.add_argument("--admission-limit", metavar="SHARE", default=None,
                        help="place calls on a transceiver only while its measured busy "
                        "share, calls placed since its last report counted, stays at or "
                        f"under SHARE of its core (default {ADMISSION_LIMIT}; else 503 overloaded; "
                        "docs/operations.md, \"Admission\")")
    parser.add_argument("--webui-dir", metavar="DIR", default=None,
                        help="static web UI directory served at / and /demo")
    add_logging_flags(parser)


def _pairs(items: Any, what: str, *, keyed: bool) -> dict[str, str]:
    """``["0=/run/t0.sock", ...]`` or a TOML table ``{0 = "..."}`` → {key: address}."""
    if isinstance(items, Mapping):
        return {str(k): str(v) for k, v in items.items()}
    if isinstance(items, str):
        items = [items]
    out: dict[str, str] = {}
    for i, item in enumerate(items or []):
        key, sep, addr = str(item).partition("=")
        if not sep:
            if keyed:
                raise ValueError(f"{what} {item!r}: expected K=ADDRESS")
            key, addr = str(i), str(item)
        if not addr:
            raise ValueError(f"{what} {item!r}: empty address")
        out[key.strip()] = addr.strip()
    return out


def _tcp_port(value: object) -> int | None:
    if value is None:
        return None
    port = int(str(value))
    if not 1 <= port <= 65535:
        raise ValueError("--public-tcp-port must be 1..65535")
    return port


def _relayed_port(value: object) -> int | None:
    if value is None:
        return None
    port = int(str(value))
    if not 1024 <= port <= 65535:
        raise ValueError("--relayed-media-port must be 1024..65535 (Chromium will not relay "
                         "to a port below 1024)")
    return port
def _read(path: object, what: str, parse: Any) -> Any:
    try:
        with open(str(path), "rb") as f:
            return parse(f.read())
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ValueError(f"{what} {path}: {exc}") from None


def build_turn(args: argparse.Namespace, cfg: SignalingConfig) -> TurnAdvert | None:
    """What to advertise of the relays' TURN (ice_servers.py): on when a secret is known —
    ``--turn-secret-file``, or derived from the routing secret of ``--secret-file`` as the
    relays derive it — unless ``--no-turn``. The URLs are ``--turn-url``, else the public
    addresses at the relays' TCP port where ``--public-tcp-port`` says ICE-TCP listens,
    TURN over TCP and, where ``--relay-https`` says it serves TLS, over TLS."""
    if args.turn is False:
        return None
    if args.turn_secret_file:
        secret = _read(args.turn_secret_file, "--turn-secret-file", parse_turn_secrets)[0]
    elif args.secret_file:
        secret = derive_turn_secret(_read(args.secret_file, "--secret-file", load_secrets)[0])
    elif args.turn:
        raise ValueError("--turn needs --secret-file (the relays' routing secret) or "
                         "--turn-secret-file: credentials are minted with the relays' secret")
    else:
        return None
    urls = turn_url_overrides(args)
    if not urls:
        tls = cfg.tcp_port if cfg.relay_https is not None else None
        for host in cfg.public_addresses:
            # TCP and TLS only: TURN over UDP on the media address breaks Chromium's direct
            # UDP path (supervisor.turn_advert says why).
            urls += turn_urls(host, cfg.udp_port, udp=False, tcp=cfg.tcp_port is not None,
                              tcp_port=cfg.tcp_port, tls_port=tls)
    if not urls:
        if args.turn:
            raise ValueError("--turn needs --public-tcp-port (the relays' TCP listener) or "
                             "--turn-url: TURN over UDP on the media port is not advertised")
        return None
    return TurnAdvert(secret=secret, urls=tuple(urls), ttl=check_ttl(args.turn_credential_ttl))


def build_config(args: argparse.Namespace) -> tuple[SignalingConfig, str | None]:
    """A SignalingConfig from resolved args; also the TLS fingerprint when self-signed."""
    host, port = parse_hostport(args.http, default_host="127.0.0.1")
    transceivers: dict[int, str] = {}
    for k, addr in _pairs(args.transceiver_control, "--transceiver-control", keyed=True).items():
        try:
            transceivers[int(k)] = addr
        except ValueError:
            raise ValueError(f"--transceiver-control {k}={addr}: K must be an integer") from None
    relays = _pairs(args.relay_control, "--relay-control", keyed=False)
    public = [check_public_address(a) for a in (args.public_address or [])]
    if not public:
        public = default_public_addresses()
    udp_port = int(args.udp_port)
    if not 1 <= udp_port <= 65535:
        raise ValueError("--udp-port must be 1..65535")
    ingress = parse_ingress_map(
        ingress=getattr(args, "ingress", None),
        prefixes=getattr(args, "ingress_prefix", None),
        region_header=getattr(args, "region_header", None),
        trusted_proxies=getattr(args, "trusted_proxy", None),
        default_port=udp_port,
    )
    cert, key, fp = tls_settings(args, [host, *public])
    webui = Path(args.webui_dir) if args.webui_dir else default_webui_dir()
    cfg = SignalingConfig(
        http=(host, port),
        transceivers=transceivers,
        relays=relays,
        public_addresses=public,
        udp_port=udp_port,
        tcp_port=_tcp_port(args.public_tcp_port),
        relayed_media_port=_relayed_port(args.relayed_media_port),
        api_token=args.api_token or None,
        tls_cert=cert,
        tls_key=key,
        webui_dir=webui,
        ingress=ingress,
        realtime_agent=str(args.realtime_agent),
        live_agent=checked_live_agent(getattr(args, "live_agent", None)),
        webhooks=webhook_endpoints(args),
        sip=sip_settings(args, public),
        admission_limit=parse_admission_limit(args.admission_limit),
    )
    if getattr(args, "relay_https", None):
        if not cfg.tls_cert:
            raise ValueError("--relay-https needs --tls (or --tls-cert): the relays splice "
                             "TLS connections to it")
        cfg.relay_https = parse_hostport(args.relay_https, default_host="127.0.0.1")
    cfg.turn = build_turn(args, cfg)
    return cfg, fp


def run(args: argparse.Namespace) -> int:
    configure(level=args.log_level, fmt=args.log_format, role="signaling")
    try:
        resolve(args, load_config(args.config), "signaling", DEFAULTS)
        cfg, fp = build_config(args)
    except (ConfigError, ValueError) as exc:
        print(f"appliance signaling: {exc}", file=sys.stderr)
        return 2
    generated = ensure_api_token(cfg)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(partial(serve_signaling, cfg))
            if fp:
                print(f"TLS certificate (self-signed) SHA-256 {fp}", flush=True)
            if generated:
                print(f"API token (generated): {generated}", flush=True)
            base = binds[0] if binds else ""
            print(f"signaling listening on {base} API {base}/v1/sessions", flush=True)
            if cfg.sip is not None and cfg.sip.bound is not None:
                print(f"sip listening on udp+tcp {format_hostport(cfg.sip.bound[0])}" + (
                    f", tls {format_hostport(cfg.sip.bound[1])}" if cfg.sip.bound[1] else ""),
                      flush=True)

    try:
        trio.run(run_until_signalled, main)
    except KeyboardInterrupt:  # before the signal receiver was installed
        return 130
    except (OSError, BaseExceptionGroup) as exc:
        leaves = _leaves(exc)
        if not all(isinstance(e, OSError) for e in leaves):
            raise
        for e in leaves:
            print(f"appliance signaling: {e}", file=sys.stderr)
        return 1
    return 0


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]
