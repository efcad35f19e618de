"""Issue 20: a relay worker that dies costs no call more than 250 ms of audio.

Real processes (``appliance up``: signaling, 2 transceivers with the echo agent, M relay
workers each with a warm standby) and real clients through the relay: our ClientPeer calls
(kernel arrival stamps) and one aiortc call. Each call's longest interval between two
received echo packets — audio lost in either direction — is measured around the event and
must stay within :data:`LIMIT` plus the longest gap the calls had in a quiet second just
before, measured in the same run (the machine's own stalls are not the relay's); no call may
end, and a call set up during the restart connects. The measure is the issue's: the longest
run of audio missing from the received RTP timestamps. Passthrough calls echo the caller's
own timestamps, so a loss in either direction shows and nothing else does: they are the
exact measure. The echo agent's calls (aiortc's among them) are stamped with the
transceiver's clock, so a stall of the caller as a sender, and a delay on the way in that
the echo agent's 60 ms queue cap turns into loss, show too: each is measured in the run
(the caller's send times; the passthrough calls' longest arrival gap) and added to their
bound. Arrival gaps get twice the bound, a sanity check.
``bench/relay_failover.py`` runs the same at 50 calls with 10 random kills.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import trio
from reliability.failover import (
    AiortcCall,
    MediaCall,
    RedisProc,
    Up,
    longest_gap,
    longest_media_gap,
    media_gap_at,
    open_media_call,
    opus_frames,
)
from reliability.support import eventually

#: The issue's bound on audio lost per call and event.
LIMIT = 0.25
N_CALLS = 3


class Calls:
    def __init__(self, media: list[MediaCall], ai: AiortcCall) -> None:
        self.media = media
        self.ai = ai
        #: The longest media gap any call had in the last quiet second before the event
        #: (:meth:`measure_quiet`): what this machine's own scheduling costs a call right
        #: now, with no failover at all. The bound is the issue's LIMIT on top of it, so a
        #: box busy with other work (a CPU hog on one of two cores) does not fail the test
        #: for stalls the relay did not cause, and a quiet box gets LIMIT + ~20 ms.
        self.quiet = 0.0

    def all_rx(self) -> dict[str, list[tuple[float, int]]]:
        out = {c.name: c.rx for c in self.media}
        out["aiortc"] = self.ai.rx
        return out

    def clocked_tx(self) -> dict[str, list[float]]:
        """The send times of the calls whose echo is stamped by the transceiver's clock."""
        out = {c.name: c.tx for c in self.media if c.own_clock}
        out["aiortc"] = self.ai.tx  # aiortc calls the echo agent
        return out

    async def flowing(self, since: float, n: int = 40, within: float = 20.0) -> float:
        """Every call has ``n`` packets after ``since``; returns the trio time then."""
        def ok() -> bool:
            return all(sum(t > since for t, _ in rx) >= n for rx in self.all_rx().values())
        await eventually(ok, within, f"media on every call after {since:.2f}")
        return trio.current_time()

    async def measure_quiet(self) -> float:
        """One second of every call's media with nothing happening: its longest gap."""
        start = trio.current_time()
        end = await self.flowing(start, 50)
        self.quiet = max(longest_media_gap(rx, start, end) for rx in self.all_rx().values())
        return self.quiet

    def check(self, start: float, end: float, what: str) -> dict[str, float]:
        assert self.ai.error is None, self.ai.error
        for c in self.media:
            assert c.failed is None, (what, c.name, c.failed)
        gaps = {name: longest_gap([t for t, _ in rx], start, end)
                for name, rx in self.all_rx().items()}
        media = {name: longest_media_gap(rx, start, end) for name, rx in self.all_rx().items()}
        # A caller's own stall as a sender in the window, beyond a frame's 20 ms, is audio
        # this test process never sent. Where the echo agent stamps what comes back with
        # the transceiver's clock (the aiortc caller, Python on a thread, among them), it
        # shows as a jump; it and the relay's outage add at most, so it is added to the
        # bound. Passthrough calls get their own timestamps back: no stall of ours shows.
        clocked = self.clocked_tx()
        stalls = {name: 0.0 for name in media}
        stalls.update({name: max(0.0, longest_gap(tx, start, end) - 0.02)
                       for name, tx in clocked.items()})
        # Those calls also turn a delay into loss: audio held up on the way in (the
        # transceiver or a worker's socket queue starved of CPU on a loaded box) arrives
        # as a burst, and the echo agent drops what would queue past 60 ms (bounded echo
        # latency, agents/echo.py). The passthrough calls, which get every packet back
        # with its own timestamp, measure such a delay as their longest arrival gap; it is
        # added to the echo-stamped calls' bound. The passthrough calls themselves, the
        # exact measure of audio the relay lost, keep LIMIT + the quiet second.
        delayed = max([0.0] + [gaps[n] - 0.02 for n in media if n not in clocked])
        bounds = {name: LIMIT + self.quiet + (stalls[name] + delayed if name in clocked
                                              else 0.0) for name in media}
        ends = {name: round(media_gap_at(rx, start, end)[1] - start, 3)
                for name, rx in self.all_rx().items()}
        print(f"{what}: media gaps {media} ending at {ends} s into the window, arrival gaps "
              f"{gaps}, sender stalls {stalls}, delay {delayed:.3f} s, quiet-second gap "
              f"{self.quiet:.3f} s, "
              f"bounds {bounds}")
        # The measure: audio that never arrived, from the received RTP timestamps.
        over = {name: gap for name, gap in media.items() if gap > bounds[name]}
        assert not over, (what, "over", over, "bounds", bounds, "media gaps", media,
                          "sender stalls", stalls, "arrival", gaps, "quiet", self.quiet)
        # Arrival gaps also include this test process's own stalls as a receiver (a loaded
        # box): a looser sanity bound only, beyond the longest stall this process had as a
        # sender in the window (measured from its own send times: a stalled process neither
        # sends nor reads; a make test-stress run saw 1.27 s of it during a SIGHUP roll,
        # with no audio lost on any call).
        own = max([0.0] + [max(0.0, longest_gap(c.tx, start, end) - 0.02) for c in self.media]
                  + [stalls[name] for name in clocked])
        assert all(gaps[name] <= 2 * bounds[name] + own for name in gaps), (
            what, "arrival gaps", gaps, "media", media, "bounds", bounds, "own stall", own)
        return media


async def _calls(nursery: trio.Nursery, up: Up) -> Calls:
    frames = opus_frames()
    # Passthrough calls get the caller's own RTP timestamps back (a loss in either
    # direction is a jump); the echo agent's (the default) are the transceiver's clock.
    agents = ["passthrough", "echo", "passthrough"]
    media = [await open_media_call(nursery, up, f"call-{i}-{agents[i % 3]}", frames,
                                   agents[i % 3]) for i in range(N_CALLS)]
    ai = AiortcCall(up.base, trio.current_time() - time.perf_counter())
    ai.start()
    calls = Calls(media, ai)
    await calls.flowing(-1e9, 50, 40)
    return calls


async def _kill(up: Up, calls: Calls, nursery: trio.Nursery, w: int) -> None:
    """SIGKILL worker ``w`` mid-call; open a call while it is being replaced."""
    await up.standbys_ready()
    await calls.measure_quiet()
    old = await up.worker_pid(w)
    assert old is not None
    killed = trio.current_time()
    os.kill(old, signal.SIGKILL)
    late = await open_media_call(nursery, up, "during-restart", opus_frames())
    await up._replaced(w, old, 20)
    end = await calls.flowing(trio.current_time())
    calls.check(killed - 0.5, end, f"kill -9 of worker {w}")
    with trio.fail_after(20):
        await late.connected.wait()
    await eventually(lambda: len(late.rx) >= 25, 20, "media on the call set up mid-restart")
    assert late.failed is None


async def _roll(up: Up, calls: Calls) -> None:
    await calls.measure_quiet()
    start, done = await up.roll()
    print(f"roll: workers replaced at {[round(t - start + 0.5, 3) for t in up.replaced_at]} "
          "s into the window")
    end = await calls.flowing(done)
    calls.check(start - 0.5, end, "SIGHUP rolling restart")


@pytest.mark.parametrize("workers", [1, 2, 4])
async def test_kill9_and_rolling_restart_without_redis(
    tmp_path: Path, nursery: trio.Nursery, workers: int
) -> None:
    """Default ``appliance up`` (one relay worker, no Redis), two and four workers: SIGKILL
    of a worker mid-call, then SIGHUP (every worker replaced, one at a time)."""
    up = await Up.start(tmp_path, workers=workers)
    try:
        calls = await _calls(nursery, up)
        try:
            await _kill(up, calls, nursery, workers - 1)
            counters = await up.counters()
            if workers == 1:  # every flow was on the killed worker: re-seeded by the
                # transceivers (with more workers the kernel may have put none there)
                assert counters["flows_vouched"] > 0, counters
            await _roll(up, calls)
        finally:
            calls.ai.stop()
    finally:
        up.stop()


async def test_kill9_with_redis_and_redis_outage(
    tmp_path: Path, nursery: trio.Nursery, redis_proc: RedisProc
) -> None:
    """Two workers with Redis: SIGKILL of one; then Redis is killed while the calls run
    (they go on; the relay counts it and retries with backoff) and comes back empty on the
    same port (the relay writes every flow back: the cache fills again)."""
    up = await Up.start(tmp_path, workers=2, redis=redis_proc.url)
    try:
        calls = await _calls(nursery, up)
        try:
            await eventually(lambda: redis_proc.keys() >= N_CALLS + 1, 15, "flows in Redis")
            await _kill(up, calls, nursery, 0)

            await calls.measure_quiet()
            redis_proc.kill9()
            down = trio.current_time()
            # A call set up while Redis is down still connects (its flow's write fails).
            late = await open_media_call(nursery, up, "redis-down", opus_frames())
            await eventually(lambda: len(late.rx) >= 25, 20, "media on a call without Redis")
            counters = await up.counters()
            assert counters["redis_errors"] > 0, counters
            calls.check(down, trio.current_time(), "Redis killed")
            calls.media.append(late)

            redis_proc.start()
            assert redis_proc.keys() == 0  # a fresh, empty Redis
            await eventually(lambda: redis_proc.keys() >= N_CALLS + 3, 20,
                             "the cache to fill again")
            counters = await up.counters()
            assert counters["redis_reconnects"] >= 1, counters
            await _roll(up, calls)
        finally:
            calls.ai.stop()
    finally:
        up.stop()


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def test_two_kills_back_to_back_keep_forwarding(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Issue 32: the active worker killed twice, 0.3 s apart. Before, the first kill used
    up the standby and the next one was still importing (1-7 s on a loaded host), so the
    second kill waited for it: every call lost 1.5 s. The standby is a fork template now:
    both successors are forks of it, and every call stays within the same bound as one
    kill (LIMIT on top of the quiet-second gap measured just before, in this run)."""
    up = await Up.start(tmp_path, workers=1)
    try:
        calls = await _calls(nursery, up)
        try:
            await up.standbys_ready()
            [template] = up.standby_pids()
            await calls.measure_quiet()
            killed, _ = await up.kill_worker(0)
            await trio.sleep_until(killed + 0.3)  # the scenario: the second kill 0.3 s on
            _, back = await up.kill_worker(0)
            end = await calls.flowing(back)
            calls.check(killed - 0.5, end, "two kills 0.3 s apart")
            pid = await up.worker_pid(0)
            assert pid is not None and _ppid(pid) == template  # a fork, not a cold start
            assert up.standby_pids() == [template]  # and the template is still there
        finally:
            calls.ai.stop()
    finally:
        up.stop()
