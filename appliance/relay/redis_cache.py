"""The optional Redis flow cache: established flows written out, unknown flows looked up.

With ``--redis`` a relay worker writes every flow it creates (and, a third of a timeout
ahead of expiry, every flow still in use) as ``appliance:relay:c<cluster>:<ip>:<port> ->
route`` with a TTL of the flow timeout, and looks a non-STUN datagram from an unknown
client address up there, so media resumes after a relay restart without waiting for the
next ICE check (DESIGN.md "Relay behaviour"). Everything here runs off the hot path: the
core queues writes and look-ups (:meth:`RelayCore.poll_writes`,
:meth:`RelayCore.poll_lookups`), these tasks batch them into one pipeline / ``MGET`` per
tick in a worker thread (redis-py is blocking), and a Redis that is down costs counted
drops (``redis-error``), never the relaying.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import trio

from ..logs import redact
from ..netio.sockets import format_addr
from .core import Address, RelayCore

log = logging.getLogger("appliance.relay.server")

#: How often queued writes go out (one pipeline per tick).
WRITE_TICK = 0.05


def open_client(url: str) -> Any:
    """A redis-py client (the optional dependency is imported only when asked for)."""
    import redis  # only relays started with --redis need it

    return redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)


class RedisFlowCache:
    """The writer and reader tasks of one worker, over a redis-py ``client``."""

    def __init__(self, core: RelayCore, client: Any, cluster: int, flow_timeout: float) -> None:
        self.core = core
        self.client = client
        self.cluster = cluster
        self.ttl = max(1, math.ceil(flow_timeout))
        #: set by the hot loop when the core has look-ups queued
        self.wanted = trio.Event()

    def key(self, client: Address) -> str:
        return f"appliance:relay:c{self.cluster}:{client[0]}:{client[1]}"

    async def writer(self) -> None:
        """Batch newly established flows (and TTL refreshes) into one pipeline per tick."""
        while True:
            await trio.sleep(WRITE_TICK)
            writes = self.core.poll_writes(trio.current_time())
            if not writes:
                continue
            keyed = [(self.key(c), v) for c, v in writes]

            def write(keyed: list[tuple[str, str]] = keyed) -> None:
                pipe = self.client.pipeline(transaction=False)
                for key, value in keyed:
                    pipe.set(key, value, ex=self.ttl)
                pipe.execute()

            try:
                await trio.to_thread.run_sync(write, abandon_on_cancel=True)
            except Exception as exc:  # redis.RedisError, OSError: keep relaying
                self.core.counters.drop("redis-error", len(keyed))
                log.warning("relay: redis write failed: %s", exc)

    async def reader(self) -> None:
        """Look up unknown flows' non-STUN datagrams in batches, in a worker thread."""
        while True:
            await self.wanted.wait()
            self.wanted = trio.Event()
            wanted = self.core.poll_lookups(trio.current_time())
            if not wanted:
                continue
            keys = [self.key(c) for c, _, _ in wanted]
            try:
                raw = await trio.to_thread.run_sync(self.client.mget, keys,
                                                    abandon_on_cancel=True)
            except Exception as exc:  # redis.RedisError, OSError
                self.core.counters.drop("redis-error", len(wanted))
                log.warning("relay: redis lookup failed: %s", exc)
                continue
            now = trio.current_time()
            for (c, public, upstream), value in zip(wanted, raw, strict=True):
                text = value.decode("ascii", "replace") if isinstance(value, bytes) else None
                flow = self.core.handle_lookup(now, c, public, upstream, text)
                if flow is not None:
                    log.debug("relay: flow %s recovered from redis -> %s",
                              redact(format_addr(c)), flow.route)

    async def close(self) -> None:
        with trio.move_on_after(1, shield=True):
            await trio.to_thread.run_sync(self.client.close, abandon_on_cancel=True)
