"""Transceiver and next-hop addresses by name, resolved off the hot path (issue 10).

``transceiver_pattern`` (e.g. ``transceiver-{id}.transceiver.ns.svc:4000``, a StatefulSet
ordinal as the id) names every transceiver; ids ``0..transceiver_count-1`` are resolved at
start (a name that does not resolve yet is not fatal), any other id — or all of them
without a count — on first use: the first verified check for an unresolved id is dropped
(``transceiver-resolving``) and :meth:`Resolver.run` looks the name up; the client's next
check (ICE retransmits) finds it. Every name (pattern or a host name given with
``transceivers``) is re-resolved every ``resolve_interval`` seconds; a changed address
re-points the flows (:meth:`RelayCore.set_transceiver`) and is accepted as a source of
return traffic, so a pod restarted with a new IP keeps working without restarting the
relays. Only MAC-verified ufrags can ask for a resolution (the core caps them), so junk
never makes the relay query DNS.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping

import trio

from ..config import parse_hostport
from ..netio.sockets import format_addr
from .core import Address, RelayCore

log = logging.getLogger("appliance.relay.server")


def pattern_address(pattern: str, ident: int) -> Address:
    """``transceiver-{id}.transceiver.ns.svc:4000`` and id 3 -> (``transceiver-3...``, 4000)."""
    if "{id}" not in pattern:
        raise ValueError(f"transceiver pattern {pattern!r} has no {{id}}")
    host, port = parse_hostport(pattern.replace("{id}", str(ident)), default_host="")
    if not host or not port:
        raise ValueError(f"transceiver pattern {pattern!r}: expected HOST:PORT with {{id}}")
    return host, port


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


async def resolve(addr: Address, family: int = 0) -> Address:
    """A host name to an IP literal (``sendto`` with a name would resolve per packet), of the
    internal socket's family when given."""
    infos = await trio.socket.getaddrinfo(addr[0], addr[1], family=family,
                                          type=trio.socket.SOCK_DGRAM)
    if not infos:  # pragma: no cover - getaddrinfo raises instead
        raise OSError(f"cannot resolve {addr[0]}")
    sockaddr = infos[0][4]
    return (str(sockaddr[0]), int(sockaddr[1]))


async def resolve_at_start(
    transceivers: Mapping[int, Address],
    next_hops: Mapping[int, Address],
    family: int,
    pattern: str | None = None,
    count: int | None = None,
    resolve_timeout: float = 2.0,
) -> tuple[dict[int, Address], dict[int, Address], dict[int, Address]]:
    """Resolve the configured addresses and the pattern's ids ``0..count-1`` before the
    worker starts: (transceivers, next hops) as IP literals, and the transceiver names to
    keep re-resolving."""
    resolved = {k: await resolve(a, family) for k, a in transceivers.items()}
    hops = {k: await resolve(a, family) for k, a in next_hops.items()}
    names = {k: a for k, a in transceivers.items() if not is_ip(a[0])}
    if pattern is not None:
        pattern_address(pattern, 1)  # a bad pattern fails now
        for k in range(count or 0):
            if k in resolved:
                continue
            names[k] = tname = pattern_address(pattern, k)
            try:
                with trio.fail_after(resolve_timeout):
                    resolved[k] = await resolve(tname, family)
            except (OSError, trio.TooSlowError) as exc:
                # Not fatal: a StatefulSet pod that is not ready has no DNS record yet.
                log.warning("relay: transceiver %d (%s) does not resolve yet (%s); will retry",
                            k, tname[0], exc)
    return resolved, hops, names


class Resolver:
    """The names a worker knows and the task that keeps their addresses current.

    ``return_sources`` is the hot loop's set of addresses whose datagrams on the internal
    socket are return traffic (configured transceivers and next hops); it is mutated in
    place, never rebound, because the internal drain holds a reference to it.
    """

    def __init__(
        self,
        core: RelayCore,
        family: int,
        *,
        pattern: str | None = None,
        count: int | None = None,
        configured: Mapping[int, Address] | None = None,
        interval: float = 5.0,
        timeout: float = 2.0,
        names: Mapping[int, Address] | None = None,
        next_hops: Mapping[int, Address] | None = None,
    ) -> None:
        self.core = core
        self.family = family
        self.pattern = pattern
        self.count = count
        self.configured = dict(configured or {})
        self.interval = interval
        self.timeout = timeout
        #: transceiver id -> the name it is resolved from (pattern or configured host name)
        self.names: dict[int, Address] = dict(names or {})
        self.next_hops: dict[int, Address] = dict(next_hops or {})
        self.return_sources: set[Address] = set()
        #: set by the hot loop when the core has ids to resolve
        self.wanted = trio.Event()

    @property
    def needed(self) -> bool:
        """Whether :meth:`run` has anything to do (names to re-resolve or a pattern)."""
        return bool(self.names) or self.pattern is not None

    def name_of(self, ident: int) -> Address | None:
        name = self.names.get(ident)
        if name is not None:
            return name
        if self.pattern is None or ident in self.configured:
            return None
        if self.count is not None and ident >= self.count:
            return None
        return pattern_address(self.pattern, ident)

    def update_return_sources(self) -> None:
        wanted = set(self.core.transceivers.values()) | set(self.next_hops.values())
        self.return_sources.intersection_update(wanted)
        self.return_sources.update(wanted)

    async def resolve_one(self, ident: int) -> None:
        name = self.name_of(ident)
        if name is None:
            return
        try:
            with trio.fail_after(self.timeout):
                addr = await resolve(name, self.family)
        except (OSError, trio.TooSlowError) as exc:
            log.debug("relay: transceiver %d (%s) does not resolve: %s", ident, name[0], exc)
            return
        self.names.setdefault(ident, name)
        old = self.core.transceivers.get(ident)
        if old == addr:
            self.core.set_transceiver(ident, addr, trio.current_time())  # parked flows
            return
        moved = self.core.set_transceiver(ident, addr, trio.current_time())
        self.update_return_sources()
        log.info("relay: transceiver %d %s is at %s%s", ident, name[0], format_addr(addr),
                 "" if old is None else f" (was {format_addr(old)}, {moved} flows moved)")

    async def run(self) -> None:
        """Resolve ids the core asks for as soon as it asks; re-resolve every known name
        every ``interval`` seconds."""
        limiter = trio.CapacityLimiter(8)

        async def limited(ident: int) -> None:
            async with limiter:
                await self.resolve_one(ident)

        next_sweep = trio.current_time() + self.interval
        while True:
            with trio.move_on_at(next_sweep):
                await self.wanted.wait()
            self.wanted = trio.Event()
            now = trio.current_time()
            ids = set(self.core.poll_resolutions(now))
            if now >= next_sweep:
                ids |= set(self.names)
                next_sweep = now + self.interval
            if ids:
                async with trio.open_nursery() as nursery:
                    for ident in sorted(ids):
                        nursery.start_soon(limited, ident)
