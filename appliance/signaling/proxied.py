"""Who is really calling: the API's trust follows the client, never a hop (issue 40 item 0).

The API needs no token from a caller on this host when signaling is bound to loopback
(``state.py``, ``requires_auth``). "On this host" must mean the *client*, not the last hop:
with ``--https-on-media-port`` the relays splice every TLS connection that reaches the
public TCP port (443) to signaling over loopback, and a reverse proxy on the same host does
the same; judged by the TCP peer, every such caller looked local and got the whole API with
no token. Two pieces close that:

* **The relays' HTTPS backend** (:func:`serve_relay_https`, ``--relay-https``): the relay
  opens each spliced connection with a PROXY v2 header (STREAM; source = the client's TCP
  address, destination = the address it reached; ``relay/tcp.py``). This listener reads the
  header (bounded: :data:`MAX_HEADER` bytes within :data:`HEADER_TIMEOUT`, else the
  connection is closed and counted), then splices the rest, TLS bytes as they are, to
  signaling's own HTTPS listener over loopback. Before it sends a byte it records
  ``(its own source address on that hop) -> real client`` in :class:`RealClients`; the
  record lives exactly as long as the hop's connection, and a source address is unique among
  open connections, so the mapping cannot be reached by anyone else.
* **The trust edge** (:class:`TrustEdge`, the outermost ASGI layer): for every request
  (HTTP and WebSocket) it replaces ``scope["client"]`` by the real client from that table
  (so geo steering and logs see it too) and sets :data:`CLIENT_IS_LOCAL` for the request,
  which ``rules.authorize_header`` reads. A client is local only if its real address is
  loopback and the request does not say it was forwarded (``Forwarded`` /
  ``X-Forwarded-For``: a reverse proxy on this host forwarded it). The default, outside any
  request, is *not local*: a path that forgets the edge asks for a token.

A PROXY header is believed only as far as the hop that wrote it: a loopback source claimed
over a non-loopback hop (a relay on another host, or anyone who can reach a
non-loopback ``--relay-https``) is judged as that hop's address, so a forged header can
only make a caller *less* trusted.

    relay ──TCP: PROXY v2 + TLS──► serve_relay_https ──TLS (loopback)──► hypercorn (--http)
                                    │ RealClients[hop] = client            │
                                    └───────────────── TrustEdge: scope["client"] = client
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from typing import Any

import trio

from ..netio.splice import splice
from ..proto.proxy import STREAM, ProxyError, parse_transport_untrusted

log = logging.getLogger(__name__)

Address = tuple[str, int]
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

#: Set by :class:`TrustEdge` for the duration of each request: its real client is on this
#: host. Read by ``rules.authorize_header``; False (ask for a token) outside a request.
CLIENT_IS_LOCAL: ContextVar[bool] = ContextVar("appliance_client_is_local", default=False)

#: The PROXY v2 header the relay writes is 28 (IPv4) or 52 (IPv6) bytes; TLVs are allowed
#: (the spec's readers skip them) up to this bound.
MAX_HEADER = 512
HEADER_TIMEOUT = 5.0
READ_SIZE = 65536
_FORWARDED = (b"forwarded", b"x-forwarded-for")


def is_loopback_ip(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0]).is_loopback
    except ValueError:
        return False


class RealClients:
    """Our side of each open relay hop -> the client the relay named for it."""

    def __init__(self) -> None:
        self._by_hop: dict[Address, Address] = {}
        self.connections = 0  # relayed connections taken (metrics)
        self.refused = 0  # closed: no valid PROXY header in time

    def real(self, client: Address) -> Address:
        return self._by_hop.get(client, client)

    def bind(self, hop: Address, client: Address) -> None:
        self._by_hop[hop] = client
        self.connections += 1

    def unbind(self, hop: Address) -> None:
        self._by_hop.pop(hop, None)

    def __len__(self) -> int:
        return len(self._by_hop)


def judged_client(claimed: Address, hop_peer: Address) -> Address:
    """The address a spliced request is judged by: the claimed client, unless it claims
    this host over a hop that is not from this host (then the hop's own address)."""
    if is_loopback_ip(claimed[0]) and not is_loopback_ip(hop_peer[0]):
        return hop_peer
    return claimed


def client_is_local(scope: Scope) -> bool:
    """Whether a request's (already real) client is on this host and not forwarded.

    No client at all is an in-process call (the ASGI test client): a network server always
    sets it for TCP."""
    if any(name in _FORWARDED for name, _ in scope.get("headers", ())):
        return False
    client = scope.get("client")
    return client is None or is_loopback_ip(str(client[0]))


class TrustEdge:
    """ASGI middleware, outermost: the real client into the scope, trust into the context."""

    def __init__(self, app: ASGIApp, clients: RealClients) -> None:
        self.app = app
        self.clients = clients

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            client = scope.get("client")
            if client is not None:
                real = self.clients.real((str(client[0]), int(client[1])))
                if real != client:
                    scope["client"] = real
            token = CLIENT_IS_LOCAL.set(client_is_local(scope))
            try:
                await self.app(scope, receive, send)
            finally:
                CLIENT_IS_LOCAL.reset(token)
        else:  # lifespan
            await self.app(scope, receive, send)


async def read_proxy_header(stream: trio.abc.ReceiveStream) -> tuple[Address, bytes]:
    """The client a PROXY v2 (STREAM) header names, and the bytes after the header.

    Raises ProxyError for anything else (too long, not v2, not STREAM, closed early)."""
    buf = bytearray()
    need = 16
    while len(buf) < need:
        chunk = await stream.receive_some(READ_SIZE)
        if not chunk:
            raise ProxyError("connection closed inside the PROXY header", hint="short")
        buf += chunk
        if need == 16 and len(buf) >= 16:
            need = 16 + int.from_bytes(buf[14:16], "big")
            if need > MAX_HEADER:
                raise ProxyError("PROXY header longer than allowed", hint="length")
    src, _dst, end, transport = parse_transport_untrusted(buf)
    if transport != STREAM:
        raise ProxyError("PROXY header is not for a stream", hint="family")
    return src, bytes(buf[end:])


async def serve_relay_https(
    listen: Address,
    backend: Address,
    clients: RealClients,
    *,
    task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept the relays' spliced HTTPS connections on ``listen`` until cancelled (module
    docstring); reports the bound address."""
    listeners = await trio.open_tcp_listeners(listen[1], host=listen[0].strip("[]"))
    bound = listeners[0].socket.getsockname()
    task_status.started((str(bound[0]), int(bound[1])))

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            peer = stream.socket.getpeername()
            try:
                with trio.fail_after(HEADER_TIMEOUT):
                    claimed, rest = await read_proxy_header(stream)
            except (ProxyError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                clients.refused += 1
                log.info("relay HTTPS connection closed: %s", exc)
                return
            client = judged_client(claimed, (str(peer[0]), int(peer[1])))
            try:
                hop = await trio.open_tcp_stream(*backend)
            except OSError as exc:
                log.warning("relay HTTPS: signaling's listener %s is unreachable: %s",
                            backend, exc)
                return
            async with hop:
                mine = hop.socket.getsockname()
                key = (str(mine[0]), int(mine[1]))
                clients.bind(key, client)
                try:
                    if rest:
                        await hop.send_all(rest)
                    await splice(stream, hop)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                finally:
                    clients.unbind(key)

    await trio.serve_listeners(handle, listeners)
