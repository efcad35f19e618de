"""The transceiver's early drop for STUN from unknown client addresses (issue 9, the ICE
password-guessing storm): a per-address budget applied before USERNAME decoding; known flows
always pass; the table is bounded."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from appliance.transceiver import server as srv

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import flood  # noqa: E402

PUBLIC = ("127.0.0.1", 3478)
RELAY = ("127.0.0.1", 40000)


class _Sock:
    def sendto(self, data: bytes, addr: Any) -> int:
        return len(data)


def _transceiver() -> srv.Transceiver:
    return srv.Transceiver(srv.TransceiverConfig(id=0, secrets=(b"s" * 32,)), _Sock())  # type: ignore[arg-type]


def _guess(client: tuple[str, int]) -> memoryview:
    data = flood.proxy_v2(client, PUBLIC) + flood.stun_binding(b"nosuchufrag:c", os.urandom(16))
    return memoryview(bytearray(data))


def test_unknown_source_gets_a_burst_then_its_rate() -> None:
    tr = _transceiver()
    client = ("203.0.113.7", 5000)
    for _ in range(100):
        tr.dispatch(10.0, _guess(client), RELAY)
    # Burst 20 reached the USERNAME look-up (no such ufrag), the rest were dropped early.
    assert tr.counters["drop_unknown_ufrag"] == 20
    assert tr.counters["drop_stun_rate"] == 80
    for _ in range(100):
        tr.dispatch(11.0, _guess(client), RELAY)  # one second later: 10 more tokens
    assert tr.counters["drop_unknown_ufrag"] == 30
    # Another address has its own budget.
    tr.dispatch(11.0, _guess(("203.0.113.8", 5000)), RELAY)
    assert tr.counters["drop_unknown_ufrag"] == 31


def test_known_flows_always_pass() -> None:
    tr = _transceiver()
    client = ("198.51.100.1", 6000)
    tr.by_client[client] = object()  # type: ignore[assignment]
    # A session's known flow: never budgeted (the USERNAME look-up still finds no session).
    for _ in range(200):
        tr.dispatch(10.0, _guess(client), RELAY)
    assert tr.counters["drop_stun_rate"] == 0
    assert tr.counters["drop_unknown_ufrag"] == 200


def test_budget_table_is_bounded() -> None:
    tr = _transceiver()
    for i in range(srv.STUN_SOURCES + 100):
        tr.dispatch(10.0, _guess((f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", 7000)), RELAY)
    assert len(tr.stun_tat) <= srv.STUN_SOURCES
