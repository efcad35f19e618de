"""The client's receive path stamps datagrams with the kernel's arrival time, so a reader
that wakes late (a busy load generator, a GC pause) does not inflate measured round trips."""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Iterator

import pytest

from appliance.client.call import enable_rx_timestamps, read_ready

SO_TIMESTAMPNS = 35  # Linux


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        yield rx, tx
    finally:
        rx.close()
        tx.close()


def _wait_readable(sock: socket.socket) -> None:
    import select

    r, _, _ = select.select([sock], [], [], 5.0)
    assert r, "datagram never arrived"


def _stamping_live(rx: socket.socket, tx: socket.socket) -> None:
    """Linux switches datagram timestamping on globally and *asynchronously* (a static key
    flipped from a work queue) when the first socket asks: until then a datagram carries no
    arrival stamp and recvmsg stamps it with the read time. Send probes until one comes back
    stamped before it was read; only then is the test's own datagram meaningful."""
    for _ in range(200):
        tx.sendto(b"probe", rx.getsockname())
        _wait_readable(rx)
        time.sleep(0.005)  # the probe must sit in the buffer to show an earlier stamp (a
        # lower bound below: load only lengthens the wait)
        now = time.monotonic()
        (_, _, at), = read_ready(rx, bytearray(64), now, now - time.time(), True)
        if now - at > 0.003:
            return
    raise AssertionError("the kernel never stamped a datagram on arrival")


@pytest.mark.parametrize("stamped", [True, False])
def test_a_late_reader_sees_the_kernel_arrival_time(
        pair: tuple[socket.socket, socket.socket], stamped: bool) -> None:
    rx, tx = pair
    assert enable_rx_timestamps(rx)  # Linux: always available
    _stamping_live(rx, tx)
    if not stamped:
        rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 0)
    sent = time.monotonic()
    tx.sendto(b"one", rx.getsockname())
    tx.sendto(b"two", rx.getsockname())
    _wait_readable(rx)
    ready = time.monotonic()  # both datagrams have arrived by now (loopback, in order)
    time.sleep(0.08)  # the scenario under test: the reader is busy for 80 ms
    now = time.monotonic()
    got = read_ready(rx, bytearray(2048), now, now - time.time(), stamped)
    assert [d for d, _, _ in got] == [b"one", b"two"]
    assert all(addr[0] == "127.0.0.1" for _, addr, _ in got)
    for _, _, at in got:
        assert at <= now
        if stamped:
            # Stamped on arrival: between the send and the moment it was readable, before
            # the reader's 80 ms (measured bounds, not a fixed one; 1 ms for the clock
            # conversion).
            assert sent - 0.001 <= at <= ready + 0.001, (at - sent, ready - sent, now - sent)
        else:
            assert at == now
    assert read_ready(rx, bytearray(2048), now, 0.0, stamped) == []  # drained


def test_arrivals_are_clamped_to_the_previous_wake(pair: tuple[socket.socket, socket.socket]) -> None:
    """A wall-clock step must not move a stamp before the last wake (or into the future)."""
    rx, tx = pair
    assert enable_rx_timestamps(rx)
    _stamping_live(rx, tx)
    tx.sendto(b"x", rx.getsockname())
    _wait_readable(rx)
    now = time.monotonic()
    # An offset one hour off (as after a clock step) lands the stamp far in the past:
    (_, _, at), = read_ready(rx, bytearray(64), now, now - time.time() - 3600, True,
                             not_before=now - 0.002)
    assert at == pytest.approx(now - 0.002)
    tx.sendto(b"y", rx.getsockname())
    _wait_readable(rx)
    now = time.monotonic()
    (_, _, at), = read_ready(rx, bytearray(64), now, now - time.time() + 3600, True)
    assert at == now  # a future stamp is clamped to the wake
    tx.sendto(b"z", rx.getsockname())
    _wait_readable(rx)
    now = time.monotonic()
    (_, _, at), = read_ready(rx, bytearray(64), now, now - time.time() - 3600, True)
    assert at == now - 1.0  # and never more than 1 s before it
    assert not math.isinf(at)
