"""The batch syscalls of ``appliance.netio._mmsg`` (recvmmsg/sendmmsg) on real loopback
sockets, and the relay behaviours that only the batch path could get wrong (truncation,
per-message send failures, the I/O mode selection).

The routing behaviour of both I/O paths is covered by the rest of tests/relay: the
``start_relay`` fixture runs every relay test once per path (conftest.py)."""

from __future__ import annotations

import argparse
import errno
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from relay.conftest import StartRelay
from relay.support import RTP, SECRET, check, open_client, open_transceiver, ufrag

from appliance.config import resolve
from appliance.relay import RelayConfig, server
from appliance.relay import io as relay_io
from appliance.relay.cli import DEFAULTS, UsageError, add_arguments, build_config

if not relay_io.mmsg_available():  # a missing build fails here: it is never skipped
    pytest.fail("appliance.netio._mmsg is not built: run .venv/bin/pip install -e .",
                pytrace=False)

from appliance.netio import _mmsg  # noqa: E402

SLOT, HEAD, CAP = 512, 64, 256
IP_RECVERR = 11  # Linux <linux/in.h>; absent from Python's socket module


def _pair(family: int) -> tuple[socket.socket, socket.socket]:
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    rx = socket.socket(family, socket.SOCK_DGRAM)
    tx = socket.socket(family, socket.SOCK_DGRAM)
    rx.bind((host, 0))
    tx.bind((host, 0))
    rx.setblocking(False)
    return rx, tx


@pytest.fixture(params=[socket.AF_INET, socket.AF_INET6], ids=["ipv4", "ipv6"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[socket.socket, socket.socket]]:
    rx, tx = _pair(int(request.param))
    try:
        yield rx, tx
    finally:
        rx.close()
        tx.close()


def _recv_all(rx: socket.socket, buf: bytearray, count: int) -> list[tuple[int, tuple[str, int]]]:
    """Datagrams already sent on loopback are queued when sendto returns."""
    got = _mmsg.recv_batch(rx.fileno(), buf, SLOT, HEAD, CAP, count)
    assert len(got) == count
    return got


def test_recv_batch_fills_slots_and_reports_sources(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    rx, tx = pair
    buf = bytearray(SLOT * 8)
    assert _mmsg.recv_batch(rx.fileno(), buf, SLOT, HEAD, CAP, 8) == []  # EAGAIN: empty
    datagrams = [b"", b"a", bytes(range(200)), b"\x80" * CAP]
    for d in datagrams:
        tx.sendto(d, rx.getsockname())
    got = _recv_all(rx, buf, len(datagrams))
    src = tx.getsockname()[:2]
    assert [addr for _, addr in got] == [src] * len(datagrams)
    assert got[0][1] is got[1][1]  # the cached tuple: one object per source address
    for i, ((n, _), d) in enumerate(zip(got, datagrams, strict=True)):
        assert n == len(d)
        assert buf[i * SLOT + HEAD : i * SLOT + HEAD + n] == d
    assert buf[:HEAD] == bytes(HEAD)  # headroom untouched
    assert _mmsg.recv_batch(rx.fileno(), buf, SLOT, HEAD, CAP, 8) == []


def test_recv_batch_reports_the_real_length_of_a_truncated_datagram(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    rx, tx = pair
    buf = bytearray(SLOT * 2)
    tx.sendto(b"\x01" * 1000, rx.getsockname())
    tx.sendto(b"ok", rx.getsockname())
    (n1, _), (n2, _) = _recv_all(rx, buf, 2)
    assert (n1, n2) == (1000, 2)  # > CAP: the caller drops it as oversize
    assert buf[HEAD : HEAD + CAP] == b"\x01" * CAP
    assert buf[SLOT + HEAD : SLOT + HEAD + 2] == b"ok"


def test_recv_batch_skips_a_queued_socket_error() -> None:
    """An ICMP error queued on the socket (port unreachable, reported with IP_RECVERR) is
    returned by the next receive call: the batch skips it, as the Python loop does, instead
    of raising into the hot loop."""
    rx, tx = _pair(socket.AF_INET)
    with rx, tx:
        rx.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
        closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()
        closed.close()
        rx.sendto(b"x", port)  # -> ICMP port unreachable, queued on rx
        tx.sendto(b"after", rx.getsockname())
        buf = bytearray(SLOT * 4)
        got = _mmsg.recv_batch(rx.fileno(), buf, SLOT, HEAD, CAP, 4)
        if not got:  # the error was reported by this call; the datagram is still queued
            got = _mmsg.recv_batch(rx.fileno(), buf, SLOT, HEAD, CAP, 4)
        assert [n for n, _ in got] == [5]
        assert buf[HEAD : HEAD + 5] == b"after"


def test_recv_batch_rejects_buffers_too_small_for_its_slots() -> None:
    rx, _tx = _pair(socket.AF_INET)
    with rx, _tx:
        with pytest.raises(ValueError, match="slot"):
            _mmsg.recv_batch(rx.fileno(), bytearray(SLOT), SLOT, HEAD, CAP, 2)
        with pytest.raises(ValueError, match="slot"):
            _mmsg.recv_batch(rx.fileno(), bytearray(SLOT), SLOT, HEAD, SLOT, 1)
        with pytest.raises(OSError, match="Bad file descriptor") as info:
            _mmsg.recv_batch(10_000, bytearray(SLOT), SLOT, HEAD, CAP, 1)  # not a socket
        assert info.value.errno == errno.EBADF


def test_send_batch_gathers_header_and_payload(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    rx, tx = pair
    dest = rx.getsockname()[:2]
    data = bytearray(b"0123456789")
    msgs = [(b"HDR:", 2, 3, dest), (b"", 0, 10, dest), (b"only-header", 0, 0, dest)]
    assert _mmsg.send_batch(tx.fileno(), data, msgs) == (3, 7 + 10 + 11, 0)
    rx.setblocking(True)
    rx.settimeout(2)
    assert [rx.recv(100) for _ in msgs] == [b"HDR:234", b"0123456789", b"only-header"]


def test_send_batch_counts_failures_per_message_and_sends_the_rest(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    rx, tx = pair
    dest = rx.getsockname()[:2]
    other_family = ("127.0.0.1", 9) if tx.family == socket.AF_INET6 else ("::1", 9)
    data = b"payload"
    msgs = [
        (b"1", 0, 0, dest),
        (b"2", 0, 0, ("not-an-ip", 9)),  # no resolution on the hot path
        (b"3", 0, 0, other_family),  # the kernel refuses this one (EAFNOSUPPORT/EINVAL)
        (b"4", 0, 0, dest),
        (b"5", 0, 0, (dest[0], 70_000)),  # no such port
        (b"6", 0, 7, dest),
    ]
    assert _mmsg.send_batch(tx.fileno(), data, msgs) == (3, 1 + 1 + 8, 3)
    rx.settimeout(2)
    rx.setblocking(True)
    assert [rx.recv(100) for _ in range(3)] == [b"1", b"4", b"6payload"]


@pytest.mark.parametrize("gso", [True, False], ids=["gso", "no-gso"])
def test_runs_to_one_address_arrive_as_the_same_datagrams(
    pair: tuple[socket.socket, socket.socket], gso: bool
) -> None:
    """Consecutive same-size datagrams to one address go out as one UDP GSO send (when on);
    the receiver must see exactly the datagrams of separate sends, in order, mixed with the
    ones around the run (another size, another address, an oversized one)."""
    rx, tx = pair
    rx2, _ = _pair(rx.family)
    with rx2, _:
        dest, dest2 = rx.getsockname()[:2], rx2.getsockname()[:2]
        data = bytes(range(256)) * 8
        msgs = [(b"h%02d" % i, i, 100, dest) for i in range(80)]  # 10, then 70 > 64
        msgs[10:10] = [(b"x", 0, 7, dest), (b"y", 0, 100, dest2), (b"z" * 1500, 0, 9, dest)]
        was = _mmsg.set_gso(gso)
        try:
            sent, nbytes, failed = _mmsg.send_batch(tx.fileno(), data, msgs)
        finally:
            _mmsg.set_gso(was)
        want = [h + data[off : off + n] for h, off, n, _ in msgs]
        assert (sent, failed) == (len(msgs), 0)
        assert nbytes == sum(map(len, want))
        rx.settimeout(2)
        rx2.settimeout(2)
        assert [rx.recv(4096) for _ in range(len(msgs) - 1)] == [
            w for w, m in zip(want, msgs, strict=True) if m[3] == dest
        ]
        assert rx2.recv(4096) == want[11]


def test_send_batch_checks_its_items() -> None:
    rx, tx = _pair(socket.AF_INET)
    with rx, tx:
        dest = rx.getsockname()
        with pytest.raises(ValueError, match="outside"):
            _mmsg.send_batch(tx.fileno(), b"abc", [(b"", 2, 2, dest)])
        with pytest.raises(TypeError):
            _mmsg.send_batch(tx.fileno(), b"abc", [("str", 0, 1, dest)])  # type: ignore[list-item]
        assert _mmsg.send_batch(tx.fileno(), b"abc", []) == (0, 0, 0)


@settings(max_examples=60, deadline=None)
@given(
    datagrams=st.lists(
        st.tuples(st.binary(max_size=40), st.integers(0, SLOT), st.integers(0, CAP + 40)),
        min_size=1,
        max_size=20,
    ),
    family=st.sampled_from([socket.AF_INET, socket.AF_INET6]),
)
def test_round_trip_through_both_batches(
    datagrams: list[tuple[bytes, int, int]], family: int
) -> None:
    """Whatever headers, offsets and lengths go into send_batch, recv_batch gives back each
    datagram's real length and source, and its bytes (up to the slot capacity) in its slot."""
    rx, tx = _pair(family)
    with rx, tx:
        source = bytes(range(256)) * 4  # the payload buffer: offsets pick distinct bytes
        dest = rx.getsockname()[:2]
        msgs = [(h, off, min(n, len(source) - off), dest) for h, off, n in datagrams]
        sent, nbytes, failed = _mmsg.send_batch(tx.fileno(), source, msgs)
        want = [h + source[off : off + n] for h, off, n, _ in msgs]
        assert (sent, nbytes, failed) == (len(msgs), sum(map(len, want)), 0)
        buf = bytearray(SLOT * len(msgs))
        got = _mmsg.recv_batch(rx.fileno(), buf, SLOT, HEAD, CAP, len(msgs))
        assert [n for n, _ in got] == [len(w) for w in want]
        assert {addr for _, addr in got} == {tx.getsockname()[:2]}
        for i, w in enumerate(want):
            start = i * SLOT + HEAD
            assert buf[start : start + min(len(w), CAP)] == w[:CAP]


# -- the relay over the batch path -----------------------------------------------------------


@pytest.mark.usefixtures("close_sockets")
async def test_oversize_datagrams_are_dropped_where_the_kernel_filter_is_missing(
    nursery: trio.Nursery, start_relay: StartRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the BPF filter a 3000-byte datagram reaches the loop: both paths count it
    ``oversize`` (the batch path sees its real length through MSG_TRUNC) and the next
    datagram, in the following slot, is routed normally."""
    monkeypatch.setattr(server, "attach_public_filter", lambda sock, max_payload=0: False)
    t = await open_transceiver(nursery)
    relay = await start_relay(transceivers={0: t.address})
    c = await open_client(relay.public[0])
    await c.send(check(ufrag()))
    await c.recv()
    await c.send(b"\x80" * 3000)
    await c.send(RTP)
    assert await c.recv() == (RTP, relay.public[0])
    assert relay.stats()["counters"]["drops"] == {"oversize": 1}
    assert t.payloads()[-1] == RTP


def test_io_mode_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(relay_io.IO_ENV, raising=False)
    assert relay_io.select_io("auto") == "mmsg"
    assert relay_io.select_io("python") == "python"
    monkeypatch.setenv(relay_io.IO_ENV, "python")
    assert relay_io.select_io("auto") == "python"
    assert relay_io.select_io("mmsg") == "mmsg"  # an explicit mode wins over the environment
    with pytest.raises(ValueError, match="expected one of"):
        relay_io.select_io("epoll")
    monkeypatch.setattr(relay_io, "_mmsg", None)
    monkeypatch.delenv(relay_io.IO_ENV)
    assert relay_io.select_io("auto") == "python"  # the fallback when the build failed
    with pytest.raises(ValueError, match="not built"):
        relay_io.select_io("mmsg")


def test_io_flag_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "routing.secret"
    secret.write_bytes(SECRET + b"\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def config(*argv: str, toml: dict[str, Any] | None = None) -> RelayConfig:
        args = parser.parse_args(["--secret-file", str(secret), *argv])
        resolve(args, toml or {}, "relay", DEFAULTS)
        return build_config(args)

    assert config().io == "auto"
    assert config("--io", "python").io == "python"
    assert config(toml={"relay": {"io": "python"}}).io == "python"
    with pytest.raises(UsageError, match="expected one of"):
        config(toml={"relay": {"io": "uring"}})
    with pytest.raises(SystemExit):  # argparse: invalid choice
        config("--io", "uring")
    monkeypatch.setattr(relay_io, "_mmsg", None)
    with pytest.raises(UsageError, match="not built"):
        config("--io", "mmsg")
