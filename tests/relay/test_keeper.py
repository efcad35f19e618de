"""The keeper of a relay worker's TCP connections, template side (appliance.relay.keeper,
issue 40 item 2): no trio, the fork template's selector driven step by step, real unix and
loopback TCP sockets. A dead worker's connections go to the next worker that says hello —
the very same connections, not copies of their bytes — except those it dropped before it
died; and the message codecs raise only KeeperError."""

from __future__ import annotations

import json
import os
import selectors
import socket
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.dtls.tlsrecord import SessionKeys
from appliance.relay.keeper import (
    MAX_MESSAGE,
    Keeper,
    KeeperError,
    Message,
    encode_message,
    keeper_name,
    kept_record,
    parse_kept_untrusted,
    parse_message_untrusted,
)

TLS_KEYS = SessionKeys("TLS_AES_128_GCM_SHA256", bytes(32), bytes(range(32)))
TLS_STATE = {"k": TLS_KEYS.to_record()}


@pytest.fixture
def keeper(tmp_path: object) -> Iterator[tuple[Keeper, selectors.BaseSelector]]:
    sel = selectors.DefaultSelector()
    k = Keeper(keeper_name(str(tmp_path), 0, 0))
    k.register(sel)
    assert k.listener is not None
    yield k, sel
    k.close()
    sel.close()


def spin(sel: selectors.BaseSelector) -> None:
    """Run the template's loop until nothing is ready (what serve_fork_template does)."""
    while events := sel.select(0):
        for key, mask in events:
            key.data(mask)


def tcp_pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    """(client, accepted) over loopback."""
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    return client, accepted


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    s = socket.create_server(("127.0.0.1", 0))
    yield s
    s.close()


def worker(k: Keeper) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(k.name)
    socket.send_fds(s, [encode_message(Message("hello"))], [])
    return s


def keep(w: socket.socket, ident: int, conn: socket.socket, port: int) -> None:
    rec = kept_record("ice", ("198.51.100.7", port), ("127.0.0.1", 3478))
    socket.send_fds(w, [encode_message(Message("keep", ident, rec))], [conn.fileno()])


def adopted(w: socket.socket) -> list[tuple[Message, socket.socket]]:
    out: list[tuple[Message, socket.socket]] = []
    w.setblocking(False)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(w, MAX_MESSAGE, 4)
        except BlockingIOError:
            return out
        assert len(fds) == 1
        out.append((parse_message_untrusted(data), socket.socket(fileno=fds[0])))


def test_a_turn_tls_connection_travels_with_its_board(
        keeper: tuple[Keeper, selectors.BaseSelector], listener: socket.socket) -> None:
    """A kept connection with a slot on its worker's board (relay/board.py) comes with a
    second descriptor, the board: both go to the next worker, the record with its slot (a
    TURN/TLS one's with its keys). A keep with more descriptors than that is refused
    (closed, not kept)."""
    k, sel = keeper
    a = worker(k)
    c1, s1 = tcp_pair(listener)
    board = os.memfd_create("board")
    os.ftruncate(board, 256)
    rec = kept_record("turn", ("198.51.100.7", 9), ("127.0.0.1", 3478), b"{}", TLS_STATE, 3)
    socket.send_fds(a, [encode_message(Message("keep", 1, rec))], [s1.fileno(), board])
    socket.send_fds(a, [encode_message(Message("keep", 2, rec))], [s1.fileno(), board, board])
    # Two more on the same board, one dropped: the keeper holds one copy of the board,
    # counted by its users, not one per connection.
    c3, s3 = tcp_pair(listener)
    socket.send_fds(a, [encode_message(Message("keep", 3, rec))], [s3.fileno(), board])
    spin(sel)
    assert k.kept == 2 and len(k.boards) == 1 and list(k.board_refs.values()) == [2]
    socket.send_fds(a, [encode_message(Message("drop", 3))], [])
    s3.close()
    spin(sel)
    assert k.kept == 1 and list(k.board_refs.values()) == [1]
    c3.settimeout(5)
    assert c3.recv(10) == b""  # its last copy went
    s1.close()
    os.close(board)
    a.close()
    spin(sel)
    b = worker(k)
    spin(sel)
    b.setblocking(False)
    data, fds, _, _ = socket.recv_fds(b, MAX_MESSAGE, 4)
    assert len(fds) == 2
    kept = parse_kept_untrusted(parse_message_untrusted(data).record)
    assert kept.tls is not None and kept.slot == 3 and kept.tls.state is None
    assert kept.tls.keys == TLS_KEYS
    assert os.fstat(fds[1]).st_size == 256  # the board itself
    conn = socket.socket(fileno=fds[0])
    c1.sendall(b"still the same connection")
    conn.settimeout(5)
    assert conn.recv(100) == b"still the same connection"
    conn.close()
    os.close(fds[1])
    c1.close()
    c3.close()
    b.close()


def test_a_dead_workers_connections_go_to_the_next_one_minus_what_it_dropped(
        keeper: tuple[Keeper, selectors.BaseSelector], listener: socket.socket) -> None:
    """The scenario of the issue: worker A keeps two connections, closes one (shutdown,
    drop) and is SIGKILLed; worker B (its successor) says hello and gets the other one —
    the same TCP connection: what the client sends next is read from the adopted fd, and
    what B writes reaches the client — and the closed one's client saw EOF although the
    keeper had held a copy of it."""
    k, sel = keeper
    a = worker(k)
    c1, s1 = tcp_pair(listener)
    c2, s2 = tcp_pair(listener)
    keep(a, 1, s1, 1)
    keep(a, 2, s2, 2)
    spin(sel)
    assert k.kept == 2
    # A closes connection 2 the way relay/tcp.py does now, then dies at once.
    s2.shutdown(socket.SHUT_RDWR)
    s2.close()
    socket.send_fds(a, [encode_message(Message("drop", 2))], [])
    c2.settimeout(5)
    assert c2.recv(10) == b""  # EOF, though the keeper still held a copy then
    s1.close()
    a.close()  # SIGKILL: its end of the link closes with it
    spin(sel)
    assert k.live is None and len(k.orphans) == 1 and k.kept == 1
    b = worker(k)
    spin(sel)
    ((msg, sock),) = adopted(b)
    assert msg.op == "adopt" and msg.ident < 0
    assert tuple(parse_kept_untrusted(msg.record).client) == ("198.51.100.7", 1)
    c1.sendall(b"\x00\x02hi")
    sock.settimeout(5)
    assert sock.recv(10) == b"\x00\x02hi"  # the same connection, at its frame boundary
    sock.sendall(b"\x00\x02ok")
    c1.settimeout(5)
    assert c1.recv(10) == b"\x00\x02ok"
    assert k.live is not None and not k.orphans
    assert list(k.workers[k.live]) == [msg.ident]  # B owns it now
    # B drops it in turn: the keeper's copy goes, and the client sees the end.
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    socket.send_fds(b, [encode_message(Message("drop", msg.ident))], [])
    spin(sel)
    assert k.kept == 0 and c1.recv(10) == b""
    for s in (b, c1, c2):
        s.close()


def test_a_hello_first_applies_the_dead_workers_last_drops(
        keeper: tuple[Keeper, selectors.BaseSelector], listener: socket.socket) -> None:
    """The successor's hello can be read before its predecessor's EOF (the loop sees both
    ready at once): the keeper drains every other worker's pending messages first, so the
    dead worker's last drop is applied and that connection is not handed over."""
    k, sel = keeper
    a = worker(k)
    spin(sel)  # A accepted and said hello
    c1, s1 = tcp_pair(listener)
    c2, s2 = tcp_pair(listener)
    keep(a, 1, s1, 1)
    keep(a, 2, s2, 2)
    socket.send_fds(a, [encode_message(Message("drop", 2))], [])
    a.close()
    b = worker(k)  # B connects and says hello; its message is handled first, by hand
    k._accept(0)
    (conn_b,) = [w for w in k.workers if w is not k.live]
    k._readable(conn_b, selectors.EVENT_READ)
    ((msg, sock),) = adopted(b)
    assert parse_kept_untrusted(msg.record).client[1] == 1
    assert k.kept == 1 and len(k.workers) == 1
    for s in (b, c1, c2, s1, s2, sock):
        s.close()


def test_orphans_wait_for_a_worker_and_a_fork_closes_every_copy(
        keeper: tuple[Keeper, selectors.BaseSelector], listener: socket.socket) -> None:
    k, sel = keeper
    a = worker(k)
    c1, s1 = tcp_pair(listener)
    keep(a, 1, s1, 1)
    # An update (no fd) replaces the record only; junk and unexpected fds are refused.
    socket.send_fds(a, [encode_message(Message("keep", 1, kept_record(
        "turn", ("198.51.100.7", 1), ("127.0.0.1", 3478), b'{"v":1}')))], [])
    socket.send_fds(a, [b"junk"], [s1.fileno()])
    spin(sel)
    (_fds, rec), = k.workers[next(iter(k.workers))].values()
    assert rec["t"] == "turn" and k.kept == 1
    s1.close()
    a.close()
    spin(sel)
    assert len(k.orphans) == 1  # held: nobody to give it to (its only descriptor left)
    copies = [fd for fds, _ in k.orphans for fd in fds]
    k.close_in_fork()
    for fd in copies:
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(fd)
    c1.settimeout(5)
    assert c1.recv(10) == b""  # the last copy went: the client sees the end
    c1.close()


def test_the_name_is_per_directory_cluster_and_worker(tmp_path: object) -> None:
    a = keeper_name(str(tmp_path), 0, 0)
    assert a.startswith(b"\0appliance-keeper-")
    assert len({a, keeper_name(str(tmp_path), 0, 1), keeper_name(str(tmp_path), 1, 0),
                keeper_name("/elsewhere", 0, 0)}) == 4


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=4),
    max_leaves=16)


@given(st.one_of(
    st.binary(max_size=300),
    _json.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["op", "id", "rec"]), _json).map(
        lambda d: json.dumps(d).encode()),
    st.builds(lambda op, i, rec: json.dumps({"op": op, "id": i, "rec": rec}).encode(),
              st.sampled_from(["hello", "keep", "drop", "adopt"]), st.integers(), _json),
))
def test_messages_and_records_raise_only_keeper_error(data: bytes) -> None:
    for n in (len(data), *range(0, len(data), 17)):
        try:
            msg = parse_message_untrusted(data[:n])
        except KeeperError:
            continue
        try:
            parse_kept_untrusted(msg.record)
        except KeeperError:
            pass


@given(st.dictionaries(st.sampled_from(["t", "c", "l", "a", "tls", "b"]), _json))
def test_mutated_records_raise_only_keeper_error(rec: dict[str, object]) -> None:
    base = kept_record("turn", ("198.51.100.7", 1), ("127.0.0.1", 3478), b"{}")
    try:
        kept = parse_kept_untrusted({**base, **rec})
    except KeeperError:
        return
    assert kept.kind in ("ice", "turn")


@given(st.dictionaries(st.sampled_from(["k", "st", "p"]), _json),
       st.dictionaries(st.sampled_from(["s", "r", "w"]), _json),
       st.none() | st.integers())
def test_mutated_tls_states_raise_only_keeper_error(tls: dict[str, object],
                                                    keys: dict[str, object],
                                                    slot: int | None) -> None:
    state: dict[str, object] = {**TLS_STATE, **tls}
    if isinstance(state.get("k"), dict):
        state["k"] = {**state["k"], **keys}  # type: ignore[dict-item]
    try:
        kept = parse_kept_untrusted(kept_record("turn", ("198.51.100.7", 1),
                                                ("127.0.0.1", 3478), b"{}", state, slot))
    except KeeperError:
        return
    assert kept.tls is not None and (kept.slot is None) != (kept.tls.state is None)


def test_tls_states_round_trip_and_a_roll_carries_the_numbers() -> None:
    rolled = {"k": TLS_KEYS.to_record(), "st": [1, 2, 0, 7]}
    kept = parse_kept_untrusted(kept_record("turn", ("198.51.100.7", 1), ("127.0.0.1", 3478),
                                            b"{}", rolled))
    assert kept.tls is not None and kept.tls.state == (1, 2, 0, 7) and kept.slot is None
    assert kept.tls.partial == b""
    half = parse_kept_untrusted(kept_record("turn", ("198.51.100.7", 1), ("127.0.0.1", 3478),
                                            b"{}", {**rolled, "p": "0001"}))
    assert half.tls is not None and half.tls.partial == b"\x00\x01"  # a message half read
    for bad, slot in (({"k": TLS_KEYS.to_record()}, None), (rolled, 1),
                      ({**rolled, "st": [1, 2, 3]}, None),
                      ({"k": {**TLS_KEYS.to_record(), "r": "00"}}, 1),
                      ({"k": TLS_KEYS.to_record(), "p": "00"}, 1), ({**rolled, "p": "0g"}, None)):
        with pytest.raises(KeeperError):
            parse_kept_untrusted(kept_record("turn", ("198.51.100.7", 1), ("127.0.0.1", 3478),
                                             b"{}", bad, slot))
    with pytest.raises(KeeperError, match="non-TURN"):
        parse_kept_untrusted(kept_record("ice", ("198.51.100.7", 1), ("127.0.0.1", 3478),
                                         None, rolled))
