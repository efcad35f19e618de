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
