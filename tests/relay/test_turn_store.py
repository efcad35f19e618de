"""The relay side of TURN allocations surviving a worker kill (relay/turn_store.py), with
real sockets and files but no relay: the embedded cache's file round trip, the relayed
port claimed back exactly (and refused when taken), a corrupt file line dropped and
counted by the gate's restore. The kill itself: tests/reliability/test_turn_failover.py."""

from __future__ import annotations

import socket
from pathlib import Path

import trio

from appliance.relay.counters import Counters
from appliance.relay.turn import RelaySockets
from appliance.relay.turn_store import FileTurnStore, serve_turn_store


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
    """The two things serve_turn_store uses of a TurnGate."""

    def __init__(self, changes: list[tuple[tuple[str, int], bytes | None, float]]) -> None:
        self.changes = changes
        self.core = type("Core", (), {"counters": Counters()})()
        self.server = self

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
