"""Restart recovery through a real redis-server (started by the ``redis_url`` fixture)."""

from __future__ import annotations

import pytest
import redis
import trio
from relay.support import DTLS, RTP, SECRET, check, eventually, open_client, open_transceiver, ufrag

from appliance.relay import RelayConfig, serve_relay

pytestmark = pytest.mark.usefixtures("close_sockets")


async def test_media_resumes_after_restart_without_new_stun(
    nursery: trio.Nursery, redis_url: str, io: str
) -> None:
    t = await open_transceiver(nursery)
    db = redis.Redis.from_url(redis_url)
    try:
        def config(listen: tuple[str, int]) -> RelayConfig:
            return RelayConfig(secrets=(SECRET,), listen=(listen,), transceivers={0: t.address},
                               redis_url=redis_url, flow_timeout=30.0, io=io)

        async with trio.open_nursery() as first:
            relay = await first.start(serve_relay, config(("127.0.0.1", 0)))
            public = relay.public[0]
            c = await open_client(public)
            await c.send(check(ufrag()))
            await c.recv()
            await c.send(RTP)
            await c.recv()
            key = f"appliance:relay:c0:{c.address[0]}:{c.address[1]}"
            value: list[bytes | None] = [None]

            async def written() -> None:
                while value[0] is None:
                    value[0] = await trio.to_thread.run_sync(db.get, key)
                    if value[0] is None:
                        await trio.sleep(0.01)

            with trio.fail_after(5):
                await written()
            assert value[0] == b"t0"
            assert 0 < await trio.to_thread.run_sync(db.ttl, key) <= 30
            first.cancel_scope.cancel()

        seen = len(t.got)
        async with trio.open_nursery() as second:
            relay = await second.start(serve_relay, config(public))
            # Media only, no STUN: the first datagram misses and triggers a Redis look-up
            # off the hot path; media flows again as soon as it answers.
            got_reply = False
            with trio.fail_after(5):
                while not got_reply:
                    await c.send(DTLS)
                    with trio.move_on_after(0.05):
                        assert (await c.recv())[0] == DTLS
                        got_reply = True
            after = t.got[seen:]
            assert after and all(r.payload == DTLS for r in after)
            assert {r.client for r in after} == {c.address}
            assert {r.src for r in after} == {relay.internal}
            counters = relay.stats()["counters"]
            assert counters["flows_recovered"] == 1
            assert counters["redis_lookups"] == 1
            # A stranger's media is looked up once, misses, and is dropped.
            stranger = await open_client(public)
            await stranger.send(RTP)
            await eventually(lambda: relay.core.counters.drops.get("redis-miss") == 1)
            second.cancel_scope.cancel()
    finally:
        db.close()


async def test_an_unreachable_redis_is_retried_with_backoff_and_refilled(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 20 item 3: Redis unreachable costs counted errors and one warning, retried
    with backoff (not every write tick); when it answers, every flow is written back."""
    from appliance.relay.core import CoreConfig, RelayCore
    from appliance.relay.redis_cache import RedisFlowCache
    from appliance.relay.redis_cache import open_client as redis_client

    core = RelayCore(CoreConfig(secrets=(SECRET,), transceivers={0: ("127.0.0.1", 9)},
                                redis=True))
    for i in range(3):
        core.handle_datagram(0.0, ("203.0.113.9", 4000 + i), check(ufrag()), ("127.0.0.1", 1))
    dead = redis_client("redis://127.0.0.1:1/0")  # nothing listens on port 1
    cache = RedisFlowCache(core, dead, 0, 30.0, backoff_initial=0.2, backoff_max=0.4)
    # How long the first four tries take: with backoff (0.2 s, then 0.4 s capped) at least
    # 0.2 + 0.4 + 0.4 s; without it, one try per write tick (50 ms), four in 0.15 s. A lower
    # bound on elapsed time, so a slow machine can only make it pass by a wider margin.
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        nursery.start_soon(cache.writer)
        with trio.fail_after(30):  # a hang guard, not a figure
            while core.counters.redis_errors < 4:  # noqa: ASYNC110 - bounded polling
                await trio.sleep(0.01)
        elapsed = trio.current_time() - t0
        nursery.cancel_scope.cancel()
    assert elapsed >= 0.2 + 0.4 + 0.4 - 0.05, elapsed
    assert not cache.up and not cache.available
    assert sum("carrying on without it" in r.message for r in caplog.records) == 1
    # Redis is back (a real one): the PING succeeds and every flow is written at once.
    cache.client = redis_client(redis_url)
    cache.retry_at = 0.0
    db = redis.Redis.from_url(redis_url)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cache.writer)
            with trio.fail_after(5):
                while len(await trio.to_thread.run_sync(  # noqa: ASYNC110 - another process
                        lambda: list(db.scan_iter("appliance:relay:*")))) < 3:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    finally:
        db.close()
    assert cache.up and core.counters.redis_reconnects == 1
