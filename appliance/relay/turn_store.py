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

**Write-ahead.** The answer to a request that changed a UDP allocation (Allocate, Refresh,
CreatePermission, ChannelBind) is held (:attr:`~.turn.TurnGate.held`) until the store has
written the change — at once, not at the next tick — so a kill never takes away what a
client was told it has (a channel bound a moment before the kill would otherwise be gone,
its ChannelData dropped until the binding's refresh, minutes later). It costs the answer
one write (a file rewrite in a thread, or a Redis round trip: ~1 ms); a failed write
releases the answers anyway (counted ``turn-store-error``). Changes that answer nobody
(expiries) are written every tick.

Not here: TCP and TLS allocations (their record travels with their connection to the keeper
in the fork template, relay/keeper.py).

**A client moved to another worker.** With several workers a kill reshuffles the
``SO_REUSEPORT`` group (the last socket takes the dead one's slot, the successor joins at
the end): a TURN client's datagrams can land on a worker — alive all along, or the
successor — that never had its allocation. That worker's server asks
(:class:`~appliance.proto.turn.server.AllocationMissing`, once per 5-tuple in flight), and
:func:`serve_turn_lookups` finds the record by client 5-tuple in every worker's records of
the cluster and imports it as *moved*: when the worker the client left is alive and still
holds the relayed socket, the address is adopted as an identity only
(:meth:`.turn.RelaySockets.adopt`), enough for our own media address (routed in-process);
the socket is taken over once its old holder lets it go (its copy expires unrefreshed)::

    ChannelData from an unknown 5-tuple ─► TurnServer: AllocationMissing (data dropped,
    requests unanswered meanwhile) ─► serve_turn_lookups ─► store.find(5-tuples)
      file: every turn-c<cluster>-w*.jsonl, indexed by the record's client and local
      Redis: …:turn:at:<client>|<local> ─► the key of the record's latest writer ─► record
    ─► TurnGate.adopt ─► import_allocation(moved=True) ─► the next ChannelData is relayed

A 5-tuple found nowhere is not asked about again for a second (``absent_for``), at most
``max_lookups`` are in flight and new ones start at ``lookup_rate`` (TurnConfig), so a flood
of ChannelData from made-up sources costs a bounded, rate-limited lookup per
:data:`LOOKUP_GAP`, not one per datagram.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from typing import Any, Protocol

import trio

from .core import Address
from .turn import RelaySockets, TurnGate, _canonical

log = logging.getLogger("appliance.relay.server")

__all__ = [
    "LOOKUP_GAP", "WRITE_TICK", "FileTurnStore", "RedisTurnStore", "TurnStore",
    "serve_turn_lookups", "serve_turn_store",
]

#: How often changed allocations are written (one file rewrite / pipeline per tick).
WRITE_TICK = 0.05
#: Records read back at start, at most (a store holds one worker's allocations).
MAX_LOAD = 100_000
#: Lookups of moved clients: at least this long between two (each reads every worker's
#: records), and adopted relayed addresses re-tried for their socket every RECLAIM_TICKS.
LOOKUP_GAP = 0.02
RECLAIM_TICKS = 20

Key = tuple[Address, Address]  # a client's 5-tuple: (client, local)


class TurnStore(Protocol):
    async def load(self) -> list[bytes]: ...

    async def write(self, changes: Sequence[tuple[Address, bytes | None, float]]) -> None: ...

    async def find(self, keys: Sequence[Key]) -> list[bytes]:
        """Records, written by any worker of the cluster, whose client 5-tuple is one of
        ``keys`` (more than one per key when a moved client's old worker kept its copy)."""
        ...


def _name(relayed: Address) -> str:
    return f"{relayed[0]}:{relayed[1]}"


def _key_text(client: Address, local: Address) -> bytes:
    """A 5-tuple as :func:`~appliance.proto.turn.encode_record` spells it, fields ``c`` and
    ``l`` (canonical IPs): how a record is found without parsing it."""
    c, lo = _canonical(client), _canonical(local)
    return json.dumps({"c": list(c), "l": list(lo)}, separators=(",", ":"))[1:-1].encode()


def _record_key(line: bytes) -> bytes | None:
    """The ``"c":…,"l":…`` text of a record line (``{"v":1,"c":[…],"l":[…],"r":…``)."""
    start = line.find(b'"c":')
    end = line.find(b',"r":', start)
    return None if start < 0 or end < 0 else line[start:end]


class FileTurnStore:
    """The embedded cache: one file per (cluster, worker index), one record per line."""

    def __init__(self, directory: str, cluster: int, worker: int) -> None:
        self.directory = directory
        self.cluster = cluster
        self.path = os.path.join(directory, f"turn-c{cluster}-w{worker}.jsonl")
        self.records: dict[Address, bytes] = {}
        #: path -> ((mtime_ns, size), {5-tuple text: [record lines]}): a file is indexed
        #: again only when it changed
        self._index: dict[str, tuple[tuple[int, int], dict[bytes, list[bytes]]]] = {}

    async def find(self, keys: Sequence[Key]) -> list[bytes]:
        wanted = {_key_text(c, lo) for c, lo in keys}
        prefix = f"turn-c{self.cluster}-w"

        def read() -> list[bytes]:
            found: list[bytes] = []
            seen = set()
            for name in os.listdir(self.directory):
                if not (name.startswith(prefix) and name.endswith(".jsonl")):
                    continue
                path = os.path.join(self.directory, name)
                seen.add(path)
                try:
                    st = os.stat(path)
                    stamp = (st.st_mtime_ns, st.st_size)
                    cached = self._index.get(path)
                    if cached is None or cached[0] != stamp:
                        index: dict[bytes, list[bytes]] = {}
                        with open(path, "rb") as f:
                            for _, raw in zip(range(MAX_LOAD), f, strict=False):
                                line = raw.rstrip(b"\n")
                                k = _record_key(line)
                                if k is not None:
                                    index.setdefault(k, []).append(line)
                        cached = self._index[path] = (stamp, index)
                except FileNotFoundError:
                    continue
                for k in wanted:
                    found.extend(cached[1].get(k, ()))
            for path in set(self._index) - seen:
                del self._index[path]
            return found

        return await trio.to_thread.run_sync(read)

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
        #: + the 5-tuple text: the key of the record its latest writer wrote (a pointer,
        #: not a copy: a deleted allocation's pointer leads nowhere)
        self.at = f"appliance:relay:c{cluster}:turn:at:"

    async def find(self, keys: Sequence[Key]) -> list[bytes]:
        names = [self.at + _key_text(c, lo).decode() for c, lo in keys]

        def read() -> list[bytes]:
            pointers = [p for p in self.client.mget(names) if isinstance(p, bytes)]
            if not pointers:
                return []
            return [v for v in self.client.mget(pointers) if isinstance(v, bytes)]

        return await trio.to_thread.run_sync(read, abandon_on_cancel=True)

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
                    ttl = max(1, math.ceil(expires - now))
                    pipe.set(key, record, ex=ttl)
                    at = _record_key(record)
                    if at is not None:
                        pipe.set(self.at + at.decode(), key, ex=ttl)
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
    """Write the allocations that changed, until cancelled: at once when a client's answer
    waits for it (write-ahead: :attr:`TurnGate.held`, released once written), else every
    tick (expiries, data-driven changes). A failed write is counted (``turn-store-error``),
    its changes tried again with the next ones, and the answers waiting for it released
    anyway (the call matters more than surviving a kill in that moment)."""
    pending: dict[Address, tuple[Address, bytes | None, float]] = {}
    warned = False
    gate.saving = True
    reclaim_at = trio.current_time() + WRITE_TICK * RECLAIM_TICKS
    try:
        while True:
            with trio.move_on_after(WRITE_TICK):
                await gate.save_now.wait()
            gate.save_now = trio.Event()
            if trio.current_time() >= reclaim_at:
                reclaim_at = trio.current_time() + WRITE_TICK * RECLAIM_TICKS
                if isinstance(gate.ports, RelaySockets) and gate.ports.adopted:
                    gate.ports.reclaim()
            waiting = len(gate.held)  # their changes are in this poll
            for change in gate.server.poll_changes():
                pending[change[0]] = change
            if pending:
                batch = list(pending.values())
                try:
                    await store.write(batch)
                except Exception as exc:  # redis.RedisError, OSError: keep relaying
                    gate.core.counters.drop("turn-store-error", len(batch))
                    if not warned:
                        warned = True
                        log.warning("relay: TURN allocations could not be written (%s)", exc)
                else:
                    warned = False
                    pending.clear()
            if waiting:
                gate.release(waiting)
    finally:
        gate.saving = False
        gate.release(len(gate.held))  # nothing will write them: answered as they are



async def serve_turn_lookups(gate: TurnGate, store: TurnStore) -> None:
    """Answer the gate's :class:`~appliance.proto.turn.server.AllocationMissing` (a client
    the ``SO_REUSEPORT`` hash moved here): find its record in the cluster's store and
    import it (:meth:`TurnGate.adopt`), until cancelled. Every 5-tuple asked about gets its
    answer, found or not (a failed read counts ``turn-store-error`` and answers "not
    found"); lookups are at least :data:`LOOKUP_GAP` apart, each taking every 5-tuple
    missed since the last."""
    gate.server.look_up_misses = True
    warned = False
    while True:
        await gate.wanted.wait()
        gate.wanted = trio.Event()
        keys = list(gate.missing)
        gate.missing.clear()
        try:
            records = await store.find(keys)
        except Exception as exc:  # redis.RedisError, OSError: the clients stay unserved
            gate.core.counters.drop("turn-store-error")
            if not warned:  # once per outage, not once per lookup
                warned = True
                log.warning("relay: moved TURN clients could not be looked up (%s)", exc)
            records = []
        else:
            warned = False
        gate.adopt(trio.current_time(), keys, records)
        await trio.sleep(LOOKUP_GAP)
