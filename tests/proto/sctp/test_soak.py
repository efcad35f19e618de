"""Mixed traffic both ways on a terrible network, several seeds: every reliable message
arrives exactly once, ordered streams keep their order, PR messages arrive at most once,
and both sides end idle with nothing in flight."""

from __future__ import annotations

import random

import pytest
from proto.sctp.sctp_pair import Network, Pair


@pytest.mark.parametrize("seed", range(6))
def test_mixed_traffic_on_a_terrible_network(seed: int) -> None:
    rng = random.Random(seed)
    net = Network(loss=0.1, duplicate=0.1, reorder=0.2, delay=0.02, jitter=0.02, seed=seed)
    p = Pair(net, seed=seed, both_connect=bool(seed % 2))
    p.connect(120)
    expected: dict[str, dict[int, list[bytes]]] = {"a": {}, "b": {}}
    pr_sent: dict[str, set[bytes]] = {"a": set(), "b": set()}
    for i in range(400):
        src = rng.choice("ab")
        dst = "b" if src == "a" else "a"
        stream = rng.randrange(4)
        size = rng.choice([1, 10, 500, 1500, 5000, 40000])
        body = f"{src}{i}:".encode() + bytes([i % 256]) * size
        kind = rng.random()
        side = p.side(src)
        if stream == 3:  # partially reliable, unordered
            side.send(p.now, stream, 53, body, ordered=False, max_retransmits=rng.randrange(3))
            pr_sent[dst].add(body)
        elif stream == 2 and kind < 0.5:  # reliable unordered
            side.send(p.now, stream, 53, body, ordered=False)
            expected[dst].setdefault(-1, []).append(body)
        else:
            side.send(p.now, stream, 53, body)
            expected[dst].setdefault(stream, []).append(body)
        if rng.random() < 0.2:
            p.run(rng.random() * 0.5)
    p.run(600, until=lambda: all(s.sender.idle for s in (p.a, p.b)))
    for name in "ab":
        got = p.messages(name)
        for stream, msgs in expected[name].items():
            if stream == -1:
                arrived = [m.data for m in got if m.stream_id == 2 and m.unordered]
                assert sorted(arrived) == sorted(msgs)
            else:
                arrived = [m.data for m in got if m.stream_id == stream and not m.unordered]
                assert arrived == msgs, f"stream {stream} to {name}"
        pr = [m.data for m in got if m.stream_id == 3]
        assert len(pr) == len(set(pr)) and set(pr) <= pr_sent[name]
        side = p.side(name)
        assert side.sender.idle and side.receiver is not None
        assert side.receiver.buffered == 0 and not side.receiver.above
