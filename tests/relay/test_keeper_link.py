"""The worker's end of the keeper link (appliance.relay.keeper.KeeperLink, issue 40 item 2):
what a keeper hears first on (re)connecting is each kept connection's *latest* record, a
change made while there was no keeper included. Stress 37 found the gap: a TURN/TCP
client's ChannelBind was handled before the worker's link reached its new template; the
link connected and sent the record of the bare Allocate, the change would have followed a
tick later, and the kill came in between: the successor adopted an allocation without the
channel and dropped every ChannelData (``turn-channel-unbound``). The keeper side is
tests/relay/test_keeper.py; the whole path, tests/reliability/test_tcp_failover.py."""

from __future__ import annotations

import json
import selectors
import socket
from pathlib import Path
from typing import Any

import trio

from appliance.relay.counters import Counters
from appliance.relay.keeper import Keeper, KeeperLink, keeper_name, kept_record

LISTENER = ("127.0.0.1", 3478)


def spin(sel: selectors.BaseSelector) -> None:
    """The template's loop until nothing is ready (as in test_keeper.py)."""
    while events := sel.select(0):
        for key, mask in events:
            key.data(mask)


async def test_a_change_made_with_no_keeper_is_in_what_it_hears_first(tmp_path: Path) -> None:
    name = keeper_name(str(tmp_path), 0, 0)
    changed: list[tuple[int, dict[str, Any]]] = []

    def poll() -> None:  # the TURN gate's kept-allocation changes, as server.py polls them
        while changed:
            link.update(*changed.pop())

    link = KeeperLink(name, Counters(), lambda *_: False, poll)
    ours, theirs = socket.socketpair()
    try:
        before = kept_record("turn", ("198.51.100.7", 1), LISTENER, b"allocate")
        after = kept_record("turn", ("198.51.100.7", 1), LISTENER, b"allocate+channel")
        ident = link.keep(ours, before)  # no template yet: it waits
        changed.append((ident, after))  # a ChannelBind, meanwhile
        sel = selectors.DefaultSelector()
        keeper = Keeper(name)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.run)
            await trio.lowlevel.checkpoint()  # the link's first try: no keeper yet
            keeper.register(sel)  # the template is up
            await link.connected.wait()
            spin(sel)  # what it sent on connecting, before any later tick
            assert keeper.live is not None
            fd, record = keeper.workers[keeper.live][ident]
            assert record == after
            nursery.cancel_scope.cancel()
        keeper.close()
        sel.close()
    finally:
        ours.close()
        theirs.close()


async def test_follow_sends_a_change_at_once(tmp_path: Path) -> None:
    """``follow`` (the TURN/TCP reader's call after each read it handled): the change goes
    to the keeper now, not at the link's next tick."""
    name = keeper_name(str(tmp_path), 0, 0)
    changed: list[tuple[int, dict[str, Any]]] = []

    def poll() -> None:
        while changed:
            link.update(*changed.pop())

    sel = selectors.DefaultSelector()
    keeper = Keeper(name)
    keeper.register(sel)
    link = KeeperLink(name, Counters(), lambda *_: False, poll)
    ours, theirs = socket.socketpair()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.run)
            await link.connected.wait()
            ident = link.keep(ours, kept_record("turn", ("198.51.100.7", 1), LISTENER, b"a"))
            spin(sel)
            assert keeper.live is not None
            after = kept_record("turn", ("198.51.100.7", 1), LISTENER, b"a+permission")
            changed.append((ident, after))
            link.follow()
            spin(sel)
            assert keeper.workers[keeper.live][ident][1] == after
            nursery.cancel_scope.cancel()
    finally:
        keeper.close()
        sel.close()
        ours.close()
        theirs.close()


async def test_a_pushed_copy_of_a_connection_we_hold_is_let_go_not_shut_down(
        tmp_path: Path) -> None:
    """The keeper pushes a connection the worker already holds (the listener's ``adopt``
    answers None: its 4-tuple is in the table): the pushed copy is closed *without* a
    shutdown and the keeper told to drop its own — a shutdown would end the very connection
    the worker serves (it did: test_tcp_failover's roll with two workers lost its ICE-TCP
    call to a ``keeper-adopt-failed`` once in ~30 runs)."""
    name = keeper_name(str(tmp_path), 0, 0)
    sel = selectors.DefaultSelector()
    keeper = Keeper(name)
    keeper.register(sel)
    counters = Counters()
    asked: list[int] = []

    def adopt(sock: socket.socket, kept: object, ident: int, board: object) -> bool | None:
        asked.append(ident)
        return None  # ours already

    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        served, _ = listener.accept()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    link = KeeperLink(name, counters, adopt)  # type: ignore[arg-type]
    try:
        # A dead worker's copy of the connection, an orphan at the keeper.
        dead.connect(name)
        rec = kept_record("ice", ("127.0.0.1", client.getsockname()[1]), LISTENER)
        socket.send_fds(dead, [b'{"op":"hello"}'], [])
        socket.send_fds(dead, [b'{"op":"keep","id":1,"rec":%s}' % json.dumps(rec).encode()],
                        [served.fileno()])
        spin(sel)
        dead.close()
        spin(sel)
        assert len(keeper.orphans) == 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.run)
            await link.connected.wait()
            spin(sel)  # the hello: the orphan is pushed to the link
            with trio.fail_after(5):
                while not asked:  # noqa: ASYNC110 - the keeper's push, read on the link's tick
                    await trio.sleep(0.01)
            spin(sel)  # the link's drop
            nursery.cancel_scope.cancel()
        assert counters.drops == {"keeper-duplicate": 1}, counters.drops
        assert keeper.kept == 0  # the keeper let its copy go too
        # The connection lives: both ways.
        served.sendall(b"still here")
        client.settimeout(5)
        assert client.recv(100) == b"still here"
        client.sendall(b"and back")
        served.settimeout(5)
        assert served.recv(100) == b"and back"
    finally:
        keeper.close()
        sel.close()
        client.close()
        served.close()
