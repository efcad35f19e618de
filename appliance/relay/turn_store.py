"""TURN allocations in the flow cache, so a TURN/UDP call survives a relay-worker kill
(issue 40 item 2).

An allocation lives in the worker that made it; when that worker is SIGKILLed its warm
standby forks a successor at once (docs/reliability.md), but the successor's TURN server is
empty: without this module the client's ChannelData is dropped (``turn-no-allocation``)
until its next Refresh gets 437, minutes later. So each worker writes its UDP allocations
(:mod:`appliance.proto.turn.snapshot` records: client 5-tuple, relayed address, username,
permissions, channels, expiry — never the secret or a key) as they change, and a worker
starting up reads back the records of the worker index it replaces and re-creates them
before it reports ready::

    TurnServer.poll_changes() ──(every WRITE_TICK)──► store.write ──► Redis  appliance:relay:
                                                                      c<cluster>:turn:w<i>:<relayed>
                                                                      (TTL: the allocation's)
                                                                  or the state file
                                                                      <dir>/turn-c<cluster>-w<i>.jsonl
    successor of worker i: store.load() ──► TurnGate.restore ──► TurnServer.import_allocation
                                              (relayed port re-bound: RelaySockets.claim)

The relayed sockets are not shared between workers: each belongs to the process that bound
it and is closed by the kernel when it dies, so the successor binds the same address again
(nothing else can hold an ephemeral port the dead worker had a moment ago, short of a race
with another allocation: that record is dropped, ``turn-import-port-taken``). The flow of the
relayed address (to the owning transceiver) is re-learnt like any moved flow: the first
datagram makes the worker ask the transceivers (:mod:`.reseed`).

Two stores, one shape: :class:`RedisTurnStore` with ``--redis``, else :class:`FileTurnStore`
— the embedded cache, a file in the supervisor's private directory (``appliance up``: the
state directory; ``appliance relay --workers M``: its temporary directory), rewritten
atomically (``os.replace``) by a worker thread, never on the hot path. Records read back are
untrusted (the file or Redis may hold anything): a bad one is dropped and counted.

Not carried: TCP and TLS allocations (their connection dies with the process), and records
written less than a tick before the kill (a ChannelBind then is repeated by the client when
its channel is not answered, as RFC 8656 §12 has it refreshed anyway).

With several workers the ``SO_REUSEPORT`` hash may move a client to another surviving
worker instead of the successor; its allocation is then on the successor and the client's
data is dropped until it re-allocates (``--relay-workers 1``, the default, has no such case).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from typing import Any, Protocol

import trio

from .core import Address
from .turn import TurnGate

log = logging.getLogger("appliance.relay.server")

__all__ = ["WRITE_TICK", "FileTurnStore", "RedisTurnStore", "TurnStore", "serve_turn_store"]

#: How often changed allocations are written (one file rewrite / pipeline per tick).
WRITE_TICK = 0.05
#: Records read back at start, at most (a store holds one worker's allocations).
MAX_LOAD = 100_000


class TurnStore(Protocol):
    async def load(self) -> list[bytes]: ...

    async def write(self, changes: Sequence[tuple[Address, bytes | None, float]]) -> None: ...


def _name(relayed: Address) -> str:
    return f"{relayed[0]}:{relayed[1]}"


class FileTurnStore:
    """The embedded cache: one file per (cluster, worker index), one record per line."""

    def __init__(self, directory: str, cluster: int, worker: int) -> None:
        self.path = os.path.join(directory, f"turn-c{cluster}-w{worker}.jsonl")
        self.records: dict[Address, bytes] = {}

    async def load(self) -> list[bytes]:
        def read() -> list[bytes]:
            try:
                with open(self.path, "rb") as f:
                    return [line.rstrip(b"\n") for _, line in zip(range(MAX_LOAD), f,
                                                                 strict=False)]
            except FileNotFoundError:
                return []
        return await trio.to_thread.run_sync(read)

    async def write(self, changes: Sequence[tuple[Address, bytes | None, float]]) -> None:
        for relayed, record, _ in changes:
            if record is None:
                self.records.pop(relayed, None)
            else:
                self.records[relayed] = record
        body = b"".join(r + b"\n" for r in self.records.values())
        tmp = self.path + ".tmp"

        def replace() -> None:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            os.replace(tmp, self.path)  # a kill mid-write leaves the previous file whole

        await trio.to_thread.run_sync(replace)


class RedisTurnStore:
    """The Redis cache: a key per allocation, expiring with it (redis-py, blocking, in a
    worker thread; the flow cache's client)."""

    def __init__(self, client: Any, cluster: int, worker: int) -> None:
        self.client = client
        self.prefix = f"appliance:relay:c{cluster}:turn:w{worker}:"

    async def load(self) -> list[bytes]:
        def read() -> list[bytes]:
            keys = [k for _, k in zip(range(MAX_LOAD),
                                      self.client.scan_iter(match=self.prefix + "*",
                                                            count=1000), strict=False)]
            if not keys:
                return []
            return [v for v in self.client.mget(keys) if isinstance(v, bytes)]
        return await trio.to_thread.run_sync(read, abandon_on_cancel=True)

    async def write(self, changes: Sequence[tuple[Address, bytes | None, float]]) -> None:
        now = trio.current_time()

        def write() -> None:
            pipe = self.client.pipeline(transaction=False)
            for relayed, record, expires in changes:
                key = self.prefix + _name(relayed)
                if record is None:
                    pipe.delete(key)
                else:
                    pipe.set(key, record, ex=max(1, math.ceil(expires - now)))
            pipe.execute()

        await trio.to_thread.run_sync(write, abandon_on_cancel=True)


async def restore(gate: TurnGate, store: TurnStore) -> int:
    """Re-create the allocations of the worker this one replaces; how many were."""
    try:
        records = await store.load()
    except Exception as exc:  # redis.RedisError, OSError: start without them
        gate.core.counters.drop("turn-store-error")
        log.warning("relay: TURN allocations could not be read back (%s)", exc)
        return 0
    n = gate.restore(trio.current_time(), records)
    if records:
        log.info("relay: %d of %d TURN allocations re-created from the cache", n, len(records))
    return n


async def serve_turn_store(gate: TurnGate, store: TurnStore) -> None:
    """Write the allocations that changed, every tick, until cancelled. A failed write is
    counted (``turn-store-error``) and its changes tried again with the next ones."""
    pending: dict[Address, tuple[Address, bytes | None, float]] = {}
    warned = False
    while True:
        await trio.sleep(WRITE_TICK)
        for change in gate.server.poll_changes():
            pending[change[0]] = change
        if not pending:
            continue
        batch = list(pending.values())
        try:
            await store.write(batch)
        except Exception as exc:  # redis.RedisError, OSError: keep relaying
            gate.core.counters.drop("turn-store-error", len(batch))
            if not warned:
                warned = True
                log.warning("relay: TURN allocations could not be written (%s)", exc)
            continue
        warned = False
        pending.clear()

