"""The board a TURN/TLS connection's sequence numbers survive a worker kill on
(relay/tlsboard.py), and the shell's bookkeeping of it (relay/tls.py ``TlsLink``), on real
TCP sockets: whatever instant the worker dies at, its successor either carries the stream
on exactly — the peer decrypts every record, in order — or sees that it cannot (a record
half written or half read) and says so; it never goes on with a wrong sequence number.

The worker's death is a point in the code where we stop and build the successor's state
from what a successor has: the board (through a second mapping of its descriptor, as the
keeper pushes it) and the kernel's count of the stream (``stream_offsets``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from appliance.proto.dtls.tlsrecord import RecordLayer, SessionKeys, record_spans_untrusted
from appliance.proto.turn import StreamFramer
from appliance.relay.tls import TlsLink
from appliance.relay.tlsboard import READ, WRITE, TlsBoard, resolve, stream_offsets

KEYS = {
    "TLS_AES_128_GCM_SHA256": (bytes(range(32)), bytes(range(32, 64))),
    "ECDHE-ECDSA-CHACHA20-POLY1305": (bytes(range(44)), bytes(range(44, 88))),
}


def server_client(suite: str) -> tuple[SessionKeys, RecordLayer]:
    """The server's keys, and a client's record layer speaking to it (its keys swapped:
    what the server reads, the client writes)."""
    read, write = KEYS[suite]
    return SessionKeys(suite, read, write), RecordLayer(SessionKeys(suite, write, read))


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    client.settimeout(5)
    server.settimeout(5)
    yield server, client
    server.close()
    client.close()


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk
        out += chunk
    return out


def successor(board: TlsBoard, link: TlsLink, sock: socket.socket) -> RecordLayer | None:
    """What a successor builds from the dead worker's board (a second mapping of the same
    memfd, as the keeper pushes it) and the kernel's count of the stream."""
    view = TlsBoard.attach(os.dup(board.fd))
    assert view is not None
    try:
        read, written = stream_offsets(sock)
        r = resolve(view.read(link.slot, READ), read)
        w = resolve(view.read(link.slot, WRITE), written)
    finally:
        view.close()
    if r is None or w is None:
        return None
    return RecordLayer(link.layer.keys, r[0], r[1], w[0], w[1])


def test_stream_offsets_count_what_the_application_read_and_wrote(
        pair: tuple[socket.socket, socket.socket]) -> None:
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


def test_a_board_entry_is_switched_to_whole_and_read_through_another_mapping() -> None:
    board = TlsBoard.create(4)
    try:
        slot = board.alloc()
        assert slot is not None
        board.write(slot, WRITE, (0, 5, 100), (0, 7, 180))
        board.write(slot, READ, (1, 2, 50), (1, 2, 50))
        view = TlsBoard.attach(os.dup(board.fd))
        assert view is not None
        assert view.read(slot, WRITE) == ((0, 5, 100), (0, 7, 180))
        assert view.read(slot, READ) == ((1, 2, 50), (1, 2, 50))
        # A store cut short by a kill lands in the half not in use: the reader still sees
        # the last whole entry, until the switch byte names the new half.
        base = slot * 256 + WRITE
        half = board.mm[base]
        other = base + (8 if half == 1 else 64)
        board.mm[other : other + 24] = b"\xff" * 24
        assert view.read(slot, WRITE) == ((0, 5, 100), (0, 7, 180))
        board.write(slot, WRITE, (0, 7, 180), (0, 7, 180))
        assert view.read(slot, WRITE) == ((0, 7, 180), (0, 7, 180))
        view.close()
        # Slots are reused zeroed; a full board says so.
        assert [board.alloc() for _ in range(3)] == [1, 2, 3]
        assert board.alloc() is None
        board.free(slot)
        assert board.alloc() == slot and board.read(slot, WRITE) == ((0, 0, 0), (0, 0, 0))
    finally:
        board.close()


def test_resolve_picks_the_entry_the_kernel_agrees_with() -> None:
    entry = ((0, 5, 100), (0, 7, 180))
    assert resolve(entry, 100) == (0, 5)
    assert resolve(entry, 180) == (0, 7)
    assert resolve(entry, 140) is None  # a record half in the kernel: no state is right


def test_a_file_that_is_not_a_board_is_refused() -> None:
    fd = os.memfd_create("not-a-board")
    os.ftruncate(fd, 100)
    assert TlsBoard.attach(fd) is None  # (and closed)
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)


@pytest.mark.parametrize("suite", sorted(KEYS))
def test_a_successor_carries_the_writes_on_wherever_the_worker_died(
        pair: tuple[socket.socket, socket.socket], suite: str) -> None:
    server, client = pair
    keys, peer = server_client(suite)
    board = TlsBoard.create(8)
    try:
        link = TlsLink(RecordLayer(keys, 0, 1, 0, 1) if keys.version == 0x0303
                       else RecordLayer(keys), StreamFramer(), 0, 0)
        if keys.version == 0x0303:
            peer = RecordLayer(SessionKeys(suite, keys.write, keys.read), 0, 1, 0, 1)
        assert link.attach(board)
        backlog = bytearray()
        got: list[bytes] = []

        def client_reads(n: int) -> None:
            data = recv_exactly(client, n)
            spans, end, _ = record_spans_untrusted(data)
            assert end == len(data)
            got.extend(peer.open(data[o : o + s]) for o, s in spans)

        # Three messages queued, then the worker dies before sending any of them: the
        # board's committed state is the one (the successor seals the next at seq 1).
        for i in range(3):
            link.seal_into(backlog, b"msg%d" % i)
        assert stream_offsets(server) == (0, 0)
        late = successor(board, link, server)
        assert late is not None and late.wseq == link.layer.wseq - 3
        # All of it sent, and the worker dies before it could record the send: the pending
        # state is the one.
        link.sending()  # as push() does before each send
        server.sendall(backlog)
        written = len(backlog)
        assert stream_offsets(server)[1] == written
        after = successor(board, link, server)
        assert after is not None and after.wseq == link.layer.wseq
        link.wrote(len(backlog))
        backlog.clear()
        # The successor writes on; the client reads every record, in order.
        client_reads(written)
        record = after.seal(b"from the successor")
        server.sendall(record)
        client_reads(len(record))
        assert got == [b"msg0", b"msg1", b"msg2", b"from the successor"]
        # The successor's record went out on the stream too: the link's view follows it
        # (the test stands in for the successor's own link from here on).
        link.layer, link.sent, link.queued = after, written + len(record), written + len(record)
        link.wcommit = (after.wgen, after.wseq, link.sent)
        # Two records queued, the kernel takes the first only (its window full): published
        # after the partial send, a kill then is carried on from between the two.
        link.seal_into(backlog, b"first")
        one = len(backlog)
        link.seal_into(backlog, b"second")
        link.sending()
        server.sendall(backlog[:one])
        link.wrote(one)
        del backlog[:one]
        between = successor(board, link, server)
        assert between is not None and between.wseq == link.layer.wseq - 1
        client_reads(one)
        # Half of the second in the kernel (a kill mid-write): the successor knows it
        # cannot go on.
        link.sending()
        server.sendall(backlog[:10])
        assert stream_offsets(server)[1] == link.sent + 10
        assert successor(board, link, server) is None
        assert got[-1] == b"first"
    finally:
        board.close()


def test_a_successor_carries_the_reads_on_wherever_the_worker_died(
        pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    keys, peer = server_client("TLS_AES_128_GCM_SHA256")
    board = TlsBoard.create(8)
    try:
        framer = StreamFramer()
        link = TlsLink(RecordLayer(keys), framer, 0, 0)
        assert link.attach(board)
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
        again = successor(board, link, server)
        assert again is not None and again.rseq == 0
        recv_exactly(server, end)
        # Killed after the take, before it was recorded: the pending state is the one.
        after = successor(board, link, server)
        assert after is not None and after.rseq == 3
        link.took(end)
        assert after.open(peer.seal(msgs[0])) == msgs[0]  # it reads the client's next
        link.layer = RecordLayer(keys, 0, 4)  # (the one after it)
        link.rcommit = (0, 4, end)

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

        # A TURN message split over two records, the first taken: no successor could finish
        # it (its first half is gone from the kernel), and the board says so.
        big = bytes((0, 1, 0, 8)) + bytes.fromhex("2112a442") + bytes(12) + bytes(8)
        first, second = peer.seal(big[:10]), peer.seal(big[10:])
        assert read_one(first) is None and not link.resumable
        assert successor(board, link, server) is None
        # Its second half completes it: a successor could carry on again.
        assert read_one(second) == big and link.resumable
        late = successor(board, link, server)
        assert late is not None and late.rseq == 6
        assert late.open(peer.seal(msgs[1])) == msgs[1]
    finally:
        board.close()
