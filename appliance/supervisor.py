"""``appliance up``: everything on one host, in ONE trio nursery (DESIGN.md "Processes").

::

    up()                                   the supervisor's nursery
     ├─ transceiver task group             Supervisor.run_group: N children
     │    └─ supervise(transceiver k)      start, wait for the ready line, restart with backoff
     ├─ relay task group                   M relay worker children sharing the public UDP port
     │    └─ supervise(relay w)            (SO_REUSEPORT), each with its own control socket
     └─ serve_signaling                    hypercorn + quart-trio, the HTTP API and web UI

Children are run by :class:`appliance.children.Supervisor` (shared with ``appliance relay
--workers M``) as ``python -m appliance ROLE …`` in their own process group (so a terminal's
Ctrl-C reaches only the supervisor, which then stops them in order). A child is *ready* when
it prints its ready line on stdout:

* ``transceiver K listening on HOST:PORT control ADDRESS``
* ``relay listening on HOST:PORT internal HOST:PORT``

A child that exits is restarted after an exponential backoff (``backoff_initial`` doubling up
to ``backoff_max``, reset once a child has stayed up for ``stable_after``); signaling is told
at once, so a dead transceiver's sessions are reported ended, reason "transceiver lost", and
no new session is routed to it until its replacement is ready. A child that cannot even
start (``startup_failures`` exits in a row before its first ready line) aborts ``up`` with a
message instead of looping forever on, say, a port already in use.

SIGHUP restarts the relay workers one at a time, make-before-break (a successor ready
before its predecessor stops): the way to roll a new version (docs/operations.md). Each
relay worker has a warm standby (started with ``--standby``: imported, nothing bound), a
fork template that forks the worker's next life at once each time it dies, and stays warm
(:mod:`appliance.children`; docs/reliability.md).

Stopping (SIGINT, SIGTERM): the nursery is cancelled; each child gets SIGTERM on its process
group, then SIGKILL after ``stop_grace`` seconds, and is reaped, so nothing is orphaned and
the whole thing exits well within 5 s. (A supervisor killed with SIGKILL cannot clean up;
its children then exit when their control sockets' owner is gone — that is theirs to do.)

The routing secret is generated on first start into the state directory (mode 0600; the
directory 0700) and reused afterwards, so ufrags minted before a restart stay valid.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from . import plugins  # noqa: F401  (registers realtime/ and speech/: appliance/plugins.py)
from .agents import resolve as resolve_agent
from .children import ChildSpec, StartupError, Supervisor, exception_leaves
from .config import (
    ADMISSION_LIMIT,
    HEADROOM_MODES,
    ConfigError,
    format_dtls_versions,
    format_hostport,
    load_config,
    parse_admission_limit,
    parse_dtls_versions,
    parse_headroom,
    parse_hostport,
    parse_opus_complexity,
    resolve,
)
from .logs import add_logging_flags, configure
from .priority import (
    MEDIA_NICE,
    add_nice_flag,
    nice_from_environment,
    parse_nice,
    raise_priority,
)
from .proto.turn.credentials import derive_turn_secret, parse_turn_secrets, turn_urls
from .proto.ufrag import load_secrets
from .recordings import (
    DEFAULT_QUOTA,
    DEFAULT_RETENTION,
    RECORDINGS_DIR,
    parse_duration,
    parse_size,
)
from .relay.argv import relay_argv
from .relay.tls import TurnTls
from .signaling.ice_servers import DEFAULT_TTL as DEFAULT_TURN_TTL
from .signaling.ice_servers import TurnAdvert
from .signaling.ice_servers import check_ttl as check_turn_ttl
from .signaling.options import (
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
from .signaling.server import (
    check_public_address,
    default_public_addresses,
    ensure_api_token,
    run_until_signalled,
    serve_signaling,
)
from .signaling.sip_config import SipSettings
from .signaling.state import SignalingConfig, SignalingState
from .signaling.webhooks import Endpoint as WebhookEndpoint
from .statedir import default_state_dir, ensure_secret, ensure_state_dir

log = logging.getLogger("appliance.supervisor")

DEFAULTS: dict[str, Any] = {
    "http": "127.0.0.1:8080",
    "udp": "0.0.0.0:3478",
    "public_address": [],
    "transceivers": 2,
    "relay_workers": 1,
    "agent": "echo",
    "realtime_agent": DEFAULT_REALTIME_AGENT,
    "live_agent": DEFAULT_LIVE_AGENT,
    "opus_complexity": None,  # None: the transceivers' own default
    "fixed_opus_complexity": False,
    "nice": MEDIA_NICE,
    "headroom": None,  # None: the transceivers' own default (core)
    "admission_limit": ADMISSION_LIMIT,
    "dtls_versions": None,  # None: the transceivers' own default (1.2,1.3)
    "redis": None,
    "state_dir": None,
    "internal_base_port": 0,
    "ice_tcp": True,
    "public_tcp_port": None,
    "relayed_media_port": None,
    "https_on_media_port": False,
    "turn": None,  # None: on wherever a public address of the media port's family is known
    "turn_secret_file": None,
    "turn_peer": [],
    "tcp_proxy_from": [],
    "turn_url": [],
    "turn_credential_ttl": DEFAULT_TURN_TTL,
    "record": False,
    "recording_quota": "1G",
    "recording_retention": "7d",
}


def _free_port(host: str, kind: socket.SocketKind) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, kind) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _https_backend(cfg: UpConfig) -> tuple[str, int]:
    """Where the relays send TLS connections in shared-port mode: signaling's PROXY-aware
    backend (``relay_https``, on loopback), which passes them on to its HTTPS listener with
    the real client's address (signaling/proxied.py)."""
    assert cfg.relay_https is not None
    return cfg.relay_https


def _free_port_pair(host: str, *, tcp: bool) -> int:
    """A port free for UDP (and, with ``tcp``, for TCP too: ICE-TCP listens on the same
    number). A race with another process remains; the relay then fails to start, loudly."""
    for _ in range(64):
        port = _free_port(host, socket.SOCK_DGRAM)
        if not tcp:
            return port
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    raise OSError("no port free for both UDP and TCP")


def check_media_port(cfg: UpConfig) -> None:
    """Fail at once, in one line, when the media port is taken (rather than the relay
    worker failing three times with a traceback): UDP, and TCP too when ICE-TCP is on,
    which listens on the same number by default. Bound without SO_REUSEPORT, so a running
    relay (whose sockets have it) counts as in use. Port 0 was picked free already."""
    host, port = cfg.udp
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kinds = [(socket.SOCK_DGRAM, "UDP")] + ([(socket.SOCK_STREAM, "TCP")] if cfg.ice_tcp else [])
    relayed = relayed_media_port(cfg)
    if relayed is not None:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind((host, relayed))
            except OSError as exc:
                err = OSError(f"--udp {format_hostport(cfg.udp)}: the relayed-media UDP port "
                              f"{relayed} (TURN clients relay to no port below 1024) is not "
                              f"free ({exc.strerror}); choose one with --relayed-media-port")
                err.errno = exc.errno
                raise err from None
    for kind, name in kinds:
        with socket.socket(family, kind) as s:
            if family == socket.AF_INET6:  # as the relay binds: IPv4 on the port is not ours
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if kind == socket.SOCK_STREAM:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the relay does
            try:
                s.bind((host, port))
            except OSError as exc:
                hint = (" (ICE-TCP listens on the --udp port; choose another --udp or pass "
                        "--no-ice-tcp)" if name == "TCP" else " (choose another --udp)")
                err = OSError(f"--udp {format_hostport(cfg.udp)}: {name} port {port} is not "
                              f"free ({exc.strerror}){hint}")
                err.errno = exc.errno
                raise err from None


# -- configuration -------------------------------------------------------------------------


@dataclass
class UpConfig:
    http: tuple[str, int]
    udp: tuple[str, int]
    public_addresses: list[str]
    transceivers: int
    relay_workers: int
    agent: str
    redis: str | None
    state_dir: Path
    internal_base_port: int
    api_token: str | None
    tls_cert: str | None
    tls_key: str | None
    tls_fingerprint: str | None
    webui_dir: Path
    log_level: str = "info"
    log_format: str = "text"
    realtime_agent: str = DEFAULT_REALTIME_AGENT  # the agent of /v1/realtime/calls
    live_agent: str = DEFAULT_LIVE_AGENT  # the agent of GET /v1/live/sessions
    webhooks: tuple[WebhookEndpoint, ...] = ()  # --webhook-url (signaling/webhooks.py)
    sip: SipSettings | None = None  # --sip (signaling/sip_server.py)
    opus_complexity: int | None = None  # passed to every transceiver when set
    fixed_opus_complexity: bool = False  # no step-down under load (transceiver/degrade.py)
    headroom: str | None = None  # --headroom of every transceiver when set (core | own)
    admission_limit: float = ADMISSION_LIMIT  # signaling/admission.py
    dtls_versions: frozenset[str] | None = None  # passed to every transceiver when set
    #: ICE-TCP (RFC 6544): the relays listen on TCP at the UDP address's port too, and
    #: answers list a TCP passive candidate (at public_tcp_port when a load balancer maps it)
    ice_tcp: bool = True
    public_tcp_port: int | None = None
    #: one TCP port for HTTPS and ICE-TCP: the relays pass TLS connections to signaling
    https_on_media_port: bool = False
    relay_https: tuple[str, int] | None = None  # signaling's backend for it (proxied.py)
    #: TURN on the media port (relay/turn.py, docs/turn.md): REST secret file (None: derived
    #: from the routing secret), extra peer networks, the URLs advertised instead of the
    #: media port's (a proxy in front) and how long a minted credential lasts
    turn: bool = True
    turn_secret_file: str | None = None
    turn_peers: list[str] = field(default_factory=list)
    #: front proxies whose PROXY header the relays' TCP listener believes (relay/tcp.py)
    tcp_proxy_from: list[str] = field(default_factory=list)
    turn_urls: list[str] = field(default_factory=list)
    turn_ttl: float = DEFAULT_TURN_TTL
    #: the relayed-media port (issue 40 item 2): with TURN on and a media port below 1024,
    #: the relays also listen on UDP at this port and answers add it as a lower-priority
    #: candidate, so TURN clients (Chromium relays to no port below 1024) have a peer port.
    #: None: RELAYED_MEDIA_PORT when needed.
    relayed_media_port: int | None = None
    #: recordings (docs/recordings.md): every call unless it says otherwise, the state
    #: directory's recordings/ quota in bytes and how long a recording is kept
    record: bool = False
    recording_quota: int = DEFAULT_QUOTA
    recording_retention: float = DEFAULT_RETENTION
    child_command: list[str] = field(default_factory=lambda: [sys.executable, "-m", "appliance"])
    #: --nice of this process and every child (appliance/priority.py); 0 here (a library
    #: caller's process is its own business), MEDIA_NICE from the command line
    nice: int = 0
    backoff_initial: float = 0.5
    stop_grace: float = 2.0


def apply_llm_flags(args: argparse.Namespace, env: Any = None) -> None:
    """``--llm URL`` / ``--llm-model`` / ``--llm-key-file``: the assistant's chat endpoint
    (appliance/speech/assistant.py), given to it and to every child as the environment it
    reads (APPLIANCE_LLM_URL, _MODEL, _KEY_FILE). The key itself is never a flag (argv is
    visible to every local user): a file, or APPLIANCE_LLM_KEY in the environment."""
    env = os.environ if env is None else env
    url = getattr(args, "llm", None)
    if url:
        if not str(url).startswith(("http://", "https://")):
            raise ValueError("--llm must be an http(s) URL ending in /v1")
        env["APPLIANCE_LLM_URL"] = str(url)
    if getattr(args, "llm_model", None):
        env["APPLIANCE_LLM_MODEL"] = str(args.llm_model)
    key_file = getattr(args, "llm_key_file", None)
    if key_file:
        if not os.path.isfile(str(key_file)):
            raise ValueError(f"--llm-key-file {key_file}: no such file")
        env["APPLIANCE_LLM_KEY_FILE"] = os.path.abspath(str(key_file))


def build_up_config(args: argparse.Namespace) -> UpConfig:
    """Validate resolved ``up`` arguments (flags > config file > defaults)."""
    http = parse_hostport(args.http, default_host="127.0.0.1")
    udp = parse_hostport(args.udp, default_host="0.0.0.0")
    n, m = int(args.transceivers), int(args.relay_workers)
    if not 1 <= n <= 256:
        raise ValueError("--transceivers must be 1..256")
    if not 1 <= m <= 64:
        raise ValueError("--relay-workers must be 1..64")
    base = int(args.internal_base_port)
    if base and not 1024 <= base <= 65535 - n:
        raise ValueError("--internal-base-port must leave room for every transceiver")
    public_in = args.public_address
    if isinstance(public_in, str):
        public_in = [public_in]
    public = [check_public_address(a) for a in public_in or []]
    if not public:
        host = udp[0]
        # Bound to one address: that is the one clients reach; bound to all: the default route's.
        public = [check_public_address(host)] if host not in ("0.0.0.0", "::", "") else default_public_addresses()
    state_dir = ensure_state_dir(args.state_dir or default_state_dir())
    args.state_dir = str(state_dir)
    cert, key, fp = tls_settings(args, [http[0], *public])
    child = shlex.split(args.child_command) if getattr(args, "child_command", None) else None
    apply_llm_flags(args)  # before the agents load: the assistant reads them
    # Load the agent once here (AgentError is a ValueError: exit 2 with its message), so a
    # typo fails `up` at once instead of every transceiver failing to start three times.
    resolve_agent(str(args.agent))
    realtime_agent = str(getattr(args, "realtime_agent", None) or DEFAULT_REALTIME_AGENT)
    if realtime_agent != DEFAULT_REALTIME_AGENT:  # the built-in one is always there
        resolve_agent(realtime_agent)
    cfg = UpConfig(
        http=http, udp=udp, public_addresses=public, transceivers=n, relay_workers=m,
        agent=str(args.agent), redis=args.redis or None, state_dir=state_dir,
        internal_base_port=base, api_token=args.api_token or None,
        tls_cert=cert, tls_key=key, tls_fingerprint=fp,
        webui_dir=Path(args.webui_dir) if getattr(args, "webui_dir", None) else default_webui_dir(),
        log_level=args.log_level, log_format=args.log_format, realtime_agent=realtime_agent,
        live_agent=checked_live_agent(getattr(args, "live_agent", None)),
        webhooks=tuple(webhook_endpoints(args)),
        sip=sip_settings(args, public),
        opus_complexity=None if getattr(args, "opus_complexity", None) is None
        else parse_opus_complexity(args.opus_complexity),
        fixed_opus_complexity=bool(getattr(args, "fixed_opus_complexity", False)),
        headroom=None if getattr(args, "headroom", None) is None
        else parse_headroom(args.headroom),
        admission_limit=parse_admission_limit(getattr(args, "admission_limit", None)
                                              or ADMISSION_LIMIT),
        dtls_versions=None if getattr(args, "dtls_versions", None) is None
        else parse_dtls_versions(args.dtls_versions),
        nice=0 if getattr(args, "nice", None) is None else parse_nice(args.nice),
    )
    cfg.record = bool(getattr(args, "record", False))
    cfg.recording_quota = parse_size(getattr(args, "recording_quota", None) or "1G")
    cfg.recording_retention = parse_duration(getattr(args, "recording_retention", None) or "7d")
    cfg.ice_tcp = bool(getattr(args, "ice_tcp", True))
    cfg.https_on_media_port = bool(getattr(args, "https_on_media_port", False))
    if cfg.https_on_media_port and not (cfg.ice_tcp and cfg.tls_cert):
        raise ValueError("--https-on-media-port needs ICE-TCP and --tls (or --tls-cert): the "
                         "relays tell HTTPS from ICE-TCP by the TLS record's first byte")
    # TURN (issue 40 item 3): on by default; off with --no-turn (config: turn = false), or
    # by default when no public address of the media port's family is known to relay to.
    asked = getattr(args, "turn", None)
    cfg.turn = asked is not False
    secret_file = getattr(args, "turn_secret_file", None)
    cfg.turn_secret_file = os.path.abspath(str(secret_file)) if secret_file else None
    if cfg.turn_secret_file is not None:
        try:
            with open(cfg.turn_secret_file, "rb") as f:
                parse_turn_secrets(f.read())
        except OSError as exc:
            raise ValueError(f"--turn-secret-file {secret_file}: {exc.strerror}") from None
        except ValueError as exc:
            raise ValueError(f"--turn-secret-file {secret_file}: {exc}") from None
    peers = getattr(args, "turn_peer", None) or []
    cfg.turn_peers = [str(p) for p in (peers if isinstance(peers, list | tuple) else [peers])]
    fronts = getattr(args, "tcp_proxy_from", None) or []
    cfg.tcp_proxy_from = [str(f) for f in (fronts if isinstance(fronts, list | tuple) else [fronts])]
    for net in cfg.tcp_proxy_from:
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError as exc:
            raise ValueError(f"--tcp-proxy-from {net}: {exc}") from None
    cfg.turn_urls = turn_url_overrides(args)
    cfg.turn_ttl = check_turn_ttl(getattr(args, "turn_credential_ttl", None) or DEFAULT_TURN_TTL)
    if cfg.turn and not turn_media(cfg):
        if asked:
            raise ValueError("--turn needs a public address of the --udp address's family "
                             "(--public-address): TURN clients and peers reach the relay by it")
        cfg.turn = False
        log.warning("TURN off: no public address of the --udp address's family to relay to "
                    "(--public-address)")
    relayed = getattr(args, "relayed_media_port", None)
    if relayed is not None:
        cfg.relayed_media_port = int(relayed)
        if not 1024 <= cfg.relayed_media_port <= 65535:
            raise ValueError("--relayed-media-port must be 1024..65535 (Chromium will not "
                             "relay to a port below 1024)")
    tcp_port = getattr(args, "public_tcp_port", None)
    if tcp_port is not None:
        cfg.public_tcp_port = int(tcp_port)
        if not 1 <= cfg.public_tcp_port <= 65535:
            raise ValueError("--public-tcp-port must be 1..65535")
    if child:
        cfg.child_command = child
    return cfg


#: The relayed-media port when the media port is below 1024 and none is given: TURN's own
#: registered port (RFC 8656 §18), so a firewall rule written for TURN fits it.
RELAYED_MEDIA_PORT = 3478


def relayed_media_port(cfg: UpConfig) -> int | None:
    """The second UDP port TURN clients relay to (issue 40 item 2), or None when the media
    port is one they relay to already (>= 1024, or any port picked at start-up)."""
    if not cfg.turn or cfg.udp[1] == 0 or cfg.udp[1] >= 1024:
        return None
    return cfg.relayed_media_port or RELAYED_MEDIA_PORT


def turn_advert(cfg: UpConfig, routing_secret_file: Path) -> TurnAdvert | None:
    """What signaling advertises for the relays' TURN (signaling/ice_servers.py): the secret
    the relays verify with (the first of --turn-secret-file, or derived from the routing
    secret, relay/cli.py build_turn) and the URLs of the ports actually listened on — TCP
    on the media port where ICE-TCP listens (at --public-tcp-port when a load balancer maps
    it), TLS on that port where it serves TLS; TURN over UDP is served but not advertised
    (below) — unless --turn-url names others (a proxy in front, another address). None
    when TURN is off or there is nothing to advertise."""
    if not cfg.turn:
        return None
    if cfg.turn_secret_file is not None:
        with open(cfg.turn_secret_file, "rb") as f:
            secret = parse_turn_secrets(f.read())[0]
    else:
        secret = derive_turn_secret(load_secrets(routing_secret_file.read_bytes())[0])
    urls = list(cfg.turn_urls)
    if not urls:
        tcp_port = cfg.public_tcp_port or cfg.udp[1]
        tls = cfg.https_on_media_port and cfg.tls_cert is not None
        for host in dict.fromkeys(h for h, _ in turn_media(cfg)):
            # Not TURN over UDP: its address would be our UDP host candidate's, and
            # Chromium hands whatever arrives from a TURN server's address on its shared
            # UDP socket to the TURN client, which drops our direct STUN answers, DTLS and
            # SRTP: every call would leave the direct UDP path (docs/turn.md).
            urls += turn_urls(host, cfg.udp[1], udp=False, tcp=cfg.ice_tcp, tcp_port=tcp_port,
                              tls_port=tcp_port if tls else None)
    if not urls:  # --no-ice-tcp without TLS on the media port: only UDP, not advertised
        return None
    return TurnAdvert(secret=secret, urls=tuple(urls), ttl=cfg.turn_ttl)


def turn_media(cfg: UpConfig) -> list[tuple[str, int]]:
    """The media addresses TURN relays to in-process (and advertises relayed addresses on):
    the public addresses of the --udp address's family, at its port and at the
    relayed-media port when there is one."""
    v6 = ":" in cfg.udp[0]
    ports = [cfg.udp[1]] + ([p] if (p := relayed_media_port(cfg)) else [])
    return [(a, port) for port in ports for a in cfg.public_addresses if (":" in a) == v6]


def _control_dir(state_dir: Path) -> tuple[Path, bool]:
    """Where the control sockets go; a short temp dir when the state dir's path would exceed
    the ~107-byte limit of a Unix socket path. Returns (dir, is_temporary)."""
    d = state_dir / "control"
    if len(str(d / "transceiver-999.sock")) < 100:
        d.mkdir(mode=0o700, exist_ok=True)
        return d, False
    return Path(tempfile.mkdtemp(prefix="appliance-")), True


def child_specs(cfg: UpConfig, secret: Path, control_dir: Path) -> tuple[list[ChildSpec], list[ChildSpec]]:
    logging_flags = ["--log-level", cfg.log_level, "--log-format", cfg.log_format]
    if cfg.internal_base_port:
        ports = [cfg.internal_base_port + k for k in range(cfg.transceivers)]
    else:
        ports = []
        while len(ports) < cfg.transceivers:  # distinct free ports, kept across restarts
            p = _free_port("127.0.0.1", socket.SOCK_DGRAM)
            if p not in ports:
                ports.append(p)
    transceivers = []
    for k, port in enumerate(ports):
        control = str(control_dir / f"transceiver-{k}.sock")
        argv = [*cfg.child_command, "transceiver", "--id", str(k), "--listen", f"127.0.0.1:{port}",
                "--control", control, "--secret-file", str(secret), "--agent", cfg.agent,
                *([] if cfg.opus_complexity is None
                  else ["--opus-complexity", str(cfg.opus_complexity)]),
                *(["--fixed-opus-complexity"] if cfg.fixed_opus_complexity else []),
                *([] if cfg.headroom is None else ["--headroom", cfg.headroom]),
                *([] if cfg.dtls_versions is None
                  else ["--dtls-versions", format_dtls_versions(cfg.dtls_versions)]),
                "--recordings-dir", str(cfg.state_dir / RECORDINGS_DIR),
                "--recording-quota", str(cfg.recording_quota),
                "--recording-retention", repr(cfg.recording_retention),
                *(["--record"] if cfg.record else []),
                "--nice", str(cfg.nice),  # always: 0 must not become their default
                *logging_flags]
        transceivers.append(ChildSpec("transceiver", str(k), argv, control))
    routes = {k: ("127.0.0.1", port) for k, port in enumerate(ports)}
    # The relay's own module, not `appliance relay`: the full CLI imports every role
    # (quart, the codecs: ~4x the start-up time), and a relay worker's start-up is on the
    # path of a failover without a warm standby (docs/reliability.md).
    relay_cmd = ([sys.executable, "-m", "appliance.relay.cli"]
                 if cfg.child_command == [sys.executable, "-m", "appliance"]
                 else [*cfg.child_command, "relay"])
    relays = []
    for w in range(cfg.relay_workers):
        control = str(control_dir / f"relay-{w}.sock")
        relayed = relayed_media_port(cfg)
        listen = [cfg.udp] + ([(cfg.udp[0], relayed)] if relayed else [])
        # Its index names the worker everywhere a worker's state is kept apart (the TURN
        # allocations' file or Redis keys that its successor, and only it, reads back).
        argv = relay_argv(relay_cmd, worker_index=w, listen=listen, transceivers=routes,
                          secret_file=str(secret), control=control, redis=cfg.redis,
                          log_level=cfg.log_level, log_format=cfg.log_format,
                          nice=cfg.nice, tcp=[cfg.udp] if cfg.ice_tcp else [],
                          tcp_https=_https_backend(cfg) if cfg.https_on_media_port else None,
                          turn=cfg.turn, turn_secret_file=cfg.turn_secret_file,
                          media_addresses=turn_media(cfg) if cfg.turn else (),
                          turn_relay_ips=list(dict.fromkeys(a for a, _ in turn_media(cfg)))
                          if cfg.turn else (),
                          turn_peers=cfg.turn_peers,
                          # the state directory's private corner for every life of worker
                          # w: without Redis, TURN allocations outlive a worker kill in a
                          # file here (relay/turn_store.py), and the keeper of its TCP
                          # connections is named from it (relay/keeper.py)
                          turn_state_dir=str(cfg.state_dir / "relay"),
                          tcp_proxy_from=cfg.tcp_proxy_from,
                          # TURN over TLS wherever the media port serves TLS (issue 40 item
                          # 3), with the same certificate as HTTPS (relay/tls.py splits).
                          turn_tls=TurnTls(cfg.tls_cert, cfg.tls_key)
                          if cfg.turn and cfg.https_on_media_port and cfg.tls_cert
                          and cfg.tls_key else None)
        # A warm standby (fork template) per worker: SIGKILL of a worker costs a few tens of ms, not a
        # Python start-up (docs/reliability.md "Relay worker failover").
        relays.append(ChildSpec("relay", str(w), argv, control, standby=True))
    return transceivers, relays


def _url_host(bind_url: str, public: list[str]) -> str:
    """``http://0.0.0.0:8080`` → ``http://<public address>:8080`` (a URL one can open)."""
    scheme, _, hostport = bind_url.partition("://")
    host, port = parse_hostport(hostport)
    if host in ("0.0.0.0", "::"):
        host = public[0] if public else "127.0.0.1"
    return f"{scheme}://{format_hostport((host, port))}"


async def up(
    cfg: UpConfig,
    *,
    task_status: trio.TaskStatus[tuple[str, Supervisor, SignalingState]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run everything until cancelled; started with (base URL, supervisor, signaling state)."""
    secret = ensure_secret(cfg.state_dir)
    # The relays' private directory (relay/turn_store.py, relay/keeper.py), its embedded
    # TURN cache emptied at start — a previous run's allocations have no sessions to serve.
    turn_state = ensure_state_dir(cfg.state_dir / "relay")
    for stale in turn_state.glob("turn-*.jsonl"):
        stale.unlink(missing_ok=True)
    if cfg.udp[1] == 0:  # "any port": pick one now so every relay worker shares the same
        cfg.udp = (cfg.udp[0], _free_port_pair(cfg.udp[0], tcp=cfg.ice_tcp))
    if cfg.https_on_media_port and cfg.relay_https is None:  # the relays need it up front
        cfg.relay_https = ("127.0.0.1", _free_port("127.0.0.1", socket.SOCK_STREAM))
    control_dir, temporary = _control_dir(cfg.state_dir)
    try:
        transceivers, relays = child_specs(cfg, secret, control_dir)
        sig_cfg = SignalingConfig(
            http=cfg.http,
            transceivers={int(s.key): s.control for s in transceivers},
            relays={s.key: s.control for s in relays},
            public_addresses=cfg.public_addresses,
            udp_port=cfg.udp[1],
            tcp_port=(cfg.public_tcp_port or cfg.udp[1]) if cfg.ice_tcp else None,
            relayed_media_port=relayed_media_port(cfg),
            api_token=cfg.api_token,
            tls_cert=cfg.tls_cert,
            tls_key=cfg.tls_key,
            relay_https=cfg.relay_https if cfg.https_on_media_port else None,
            webui_dir=cfg.webui_dir,
            managed=True,
            realtime_agent=cfg.realtime_agent,
            live_agent=cfg.live_agent,
            webhooks=list(cfg.webhooks),
            sip=cfg.sip,
            admission_limit=cfg.admission_limit,
            recordings_dir=cfg.state_dir / RECORDINGS_DIR,
            recording_quota=cfg.recording_quota,
            recording_retention=cfg.recording_retention,
            turn=turn_advert(cfg, secret),
        )
        generated = ensure_api_token(sig_cfg)
        state = SignalingState(sig_cfg)
        state.supervisor_info = {"supervisor": True}
        sup = Supervisor([*transceivers, *relays], state=state,
                         backoff_initial=cfg.backoff_initial, stop_grace=cfg.stop_grace)
        async with trio.open_nursery() as nursery:
            # Transceivers first: the relays route to them, signaling creates sessions on them.
            await nursery.start(sup.run_group, transceivers)
            await nursery.start(sup.run_group, relays)
            nursery.start_soon(roll_on_sighup, sup, [s.name for s in relays])
            binds = await nursery.start(partial(serve_signaling, sig_cfg, state=state))
            base = _url_host(binds[0], cfg.public_addresses)
            if cfg.tls_fingerprint:
                print(f"TLS certificate (self-signed) SHA-256 {cfg.tls_fingerprint}", flush=True)
            if generated:
                print(f"API token (generated): {generated}", flush=True)
            media = ", ".join(format_hostport((a, cfg.udp[1])) for a in cfg.public_addresses)
            print(f"media: UDP {media}", flush=True)
            if (relayed := relayed_media_port(cfg)) is not None:
                print(f"media: UDP port {relayed} too, for TURN clients (they relay to no port "
                      f"below 1024; it need not be open outside)", flush=True)
            if cfg.ice_tcp:
                port = cfg.public_tcp_port or cfg.udp[1]
                tcp = ", ".join(format_hostport((a, port)) for a in cfg.public_addresses)
                print(f"media: ICE-TCP {tcp} (listening on {format_hostport(cfg.udp)})",
                      flush=True)
            if sig_cfg.turn is not None:  # the URLs signaling hands out, with credentials
                print(f"TURN: {' '.join(sig_cfg.turn.urls)} (REST API credentials per "
                      "session from signaling, secret "
                      f"{cfg.turn_secret_file or 'derived from the routing secret'})",
                      flush=True)
            elif cfg.turn:
                print("TURN: UDP only (no ICE-TCP, no TLS on the media port): not advertised "
                      "to clients (docs/turn.md; --turn-url to advertise)", flush=True)
            else:
                print("TURN: off", flush=True)
            if cfg.https_on_media_port:
                print(f"HTTPS also on the media port: https://{format_hostport((cfg.public_addresses[0], cfg.public_tcp_port or cfg.udp[1]))}/",
                      flush=True)
            print(f"appliance ready: web UI {base}/  demo {base}/demo  API {base}/v1/sessions",
                  flush=True)
            task_status.started((base, sup, state))
    finally:
        if temporary:
            shutil.rmtree(control_dir, ignore_errors=True)


async def roll_on_sighup(sup: Supervisor, names: list[str]) -> None:
    """SIGHUP: restart the relay workers one at a time, each successor ready before its
    predecessor stops, so no call loses more than a few packets (docs/operations.md
    "Rolling a new version"). Transceivers are not touched: their calls live in them."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            log.warning("SIGHUP: restarting %d relay workers one at a time", len(names))
            done = await sup.roll(names)
            log.warning("rolling restart done: %d of %d relay workers replaced",
                        sum(done), len(done))


# -- command line --------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run everything on one host: signaling (HTTP API, web UI, metrics), relay workers on "
        "the public UDP port and N transceivers, restarted with backoff if they die. "
        "Ctrl-C or SIGTERM stops it all."
    )
    parser.add_argument("--config", metavar="FILE", help="TOML config file ([up] table)")
    parser.add_argument("--http", metavar="HOST:PORT", default=None,
                        help="HTTP(S) listen address (default 127.0.0.1:8080; any non-loopback "
                             "address requires the API token)")
    parser.add_argument("--udp", metavar="HOST:PORT", default=None,
                        help="public media address of the relays (default 0.0.0.0:3478)")
    parser.add_argument("--no-ice-tcp", dest="ice_tcp", action="store_false", default=None,
                        help="no ICE-TCP: by default the relays also listen on TCP at the "
                             "--udp port (RFC 6544, for networks that drop UDP) and answers "
                             "list a TCP passive candidate beside the UDP one")
    parser.add_argument("--public-tcp-port", type=int, metavar="PORT", default=None,
                        help="the ICE-TCP port clients reach when a load balancer maps "
                             "another one to the relays' (e.g. 443 outside; default: the "
                             "--udp port)")
    parser.add_argument("--relayed-media-port", type=int, metavar="PORT", default=None,
                        help="with TURN and a --udp port below 1024: the second UDP port the "
                             "relays listen on and answers offer to TURN clients, which relay "
                             f"to no port below 1024 (default {RELAYED_MEDIA_PORT}; it need not "
                             "be open outside)")
    parser.add_argument("--https-on-media-port", action="store_true", default=None,
                        help="with --tls: serve HTTPS on the relays' TCP port too (a "
                             "connection whose first byte starts a TLS record goes to "
                             "signaling, an RFC 4571 frame to ICE-TCP): e.g. --udp "
                             "0.0.0.0:443 for a network that opens only 443")
    add_turn_arguments(parser, role="up")
    parser.add_argument("--turn-peer", action="append", metavar="CIDR", default=None,
                        help="TURN also relays to peers in this network (repeatable; "
                             "default: only this appliance's own media addresses)")
    parser.add_argument("--tcp-proxy-from", action="append", metavar="CIDR", default=None,
                        help="a reverse proxy in front of the media port's TCP (repeatable): "
                             "connections from it must open with a PROXY v1/v2 header "
                             "(HAProxy send-proxy-v2, nginx proxy_protocol) and are judged by "
                             "the client it names: the API token rule, TURN quotas, ICE-TCP "
                             "(docs/turn.md 'A proxy in front')")
    parser.add_argument("--transceivers", type=int, metavar="N", default=None,
                        help="number of transceiver processes (default 2)")
    parser.add_argument("--relay-workers", type=int, metavar="M", default=None,
                        help="relay worker processes sharing the UDP port (default 1)")
    parser.add_argument("--agent", metavar="NAME", default=None,
                        help="default agent (default echo): a built-in name (echo), "
                             "passthrough (media echoed without decoding), package.module:attr, "
                             "path/file.py:attr, or ws://host:port/path (an external agent); "
                             "loaded at start, exit 2 if it cannot be")
    parser.add_argument("--llm", metavar="URL", default=None,
                        help="OpenAI-compatible chat-completions base URL (…/v1: Ollama, "
                             "llama.cpp, vLLM, OpenAI) for --agent assistant (default: its "
                             "offline built-in responder)")
    parser.add_argument("--llm-model", metavar="NAME", default=None,
                        help="chat model for --llm (default gpt-4o-mini)")
    parser.add_argument("--llm-key-file", metavar="FILE", default=None,
                        help="file holding the --llm API key (or set APPLIANCE_LLM_KEY); "
                             "never logged")
    parser.add_argument("--opus-complexity", metavar="0-10", default=None,
                        help="Opus encoder complexity of the transceivers (lower: less CPU "
                             "per call; default: the transceiver's, see appliance transceiver "
                             "--help)")
    parser.add_argument("--admission-limit", metavar="SHARE", default=None,
                        help="signaling places calls on a transceiver while its measured "
                             f"busy share stays at or under SHARE of its core (default {ADMISSION_LIMIT}; "
                             "else 503 overloaded)")
    parser.add_argument("--fixed-opus-complexity", action="store_true", default=None,
                        help="the transceivers keep --opus-complexity under load (default: "
                             "lower it step by step as a core fills up)")
    parser.add_argument("--headroom", default=None, choices=HEADROOM_MODES,
                        help="what the transceivers count as their load: core (default) what "
                             "their CPUs have left, other processes included; own only their "
                             "own CPU, for dedicated cores (docs/operations.md)")
    parser.add_argument("--dtls-versions", metavar="1.2,1.3", default=None,
                        help="DTLS versions the transceivers negotiate (default 1.2,1.3: 1.3 "
                             "when the browser offers it, else 1.2; docs/dtls13.md)")
    parser.add_argument("--redis", metavar="URL", default=None,
                        help="optional Redis flow cache for the relays (redis://host:port/db)")
    parser.add_argument("--state-dir", metavar="DIR", default=None,
                        help="routing secret, control sockets, self-signed certificate "
                             "(default $XDG_STATE_HOME/appliance or ./.appliance-state)")
    parser.add_argument("--record", action="store_true", default=None,
                        help="record every call (both directions, a stereo WAV in the state "
                             "directory's recordings/) unless its session says otherwise; "
                             "without it a call may still ask (docs/recordings.md)")
    parser.add_argument("--recording-quota", metavar="SIZE", default=None,
                        help="the recordings' disk quota (e.g. 500M, 2G; default 1G): a "
                             "recording that would pass it stops, the call goes on")
    parser.add_argument("--recording-retention", metavar="DURATION", default=None,
                        help="recordings older than this are deleted (e.g. 12h, 7d; "
                             "default 7d)")
    parser.add_argument("--internal-base-port", type=int, metavar="PORT", default=None,
                        help="transceiver k listens on 127.0.0.1:PORT+k (default: free ports)")
    parser.add_argument("--webui-dir", metavar="DIR", default=None, help=argparse.SUPPRESS)
    # For tests and packaging: how to start a child role (default: python -m appliance).
    parser.add_argument("--child-command", metavar="CMD", default=None, help=argparse.SUPPRESS)
    add_auth_arguments(parser)
    add_realtime_arguments(parser)
    add_live_arguments(parser)
    add_webhook_arguments(parser)
    add_sip_arguments(parser)
    add_tls_arguments(parser)
    add_nice_flag(parser)
    add_logging_flags(parser)


def run(args: argparse.Namespace) -> int:
    configure(level=args.log_level, fmt=args.log_format, role="up")
    nice_from_environment(args)
    try:
        resolve(args, load_config(args.config), "up", DEFAULTS)
        cfg = build_up_config(args)
        check_media_port(cfg)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"appliance up: {exc}", file=sys.stderr)
        return 2
    # Signaling and the supervisor too: on a shared core their share against our own
    # media processes stays what it was, and the host's other work comes after all of us.
    raise_priority(cfg.nice, "appliance up")

    async def main() -> None:
        await up(cfg)

    try:
        trio.run(run_until_signalled, main)
    except KeyboardInterrupt:  # before the signal receiver was installed
        return 130
    except (StartupError, OSError, BaseExceptionGroup) as exc:
        # Failures arrive wrapped in nurseries' exception groups; report the leaves we expect.
        expected = (StartupError, OSError)
        if isinstance(exc, BaseExceptionGroup):
            matched, rest = exc.split(expected)
            if matched is None or rest is not None:
                raise
            leaves = list(exception_leaves(matched))
        else:
            leaves = [exc]
        for leaf in leaves:
            print(f"appliance up: {leaf}", file=sys.stderr)
        return 1
    print("appliance stopped", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m appliance.supervisor`` (the same as ``appliance up``)."""
    parser = argparse.ArgumentParser(prog="appliance up")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
