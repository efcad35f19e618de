"""The roll's hand-over: a relay worker replaced in a rolling restart (SIGHUP) leaves its
established TCP connections to its successor, which carries on with the same connections
(issue 40), as a killed worker's go to its successor through the keeper (:mod:`.keeper`).

Why a direct hand-over, not the keeper's orphan push: a roll
(:meth:`appliance.children.Supervisor.replace`) stops the worker's fork template *first* —
it runs the old code — and starts the successor as a fresh process, not a fork; a new
template follows only once the step is over. So during a roll step there is no keeper: none
holds a copy of the predecessor's connections, and none would push them. Making the keeper
outlive the step would mean changing the supervisor (a new-code template before the
successor, the old keeper's copies moved into it) for what is, in a roll, a direct meeting:
the two lives of a worker index overlap — the successor is ready before its predecessor is
told to stop — so the predecessor gives its connections straight to it, over the same
messages the keeper pushes (``adopt``: id, record, the descriptor by SCM_RIGHTS)::

    predecessor (the live worker i)                   successor (a new life of worker i)
    ───────────────────────────────                   ──────────────────────────────────
    holds the abstract name handover_name(dir, c, i)  Handover.open, before its ready line:
      and accepts on it                                 the name is held: connect,
                        ◄──────────────────────────────  SO_PEERCRED, hello
                                                        ── ready line ──► the supervisor
    SIGTERM ─► leave(): a successor said hello and     SIGTERM's the predecessor
      is still there: a roll. The name is let go;
      every kept connection whose task the stop
      cancels is *released* (TcpListener: no
      shutdown), not closed
    … tasks done, sockets closed, TURN relayed ports
      closed (the successor binds them again):
    send_released(): each one's unsent bytes written
      out, then  adopt id + record + fd  ────────────► KeeperLink.take_handed: into its
      (the record made at the stop: a TURN/TCP         listener's table, reader and writer
      allocation's snapshot as of then)                running, TURN allocation re-created;
    close: the link ── EOF ───────────────────────────► kept at our keeper once it is up;
                                                        holds the name from now on

What makes it exact, and what closes as before:

* **Only a roll hands over.** A stop hands over only when a successor of the same worker
  index said hello and has not hung up: a full shutdown (SIGTERM or SIGINT to the relay,
  ``appliance down``, the supervisor cancelled) has none, so every connection is shut down
  and closed as before (FIN) — and so is every connection left over when the successor
  goes away mid-hand-over (a send fails) or the hand-over runs out of time
  (:data:`HANDOVER_WAIT`, under the supervisor's 2 s stop grace).
* **Only kept connections**: established ones (ICE-TCP with a flow, TURN/TCP and TURN/TLS
  with an allocation — TLS with its keys, record sequence numbers and any TURN message
  half read across its records in its record), and only those whose task the stop ends: one that ends by itself meanwhile (its peer gone, bad input, idle)
  closes.
* **At a frame boundary, both ways.** Reads take only whole frames out of the kernel
  (relay/tcp.py), and a stop cancels a reader only between two reads; what the worker had
  framed but the kernel had not taken — the rest of a frame half written when the stop
  came — is written out before the descriptor goes (the graceful stop can wait for it, a
  kill cannot). A connection whose bytes do not drain within :data:`WRITE_WAIT` (its
  client's receive window stays full) is closed instead: a corrupt stream would be worse.
* **TURN/TCP allocations travel with their connection**: the record is made at the stop
  (:meth:`appliance.proto.turn.server.TurnServer.keep`), so a change the keeper link had
  not yet sent is in it; the relayed sockets are closed before the first descriptor is
  sent, so the successor can bind the same relayed ports again.
* **The name moves with the connections.** The predecessor lets go of the name when it
  commits to the hand-over; the successor binds it as soon as it can (each wake-up of the
  link, at the latest at its EOF, which comes after the last descriptor), ready for the
  next roll. A successor forked after a kill finds the name free and holds it at once.

Trust as for the keeper: an abstract name derived from the private directory of the
worker index, ``SO_PEERCRED`` (same uid) checked on both ends, messages parsed untrusted
(only :class:`~.keeper.KeeperError` inside; a bad one is dropped and counted).

Counters: ``tcp_handed_over`` (the predecessor's, gone with it: in its log line),
``tcp_taken_over`` (the successor's); drops ``handover-adopt-failed`` (a connection the
successor could not take: shut down, its client restarts ICE), ``handover-send-failed``,
``handover-write-timeout``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

import trio

from .counters import Counters
from .keeper import (
    TICK,
    KeeperError,
    KeeperLink,
    Message,
    _close_fds,
    _receive_nowait,
    _same_uid,
    accept_same_uid,
    encode_message,
    keeper_name,
    parse_message_untrusted,
)

log = logging.getLogger("appliance.relay.server")

__all__ = ["HANDOVER_WAIT", "WRITE_WAIT", "Handover", "handover_name"]

#: How long a stopping worker may spend handing its connections over, in all (the
#: supervisor's stop grace is 2 s, then SIGKILL)...
HANDOVER_WAIT = 1.0
#: ... of which at most this writing out what its connections' clients had yet to receive.
WRITE_WAIT = 0.5


def handover_name(state_dir: str, cluster: int, worker: int) -> bytes:
    """The abstract unix socket name a live worker of this index holds for its successor
    in a roll (the keeper's name, :func:`~.keeper.keeper_name`, and a suffix)."""
    return keeper_name(state_dir, cluster, worker) + b"-roll"


class _Released:
    """A connection the stopping worker let go of: its socket, record and unsent bytes."""

    __slots__ = ("backlog", "record", "sock")

    def __init__(self, sock: socket.socket, record: dict[str, Any], backlog: bytes) -> None:
        self.sock = sock
        self.record = record
        self.backlog = bytearray(backlog)


class Handover:
    """One worker's end of the roll's hand-over (the module docstring): the name holder
    and predecessor, or the successor until its predecessor is gone. ``close`` is how a
    connection that is not handed over ends (relay/tcp.py: discard, shutdown, close)."""

    def __init__(self, name: bytes, counters: Counters, link: KeeperLink,
                 close: Callable[[socket.socket], None]) -> None:
        self.name = name
        self.counters = counters
        self.link = link
        self.close_connection = close
        #: while we hold the name: the listening socket
        self.listener: socket.socket | None = None
        #: successors that connected, oldest first, each with whether it said hello
        self.successors: list[tuple[socket.socket, bool]] = []
        #: the successor this stop hands over to (set by :meth:`leave`)
        self.successor: socket.socket | None = None
        #: our predecessor, while we are its successor
        self.predecessor: socket.socket | None = None
        self.released: list[_Released] = []

    @property
    def leaving(self) -> bool:
        """A stop for a roll is under way: kept connections are released, not closed."""
        return self.successor is not None

    # -- start: holder, or a predecessor's successor --------------------------------------

    def open(self) -> None:
        """Before the ready line: hold the name, or — a live worker holds it: this is a roll
        — connect to it and say hello, so that it knows of us before it is told to stop."""
        if self._bind():
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.setblocking(False)
            sock.connect(self.name)
            if not _same_uid(sock):
                raise OSError("the hand-over socket belongs to another user")
            socket.send_fds(sock, [encode_message(Message("hello"))], [],
                            socket.MSG_DONTWAIT)
        except OSError as exc:
            sock.close()  # no predecessor to take from; run() holds the name once it can
            log.info("relay: no predecessor to take TCP connections from (%s)", exc)
            return
        self.predecessor = sock
        log.info("relay: a predecessor is live; its TCP connections come here when it stops")

    def _bind(self) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.bind(self.name)
            sock.listen(8)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return False
        self.listener = sock
        return True

    async def run(self) -> None:
        """Until cancelled: take what the predecessor hands over, hold the name once it is
        free, accept successors. (The sockets outlive it: :meth:`send_released` runs after
        the worker's tasks, :meth:`close` last.)"""
        while True:
            if self.predecessor is not None:
                await trio.lowlevel.wait_readable(self.predecessor)
                self._receive()
            elif self.listener is None:
                if not self._bind():
                    await trio.sleep(TICK)  # the predecessor's last moments
            else:
                await trio.lowlevel.wait_readable(self.listener)
                self._accept()

    def _receive(self) -> None:
        sock = self.predecessor
        while sock is not None:
            got = _receive_nowait(sock)
            if got is None:
                break
            data, fds, flags = got
            if not data:  # it is gone: every connection it handed over is in
                sock.close()
                self.predecessor = sock = None
                break
            self.link.take_handed(data, fds, flags)
        if self.listener is None:
            self._bind()  # free once the predecessor committed to the hand-over

    def _accept(self) -> None:
        assert self.listener is not None
        while (conn := accept_same_uid(self.listener)) is not None:
            self.successors = [s for s in self.successors if self._alive(s) is not None]
            self.successors.append((conn, False))

    def _alive(self, entry: tuple[socket.socket, bool]) -> tuple[socket.socket, bool] | None:
        """``entry`` updated with what it sent meanwhile, or None (closed) if it hung up."""
        sock, hello = entry
        while (got := _receive_nowait(sock)) is not None:
            data, fds, _ = got
            _close_fds(fds)
            if not data:
                sock.close()
                return None
            try:
                hello = hello or parse_message_untrusted(data).op == "hello"
            except KeeperError:
                pass
        return sock, hello

    # -- the predecessor's stop ------------------------------------------------------------

    def leave(self) -> bool:
        """A stop begins (SIGTERM/SIGINT, before the worker's tasks are cancelled): True —
        a roll — if a successor said hello and is still there; kept connections are then
        released to :meth:`release` as their tasks end, and the name is let go."""
        if self.listener is None:
            return False
        self._accept()  # one that connected just before its ready line, not yet accepted
        live = [e for e in map(self._alive, self.successors) if e is not None]
        self.successors = []
        for sock, hello in reversed(live):  # the newest live one
            if hello and self.successor is None:
                self.successor = sock
            else:
                sock.close()
        if self.successor is None:
            return False
        self.listener.close()  # the successor holds the name from now on
        self.listener = None
        return True

    def release(self, sock: socket.socket, record: dict[str, Any], backlog: bytes) -> None:
        """A kept connection the stop let go of (relay/tcp.py): handed over by
        :meth:`send_released`, else closed by :meth:`close`."""
        self.released.append(_Released(sock, record, backlog))

    async def send_released(self) -> None:
        """In the stopping worker's cleanup (shielded, under :data:`HANDOVER_WAIT`), after
        its tasks and sockets: finish each released connection's writes, then send it."""
        successor = self.successor
        if successor is None or not self.released:
            return
        with trio.move_on_after(WRITE_WAIT):
            async with trio.open_nursery() as nursery:
                for rel in self.released:
                    if rel.backlog:
                        nursery.start_soon(self._finish_writes, rel)
        handed = 0
        while self.released:
            rel = self.released[-1]
            if rel.backlog:  # half a frame would stay unwritten: close it instead
                self.counters.drop("handover-write-timeout")
                self.released.pop()
                self.close_connection(rel.sock)
                continue
            handed += 1
            msg = encode_message(Message("adopt", handed, rel.record))
            try:
                while True:
                    try:
                        socket.send_fds(successor, [msg], [rel.sock.fileno()],
                                        socket.MSG_DONTWAIT)
                        break
                    except (BlockingIOError, InterruptedError):
                        await trio.lowlevel.wait_writable(successor)
            except (OSError, ValueError) as exc:
                self.counters.drop("handover-send-failed")
                log.warning("relay: the successor went away mid-hand-over (%s)", exc)
                return  # the rest are closed by close()
            self.released.pop()
            rel.sock.close()  # our descriptor only: no shutdown, the successor has it now
            self.counters.add("tcp_handed_over")
        log.info("relay: %d TCP connections handed to the successor", handed)

    async def _finish_writes(self, rel: _Released) -> None:
        sock = rel.sock
        while rel.backlog:
            try:
                n = sock.send(rel.backlog)
            except (BlockingIOError, InterruptedError):
                await trio.lowlevel.wait_writable(sock)
                continue
            except OSError:
                return  # broken: the successor would find it so too; left to close()
            del rel.backlog[:n]

    def close(self) -> None:
        """Last: every connection not handed over is closed (its client sees the end), the
        name let go, the links closed (the successor reads EOF: everything is in)."""
        for rel in self.released:
            self.close_connection(rel.sock)
        self.released.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        for sock, _ in self.successors:
            sock.close()
        self.successors.clear()
        for link in (self.successor, self.predecessor):
            if link is not None:
                link.close()
        self.successor = self.predecessor = None
