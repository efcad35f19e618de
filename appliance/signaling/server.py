"""Running the HTTP API: hypercorn's trio worker plus a health poller, in one nursery."""

from __future__ import annotations

import ipaddress
import logging
import secrets
import signal
import socket
from collections.abc import Awaitable, Callable
from functools import partial

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from ..config import format_hostport, parse_hostport
from . import sip_http
from .app import create_app
from .proxied import serve_relay_https
from .sip_server import serve_sip
from .state import SignalingConfig, SignalingState

log = logging.getLogger(__name__)

# Documentation addresses (RFC 5737 / RFC 3849): connect() on a UDP socket picks the source
# address the kernel would route through, and sends nothing.
_PROBE = {socket.AF_INET: "192.0.2.1", socket.AF_INET6: "2001:db8::1"}


def default_route_address(family: socket.AddressFamily = socket.AF_INET) -> str | None:
    """The address of the interface that holds the default route, found without sending a
    packet; None when there is no such route."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((_PROBE[family], 9))
            addr = str(s.getsockname()[0])
    except OSError:
        return None
    ip = ipaddress.ip_address(addr)
    return None if ip.is_unspecified else addr


def default_public_addresses() -> list[str]:
    """The default advertised media address: the default-route interface (IPv4, else IPv6),
    else loopback (a machine with no route can only be reached from itself)."""
    return [default_route_address(socket.AF_INET) or default_route_address(socket.AF_INET6)
            or "127.0.0.1"]


def check_public_address(text: str) -> str:
    """An advertised address must be a literal IPv4 or IPv6 address (it goes into an ICE
    candidate line as is)."""
    try:
        ip = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        raise ValueError(f"public address {text!r} is not an IPv4 or IPv6 address") from None
    if ip.is_unspecified or ip.is_multicast:
        raise ValueError(f"public address {text!r} cannot be advertised")
    return str(ip)


def ensure_api_token(config: SignalingConfig) -> str | None:
    """When auth is needed and no API token is configured, generate one (and return it so
    the caller prints it); None otherwise."""
    if config.reachable_from_elsewhere() and not config.api_token:
        config.api_token = secrets.token_urlsafe(32)
        return config.api_token
    return None


def loopback_of(addr: tuple[str, int]) -> tuple[str, int]:
    """Where this host reaches a listener bound to ``addr`` (a wildcard bind: loopback)."""
    host = addr[0].strip("[]")
    return ("127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host,
            addr[1])


def _listen_socket(host: str, port: int) -> socket.socket:
    """Bind the HTTP socket ourselves: a bind error then leaves no socket behind (hypercorn
    does not close the socket of a failed bind) and the caller gets a plain OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    return sock


def hypercorn_config(config: SignalingConfig) -> HypercornConfig:
    hc = HypercornConfig()
    sock = _listen_socket(*config.http)
    hc.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) it from here
    if config.tls_cert and config.tls_key:
        hc.certfile = config.tls_cert
        hc.keyfile = config.tls_key
    hc.accesslog = None
    hc.errorlog = logging.getLogger("appliance.signaling.http")
    hc.graceful_timeout = 1.0  # stop within the supervisor's 5 s budget
    hc.include_server_header = False
    return hc


async def _poll_forever(state: SignalingState) -> None:
    while True:
        await state.refresh()
        await trio.sleep(state.config.events_interval)


async def serve_signaling(
    config: SignalingConfig,
    *,
    state: SignalingState | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the HTTP API until cancelled; reports the bound URLs (``["http://h:p"]``)."""
    if state is None:
        state = SignalingState(config)
    app = create_app(state)
    try:
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(partial(serve, app, hypercorn_config(config)))
            if config.relay_https is not None:  # HTTPS from the media port (proxied.py)
                listening = parse_hostport(binds[0].partition("://")[2])  # port 0 resolved
                bound = await nursery.start(serve_relay_https, config.relay_https,
                                            loopback_of(listening), state.real_clients)
                log.info("relay HTTPS backend on %s", format_hostport(bound))
            nursery.start_soon(_poll_forever, state)
            state.call_events.start(nursery)  # every call's end (call_events.py)
            if state.webhooks.queue.endpoints:
                nursery.start_soon(state.webhooks.run)
            if config.sip is not None:  # phone calls: sip_server.py, docs/sip.md
                await nursery.start(serve_sip, config.sip, app.extensions[sip_http.EXTENSION])
            log.info("signaling listening on %s", ", ".join(binds))
            task_status.started(binds)
    finally:
        with trio.move_on_after(1, shield=True):
            await state.aclose()


async def run_until_signalled(main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main`` until it returns or SIGINT/SIGTERM arrives, then cancel it.

    The signals are *received* for the whole run rather than raised as KeyboardInterrupt,
    which trio would deliver into whichever task happens to run (an HTTP request handler,
    say, where hypercorn logs and swallows it) and which could cut short the cleanup that
    stops child processes.
    """
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as outer:
            work = trio.CancelScope()

            async def watch() -> None:
                async for signum in signals:
                    log.info("%s: stopping", signal.Signals(signum).name)
                    work.cancel()

            outer.start_soon(watch)
            with work:
                await main()
            outer.cancel_scope.cancel()
