"""The board where a kept TCP connection's stream state survives a worker kill
(relay/board.py), and the shell's bookkeeping of it (``Outgoing`` for writes, relay/tls.py
``TlsLink`` for TLS reads), on real TCP sockets: whatever instant the worker dies at, its
successor either carries the stream on exactly — the peer gets every frame whole, every
record in order — or sees that it cannot and says so; it never goes on with a frame cut
in two or a wrong sequence number.

The worker's death is a point in the code where we stop and build the successor's state
from what a successor has: the board (through a second mapping of its descriptor, as the
keeper pushes it) and the kernel's count of the stream (``stream_offsets``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from appliance.proto.dtls.tlsrecord import RecordLayer, SessionKeys, record_spans_untrusted
from appliance.proto.framing import frame_spans_untrusted
from appliance.proto.turn import StreamFramer
from appliance.relay.board import (
    CHUNK,
    NOT_RESUMABLE,
    PARTIAL,
    SLOT,
    Board,
    Outgoing,
    resolve,
    resume_out,
    stream_offsets,
)
from appliance.relay.tls import TlsLink

KEYS = {
    "TLS_AES_128_GCM_SHA256": (bytes(range(32)), bytes(range(32, 64))),
    "ECDHE-ECDSA-CHACHA20-POLY1305": (bytes(range(44)), bytes(range(44, 88))),
}
Pair = tuple[socket.socket, socket.socket]


def tls_pair(suite: str) -> tuple[RecordLayer, RecordLayer]:
    """The server's record layer and its client's (keys swapped), past their Finished."""
    read, write = KEYS[suite]
    first = 1 if suite.startswith("ECDHE") else 0
    return (RecordLayer(SessionKeys(suite, read, write), 0, first, 0, first),
            RecordLayer(SessionKeys(suite, write, read), 0, first, 0, first))


@pytest.fixture
def pair() -> Iterator[Pair]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    client.settimeout(5)
    server.settimeout(5)
    yield server, client
    server.close()
    client.close()


@pytest.fixture
def board() -> Iterator[Board]:
    b = Board.create(8)
    yield b
    b.close()


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk
        out += chunk
    return out


def view_of(board: Board) -> Board:
    """A second mapping of the board, as the keeper pushes it to a successor."""
    view = Board.attach(os.dup(board.fd))
    assert view is not None
    return view


def successor_out(board: Board, slot: int, sock: socket.socket
                  ) -> tuple[int, int, bytes] | None:
    view = view_of(board)
    try:
        return resume_out(view.read_out(slot), stream_offsets(sock)[1])
    finally:
        view.close()


def test_stream_offsets_count_what_the_application_read_and_wrote(pair: Pair) -> None:
    server, client = pair
    assert stream_offsets(server) == (0, 0)
    client.sendall(b"x" * 1000)
    server.sendall(b"y" * 300)
    # Exact at once, arrived or acked or not: read = received - unread, written = acked +
    # not yet acked.
    assert stream_offsets(server) == (0, 300)
    recv_exactly(server, 400)  # 600 left unread in the kernel
    assert stream_offsets(server) == (400, 300)
    recv_exactly(client, 300)
    assert stream_offsets(server) == (400, 300)


def test_entries_are_switched_to_whole_and_read_through_another_mapping(board: Board) -> None:
    slot = board.alloc()
    assert slot is not None
    board.write_read(slot, (1, 2, 50, b""), (1, 3, 80, b"half"))
    board.write_out(slot, 0, 7, 100, b"frame")
    view = view_of(board)
    assert view.read_read(slot) == ((1, 2, 50, b""), (1, 3, 80, b"half"))
    assert view.read_out(slot) == (0, 7, 100, b"frame")
    # A store cut short by a kill lands in the half not in use: the reader still sees the
    # last whole entry, until the switch byte names the new half.
    base = slot * SLOT
    for sel, halves in ((base + 8320, (8328, 12616)), (base, (64, 4192))):
        other = base + halves[1 - board.mm[sel]]
        board.mm[other : other + 24] = b"\xff" * 24
    assert view.read_read(slot) == ((1, 2, 50, b""), (1, 3, 80, b"half"))
    assert view.read_out(slot) == (0, 7, 100, b"frame")
    board.write_out(slot, 0, 8, 105, b"next")
    assert view.read_out(slot) == (0, 8, 105, b"next")
    with pytest.raises(ValueError, match="chunk too long"):
        board.write_out(slot, 0, 0, 0, bytes(CHUNK + 1))
    with pytest.raises(ValueError, match="partial message too long"):
        board.write_read(slot, (0, 0, 0, b""), (0, 0, 0, bytes(PARTIAL + 1)))
    view.close()
    # Slots are reused reset; a full board says so.
    assert [board.alloc() for _ in range(7)] == [1, 2, 3, 4, 5, 6, 7]
    assert board.alloc() is None
    board.free(slot)
    assert board.alloc() == slot
    assert board.read_out(slot)[2] == NOT_RESUMABLE
    assert board.read_read(slot) == ((0, 0, 0, b""), (0, 0, 0, b""))


def test_resolve_and_resume_pick_what_the_kernel_agrees_with() -> None:
    entry = ((0, 5, 100, b""), (0, 7, 180, b"\x00\x01"))
    assert resolve(entry, 100) == (0, 5, b"")
    assert resolve(entry, 180) == (0, 7, b"\x00\x01")
    assert resolve(entry, 140) is None  # the kernel agrees with neither
    out = (0, 9, 1000, b"abcdef")
    assert resume_out(out, 1000) == (0, 9, b"abcdef")  # none of it went in
    assert resume_out(out, 1002) == (0, 9, b"cdef")  # a frame cut in two: finish it
    assert resume_out(out, 1006) == (0, 9, b"")
    assert resume_out(out, 999) is None and resume_out(out, 1007) is None
    assert resume_out((0, 0, NOT_RESUMABLE, b""), 0) is None


def test_a_file_that_is_not_a_board_is_refused() -> None:
    fd = os.memfd_create("not-a-board")
    os.ftruncate(fd, 100)
    assert Board.attach(fd) is None  # (and closed)
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)


def frames(n: int, size: int) -> list[bytes]:
    """RFC 4571 frames (ICE-TCP) of ``size`` bytes, numbered."""
    return [(size - 2).to_bytes(2, "big") + bytes((i,)) * (size - 2) for i in range(n)]


def test_a_frame_cut_in_two_by_a_kill_is_finished_by_the_successor(
        pair: Pair, board: Board) -> None:
    """ICE-TCP: the worker dies with a frame half in the kernel (its client's window full,
    the rest in its backlog); the successor writes the rest first, and the client's
    framing never breaks."""
    server, client = pair
    slot = board.alloc()
    assert slot is not None
    out = Outgoing(board, slot, 0, 0)
    backlog = bytearray()
    sent: list[bytes] = []
    for f in frames(3, 700):
        backlog += f
        out.appended(len(f))
        sent.append(f)
    n = out.chunk(backlog)
    assert n == len(backlog)  # 2 100 bytes: one chunk
    server.sendall(backlog[:1000])  # the kernel took part of it: frame 1 cut at 300 bytes
    out.wrote(1000)
    del backlog[:1000]
    rest = successor_out(board, slot, server)
    assert rest is not None and rest[2] == bytes(b"".join(sent))[1000:]
    server.sendall(rest[2])
    got = recv_exactly(client, 2100)
    spans, end, _ = frame_spans_untrusted(got, 2048)
    assert end == 2100 and [got[o : o + s] for o, s in spans] == [f[2:] for f in sent]
    # And killed again right after that send, before the worker recorded it: the chunk
    # published before the send still accounts for it.
    assert successor_out(board, slot, server) == (0, 0, b"")


def test_a_backlog_longer_than_a_chunk_is_sent_a_chunk_at_a_time(
        pair: Pair, board: Board) -> None:
    """A slow reader's backlog: each send hands the kernel at most one published chunk of
    whole frames, so a kill anywhere leaves a successor knowing what to finish; what was
    never handed over is lost whole, like a datagram."""
    server, client = pair
    slot = board.alloc()
    assert slot is not None
    out = Outgoing(board, slot, 0, 0)
    backlog = bytearray()
    for f in frames(10, 1000):
        backlog += f
        out.appended(len(f))
    n = out.chunk(backlog)
    assert n == 4000 and n <= CHUNK  # four whole frames
    server.sendall(backlog[:2500])  # the kill: frame 2 half in
    rest = successor_out(board, slot, server)
    assert rest is not None and len(rest[2]) == 1500
    server.sendall(rest[2])
    got = recv_exactly(client, 4000)
    spans, end, _ = frame_spans_untrusted(got, 2048)
    assert end == 4000 and [got[o] for o, _ in spans] == [0, 1, 2, 3]


@pytest.mark.parametrize("suite", sorted(KEYS))
def test_tls_records_carry_on_with_the_right_sequence_numbers(
        pair: Pair, board: Board, suite: str) -> None:
    """TURN/TLS: the write entry carries the write state after its chunk; the successor
    finishes a record cut in two and seals the next with the number the client expects,
    also when records queued beyond the chunk were lost with the worker."""
    server, client = pair
    layer, peer = tls_pair(suite)
    slot = board.alloc()
    assert slot is not None
    out = Outgoing(board, slot, 0, 0, layer.wgen, layer.wseq)
    backlog = bytearray()
    got: list[bytes] = []

    def client_reads(n: int) -> None:
        data = recv_exactly(client, n)
        spans, end, _ = record_spans_untrusted(data)
        assert end == len(data)
        got.extend(peer.open(data[o : o + s]) for o, s in spans)

    def queue(msg: bytes) -> int:
        records = layer.seal(msg)
        backlog.extend(records)
        out.appended(len(records), layer.wgen, layer.wseq)
        return len(records)

    # Killed before a send: nothing in the kernel, the chunk all to write.
    queue(b"msg0")
    n = out.chunk(backlog)
    before = successor_out(board, slot, server)
    assert before is not None and before[2] == bytes(backlog[:n])
    # Sent whole; killed before the worker recorded it: nothing left to write.
    server.sendall(backlog[:n])
    client_reads(n)
    out.wrote(n)
    del backlog[:n]
    # Big records (a slow reader's backlog): the chunk holds one, the second is lost.
    a = queue(b"a" * 3000)
    queue(b"b" * 3000)
    n = out.chunk(backlog)
    assert n == a
    server.sendall(backlog[:1000])  # the kill: record "a" cut in two
    rest = successor_out(board, slot, server)
    assert rest is not None
    gen, seq, tail = rest
    server.sendall(tail)
    client_reads(n)
    after = RecordLayer(layer.keys, 0, 0, gen, seq)
    record = after.seal(b"from the successor")
    server.sendall(record)
    client_reads(len(record))
    assert got == [b"msg0", b"a" * 3000, b"from the successor"]


def test_tls_reads_carry_on_wherever_the_worker_died(pair: Pair, board: Board) -> None:
    server, client = pair
    layer, peer = tls_pair("TLS_AES_128_GCM_SHA256")
    slot = board.alloc()
    assert slot is not None
    framer = StreamFramer()
    link = TlsLink(layer, framer, 0)
    link.attach(board, slot)

    def successor_state() -> tuple[int, int, bytes] | None:
        view = view_of(board)
        try:
            return resolve(view.read_read(slot), stream_offsets(server)[0])
        finally:
            view.close()

    def successor() -> RecordLayer | None:
        r = successor_state()
        return None if r is None else RecordLayer(layer.keys, r[0], r[1])

    # A TURN message per record (a Binding request header with no attributes)...
    msgs = [bytes((0, 1, 0, 0)) + bytes.fromhex("2112a442") + bytes((i,)) * 12
            for i in range(3)]
    wire = b"".join(peer.seal(m) for m in msgs)
    client.sendall(wire)
    data = server.recv(len(wire), socket.MSG_PEEK | socket.MSG_WAITALL)
    spans, end, _ = record_spans_untrusted(data)
    for o, s in spans:
        framer.handle_input(link.layer.open(data[o : o + s]))
    assert [framer.poll_output() for _ in msgs] == msgs
    link.taking(end)
    # Killed before the take: the records are still in the kernel, read them again.
    again = successor()
    assert again is not None and again.rseq == 0
    recv_exactly(server, end)
    # Killed after the take, before it was recorded: the pending state is the one.
    after = successor()
    assert after is not None and after.rseq == 3
    link.took(end)
    assert after.open(peer.seal(msgs[0])) == msgs[0]  # it reads the client's next
    link.layer = RecordLayer(layer.keys, 0, 4)  # (the one after it)
    link.rcommit = (0, 4, end, b"")

    def read_one(record: bytes) -> bytes | None:
        """As the reader does: open, frame (every whole message out), take."""
        client.sendall(record)
        data = server.recv(len(record), socket.MSG_PEEK | socket.MSG_WAITALL)
        framer.handle_input(link.layer.open(data))
        msg = framer.poll_output()
        link.taking(len(record))
        recv_exactly(server, len(record))
        link.took(len(record))
        return msg

    # A TURN message split over two records, the first taken: its first half is gone from
    # the kernel, and the board holds it; a successor's framer starts with it and the
    # second record completes the message.
    big = bytes((0, 1, 0, 8)) + bytes.fromhex("2112a442") + bytes(12) + bytes(8)
    first, second = peer.seal(big[:10]), peer.seal(big[10:])
    assert read_one(first) is None
    got = successor_state()
    assert got is not None and got[1] == 5 and got[2] == big[:10]
    resumed = RecordLayer(layer.keys, got[0], got[1])
    framer2 = StreamFramer()
    framer2.handle_input(got[2])
    framer2.handle_input(resumed.open(second))
    assert framer2.poll_output() == big
    # The worker itself reads it on too.
    assert read_one(second) == big
    late = successor()
    assert late is not None and late.rseq == 6
    assert late.open(peer.seal(msgs[1])) == msgs[1]
