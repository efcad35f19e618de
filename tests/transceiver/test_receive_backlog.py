"""The receive loop says when it is behind its socket (issue 41 item 1, headroom.py
"Backlog"): from the wake-up that found more datagrams than one batch until the read that
finds the socket empty, ``TransceiverLoad.behind_since`` holds that wake-up's time, which the
meter's tick turns into a lateness sample. Both loops (``recvmmsg`` and one
``recvfrom_into`` a datagram) are checked with a real socket."""

from __future__ import annotations

import socket

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from appliance.netio.sockets import udp_socket
from appliance.transceiver import server
from appliance.transceiver.server import BATCH, Transceiver, TransceiverConfig

QUEUED = BATCH + 44  # more than one batch: the loop yields once with datagrams left


@pytest.mark.parametrize("batch_recv", [True, False], ids=["recvmmsg", "recvfrom"])
async def test_the_receive_loop_marks_a_backlog_until_it_drains_the_socket(
        batch_recv: bool) -> None:
    sock = udp_socket(("127.0.0.1", 0), buffer=1 << 21, v6only=None)
    tr = Transceiver(TransceiverConfig(id=1, secrets=(b"k" * 32,), batch_recv=batch_recv), sock)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for i in range(QUEUED):  # garbage: each one is read, dropped and counted
            sender.sendto(b"not a proxy header %d" % i, sock.getsockname())
        assert tr.load.behind_since is None
        seen: list[float | None] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tr.receive_loop)
            with trio.fail_after(10):  # a hang guard: until every datagram has been read
                while tr.counters["datagrams_in"] < QUEUED:
                    seen.append(tr.load.behind_since)
                    await trio.lowlevel.checkpoint()
                # The loop goes back to waiting once it has found the socket empty.
                while tr.load.behind_since is not None:  # noqa: ASYNC110
                    await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()
        assert tr.counters["drop_proxy"] == QUEUED
        # Between its batches the loop was seen behind, since one wake-up's time.
        behind = {t for t in seen if t is not None}
        assert len(behind) == 1, seen
    finally:
        sender.close()
        sock.close()


@pytest.mark.parametrize("batch_recv", [True, False], ids=["recvmmsg", "recvfrom"])
async def test_a_loop_that_yields_at_its_time_bound_is_not_behind_once_the_socket_is_empty(
        batch_recv: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A datagram that takes longer than the batch's time bound (a DTLS handshake's
    signature, a slow Opus frame) ends its batch without a read that finds the socket
    empty. The loop then sleeps with nothing waiting: it must not read as behind, or an
    idle transceiver's backlog would grow with the time since its last datagram (a
    capacity run refused every call at four calls this way)."""
    monkeypatch.setattr(server, "YIELD_AFTER", -1.0)  # every datagram is past the bound
    sock = udp_socket(("127.0.0.1", 0), buffer=1 << 21, v6only=None)
    tr = Transceiver(TransceiverConfig(id=1, secrets=(b"k" * 32,), batch_recv=batch_recv), sock)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tr.receive_loop)
            for i in range(3):
                sender.sendto(b"not a proxy header %d" % i, sock.getsockname())
                with trio.fail_after(10):  # a hang guard: until the loop has read it
                    while tr.counters["datagrams_in"] <= i:  # noqa: ASYNC110
                        await trio.lowlevel.checkpoint()
                # The loop has handled it, found nothing more and gone back to waiting.
                await wait_all_tasks_blocked()
                assert tr.load.behind_since is None
            nursery.cancel_scope.cancel()
    finally:
        sender.close()
        sock.close()
