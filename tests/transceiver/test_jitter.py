"""Jitter buffer: reorder, duplicates, loss, bounded depth, zero delay in order."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from appliance.transceiver.jitter import JitterBuffer, JitterItem


def drain(jb: JitterBuffer) -> list[JitterItem]:
    out = []
    while (item := jb.poll()) is not None:
        out.append(item)
    return out


def test_in_order_is_released_immediately() -> None:
    jb = JitterBuffer()
    for i in range(5):
        jb.push(i * 0.02, 100 + i, 1000 + 960 * i, b"p%d" % i)
        items = drain(jb)
        assert [it.payload for it in items] == [b"p%d" % i]
        assert jb.poll_timeout() is None


def test_reorder_waits_for_the_hole() -> None:
    jb = JitterBuffer()
    jb.push(0.00, 1, 0, b"a")
    jb.push(0.02, 3, 1920, b"c")  # 2 is late
    assert [i.payload for i in drain(jb)] == [b"a"]
    assert jb.poll_timeout() == 0.02 + jb.wait
    jb.push(0.025, 2, 960, b"b")
    assert [i.payload for i in drain(jb)] == [b"b", b"c"]
    assert jb.poll_timeout() is None
    assert jb.lost == 0


def test_loss_is_concealed_after_the_wait() -> None:
    jb = JitterBuffer()
    jb.push(0.00, 65535, 0, b"a")
    jb.push(0.04, 1, 1920, b"c")  # 0 lost (wraps around)
    drain(jb)
    deadline = jb.poll_timeout()
    assert deadline is not None
    jb.handle_timeout(deadline - 0.001)
    assert drain(jb) == []
    jb.handle_timeout(deadline)
    items = drain(jb)
    assert [(i.payload, i.timestamp) for i in items] == [(None, 960), (b"c", 1920)]
    assert items[0].seq + 1 == items[1].seq
    assert jb.lost == 1


def test_duplicates_are_dropped() -> None:
    jb = JitterBuffer()
    jb.push(0, 10, 0, b"a")
    jb.push(0, 10, 0, b"a")
    jb.push(0, 12, 1920, b"c")
    jb.push(0, 12, 1920, b"c")
    assert jb.duplicates == 2
    jb.push(0, 11, 960, b"b")
    assert [i.payload for i in drain(jb)] == [b"a", b"b", b"c"]


def test_late_after_conceal_grows_the_wait() -> None:
    jb = JitterBuffer()
    jb.push(0.00, 1, 0, b"a")
    jb.push(0.02, 3, 1920, b"c")
    before = jb.wait
    jb.handle_timeout(1.0)
    jb.push(1.01, 2, 960, b"b")  # too late: its slot was concealed
    assert jb.late == 1
    assert jb.wait > before
    assert [i.payload for i in drain(jb)] == [b"a", None, b"c"]


def test_depth_is_bounded() -> None:
    jb = JitterBuffer(max_depth=4)
    jb.push(0, 0, 0, b"0")
    for s in range(2, 20):
        jb.push(0, s, 960 * s, b"x")
        assert jb.depth <= 4
    items = drain(jb)
    assert [i.seq - items[0].seq for i in items] == list(range(20))
    assert items[1].payload is None


def test_big_jump_resyncs_without_filling() -> None:
    jb = JitterBuffer()
    jb.push(0, 0, 0, b"a")
    jb.push(0.02, 5000, 123456, b"b")
    items = drain(jb)
    assert [i.payload for i in items] == [b"a", b"b"]
    assert jb.resyncs == 1


@given(
    seed=st.integers(0, 2**32),
    start=st.integers(0, 65535),
    loss=st.floats(0, 0.3),
    dup=st.floats(0, 0.3),
)
def test_netem_stream_comes_out_in_order_each_once(
    seed: int, start: int, loss: float, dup: float
) -> None:
    """Under seeded loss/duplication/reorder every released slot is unique and ordered,
    every packet that arrived in time comes out once, and the depth stays bounded."""
    rng = random.Random(seed)
    arrivals = []
    for i in range(200):
        if rng.random() < loss:
            continue
        t = i * 0.02 + rng.uniform(0, 0.03)  # up to 30 ms of jitter → reordering
        arrivals.append((t, i))
        if rng.random() < dup:
            arrivals.append((t + rng.uniform(0, 0.05), i))
    arrivals.sort()
    jb = JitterBuffer()
    out: list[JitterItem] = []
    for t, i in arrivals:
        deadline = jb.poll_timeout()
        if deadline is not None and deadline <= t:
            jb.handle_timeout(t)
        jb.push(t, (start + i) & 0xFFFF, (960 * i) & 0xFFFFFFFF, b"%d" % i)
        assert jb.depth <= jb.max_depth
        out += drain(jb)
    # The end of the stream, as the session's timer task plays it: every remaining hole
    # gets its own wait from when it reached the front.
    while (deadline := jb.poll_timeout()) is not None:
        jb.handle_timeout(deadline)
    out += drain(jb)
    seqs = [it.seq for it in out]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # contiguous, no repeats
    delivered = [int(it.payload) for it in out if it.payload is not None]
    assert delivered == sorted(set(delivered))
    assert len(delivered) + jb.late >= len({i for _, i in arrivals}) - 1
