"""The worker's end of the keeper link (appliance.relay.keeper.KeeperLink, issue 40 item 2):
what a keeper hears first on (re)connecting is each kept connection's *latest* record, a
change made while there was no keeper included. Stress 37 found the gap: a TURN/TCP
client's ChannelBind was handled before the worker's link reached its new template; the
link connected and sent the record of the bare Allocate, the change would have followed a
tick later, and the kill came in between: the successor adopted an allocation without the
channel and dropped every ChannelData (``turn-channel-unbound``). The keeper side is
tests/relay/test_keeper.py; the whole path, tests/reliability/test_tcp_failover.py."""

from __future__ import annotations

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
