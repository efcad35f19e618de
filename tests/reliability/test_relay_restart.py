"""Issue 9 items 1-2: ``kill -9`` of the relay worker (with and without Redis) and of one of
two transceivers, during live calls. Real processes: ``python -m appliance relay`` and
``python -m appliance transceiver``; calls are ClientPeers whose only candidate is the relay."""

from __future__ import annotations

import shutil
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
from relay.support import redis_server
from reliability.support import (
    Call,
    Stack,
    eventually,
    max_gap,
    media_settled,
    open_call,
    opus_frame,
    restart_worker,
    worker_pids,
)

N_CALLS = 10


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    s = Stack.make(tmp_path)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def redis_url() -> Iterator[str]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (make sysdeps installs it)")
    yield from redis_server()


async def _calls(nursery: trio.Nursery, stack: Stack, ks: list[int], n: int,
                 **kw: float) -> list[Call]:
    payload = opus_frame()
    calls = [await open_call(nursery, stack, ks[i % len(ks)], f"call-{i}", payload, **kw)
             for i in range(n)]
    await eventually(lambda: all(c.received >= 10 for c in calls), 15, "media on every call")
    return calls


async def _restart_relay(stack: Stack) -> tuple[float, float]:
    """kill -9 the relay, restart it on the same port; (killed_at, ready_at) in trio time."""
    assert stack.relay is not None
    stack.relay.kill9()
    killed = trio.current_time()
    await stack.start_relay()
    return killed, trio.current_time()


async def test_relay_kill9_without_redis_transceivers_vouch_for_the_flows(
    stack: Stack, nursery: trio.Nursery
) -> None:
    """Issue 20: a restarted relay (no Redis) re-learns every flow from the transceivers
    (relay/reseed.py) on the first media packet, without waiting for a consent check."""
    await stack.start_transceiver(0)
    await stack.start_relay("--new-flow-rate", "1000")
    # No consent checks during the test: only the transceiver can bring media back.
    calls = await _calls(nursery, stack, [0], N_CALLS, consent_interval=600.0)
    stun_before = {c.sid: len(c.stun_sent) for c in calls}

    _, ready = await _restart_relay(stack)
    await eventually(lambda: all(c.rx_after(ready) for c in calls), 5,
                     "media to resume on every call")
    for c in calls:
        assert c.failed is None, c.failed
        # The new relay binds a moment before the test sees its ready line.
        assert c.rx_after(ready)[0] - ready < 0.25, c.sid
    assert {c.sid: len(c.stun_sent) for c in calls} == stun_before  # no STUN was needed
    stats = await stack.relay_stats()
    counters = stats["counters"]
    assert stats["flows"] == N_CALLS
    assert counters["flows_vouched"] == N_CALLS
    assert counters["flows_created"] == N_CALLS  # installed by the vouch, not by STUN
    assert counters["drops"].get("no-flow", 0) == 0
    t = (await stack.ctl(0, op="stats"))["counters"]
    assert t["vouch_answers"] == N_CALLS
    sessions = (await stack.ctl(0, op="list"))["sessions"]
    assert sorted(s["state"] for s in sessions) == ["connected"] * N_CALLS


async def test_relay_kill9_with_redis_media_resumes_without_stun(
    stack: Stack, nursery: trio.Nursery, redis_url: str
) -> None:
    await stack.start_transceiver(0)
    await stack.start_relay("--redis", redis_url, "--new-flow-rate", "1000")
    # No consent checks during the test: only Redis can bring media back.
    calls = await _calls(nursery, stack, [0], N_CALLS, consent_interval=600.0)
    stun_before = {c.sid: len(c.stun_sent) for c in calls}
    # Flows are written to Redis asynchronously; wait until each has been written.
    import redis as redislib

    db = redislib.Redis.from_url(redis_url)
    try:
        def all_written() -> bool:
            return len(list(db.scan_iter("appliance:relay:*"))) >= N_CALLS

        await eventually(all_written, 10, "flows written to Redis")
    finally:
        db.close()

    _, ready = await _restart_relay(stack)
    await eventually(lambda: all(c.rx_after(ready) for c in calls), 5,
                     "media to resume on every call")
    gaps = [c.rx_after(ready)[0] - ready for c in calls]
    assert max(gaps) <= 1.0, gaps  # issue 9: gap <= 1 s after the worker is back
    assert {c.sid: len(c.stun_sent) for c in calls} == stun_before  # no STUN was needed
    assert all(c.failed is None for c in calls)
    counters = (await stack.relay_stats())["counters"]
    assert counters["flows_recovered"] == N_CALLS
    assert counters["redis_lookups"] == N_CALLS


async def test_kill9_one_of_two_transceivers(stack: Stack, nursery: trio.Nursery) -> None:
    await stack.start_transceiver(0)
    await stack.start_transceiver(1)
    await stack.start_relay("--new-flow-rate", "1000")
    calls = await _calls(nursery, stack, [0, 1], 6, consent_interval=0.3, consent_timeout=2.0)
    lost = [c for c in calls if c.transceiver == 1]
    kept = [c for c in calls if c.transceiver == 0]

    stack.transceivers[1].kill9()
    killed = trio.current_time()
    # Its calls end: consent can no longer be proven (client side), within the timeout.
    await eventually(lambda: all(c.failed is not None for c in lost), 10,
                     "the lost transceiver's calls to end")
    assert {c.failed for c in lost} == {"ICE consent expired"}
    # The other transceiver's calls never noticed: media kept flowing all along.
    after = trio.current_time()
    await eventually(lambda: all(len(c.rx_after(after)) >= 25 for c in kept), 5,
                     "media on the surviving calls")
    for c in kept:
        assert c.failed is None
        rx = [t for t in c.rx_times if t >= killed - 0.2]
        gaps = [b - a for a, b in zip(rx, rx[1:], strict=False)]
        assert max(gaps) < 0.5, max(gaps)
    sessions = (await stack.ctl(0, op="list"))["sessions"]
    assert [s["state"] for s in sessions] == ["connected"] * len(kept)
    stats = await stack.relay_stats()
    assert stats["ok"]


async def test_rolling_restart_of_two_relay_workers(stack: Stack, nursery: trio.Nursery) -> None:
    """Issue 9 item 1, test-sized (bench/relay_restart.py runs 50 calls): SIGTERM each of the
    relay's 2 workers in turn, the next only once the supervisor's restarted worker answers
    and every call has media again. Without Redis a call whose flow is gone (or moved to the
    other worker by the SO_REUSEPORT hash) resumes at its next consent check."""
    await stack.start_transceiver(0)
    await stack.start_transceiver(1)
    await stack.start_relay("--workers", "2", "--new-flow-rate", "1000")
    calls = await _calls(nursery, stack, [0, 1], N_CALLS, consent_interval=0.3,
                         consent_timeout=10.0)
    start = trio.current_time()
    for index in (0, 1):
        back = await restart_worker(stack, index, signal.SIGTERM)
        await media_settled(calls, back, 10)
    end = trio.current_time()
    for c in calls:
        assert c.failed is None, (c.sid, c.failed)
        # Consent interval 0.3 s (x1.2 jitter) per restart step, plus the restart itself.
        assert max_gap(c, start, end) < 2.0, (c.sid, max_gap(c, start, end))
    stats = await stack.relay_stats()
    assert [w["ok"] for w in stats["workers"]] == [True, True]
    assert stats["flows"] >= N_CALLS  # every call has a flow on the worker it hashes to
    for k in (0, 1):
        sessions = (await stack.ctl(k, op="list"))["sessions"]
        assert [s["state"] for s in sessions] == ["connected"] * (N_CALLS // 2)


async def test_rolling_restart_with_redis_both_steps_resume_without_stun(
    stack: Stack, nursery: trio.Nursery, redis_url: str
) -> None:
    """Two successive worker restarts (SIGTERM worker 0, then worker 1) of a 2-worker relay
    with Redis, consent checks disabled: each step moves every client to a worker without
    its flow (SO_REUSEPORT reshuffle), so only Redis can bring media back — at the second
    step too, when the flows' entries were last recovered, not created, by a worker
    (docs/reliability.md "Relay rolling restart, --redis")."""
    await stack.start_transceiver(0)
    await stack.start_transceiver(1)
    # A short flow timeout (Redis TTL 4 s): entries must be kept alive by whichever worker
    # has the flow now, and the pause between the steps lets stale flows expire.
    await stack.start_relay("--workers", "2", "--redis", redis_url, "--new-flow-rate", "1000",
                            "--flow-timeout", "4")
    calls = await _calls(nursery, stack, [0, 1], N_CALLS, consent_interval=600.0)
    import redis as redislib

    db = redislib.Redis.from_url(redis_url)
    try:
        await eventually(lambda: len(list(db.scan_iter("appliance:relay:*"))) >= N_CALLS, 10,
                         "flows written to Redis")
        stun_before = {c.sid: len(c.stun_sent) for c in calls}
        recovered = []
        for index in (0, 1):
            # Stale flows (a worker's flows for clients the last step moved away from it)
            # expire first, so the next step's worker has only Redis to go by: one flow per
            # call left across the workers.
            with trio.fail_after(30):  # a hang guard: the flow timeout is 4 s
                while (await stack.relay_stats())["flows"] > N_CALLS:  # noqa: ASYNC110
                    await trio.sleep(0.1)  # the poll interval of a bounded wait
            other = (await stack.relay_stats())["workers"][1 - index]
            before = other["counters"]["flows_recovered"]  # the restarted one starts at 0
            t0 = trio.current_time()
            back = await restart_worker(stack, index, signal.SIGTERM)
            await media_settled(calls, back, 5)
            for c in calls:
                assert c.failed is None, (c.sid, c.failed)
                gap = max_gap(c, t0, trio.current_time())
                assert gap < back - t0 + 1.0, (index, c.sid, gap)  # no consent check to wait for
            recovered.append((await stack.relay_stats())["counters"]["flows_recovered"] - before)
            # Every call's entry is still there, with a full TTL (written back on recovery).
            ttls = [db.ttl(k) for k in db.scan_iter("appliance:relay:*")]
            assert len(ttls) >= N_CALLS and min(ttls) > 0, ttls
        assert {c.sid: len(c.stun_sent) for c in calls} == stun_before  # no STUN was needed
        assert all(n > 0 for n in recovered), recovered
    finally:
        db.close()


async def test_sighup_rolls_the_relay_workers_without_a_gap(
    stack: Stack, nursery: trio.Nursery
) -> None:
    """Issue 20 item 2 for ``appliance relay --workers 2`` (no Redis, no consent checks):
    SIGHUP replaces each worker in turn with a fresh process, the successor ready before
    its predecessor stops; the transceivers re-seed every worker that finds itself without
    a flow (relay/reseed.py), so no call loses more than 250 ms of audio."""
    from reliability.failover import longest_media_gap, open_stack_call, opus_frames

    await stack.start_transceiver(0)
    await stack.start_transceiver(1)
    await stack.start_relay("--workers", "2")
    frames = opus_frames()
    calls = [await open_stack_call(nursery, stack, i % 2, f"call-{i}", frames)
             for i in range(4)]
    await eventually(lambda: all(len(c.rx) >= 50 for c in calls), 30, "media on every call")
    old = await worker_pids(stack)
    assert stack.relay is not None
    start = trio.current_time()
    stack.relay.popen.send_signal(signal.SIGHUP)
    with trio.fail_after(60):
        while set((await worker_pids(stack)).values()) & set(old.values()):  # noqa: ASYNC110
            await trio.sleep(0.05)  # bounded polling of the supervisor's state
    done = trio.current_time()
    await eventually(lambda: all(sum(t > done for t in c.rx_times) >= 40 for c in calls), 20,
                     "media after the roll")
    end = trio.current_time()
    gaps = {c.name: longest_media_gap(c.rx, start, end) for c in calls}
    assert all(c.failed is None for c in calls)
    assert max(gaps.values()) <= 0.25, gaps
    stats = await stack.relay_stats()
    assert [w["ok"] for w in stats["workers"]] == [True, True]
