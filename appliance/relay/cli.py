"""``appliance relay``: run the relay alone (one worker, or M worker processes).

Flags override the ``[relay]`` table of the TOML config file, which overrides the defaults
(see :mod:`appliance.config`). With ``--workers M`` (M > 1) this process becomes a small
supervisor: it starts M copies of itself with ``--workers 1`` sharing the public port through
``SO_REUSEPORT`` (their argv from :mod:`.argv`), restarts a worker that dies (at once from a warm standby, else with backoff,
through :class:`appliance.children.Supervisor`, the one ``appliance up`` uses), restarts
them one at a time on SIGHUP (each successor ready before its predecessor stops), serves
``--control`` by summing the workers' counters, and stops them all on SIGINT/SIGTERM.

When ready it prints exactly one line (tests and the supervisor of ``appliance up`` wait for
it)::

    relay listening on HOST:PORT internal HOST:PORT [tcp HOST:PORT]

With several listen addresses or workers, each field is a comma-separated list; ``tcp``
(the ICE-TCP listeners, ``--tcp``) is there only when there are some.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from .. import logs
from ..children import ChildSpec, Supervisor, exception_leaves, serve_fork_template
from ..config import ConfigError, format_hostport, load_config, parse_hostport, resolve
from ..control import serve_control
from ..heap import settle_heap
from ..priority import (
    MEDIA_NICE,
    add_nice_flag,
    nice_from_environment,
    parse_nice,
    raise_priority,
)
from ..proto.turn.credentials import derive_turn_secret, parse_turn_secrets
from ..proto.ufrag import load_secrets
from .argv import relay_argv
from .control import merged_stats, unknown_op
from .core import Address
from .io import IO_ENV, IO_MODES, select_io
from .keeper import Keeper, keeper_name
from .resolver import pattern_address
from .server import RelayConfig, RelayHandle, serve_relay
from .tcp import TcpLimits
from .tls import TurnTls
from .turn import TurnSettings, raise_fd_limit

log = logging.getLogger("appliance.relay")

READY_PREFIX = "relay listening on "
STANDBY_LINE = "relay standby warm"

DEFAULTS: dict[str, Any] = {
    "listen": ["0.0.0.0:3478"],
    "internal": "127.0.0.1:0",
    "transceivers": {},
    "next_hops": {},
    "cluster": 0,
    "workers": 1,
    "flow_timeout": 30.0,
    "max_flows": 100_000,
    "new_flow_rate": 20.0,
    "pin": False,
    "nice": MEDIA_NICE,
    "transceiver_pattern": None,
    "transceiver_count": None,
    "resolve_interval": 5.0,
    "io": "auto",
    "coalesce_us": 20.0,
    "tcp": [],
    "tcp_max_connections": 10_000,
    "tcp_max_per_ip": 64,
    "tcp_proxy_from": [],
    "tcp_https": None,
    "turn": None,  # None: on wherever the relay knows its media address (build_turn)
    "turn_secret_file": None,
    "turn_realm": "appliance",
    "media_address": [],
    "turn_relay_ip": [],
    "turn_peer": [],
    "turn_max_allocations": 2000,
    "turn_allocations_per_ip": 16,
    "turn_allocations_per_user": 8,
    "turn_max_lifetime": 3600,
    "turn_state_dir": None,
    "turn_tls_cert": None,
    "turn_tls_key": None,
    "turn_tls_name": [],
    "tcp_https_name": [],
}


class UsageError(Exception):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the relay: one public UDP port; the first packet of each client flow is routed "
        "by the server ICE ufrag in its STUN USERNAME to the owning transceiver (or to the "
        "relay of another cluster); later packets follow the flow table. Internal datagrams "
        "carry a PROXY protocol v2 header."
    )
    a = parser.add_argument
    a("--listen", action="append", metavar="HOST:PORT",
      help="public UDP address (repeatable, e.g. once for IPv4 and once for [::]:PORT; "
           "default 0.0.0.0:3478)")
    a("--transceiver", dest="transceivers", action="append", metavar="K=HOST:PORT",
      help="internal address of transceiver K of this cluster (repeatable; config file: "
           '[relay] transceivers = {0 = "127.0.0.1:4000"})')
    a("--transceiver-pattern", metavar="PATTERN",
      help="internal address of every transceiver of this cluster by id, e.g. "
           "'transceiver-{id}.transceiver.ns.svc:4000' (a StatefulSet ordinal is the id); "
           "names are resolved off the hot path and re-resolved every --resolve-interval")
    a("--transceivers", dest="transceiver_count", type=int, metavar="N",
      help="with --transceiver-pattern: resolve ids 0..N-1 at start and accept only those "
           "(default: any id, resolved on first use)")
    a("--resolve-interval", type=float, metavar="S",
      help="re-resolve transceiver host names every S seconds, so a pod restarted with a "
           "new IP keeps working (default 5)")
    a("--cluster", type=int, metavar="C", help="this relay's cluster id (default 0)")
    a("--next-hop", dest="next_hops", action="append", metavar="CLUSTER=HOST:PORT",
      help="internal address of the relay serving another cluster (repeatable; config "
           'file: [relay] next_hops = {1 = "10.0.0.2:3479"})')
    a("--secret-file", metavar="F", help="routing secret file (one secret per line; required)")
    a("--workers", type=int, metavar="M",
      help="worker processes sharing the public port with SO_REUSEPORT (default 1)")
    a("--internal", metavar="HOST:PORT",
      help="each worker's internal UDP address (default 127.0.0.1:0, an ephemeral port per "
           "worker; a fixed port is shared by the workers)")
    a("--control", metavar="ADDRESS",
      help='control channel (Unix socket path or host:port) serving {"op": "stats"}')
    a("--redis", metavar="URL",
      help="write established flows to Redis and look unknown flows up there, so media "
           "resumes after a relay restart (e.g. redis://127.0.0.1:6379/0)")
    a("--flow-timeout", type=float, metavar="S",
      help="forget a flow after S seconds without a client datagram (default 30)")
    a("--max-flows", type=int, metavar="N",
      help="hard cap on flows per worker; the stalest is evicted (default 100000)")
    a("--new-flow-rate", type=float, metavar="R",
      help="new flows (and reflexive STUN answers) per second per source IP, burst 2R "
           "(default 20)")
    a("--pin", action="store_true", default=None,
      help="pin each worker process to its own CPU (os.sched_setaffinity)")
    a("--io", choices=IO_MODES, default=None,
      help="hot-loop syscalls: 'mmsg' batches them (recvmmsg/sendmmsg, the optional C "
           "extension appliance.netio._mmsg), 'python' is one recvfrom_into/sendto per "
           f"datagram, 'auto' (default) is mmsg when built; ${IO_ENV} overrides auto")
    a("--coalesce-us", type=float, metavar="US",
      help="under dense traffic, after a wake-up that found fewer than 4 datagrams, wait US "
           "microseconds so the next one finds a batch: less CPU per datagram for at most "
           "US of added latency (default 20; 0 turns it off)")
    a("--tcp", action="append", metavar="HOST:PORT",
      help="ICE-TCP listen address (RFC 6544; repeatable, IPv4 and IPv6): RFC 4571 framed "
           "STUN/DTLS/SRTP over TCP for clients whose networks drop UDP (default: none)")
    a("--tcp-max-connections", type=int, metavar="N",
      help="ICE-TCP connections per worker, at most (default 10000)")
    a("--tcp-max-per-ip", type=int, metavar="N",
      help="ICE-TCP connections per client IP and worker, at most (default 64)")
    a("--tcp-proxy-from", action="append", metavar="CIDR",
      help="a front proxy's address (repeatable): TCP connections from these networks must "
           "open with a PROXY v1/v2 header (HAProxy send-proxy[-v2], nginx proxy_protocol), "
           "and the client it names is the one the relay, TURN and the API judge "
           "(docs/turn.md 'A proxy in front'); from elsewhere no header is read")
    a("--tcp-https", metavar="HOST:PORT",
      help="one port for HTTPS and ICE-TCP: a --tcp connection whose first byte starts a TLS "
           "record is relayed, as is, behind a PROXY v2 header naming the client, to this "
           "address (signaling's --relay-https backend)")
    a("--turn", action="store_true", default=None,
      help="TURN server (RFC 8656) on the UDP listen addresses (and the --tcp listeners), "
           "for clients that may only use relayed candidates; data to this appliance's own "
           "media address goes to its transceiver without leaving the host (docs/turn.md). "
           "On by default wherever the media address is known (a --listen bound to one IP, "
           "or --media-address / --turn-relay-ip); --turn makes it a usage error when not")
    a("--no-turn", dest="turn", action="store_false", default=None,
      help="no TURN server (config file: turn = false): TURN requests are dropped like any "
           "other unknown first packet")
    a("--turn-secret-file", metavar="F",
      help="TURN REST API shared secrets, one per line as text (the first mints, all "
           "verify; the form of coturn's static-auth-secret). Default: derived from the "
           "routing secret")
    a("--turn-realm", metavar="REALM",
      help="TURN realm, 1-12 characters (default 'appliance'; longer would not fit the "
           "amplification bound of a 401 to a 28-byte Allocate)")
    a("--media-address", action="append", metavar="HOST:PORT",
      help="an address clients reach this relay's media port at (repeatable; the answer's "
           "candidates): TURN relays to it in-process. Default: the listen addresses bound "
           "to a specific IP")
    a("--turn-relay-ip", action="append", metavar="IP",
      help="the IP of the relayed addresses TURN hands out (one per family; the sockets "
           "bind to it if it is local, else to the wildcard). Default: the first "
           "--media-address or specific listen IP")
    a("--turn-peer", action="append", metavar="CIDR",
      help="also relay to peers in this network (repeatable; default: only this "
           "appliance's own media addresses). Careful: 127.0.0.0/8 or a private range "
           "opens the services there to anyone holding a credential")
    a("--turn-max-allocations", type=int, metavar="N",
      help="TURN allocations per worker, at most (default 2000; one socket each)")
    a("--turn-allocations-per-ip", type=int, metavar="N",
      help="TURN allocations per client IP and worker (default 16)")
    a("--turn-allocations-per-user", type=int, metavar="N",
      help="TURN allocations per credential (REST username) and worker (default 8)")
    a("--turn-max-lifetime", type=int, metavar="S",
      help="longest allocation lifetime a client may ask for, seconds (default 3600)")
    a("--turn-state-dir", metavar="DIR",
      help="a private directory for what outlives this worker index's lives: without "
           "--redis, its TURN allocations in a file here (the worker that replaces a killed "
           "one re-creates them), and the name of the keeper of its TCP connections in its "
           "warm standby (docs/turn.md 'A worker kill'). `appliance up` and --workers M "
           "give their own")
    a("--turn-tls-cert", metavar="PEM",
      help="TURN over TLS on the --tcp listeners (needs --turn): this certificate chain "
           "(the operator's --tls-cert or signaling's self-signed one); a TLS connection "
           "goes to TURN when its ALPN offers stun.turn, its SNI is a --turn-tls-name, or "
           "it offers no ALPN at all (docs/turn.md)")
    a("--turn-tls-key", metavar="PEM", help="the private key of --turn-tls-cert")
    a("--turn-tls-name", action="append", metavar="HOST",
      help="an SNI host name that means TURN/TLS (repeatable)")
    a("--tcp-https-name", action="append", metavar="HOST",
      help="an SNI host name that means HTTPS signaling even without an http ALPN "
           "(repeatable; with --tcp-https and --turn-tls-cert)")
    a("--config", metavar="FILE", help="TOML config file (flags override it)")
    a("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    # A supervisor's warm standby (appliance.children): start, read the configuration, then
    # fork a worker for each "go" on the control socket that is its stdin, binding nothing
    # itself (issues 20 and 32: fast failover, every time).
    a("--standby", action="store_true", help=argparse.SUPPRESS)
    add_nice_flag(parser)
    logs.add_logging_flags(parser)


def _mapping(value: object, what: str) -> dict[int, Address]:
    """``["0=h:p", ...]`` (flags) or ``{"0": "h:p"}`` (TOML) -> {0: ("h", p)}."""
    items: list[tuple[object, object]]
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list | tuple):
        items = []
        for entry in value:
            ident_text, sep, addr_text = str(entry).partition("=")
            if not sep:
                raise UsageError(f"{what} {entry!r}: expected ID=HOST:PORT")
            items.append((ident_text, addr_text))
    else:
        raise UsageError(f"{what}: expected ID=HOST:PORT entries")
    out: dict[int, Address] = {}
    for key, addr in items:
        try:
            ident = int(str(key))
            if not 0 <= ident <= 0xFFFF:
                raise ValueError
        except ValueError:
            raise UsageError(f"{what} id {key!r}: expected an integer 0..65535") from None
        try:
            out[ident] = parse_hostport(str(addr), default_host="127.0.0.1")
        except ValueError as exc:
            raise UsageError(f"{what} {ident}: {exc}") from None
    return out


def _addr(text: object, what: str, default_host: str) -> Address:
    try:
        return parse_hostport(str(text), default_host=default_host)
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None


def load_turn_secrets(path: str) -> tuple[bytes, ...]:
    """A TURN secret file: one shared secret per non-empty line, taken as text (coturn's
    ``static-auth-secret`` form: the HMAC key is the line's bytes); ``#`` starts a comment."""
    with open(path, "rb") as f:
        return parse_turn_secrets(f.read())


def _list(value: object) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]


def _networks(value: object, what: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    try:
        return tuple(ipaddress.ip_network(x, strict=False) for x in _list(value))
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None


def _knows_media_address(args: argparse.Namespace) -> bool:
    """Whether TURN can name this relay's media address (server.relay_ips): a listen
    address bound to one IP, or --media-address / --turn-relay-ip."""
    listen = _list(args.listen)
    return bool(_list(args.media_address) or _list(args.turn_relay_ip) or any(
        _addr(x, "--listen", "0.0.0.0")[0] not in ("0.0.0.0", "::") for x in listen))


def build_turn(args: argparse.Namespace, routing: list[bytes]) -> TurnSettings | None:
    """TURN's settings, checked; None with ``--no-turn``, or by default when the relay
    listens on a wildcard and is not told the address clients reach it by (TURN could not
    relay to our own media address, so it would only answer 403s: a Kubernetes relay behind
    a load balancer, deploy/kubernetes/40-relay.yaml). ``--turn`` there is a usage error."""
    if args.turn is False:
        return None
    if not _knows_media_address(args):
        if args.turn:
            raise UsageError("--turn on a wildcard listen address needs --media-address "
                             "(or --turn-relay-ip): the address clients reach this relay by")
        log.info("TURN off: the relay listens on a wildcard address and has no "
                 "--media-address (or --turn-relay-ip) to relay to")
        return None
    if args.turn_secret_file:
        try:
            secrets = load_turn_secrets(str(args.turn_secret_file))
        except OSError as exc:
            raise UsageError(f"cannot read TURN secret file {args.turn_secret_file}: "
                             f"{exc.strerror}") from None
        except ValueError as exc:
            raise UsageError(f"{args.turn_secret_file}: {exc}") from None
    else:
        secrets = tuple(derive_turn_secret(s) for s in routing)
    media = tuple(_addr(x, "--media-address", "") for x in _list(args.media_address))
    try:
        relay_ips = tuple(str(ipaddress.ip_address(x)) for x in _list(args.turn_relay_ip))
        peers = tuple(ipaddress.ip_network(x, strict=False) for x in _list(args.turn_peer))
    except ValueError as exc:
        raise UsageError(f"--turn-relay-ip / --turn-peer: {exc}") from None
    settings = TurnSettings(
        secrets=secrets, realm=str(args.turn_realm), media=media, relay_ips=relay_ips,
        peers=peers, max_allocations=int(args.turn_max_allocations),
        max_per_source=int(args.turn_allocations_per_ip),
        max_per_username=int(args.turn_allocations_per_user),
        max_lifetime=int(args.turn_max_lifetime))
    try:
        settings.server_config(frozenset())  # the server's own checks, now
    except ValueError as exc:
        raise UsageError(f"--turn: {exc}") from None
    return settings


def build_turn_tls(args: argparse.Namespace, turn: bool) -> TurnTls | None:
    """``--turn-tls-cert/--turn-tls-key`` and the split's names, checked (the chain loads
    now, so a bad file is a usage error, not a dead listener); None without them."""
    cert, key = args.turn_tls_cert, args.turn_tls_key
    if not cert and not key:
        return None
    if not (cert and key):
        raise UsageError("--turn-tls-cert and --turn-tls-key go together")
    if not turn:
        raise UsageError("--turn-tls-cert needs TURN (no --no-turn, and a media address "
                         "it can relay to)")
    if not args.tcp:
        raise UsageError("--turn-tls-cert needs a --tcp listener")
    tls = TurnTls(cert=str(cert), key=str(key),
                  names=tuple(n.lower().rstrip(".") for n in _list(args.turn_tls_name)),
                  https_names=tuple(n.lower().rstrip(".") for n in _list(args.tcp_https_name)))
    try:
        tls.context()
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"--turn-tls-cert/--turn-tls-key: {exc}") from None
    return tls


def build_config(args: argparse.Namespace) -> RelayConfig:
    """The worker configuration from resolved args; raises UsageError with a clear message."""
    if not args.secret_file:
        raise UsageError("--secret-file is required (or secret_file in the config file)")
    try:
        with open(args.secret_file, "rb") as f:
            secrets = load_secrets(f.read())
    except OSError as exc:
        raise UsageError(f"cannot read secret file {args.secret_file}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"{args.secret_file}: {exc}") from None
    listen = args.listen if isinstance(args.listen, list | tuple) else [args.listen]
    if args.flow_timeout <= 0:
        raise UsageError("--flow-timeout must be > 0")
    if args.max_flows < 1:
        raise UsageError("--max-flows must be >= 1")
    if args.new_flow_rate <= 0:
        raise UsageError("--new-flow-rate must be > 0")
    if not 0 <= int(args.cluster) <= 0xFFFF:
        raise UsageError("--cluster must be 0..65535")
    worker = args.worker_index or 0
    pattern = args.transceiver_pattern or None
    count = None if args.transceiver_count is None else int(args.transceiver_count)
    if pattern is not None:
        try:
            pattern_address(str(pattern), 1)
        except ValueError as exc:
            raise UsageError(f"--transceiver-pattern: {exc}") from None
    if count is not None:
        if pattern is None:
            raise UsageError("--transceivers N needs --transceiver-pattern")
        if not 1 <= count <= 0x10000:
            raise UsageError("--transceivers must be 1..65536")
    if float(args.resolve_interval) <= 0:
        raise UsageError("--resolve-interval must be > 0")
    try:
        select_io(str(args.io))
    except ValueError as exc:
        raise UsageError(f"--io: {exc}") from None
    tcp = args.tcp if isinstance(args.tcp, list | tuple) else [args.tcp]
    if int(args.tcp_max_connections) < 1 or int(args.tcp_max_per_ip) < 1:
        raise UsageError("--tcp-max-connections and --tcp-max-per-ip must be >= 1")
    coalesce_us = float(args.coalesce_us)
    if not 0 <= coalesce_us <= 1000:
        raise UsageError("--coalesce-us must be 0..1000")
    turn = build_turn(args, secrets)
    return RelayConfig(
        secrets=tuple(secrets),
        listen=tuple(_addr(x, "--listen", "0.0.0.0") for x in listen),
        internal=_addr(args.internal, "--internal", "127.0.0.1"),
        transceivers=_mapping(args.transceivers, "--transceiver"),
        cluster=int(args.cluster),
        next_hops=_mapping(args.next_hops, "--next-hop"),
        flow_timeout=float(args.flow_timeout),
        max_flows=int(args.max_flows),
        new_flow_rate=float(args.new_flow_rate),
        new_flow_burst=max(1.0, 2 * float(args.new_flow_rate)),
        redis_url=args.redis,
        control=args.control,
        relay_id=f"{socket.gethostname()[:40]}/c{int(args.cluster)}/w{worker}",
        worker=worker,
        transceiver_pattern=None if pattern is None else str(pattern),
        transceiver_count=count,
        resolve_interval=float(args.resolve_interval),
        io=str(args.io),
        coalesce=coalesce_us / 1e6,
        tcp=tuple(_addr(x, "--tcp", "0.0.0.0") for x in tcp),
        tcp_limits=TcpLimits(max_connections=int(args.tcp_max_connections),
                             max_per_ip=int(args.tcp_max_per_ip),
                             proxy_from=_networks(args.tcp_proxy_from, "--tcp-proxy-from")),
        tcp_https=None if not args.tcp_https else _addr(args.tcp_https, "--tcp-https",
                                                        "127.0.0.1"),
        turn=turn,
        turn_tls=build_turn_tls(args, turn is not None),
        turn_state_dir=args.turn_state_dir or None,
    )


def _pin(index: int) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[index % len(cpus)]
    os.sched_setaffinity(0, {cpu})
    log.info("relay worker %d pinned to CPU %d", index, cpu)


async def _stop_on_signals(scope: trio.CancelScope,
                           leave: Callable[[], None] | None = None) -> None:
    """SIGINT/SIGTERM: ``leave`` (a worker's: a roll's successor takes its TCP connections),
    then cancel ``scope``."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("relay: %s, stopping", signal.Signals(signum).name)
            if leave is not None:
                leave()
            scope.cancel()
            return


async def _run_worker(config: RelayConfig, pin: bool) -> None:
    if pin:
        _pin(config.worker)
    started: list[RelayHandle] = []

    def leave() -> None:
        # Before the cancellation reaches the connections' tasks: if this stop is a
        # rolling restart's (the successor said hello), the established TCP connections
        # are handed to it, else they close as before (handover.py).
        for handle in started:
            if handle.leave():
                log.info("relay worker %d: stopping for a successor: TCP connections "
                         "go to it", config.worker)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signals, nursery.cancel_scope, leave)
        handle = await nursery.start(serve_relay, config)
        started.append(handle)
        public = ",".join(format_hostport(a) for a in handle.public)
        tcp = ",".join(format_hostport(a) for a in handle.tcp)
        print(f"{READY_PREFIX}{public} internal {format_hostport(handle.internal)}"
              + (f" tcp {tcp}" if tcp else ""), flush=True)


# -- M worker processes -------------------------------------------------------------------


def _child_argv(args: argparse.Namespace, config: RelayConfig, index: int,
                listen: Sequence[Address], control: str,
                tcp: Sequence[Address] | None = None, tmp: str | None = None) -> list[str]:
    """Worker ``index``'s command line: this relay's settings, one worker, its own control
    socket (the one argv builder, :func:`.argv.relay_argv`)."""
    return relay_argv(
        [sys.executable, "-m", "appliance.relay.cli"], workers=1, worker_index=index,
        listen=listen, secret_file=str(args.secret_file), control=control,
        transceivers=config.transceivers, next_hops=config.next_hops, cluster=config.cluster,
        internal=config.internal, flow_timeout=config.flow_timeout,
        max_flows=config.max_flows, new_flow_rate=config.new_flow_rate,
        redis=config.redis_url, transceiver_pattern=config.transceiver_pattern,
        transceiver_count=config.transceiver_count, resolve_interval=config.resolve_interval,
        io=config.io, coalesce_us=config.coalesce * 1e6, pin=bool(args.pin),
        nice=parse_nice(args.nice),
        log_level=args.log_level, log_format=args.log_format,
        tcp=config.tcp if tcp is None else tcp,
        tcp_max_connections=config.tcp_limits.max_connections,
        tcp_max_per_ip=config.tcp_limits.max_per_ip,
        tcp_https=config.tcp_https,
        tcp_proxy_from=tuple(str(n) for n in config.tcp_limits.proxy_from),
        turn=config.turn is not None,
        turn_secret_file=args.turn_secret_file or None,
        turn_realm=None if config.turn is None else config.turn.realm,
        media_addresses=() if config.turn is None else config.turn.media,
        turn_relay_ips=() if config.turn is None else config.turn.relay_ips,
        turn_peers=() if config.turn is None else tuple(str(n) for n in config.turn.peers),
        turn_max_allocations=None if config.turn is None else config.turn.max_allocations,
        turn_allocations_per_ip=None if config.turn is None else config.turn.max_per_source,
        turn_allocations_per_user=None if config.turn is None
        else config.turn.max_per_username,
        turn_max_lifetime=None if config.turn is None else config.turn.max_lifetime,
        turn_tls=config.turn_tls,
        # The embedded TURN cache: every life of worker i reads what the last one wrote.
        turn_state_dir=config.turn_state_dir or tmp,
    )


class _Workers:
    """M workers under the one child supervisor (:class:`appliance.children.Supervisor`):
    restarted with backoff (0.1 s doubling to 5 s, reset after 10 s up), stopped with
    SIGTERM then SIGKILL, never given up on."""

    def __init__(self, args: argparse.Namespace, config: RelayConfig, workers: int) -> None:
        self.args = args
        self.config = config
        self.workers = workers
        self.tmp = tempfile.mkdtemp(prefix="appliance-relay-")
        self.specs = [ChildSpec("relay", str(i), [], self.control_path(i), standby=True)
                      for i in range(workers)]
        self.listen(config.listen)
        self.supervisor = Supervisor(self.specs, backoff_initial=0.1, backoff_max=5.0,
                                     stable_after=10.0, ready_timeout=None,
                                     startup_failures=None)

    def control_path(self, index: int) -> str:
        return os.path.join(self.tmp, f"worker-{index}.sock")

    def listen(self, listen: Sequence[Address], tcp: Sequence[Address] | None = None) -> None:
        """(Re)write every worker's argv for these public addresses: the first worker picks
        any ephemeral public port; the others (and restarts) must bind the same one."""
        for i, spec in enumerate(self.specs):
            spec.argv = _child_argv(self.args, self.config, i, listen, spec.control, tcp,
                                    self.tmp)

    def ready(self, index: int) -> dict[str, str] | None:
        status = self.supervisor.status[self.specs[index].name]
        return status.ready_fields if status.ready_line else None

    async def stats(self, req: dict[str, Any]) -> dict[str, Any]:
        if req.get("op") != "stats":
            return unknown_op(req)
        return await merged_stats([s.control for s in self.specs])

    async def run(self) -> None:
        sup = self.supervisor
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_stop_on_signals, nursery.cancel_scope)
                nursery.start_soon(_roll_on_sighup, self)
                nursery.start_soon(sup.supervise, self.specs[0])
                await sup.wait_until(lambda: self.ready(0) is not None)
                first = self.ready(0)
                assert first is not None
                public = [parse_hostport(p) for p in first["listen"].split(",")]
                tcp = [parse_hostport(p) for p in (first.get("tcp") or "").split(",") if p]
                self.listen(public, tcp)
                for spec in self.specs[1:]:
                    nursery.start_soon(sup.supervise, spec)
                await sup.wait_until(lambda: all(self.ready(i) is not None
                                                 for i in range(self.workers)))
                if self.args.control:
                    await nursery.start(serve_control, self.args.control, self.stats)
                internal = ",".join((self.ready(i) or {})["internal"]
                                    for i in range(self.workers))
                print(f"{READY_PREFIX}{','.join(format_hostport(a) for a in public)} "
                      f"internal {internal}"
                      + (f" tcp {','.join(format_hostport(a) for a in tcp)}" if tcp else ""),
                      flush=True)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _standby(config: RelayConfig, pin: bool, nice: int) -> int:
    """Serve as the supervisor's fork template (:func:`appliance.children.serve_fork_template`):
    every ``go`` forks a worker that runs :func:`_worker` from here, with everything it
    imports imported (the Redis client's module too, when configured) and the
    configuration read: milliseconds, not an interpreter start (issue 32). No trio loop
    runs in this process, so forking it is safe; returns when the supervisor lets go."""
    if config.redis_url is not None:
        import redis  # noqa: F401 - imported now, not in each fork
    sources = []
    if config.turn_state_dir is not None and config.tcp:
        # The keeper of the workers' TCP connections (keeper.py): one descriptor each.
        raise_fd_limit(config.tcp_limits.max_connections)
        sources.append(Keeper(keeper_name(config.turn_state_dir, config.cluster,
                                          config.worker)))
    settle_heap()  # the start-up objects out of the collector's reach (and shared by forks)
    return serve_fork_template(lambda: _worker(config, pin, nice), STANDBY_LINE, sources)


def _worker(config: RelayConfig, pin: bool, nice: int) -> int:
    """One worker process: its own trio loop until SIGINT/SIGTERM; 1 if a bind failed.
    Its priority first (every life: a forked one is in a new session, so a new autogroup)."""
    raise_priority(nice, f"relay worker {config.worker}")
    rc = 0
    try:
        trio.run(_run_worker, config, pin)
    except* OSError as group:  # a bind that failed, from inside the worker's nursery
        for leaf in exception_leaves(group):
            print(f"appliance relay: {leaf}", file=sys.stderr)
        rc = 1
    except* KeyboardInterrupt:  # pragma: no cover - the signal receiver normally wins
        pass
    return rc


async def _roll_on_sighup(workers: _Workers) -> None:
    """SIGHUP: restart the workers one at a time, each successor ready before its
    predecessor stops (docs/operations.md "Rolling a new version")."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            log.warning("relay: SIGHUP, restarting %d workers one at a time", workers.workers)
            done = await workers.supervisor.roll([s.name for s in workers.specs])
            log.warning("relay: rolling restart done (%d of %d replaced)", sum(done), len(done))


def run(args: argparse.Namespace) -> int:
    nice_from_environment(args)
    try:
        resolve(args, load_config(args.config), "relay", DEFAULTS)
        config = build_config(args)
        nice = parse_nice(args.nice)
    except (ConfigError, UsageError, ValueError) as exc:
        print(f"appliance relay: {exc}", file=sys.stderr)
        return 2
    logs.configure(level=args.log_level, fmt=args.log_format, role="relay")
    workers = int(args.workers)
    if workers < 1:
        print("appliance relay: --workers must be >= 1", file=sys.stderr)
        return 2
    if args.standby:
        return _standby(config, bool(args.pin), nice)
    if workers == 1 or args.worker_index is not None:
        return _worker(config, bool(args.pin), nice)
    rc = 0
    try:
        trio.run(_Workers(args, config, workers).run)
    except* OSError as group:  # a bind that failed, from inside the worker's nursery
        for leaf in exception_leaves(group):
            print(f"appliance relay: {leaf}", file=sys.stderr)
        rc = 1
    except* KeyboardInterrupt:  # pragma: no cover - the signal receiver normally wins
        pass
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m appliance.relay.cli`` (what the M-worker supervisor starts)."""
    parser = argparse.ArgumentParser(prog="appliance relay")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
