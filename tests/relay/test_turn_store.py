"""The relay side of TURN allocations surviving a worker kill (relay/turn_store.py), with
real sockets and files but no relay: the embedded cache's file round trip, the relayed
port claimed back exactly (and refused when taken), a corrupt file line dropped and
counted by the gate's restore; a moved client's record found by its 5-tuple in any worker's
records (file and Redis), adopted as an identity while its old worker holds the socket,
and the socket taken back once that worker lets go. The kill itself:
tests/reliability/test_turn_failover.py."""

from __future__ import annotations

import socket
from pathlib import Path

import trio

from appliance.proto.turn import AllocationRecord, encode_record
from appliance.relay.counters import Counters
from appliance.relay.turn import RelaySockets
from appliance.relay.turn_store import (
    FileTurnStore,
    RedisTurnStore,
    TurnStore,
    serve_turn_lookups,
    serve_turn_store,
)

LOCAL = ("127.0.0.1", 3478)


async def test_the_state_file_holds_what_is_live_and_only_that(tmp_path: Path) -> None:
    store = FileTurnStore(str(tmp_path), cluster=3, worker=1)
    assert await store.load() == []  # a first life: nothing to re-create
    a, b = ("127.0.0.1", 50000), ("127.0.0.1", 50002)
    await store.write([(a, b'{"a":1}', 600.0), (b, b'{"b":2}', 600.0)])
    await store.write([(a, None, 0.0)])  # ended
    path = tmp_path / "turn-c3-w1.jsonl"
    assert path.stat().st_mode & 0o777 == 0o600  # usernames and client addresses: private
    # The next life of worker 1 (a new store object) reads what the last one wrote.
    assert await FileTurnStore(str(tmp_path), 3, 1).load() == [b'{"b":2}']
    assert await FileTurnStore(str(tmp_path), 3, 0).load() == []  # another worker's: not


async def test_a_relayed_port_is_claimed_back_exactly_or_not_at_all() -> None:
    c = Counters()
    socks = RelaySockets(["127.0.0.1"], c, read=False)
    relayed = socks.bind(1, ("127.0.0.1", 40000))
    assert relayed is not None
    assert not socks.claim(relayed)  # ours already
    socks.close(relayed)  # the worker died: the kernel closed it
    assert socks.claim(relayed) and relayed in socks.socks
    assert socks.socks[relayed].getsockname()[1] == relayed[1]
    socks.close(relayed)
    # Someone else holds the port now: refused, not counted as a bind failure of a client.
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        other.bind(relayed)
        assert not socks.claim(relayed)
    finally:
        other.close()
    assert not socks.claim(("127.0.0.2", relayed[1]))  # not an address we hand out
    assert c.drops == {}
    socks.close_all()


class _Failing:
    def __init__(self) -> None:
        self.calls = 0

    async def load(self) -> list[bytes]:
        return []

    async def write(self, changes: object) -> None:
        self.calls += 1
        raise OSError("disk full")


class _Gate:
    """What serve_turn_store uses of a TurnGate (no answers held)."""

    def __init__(self, changes: list[tuple[tuple[str, int], bytes | None, float]]) -> None:
        self.changes = changes
        self.core = type("Core", (), {"counters": Counters()})()
        self.server = self
        self.ports = None
        self.saving = False
        self.held: list[object] = []
        self.save_now = trio.Event()

    def release(self, n: int) -> None:
        assert n == 0

    def poll_changes(self) -> list[tuple[tuple[str, int], bytes | None, float]]:
        out, self.changes = self.changes, []
        return out


async def test_a_failed_write_is_counted_and_tried_again(autojump_clock: trio.abc.Clock) -> None:
    ticks = 2
    store = _Failing()
    gate = _Gate([(("127.0.0.1", 50000), b"{}", 600.0)])
    with trio.move_on_after(0.05 * ticks + 0.01):
        await serve_turn_store(gate, store)  # type: ignore[arg-type]
    # One change, written (and failed) at each tick: it stays pending until it succeeds.
    assert store.calls == ticks
    assert gate.core.counters.drops == {"turn-store-error": ticks}


def test_restore_drops_and_counts_a_corrupt_line() -> None:
    from relay.support import SECRET

    from appliance.relay.core import CoreConfig, RelayCore
    from appliance.relay.turn import TurnGate, TurnSettings

    core = RelayCore(CoreConfig(secrets=(SECRET,)))
    socks = RelaySockets(["127.0.0.1"], core.counters, read=False)
    gate = TurnGate(core, TurnSettings(secrets=(SECRET,)), {}, socks)
    assert gate.restore(0.0, [b"{not json", b"", b'{"v":1}']) == 0
    assert core.counters.drops == {"turn-import-corrupt": 3}
    assert gate.server.allocations == {} and socks.socks == {}


def _record(client: tuple[str, int], relayed: tuple[str, int], expires: float) -> bytes:
    return encode_record(AllocationRecord(
        client=client, local=LOCAL, relayed=relayed, family=1, username="9999999999:u",
        tid=bytes(12), expires=expires, permissions=(("127.0.0.1", expires),),
        channels=((0x4001, LOCAL, expires),)))


async def _finds_by_five_tuple(w0: TurnStore, w1: TurnStore, reader: TurnStore) -> None:
    a, b = ("127.0.0.5", 50000), ("127.0.0.6", 50000)
    stale, fresh = _record(a, ("127.0.0.1", 40000), 1e10), _record(a, ("127.0.0.1", 40000),
                                                                   2e10)
    await w0.write([(("127.0.0.1", 40000), stale, 600.0),
                    (("127.0.0.1", 40002), _record(b, ("127.0.0.1", 40002), 1e10), 600.0)])
    await w1.write([(("127.0.0.1", 40000), fresh, 600.0)])  # a took it over (moved)
    found = await reader.find([(a, LOCAL)])
    assert fresh in found and all(r in (stale, fresh) for r in found)
    assert await reader.find([(b, LOCAL)]) == [_record(b, ("127.0.0.1", 40002), 1e10)]
    assert await reader.find([(("127.0.0.5", 50001), LOCAL)]) == []  # another port: nothing
    await w0.write([(("127.0.0.1", 40002), None, 0.0)])  # b's allocation ended
    assert await reader.find([(b, LOCAL)]) == []


async def test_a_moved_clients_record_is_found_in_any_workers_file(tmp_path: Path) -> None:
    await _finds_by_five_tuple(FileTurnStore(str(tmp_path), 0, 0),
                               FileTurnStore(str(tmp_path), 0, 1),
                               FileTurnStore(str(tmp_path), 0, 2))
    # Another cluster's files are not read.
    assert await FileTurnStore(str(tmp_path), 1, 0).find(
        [(("127.0.0.5", 50000), LOCAL)]) == []


async def test_a_moved_clients_record_is_found_in_redis(redis_url: str) -> None:
    import redis

    db = redis.Redis.from_url(redis_url)
    try:
        await _finds_by_five_tuple(RedisTurnStore(db, 0, 0), RedisTurnStore(db, 0, 1),
                                   RedisTurnStore(db, 0, 2))
    finally:
        db.close()


async def test_an_address_another_worker_holds_is_adopted_then_taken_back() -> None:
    """Adopted: never handed to a new allocation here; the socket is ours once the other
    worker's copy lets it go (reclaim), and until then a peer beyond our own media address
    cannot be sent to (counted)."""
    c = Counters()
    socks = RelaySockets(["127.0.0.1"], c, read=False)
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # the worker the client left
    other.bind(("127.0.0.1", 0))
    held = ("127.0.0.1", other.getsockname()[1])
    try:
        assert not socks.claim(held)
        assert socks.adopt(held) and not socks.adopt(held) and held not in socks.socks
        assert not socks.adopt(("127.0.0.2", 1))  # not an address we hand out
        socks.send(held, ("127.0.0.1", 9), memoryview(b"x"))
        assert c.drops == {"turn-peer-no-socket": 1}
        assert socks.reclaim() == 0 and held in socks.adopted  # still held over there
    finally:
        other.close()
    assert socks.reclaim() == 1 and held in socks.socks and not socks.adopted
    socks.close_all()


class _FakeStore:
    def __init__(self, records: list[bytes]) -> None:
        self.records = records
        self.asked: list[list[tuple[tuple[str, int], tuple[str, int]]]] = []

    async def load(self) -> list[bytes]:
        return []

    async def write(self, changes: object) -> None:
        pass

    async def find(self, keys: list[tuple[tuple[str, int], tuple[str, int]]]) -> list[bytes]:
        self.asked.append(list(keys))
        return self.records


async def test_a_moved_client_is_served_after_one_lookup(nursery: trio.Nursery) -> None:
    """Through the gate: ChannelData from a 5-tuple this worker never saw asks the store
    once; the freshest record found is imported as moved (the port is held elsewhere, so
    adopted) and the client's next ChannelData reaches our own media address."""
    import time

    from relay.support import SECRET

    from appliance.proto.turn import encode_channel_data
    from appliance.relay.core import CoreConfig, RelayCore
    from appliance.relay.transport import Transport
    from appliance.relay.turn import TurnGate, TurnSettings

    core = RelayCore(CoreConfig(secrets=(SECRET,)))
    socks = RelaySockets(["127.0.0.1"], core.counters, read=False)
    gate = TurnGate(core, TurnSettings(secrets=(SECRET,), media=(LOCAL,)), {LOCAL: LOCAL},
                    socks, unix_offset=time.time() - trio.current_time())
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.1", 0))
    relayed = ("127.0.0.1", other.getsockname()[1])
    client = ("127.0.0.5", 50000)
    now = time.time()
    store = _FakeStore([_record(client, relayed, now + 300), _record(client, relayed, now + 60),
                        b"{corrupt"])
    nursery.start_soon(serve_turn_lookups, gate, store)
    await trio.testing.wait_all_tasks_blocked()
    cd = encode_channel_data(0x4001, b"\x80" + bytes(11))  # an RTP-looking payload
    try:
        for _ in range(3):
            assert gate.handle(trio.current_time(), client, cd, LOCAL, Transport.UDP) is None
        await trio.testing.wait_all_tasks_blocked()
        assert store.asked == [[(client, LOCAL)]]  # once, for three datagrams
        alloc = gate.server.allocations[(client, LOCAL)]
        assert alloc.relayed == relayed and relayed in socks.adopted
        assert alloc.expires > trio.current_time() + 200  # the freshest record won
        assert core.counters.drops["turn-import-corrupt"] == 1
        core.counters.drops.clear()
        gate.handle(trio.current_time(), client, cd, LOCAL, Transport.UDP)
        assert core.counters.drops.get("turn-lookup-pending") is None
        assert core.counters.extra.get("turn_relayed_in") == 1, core.counters.as_dict()
    finally:
        other.close()
        socks.close_all()


class _Gated:
    """A store whose writes wait for the test's word."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[tuple[str, int], bytes | None, float]]] = []
        self.proceed = trio.Event()

    async def load(self) -> list[bytes]:
        return []

    async def write(self, changes: list[tuple[tuple[str, int], bytes | None, float]]) -> None:
        self.batches.append(list(changes))
        await self.proceed.wait()
        self.proceed = trio.Event()


async def test_an_answer_that_changed_an_allocation_waits_until_it_is_written(
        nursery: trio.Nursery) -> None:
    """Write-ahead: the success of an Allocate or a ChannelBind over UDP leaves only once
    the store has the allocation as it made it — so a kill right after the client learns it
    has a channel cannot take the channel away (before, a change waited up to a tick for
    the store, and a kill meanwhile lost it: the client's ChannelData dropped until its
    binding's refresh, minutes later). A 401 changes nothing and is answered at once."""
    from proto.turn.turn_client import NOW, SECRET, UNIX, Client, relayed_of

    from appliance.proto.stun import AttrType, Class, Method
    from appliance.proto.turn import parse_record_untrusted
    from appliance.relay.core import CoreConfig, RelayCore
    from appliance.relay.transport import Transport, UdpSink
    from appliance.relay.turn import TurnGate, TurnSettings

    media = ("203.0.113.1", 3478)
    core = RelayCore(CoreConfig(secrets=(b"routing-secret-0123456789abcdef",)))
    sent: list[tuple[object, int, int, tuple[str, int]]] = []

    def send(buf: object, pending: list[tuple[object, int, int, tuple[str, int]]]
             ) -> tuple[int, int, int]:
        sent.extend(pending)
        return len(pending), 0, 0

    core.sinks[(Transport.UDP, LOCAL)] = UdpSink(LOCAL, send)
    from proto.turn.turn_client import FakePorts
    gate = TurnGate(core, TurnSettings(secrets=(SECRET,)), {media: LOCAL}, FakePorts(),
                    unix_offset=UNIX - NOW)
    store = _Gated()
    nursery.start_soon(serve_turn_store, gate, store)
    await trio.testing.wait_all_tasks_blocked()
    c = Client(addr=("198.51.100.7", 50000), local=LOCAL)

    async def ask(method: Method, attrs: tuple[tuple[AttrType, object], ...]) -> object:
        challenge = core.handle_datagram(NOW, c.addr, c.request(method, attrs), LOCAL)  # type: ignore[arg-type]
        if isinstance(challenge, bytes):  # a 401: answered at once, nothing changed
            assert c.learn(challenge).msg_class == Class.ERROR
            assert core.handle_datagram(NOW, c.addr, c.request(method, attrs), LOCAL) is None  # type: ignore[arg-type]
        else:
            assert challenge is None
        assert gate.held and not sent  # held: the store has not written it yet
        await trio.testing.wait_all_tasks_blocked()
        assert store.batches and not sent  # being written
        store.proceed.set()
        await trio.testing.wait_all_tasks_blocked()
        ((answer, _, _, dest),) = sent
        sent.clear()
        assert dest == c.addr and not gate.held
        msg = c.learn(answer)  # type: ignore[arg-type]
        assert msg.msg_class == Class.SUCCESS
        return msg

    relayed = relayed_of(await ask(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)))  # type: ignore[arg-type]
    ((key, record, _),) = store.batches[-1]
    assert key == relayed and record is not None
    await ask(Method.CHANNEL_BIND, ((AttrType.CHANNEL_NUMBER, 0x4001),
                                   (AttrType.XOR_PEER_ADDRESS, media)))
    ((_, record, _),) = store.batches[-1]
    assert record is not None
    assert [ch[0] for ch in parse_record_untrusted(record).channels] == [0x4001]
