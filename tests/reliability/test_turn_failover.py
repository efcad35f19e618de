"""Issue 40 item 2: a TURN/UDP call survives a relay-worker kill (relay/turn_store.py).

A real ``appliance up`` (one relay worker with its warm standby, ``--turn-peer
127.0.0.0/8``), our TURN client on a loopback socket, and an echo peer on loopback reached
through the allocation's relayed socket: ChannelData out, the peer's echo back as
ChannelData. SIGKILL of the worker that holds the media port, twice; after each the relayed
flow resumes — echoes of packets sent after the successor was up — with no new Allocate
(the client never sends one: the successor re-created the allocation from the cache and
re-bound its relayed port). With the embedded cache (the state file) and with Redis.

Measured: the longest gap between two echoes across each kill, printed (docs/turn.md).

With **two** relay workers a kill reshuffles the ``SO_REUSEPORT`` group: every TURN client
lands on the *other* worker than before (the successor joins the group at its end), which
never had its allocation. Full WebRTC calls (our ``ClientPeer``: ICE, DTLS, SRTP to the echo
agent) ride TURN/UDP allocations to our own media address, as a relay-only browser does;
after the kill each one must carry on with no new Allocate: the worker it landed on finds
the allocation by its 5-tuple in the other workers' records and takes it over.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from proto.turn.turn_client import Client
from reliability.failover import (
    RedisProc,
    Up,
    longest_gap,
    open_turn_media_call,
    opus_frames,
)
from reliability.support import eventually

from appliance.proto.stun import AttrType, Class, Message, Method
from appliance.proto.turn import (
    derive_turn_secret,
    encode_channel_data,
    mint_rest_credential,
    parse_channel_data_untrusted,
)
from appliance.proto.ufrag import load_secrets
from appliance.statedir import SECRET_NAME

CHANNEL = 0x4001
KILLS = 2


class TurnCall:
    """One TURN client relaying numbered packets to an echo peer every 20 ms."""

    def __init__(self, sock: trio.socket.SocketType, peer: trio.socket.SocketType,
                 client: Client, server: tuple[str, int]) -> None:
        self.sock = sock
        self.peer = peer
        self.client = client
        self.server = server
        self.seq = 0
        self.sent: dict[int, float] = {}
        #: (arrival, seq) of every echo
        self.rx: list[tuple[float, int]] = []
        self.stun: list[Message] = []
        self.requests: list[Method] = []

    async def ask(self, method: Method, attrs: tuple[tuple[AttrType, object], ...]) -> Message:
        for _ in range(2):  # one 401 round, as a client does
            self.requests.append(method)
            await self.sock.sendto(self.client.request(method, attrs),  # type: ignore[arg-type]
                                   self.server)
            with trio.fail_after(5):
                data, _ = await self.sock.recvfrom(65536)
            msg = self.client.learn(data)
            if msg.msg_class == Class.SUCCESS:
                return msg
        raise AssertionError(msg.error_code)

    async def echo(self) -> None:
        while True:
            data, src = await self.peer.recvfrom(65536)
            await self.peer.sendto(data, src)

    async def send(self) -> None:
        while True:
            self.seq += 1
            self.sent[self.seq] = trio.current_time()
            await self.sock.sendto(encode_channel_data(CHANNEL, self.seq.to_bytes(4, "big")
                                                       + bytes(156)), self.server)
            await trio.sleep(0.02)  # pacing (50 packets/s, like audio), not a wait

    async def receive(self) -> None:
        while True:
            data, _ = await self.sock.recvfrom(65536)
            if data[0] >> 6 == 1:
                number, length = parse_channel_data_untrusted(data)
                assert number == CHANNEL and length == 160
                self.rx.append((trio.current_time(), int.from_bytes(data[4:8], "big")))
            else:
                self.stun.append(Message.parse_untrusted(data))

    def echoed_after(self, t: float) -> bool:
        """An echo of a packet sent after ``t`` has come back."""
        return any(self.sent[seq] > t for _, seq in self.rx[-50:])

    def longest_gap(self, start: float, end: float) -> float:
        times = [t for t, _ in self.rx if start <= t <= end]
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=end - start)


async def _turn_call(nursery: trio.Nursery, up: Up) -> TurnCall:
    routing = load_secrets((up.state / SECRET_NAME).read_bytes())[0]
    cred = mint_rest_credential(derive_turn_secret(routing), "turn-failover",
                                int(time.time()) + 3600)
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sock.bind(("127.0.0.1", 0))
    peer = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await peer.bind(("127.0.0.1", 0))
    server = ("127.0.0.1", up.udp)
    name = sock.getsockname()
    client = Client(addr=(name[0], name[1]), local=server, username=cred.username,
                    password=cred.password)
    call = TurnCall(sock, peer, client, server)
    nursery.start_soon(call.echo)
    await call.ask(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),))
    pname = peer.getsockname()
    await call.ask(Method.CHANNEL_BIND, ((AttrType.CHANNEL_NUMBER, CHANNEL),
                                         (AttrType.XOR_PEER_ADDRESS, (pname[0], pname[1]))))
    nursery.start_soon(call.receive)
    nursery.start_soon(call.send)
    return call


def _turn_keys(url: str) -> int:
    import redis

    db = redis.Redis.from_url(url, socket_timeout=2)
    try:
        return len(list(db.scan_iter("appliance:relay:*:turn:w*")))  # not the pointers
    finally:
        db.close()


async def _survives_kills(tmp_path: Path, nursery: trio.Nursery, redis: str | None) -> None:
    up = await Up.start(tmp_path, workers=1, redis=redis,
                        extra=("--turn-peer", "127.0.0.0/8"))
    opened: list[trio.socket.SocketType] = []
    try:
        await up.standbys_ready()
        call = await _turn_call(nursery, up)
        opened.extend((call.sock, call.peer))
        start = trio.current_time()
        await eventually(lambda: call.echoed_after(start), 10, "echoes through the relay")
        asked = list(call.requests)  # Allocate (its 401 round, then signed), ChannelBind
        gaps = []
        measured = start
        for kill in range(KILLS):
            if redis is None:
                await eventually(lambda: any((up.state / "relay").glob("turn-*.jsonl")), 5,
                                 "the allocation in the state file")
            else:
                await eventually(lambda: _turn_keys(redis) == 1, 5,
                                 "the allocation in Redis")
            killed, back = await up.kill_worker(0)
            try:
                await eventually(lambda b=back: call.echoed_after(b), 10,  # type: ignore[misc]
                                 f"echoes after kill {kill + 1}")
            except AssertionError:  # what the successor counted, for the reader of a red run
                print("worker 0:", await up.worker_stats(0))
                raise
            # From just before this kill (not before the last one's end: kills come fast).
            gap = call.longest_gap(max(killed - 0.2, measured), trio.current_time())
            measured = trio.current_time()
            gaps.append(gap)
            print(f"TURN/UDP across SIGKILL {kill + 1} ({'redis' if redis else 'embedded'}): "
                  f"longest echo gap {gap * 1000:.0f} ms (worker back after "
                  f"{(back - killed) * 1000:.0f} ms)")
            await up.standbys_ready()
            counters = await up.counters()
            # The successor re-created the allocation; nobody allocated anew.
            assert counters.get("turn_allocations_imported") == 1, counters
            assert counters.get("turn_allocations_created", 0) == 0, counters
        assert call.requests == asked  # no request at all after the kills: no re-Allocate
        assert not any(m.msg_class == Class.ERROR for m in call.stun), call.stun
        assert all(g < 2.0 for g in gaps), gaps
    finally:
        nursery.cancel_scope.cancel()  # the call's tasks, before their sockets close
        for sock in opened:
            sock.close()
        up.stop()


@pytest.fixture(params=["embedded", "redis"])
def store(request: pytest.FixtureRequest) -> str | None:
    """Where the allocations are kept: the embedded cache (the state file; None) or the URL
    of a redis-server of the test's own."""
    if request.param == "redis":
        proc: RedisProc = request.getfixturevalue("redis_proc")
        return proc.url
    return None


async def test_turn_udp_call_survives_worker_kills(
        tmp_path: Path, nursery: trio.Nursery, store: str | None) -> None:
    await _survives_kills(tmp_path, nursery, store)


async def _moved_clients_carry_on(tmp_path: Path, nursery: trio.Nursery,
                                  redis: str | None) -> None:
    up = await Up.start(tmp_path, workers=2, redis=redis)
    try:
        await up.standbys_ready()
        frames = opus_frames()
        calls = []

        async def created(w: int) -> int:
            stats = await up.worker_stats(w)
            assert stats is not None
            return int(stats["counters"].get("turn_allocations_created", 0))

        # Until both workers hold allocations (the hash decides; six almost always do).
        while len(calls) < 6 or min([await created(0), await created(1)]) == 0:
            assert len(calls) < 16, "every client hashed to one worker"
            calls.append(await open_turn_media_call(nursery, up, f"moved-{len(calls)}",
                                                    frames))
        for call, _ in calls:
            await eventually(lambda c=call: len(c.rx) > 10, 20,  # type: ignore[misc]
                             f"{call.name}'s echo through TURN")
        created_1 = await created(1)  # worker 1 lives through the kill
        asked = [list(a) for _, a in calls]

        async def kill(w: int) -> tuple[float, float]:
            killed, back = await up.kill_worker(w)
            try:
                for call, _ in calls:
                    await eventually(lambda c=call: c.rx_times[-1] > back,  # type: ignore[misc]
                                     10, f"{call.name}'s echo after the kill")
            except AssertionError:  # what each worker counted, for the reader of a red run
                for i in range(2):
                    print(f"worker {i}:", await up.worker_stats(i))
                raise
            return killed, back

        killed, back = await kill(0)
        moved = await up.counters()
        if not moved.get("turn_lookups", 0) and not moved.get("turn_allocations_adopted", 0):
            # Nobody moved (a clean-clone .ci/run failed here on no lookup, the calls carrying
            # on): worker 0 held the group's *last* slot (the workers bind in either order at
            # start), its successor took that slot back with its predecessor's allocations
            # (imported), and no client sent in the few ms the group had one socket. Worker 1
            # holds the first slot now: its kill moves the clients of both.
            print("nobody moved: worker 0 held the last slot; killing worker 1")
            _, back = await kill(1)
            created_1 = 0  # worker 1's count went with it; no successor allocates
        end = trio.current_time()
        gaps = [longest_gap(call.rx_times, killed - 0.2, end) for call, _ in calls]
        print(f"TURN/UDP, 2 relay workers ({'redis' if redis else 'embedded'}): longest echo "
              f"gap per call {[round(g * 1000) for g in gaps]} ms (worker back after "
              f"{(back - killed) * 1000:.0f} ms)")
        after = await up.counters()
        assert [list(a) for _, a in calls] == asked  # no call allocated again
        for call, _ in calls:
            assert call.failed is None and call.turn is not None, call.failed
            errors = [Message.parse_untrusted(d) for d in call.turn.other]
            assert not any(m.msg_class == Class.ERROR for m in errors), errors
        # The first slot's clients now land on the killed worker's successor: taken over
        # from the other worker's records, their address adopted (that worker, alive, holds
        # the sockets). The killed worker's land on the other (looked up there too, unless
        # the successor had them back first).
        print("counters after the kill:", {k: v for k, v in after.items()
                                           if k.startswith("turn") or k == "drops"})
        assert after.get("turn_lookups", 0) >= 1, after
        assert after.get("turn_allocations_adopted", 0) >= 1, after
        # Nothing allocated anew: the live worker made no more, the successors none.
        assert after.get("turn_allocations_created", 0) == created_1, (created_1, after)
        assert all(g < 2.0 for g in gaps), gaps
    finally:
        nursery.cancel_scope.cancel()
        up.stop()


async def test_turn_clients_moved_to_another_worker_by_a_kill_carry_on(
        tmp_path: Path, nursery: trio.Nursery, store: str | None) -> None:
    await _moved_clients_carry_on(tmp_path, nursery, store)
