"""Coalescing in the relay's hot loop (``RelayConfig.coalesce``, ``--coalesce-us``): under
dense traffic a wake-up that found only a few datagrams waits a little so the next one
finds a batch. The decision is a pure function; the real-socket test checks that the wait
runs under dense traffic and loses, reorders or duplicates nothing, on both I/O paths."""

from __future__ import annotations

import argparse
import socket
import time
from pathlib import Path

import pytest
import trio
from relay.conftest import StartRelay
from relay.support import RTP, check, eventually, open_transceiver, ufrag

from appliance.config import resolve
from appliance.relay import RelayConfig
from appliance.relay.cli import DEFAULTS, UsageError, add_arguments, build_config
from appliance.relay.fastpath import COALESCE_BELOW, DENSE, coalesce_wait


def test_waits_only_after_a_sparse_wake_up_under_dense_traffic() -> None:
    w = 20e-6
    assert coalesce_wait(w, 1, DENSE / 4) == w
    assert coalesce_wait(w, COALESCE_BELOW - 1, 0.0) == w
    assert coalesce_wait(w, COALESCE_BELOW, DENSE / 4) == 0.0  # the batch was good already
    assert coalesce_wait(w, 1, DENSE * 2) == 0.0  # sparse traffic: nothing would come
    assert coalesce_wait(0.0, 1, 0.0) == 0.0  # switched off


def _burst(s: socket.socket, public: tuple[str, int], count: int) -> None:
    """From a blocking socket in a worker thread (so the traffic does not depend on the
    relay's trio loop): ``count`` RTP datagrams in pairs ~30-80 µs apart — dense, but never
    more than two waiting at a wake-up unless the relay waits."""
    for i in range(0, count, 2):
        s.sendto(RTP + i.to_bytes(4, "big"), public)
        s.sendto(RTP + (i + 1).to_bytes(4, "big"), public)
        time.sleep(30e-6)  # pacing (and the GIL free for the relay), not synchronisation


@pytest.mark.usefixtures("close_sockets")
async def test_dense_traffic_is_coalesced_and_nothing_is_lost(
        nursery: trio.Nursery, start_relay: StartRelay) -> None:
    t = await open_transceiver(nursery, echo=False)
    # The fake transceiver reads in the test's trio loop, which the relay's hot loop holds
    # during the burst: give its socket room for the whole burst.
    t.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    relay = await start_relay(transceivers={0: t.address}, coalesce=50e-6)
    marker = check(ufrag(transceiver=0))
    count = 2000
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        client = s.getsockname()
        s.sendto(marker, relay.public[0])
        await eventually(lambda: marker in t.payloads())  # the flow exists
        await trio.to_thread.run_sync(_burst, s, relay.public[0], count)
    expected = [RTP + i.to_bytes(4, "big") for i in range(count)]
    await eventually(lambda: len(t.payloads()) >= count + 1)
    got = [r.payload for r in t.got if r.client == client and r.payload.startswith(RTP)]
    assert got == expected  # nothing lost, reordered or duplicated
    counters = relay.stats()["counters"]
    assert counters["coalesced"] > 0, counters
    assert counters["packets_in"] / counters["wakeups"] > 1.0, counters


def test_coalesce_flag_is_checked_and_reaches_the_config(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("00112233445566778899aabbccddeeff\n")

    def config(*extra: str) -> RelayConfig:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["--secret-file", str(secret),
                                  "--transceiver", "0=127.0.0.1:4000", *extra])
        resolve(args, {}, "relay", DEFAULTS)
        return build_config(args)

    assert config().coalesce == pytest.approx(20e-6)
    assert config("--coalesce-us", "0").coalesce == 0.0
    assert config("--coalesce-us", "35").coalesce == pytest.approx(35e-6)
    with pytest.raises(UsageError, match="coalesce"):
        config("--coalesce-us", "-1")
