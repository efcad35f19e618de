"""The load generator's ``conversational`` pattern (bench/capacity.py ``--pattern
conversational``, issue 32 item 3) over real loopback sockets, against a passthrough echo."""

from __future__ import annotations

import trio
from loadgen.support import serve_passthrough

from appliance.loadgen import LoadConfig, run_load


async def test_conversational_talks_40_percent_and_counts_loss_as_continuous() -> None:
    """A 1 s cycle: 20 frames of tone, 30 of silence. Every packet, silent or not, is sent
    at 50/s and comes back tagged (exact loss), and no turn bookkeeping is kept: the echo's
    silence is not a turn to wait for."""
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_passthrough)
        report = await run_load(LoadConfig(url, sessions=1, duration=2.0,
                                           pattern="conversational", cycle=1.0, drain=0.2))
        nursery.cancel_scope.cancel()
    [res] = report.sessions
    assert res.failure is None, res.failure
    assert res.rtt_method == "tag" and not res.turn_taking and res.turns == []
    # At most 2 s at 50 packets/s: a late pacer drops ticks, it never adds one (no lower
    # bound: on a loaded box the pacer may drop many).
    assert 0 < res.sent <= 101, res.sent
    assert res.echoed == res.sent and res.loss == 0.0
