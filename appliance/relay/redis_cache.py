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

Redis down or unreachable (issue 20 item 3): the first failure is logged once (warning)
and counted (``redis_errors``; the writes and look-ups it cost under drops
``redis-error``); the cache is then *down*: no write or look-up is attempted (look-ups go
to the transceivers alone, :mod:`.reseed`) until a ``PING`` succeeds, tried after a backoff
of ``BACKOFF_INITIAL`` doubling to ``BACKOFF_MAX``. When it answers again the recovery is
logged, counted (``redis_reconnects``), and every flow the worker has is written at once
(:meth:`RelayCore.resync_writes`): the Redis that came back may be a fresh, empty one, so
the cache fills again without waiting for the flows' TTL refreshes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import trio

from ..logs import redact
from ..netio.sockets import format_addr
from .core import Address, RelayCore

log = logging.getLogger("appliance.relay.server")

#: How often queued writes go out (one pipeline per tick).
WRITE_TICK = 0.05
#: Retry a Redis that failed after this long, doubling up to BACKOFF_MAX.
BACKOFF_INITIAL = 0.2
BACKOFF_MAX = 5.0


def open_client(url: str) -> Any:
    """A redis-py client (the optional dependency is imported only when asked for)."""
    import redis  # only relays started with --redis need it
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # No retries inside redis-py (its default retries 3 times with backoff, holding the
    # worker thread): the cache's own backoff decides when to try again.
    return redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0,
                                retry=Retry(NoBackoff(), 0))


class RedisFlowCache:
    """The writer task and the look-up batches of one worker, over a redis-py ``client``."""

    def __init__(self, core: RelayCore, client: Any, cluster: int, flow_timeout: float,
                 *, backoff_initial: float = BACKOFF_INITIAL,
                 backoff_max: float = BACKOFF_MAX) -> None:
        self.core = core
        self.client = client
        self.cluster = cluster
        self.ttl = max(1, math.ceil(flow_timeout))
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        #: False after a failure, until a PING succeeds (see the module docstring)
        self.up = True
        self.backoff = backoff_initial
        self.retry_at = -math.inf
        #: called after a batch of look-ups was answered (the shell sends held datagrams)
        self.on_recovered: Callable[[], None] | None = None

    @property
    def available(self) -> bool:
        """Worth asking now (up; the writer's PING decides when it is up again)."""
        return self.up

    def key(self, client: Address) -> str:
        return f"appliance:relay:c{self.cluster}:{client[0]}:{client[1]}"

    def _failed(self, what: str, exc: BaseException, lost: int) -> None:
        c = self.core.counters
        c.redis_errors += 1
        if lost:
            c.drop("redis-error", lost)
        now = trio.current_time()
        if self.up:
            self.up = False
            self.backoff = self.backoff_initial
            log.warning("relay: redis %s failed (%s); carrying on without it, retrying with "
                        "backoff", what, exc)
        else:
            self.backoff = min(self.backoff * 2, self.backoff_max)
            log.info("relay: redis still unreachable (%s); next try in %.1f s", exc,
                     self.backoff)
        self.retry_at = now + self.backoff

    async def _reconnect(self) -> bool:
        try:
            await trio.to_thread.run_sync(self.client.ping, abandon_on_cancel=True)
        except Exception as exc:  # redis.RedisError, OSError
            self._failed("ping", exc, 0)
            return False
        self.up = True
        self.core.counters.redis_reconnects += 1
        n = self.core.resync_writes()
        log.warning("relay: redis reachable again; writing back %d flows", n)
        return True

    async def writer(self) -> None:
        """Batch newly established flows (and TTL refreshes) into one pipeline per tick;
        while Redis is down, retry it with backoff instead (module docstring)."""
        while True:
            await trio.sleep(WRITE_TICK)
            if not self.up and (trio.current_time() < self.retry_at
                                or not await self._reconnect()):
                continue  # the dirty flows stay queued in the core
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
                self._failed("write", exc, len(keyed))

    async def lookup(self, wanted: list[tuple[Address, Address, Address | None]]) -> None:
        """Look a batch of unknown flows up (one MGET, in a worker thread); called by
        :class:`.reseed.Lookups` with what :meth:`RelayCore.poll_lookups` returned."""
        keys = [self.key(c) for c, _, _ in wanted]
        try:
            raw = await trio.to_thread.run_sync(self.client.mget, keys, abandon_on_cancel=True)
        except Exception as exc:  # redis.RedisError, OSError
            self._failed("lookup", exc, len(wanted))
            return
        now = trio.current_time()
        for (c, public, upstream), value in zip(wanted, raw, strict=True):
            text = value.decode("ascii", "replace") if isinstance(value, bytes) else None
            if text is None and c in self.core.flows:
                continue  # a miss, but the transceiver vouched for it meanwhile
            flow = self.core.handle_lookup(now, c, public, upstream, text)
            if flow is not None:
                log.debug("relay: flow %s recovered from redis -> %s",
                          redact(format_addr(c)), flow.route)
        if self.on_recovered is not None:
            self.on_recovered()  # the datagrams held for these flows (core._hold)

    async def close(self) -> None:
        with trio.move_on_after(1, shield=True):
            await trio.to_thread.run_sync(self.client.close, abandon_on_cancel=True)
