"""The keeper: a relay worker's TCP connections outlive a SIGKILL of the worker (issue 40
item 2).

A worker's UDP calls survive its death because nothing of theirs is in the process: its warm
standby forks a successor in milliseconds (docs/reliability.md), the successor re-learns the
flows (:mod:`.reseed`) and re-creates TURN/UDP allocations (:mod:`.turn_store`). A TCP
connection is different: its socket *is* in the process, and the kernel closes it (FIN) when
the last descriptor of it goes. So a second descriptor of every established connection is
held elsewhere — by the keeper, in the worker's fork template (the standby process: no trio
loop, a ``selectors`` loop, :func:`appliance.children.serve_fork_template`) — and handed to
the successor, which carries on reading and writing the same connection. The client never
notices more than the gap the UDP calls have::

    worker (trio)                         fork template of worker i (selectors)
    ─────────────                         ──────────────────────────────────────
    KeeperLink ──unix SOCK_SEQPACKET──►  Keeper  (abstract name from the worker index's
      hello                                       private directory: keeper_name)
      keep  id + record  + fd (SCM_RIGHTS)   holds a copy of the fd and the record
      keep  id + record  (no fd: an update: a TURN/TCP allocation changed)
      drop  id                               closes its copy
                          ◄── EOF: the worker died: its connections become orphans
    successor (forked by the template)
      hello ─────────────────────────────►  pushes every orphan to the live worker:
      ◄── adopt  id + record + fd             (or holds them until one says hello)
    TcpListener.adopt: back into its listener's table, its reader and writer tasks running,
    already flowed; an ICE-TCP flow is re-learnt by asking the transceivers (reseed.py), a
    TURN/TCP allocation re-created from the record (TurnServer.import_allocation)

What makes the hand-over exact:

* **A connection is kept once it is established** — ICE-TCP once the core made a flow of
  it, TURN/TCP once it has an allocation (the record then carries the allocation's snapshot,
  :mod:`appliance.proto.turn.snapshot`, updated as it changes) — and **dropped when it
  ends**. Closing one in the worker is now ``shutdown(SHUT_RDWR)`` before ``close()``:
  the keeper's copy would otherwise keep it open. TURN over TLS too: after OpenSSL's
  handshake the relay does the records itself (relay/tls.py), and its record carries the
  session's keys.
* **A second descriptor goes with it: the worker's board** (relay/board.py), a memfd with
  a slot per kept connection, for what changes too often to send and must be exact at the
  kill: before each send, the bytes it hands the kernel (and TLS's write state after
  them); for TLS, the read state around each take, with any TURN message left half read
  across records. The successor checks the slot against the kernel's count of the stream,
  writes first what the dead worker had half handed the kernel — **a frame cut in two by
  the kill is finished** — and carries TLS on with the right sequence numbers and the
  half-read message; when the slot cannot account for the kernel's count (not expected)
  the connection is closed (``tcp-resume``), never fed a wrong frame or record. A connection kept without a slot (the board full) is
  carried on as before, and a kill that cuts one of its frames breaks its stream.
* **Streams stay at a frame boundary in the kernel, reading.** The worker peeks
  (``MSG_PEEK``) and takes only whole RFC 4571 frames / TURN messages / TLS records out of
  the socket (:func:`appliance.proto.framing.frame_spans_untrusted`,
  :func:`appliance.proto.turn.message_spans_untrusted`), so a kill between two reads leaves
  nothing half-read for the successor (relay/tcp.py).
* **A dead worker's last drops count.** Before the keeper acts on a worker's EOF or on a
  hello it drains every other worker connection's pending messages, so a connection the
  dead worker closed just before it died is not handed over.
* **Ownership moves with the push**: an adopted connection belongs to the worker it was
  pushed to, under an id the keeper chose (negative: a worker's own are positive), which
  that worker then updates and drops like its own.
* The forked successor closes every keeper descriptor it inherited from the template
  (:meth:`Keeper.close_in_fork`) and receives the ones it adopts afresh.

Trust: the keeper's socket is in the abstract namespace (no file to leave behind or
protect), named from the private directory the supervisor gives every life of a worker
index (``--turn-state-dir``; ``appliance up``: ``<state dir>/relay``), and each side checks
the other's ``SO_PEERCRED`` (same uid) before it sends or accepts a descriptor. Messages are
parsed as untrusted anyway (:func:`parse_message_untrusted`, :func:`parse_kept_untrusted`:
only :class:`KeeperError` escapes; fuzzed). No private directory (a lone worker), no keeper:
today's behaviour, a kill closes its connections.

A graceful stop (SIGTERM) closes the worker's connections as before — unless it is a
rolling restart's (SIGHUP). A roll replaces the standby too (it runs the old code) and
starts the successor fresh, not forked, so there is no keeper during the step; instead the
worker being replaced hands its established connections straight to its successor, which
said hello before its ready line (:mod:`.handover`, :meth:`KeeperLink.take_handed`: the
same ``adopt`` messages, the successor's own ids, and kept at its keeper once its new
template is up).

Counters (the worker's): ``tcp_kept`` (connections handed to the keeper), ``tcp_adopted``
(connections taken over from it), ``tcp_taken_over`` (from a roll's predecessor,
:mod:`.handover`), ``keeper_connects``; drops ``keeper-unavailable`` (a
streak of failed connects to the keeper: its template is not up yet, or there is none),
``keeper-adopt-failed`` (a pushed connection that could not be taken over: closed, the
client restarts ICE), ``keeper-send-failed`` (the link broke mid-message: reconnected, and
everything kept is sent again).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import ipaddress
import json
import logging
import os
import select
import selectors
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from ..proto.dtls import DtlsError
from ..proto.dtls.tlsrecord import SessionKeys
from ..proto.proxy import StreamAddr
from .board import Board
from .counters import Counters
from .transport import Address

log = logging.getLogger("appliance.relay.server")

__all__ = [
    "Keeper", "KeeperError", "KeeperLink", "Kept", "Message", "encode_message",
    "keeper_name", "kept_record", "parse_kept_untrusted", "parse_message_untrusted",
]

#: Largest message either side sends or accepts (a record holds at most one allocation
#: snapshot, itself at most 8192 bytes: proto/turn/snapshot.py).
MAX_MESSAGE = 16384
#: Connections one keeper holds at most (every worker's together): past it a keep is
#: refused (its copy closed at once) and that connection dies with its worker, as before.
MAX_KEPT = 65536
#: How often a worker tries to reach its keeper until it is up (the first life starts
#: before its template; a new template starts 1 s after a takeover), and how often it
#: retries sending what the kernel would not take at once.
TICK = 0.05
#: How long the keeper waits for a slow worker to take a pushed message before leaving the
#: rest orphaned (they are pushed again at the next hello).
SEND_WAIT = 1.0
OPS = frozenset({"hello", "keep", "drop", "adopt"})
#: Descriptors one message carries at most: a connection's, and its worker's board
#: (relay/board.py).
MAX_FDS = 2
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _receive_nowait(sock: socket.socket) -> tuple[bytes, list[int], int] | None:
    """One message with its descriptors, without blocking, for both ends: None when none
    is pending, an empty message at EOF (a broken link reads as one)."""
    try:
        msg, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE + 1, MAX_FDS, socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b"", [], 0
    return msg, fds, flags


class KeeperError(Exception):
    """A keeper message or kept record that does not parse; ``hint`` is the reason."""

    def __init__(self, message: str, hint: str = "malformed") -> None:
        super().__init__(message)
        self.hint = hint


def keeper_name(state_dir: str, cluster: int, worker: int) -> bytes:
    """The abstract unix socket name of worker ``worker``'s keeper: every life of the worker
    index, and its fork template, derive the same one from the private directory they are
    given (two appliances on one host have two directories, so two names)."""
    digest = hashlib.sha256(os.path.realpath(state_dir).encode()).hexdigest()[:32]
    return b"\0appliance-keeper-%s-c%d-w%d" % (digest.encode(), cluster, worker)


@dataclass(frozen=True, slots=True)
class Message:
    """One keeper message: ``op`` (hello, keep, drop, adopt), the connection's id, its record."""

    op: str
    ident: int = 0
    record: dict[str, Any] | None = None


def encode_message(msg: Message) -> bytes:
    obj: dict[str, Any] = {"op": msg.op}
    if msg.ident:
        obj["id"] = msg.ident
    if msg.record is not None:
        obj["rec"] = msg.record
    data = json.dumps(obj, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError("keeper message too long")
    return data


def parse_message_untrusted(data: bytes | bytearray | memoryview) -> Message:
    """The message in ``data``. Raises only :class:`KeeperError`."""
    if len(data) > MAX_MESSAGE:
        raise KeeperError("message too long", "too-long")
    try:
        obj = json.loads(bytes(data))
    except (ValueError, RecursionError):
        raise KeeperError("not JSON") from None
    if not isinstance(obj, dict):
        raise KeeperError("not an object")
    op = obj.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise KeeperError("unknown op", "op")
    ident = obj.get("id", 0)
    if type(ident) is not int or not -(2**53) < ident < 2**53 or (ident == 0) != (op == "hello"):
        raise KeeperError("bad id", "id")
    record = obj.get("rec")
    if record is not None and not isinstance(record, dict):
        raise KeeperError("record is not an object", "record")
    if (record is None) == (op in ("keep", "adopt")):
        raise KeeperError("record missing or unexpected", "record")
    return Message(op, ident, record)


@dataclass(frozen=True, slots=True)
class KeptTls:
    """A kept TURN/TLS connection's record state: its keys, and — handed over by a roll —
    the numbers themselves (read gen, seq, write gen, seq); kept at a keeper, they are on
    the board at the connection's slot instead (:attr:`Kept.slot`)."""

    keys: SessionKeys
    state: tuple[int, int, int, int] | None = None
    #: handed over by a roll: the TURN message its reader had half read (else b"")
    partial: bytes = b""


@dataclass(frozen=True, slots=True)
class Kept:
    """A kept connection's record, as the worker that adopts it needs it."""

    kind: str  # "ice" (RFC 4571 frames) or "turn" (TURN over TCP or TLS)
    client: StreamAddr  # the client (a front proxy's header's, if any)
    listener: Address  # the public TCP address it reached (which listener takes it)
    #: TURN: the allocation's snapshot record (proto/turn/snapshot.py), None without one
    allocation: bytes | None = None
    #: TURN over TLS: its records' state, None for TCP
    tls: KeptTls | None = None
    #: its slot on its worker's board (relay/board.py, whose descriptor travels with it),
    #: or None (handed over by a roll; or kept without one)
    slot: int | None = None


def kept_record(kind: str, client: Address, listener: Address,
                allocation: bytes | None = None, tls: dict[str, Any] | None = None,
                slot: int | None = None) -> dict[str, Any]:
    """The record of a connection handed to the keeper (:class:`Kept`, as JSON)."""
    rec: dict[str, Any] = {"t": kind, "c": [client[0], client[1]],
                           "l": [listener[0], listener[1]]}
    if allocation is not None:
        rec["a"] = allocation.decode()
    if tls is not None:
        rec["tls"] = tls
    if slot is not None:
        rec["b"] = slot
    return rec


def _kept_tls(obj: object, slot: int | None) -> KeptTls:
    if not isinstance(obj, dict):
        raise KeeperError("bad TLS state", "record")
    try:
        keys = SessionKeys.from_record_untrusted(obj.get("k"))
    except DtlsError:
        raise KeeperError("bad TLS keys", "record") from None
    state = obj.get("st")
    if (slot is None) == (state is None):
        raise KeeperError("TLS state: a slot or the numbers", "record")
    if state is not None:
        if not (isinstance(state, list) and len(state) == 4
                and all(type(v) is int and 0 <= v < 1 << 64 for v in state)):
            raise KeeperError("bad TLS state", "record")
        state = (state[0], state[1], state[2], state[3])
    partial = obj.get("p", "")
    if not isinstance(partial, str) or len(partial) > 2 * 4096 or (partial and state is None):
        raise KeeperError("bad TLS partial message", "record")
    try:
        held = bytes.fromhex(partial)
    except ValueError:
        raise KeeperError("bad TLS partial message", "record") from None
    return KeptTls(keys, state, held)


def _addr(value: object, what: str) -> Address:
    if not (isinstance(value, list) and len(value) == 2):
        raise KeeperError(f"{what} is not [ip, port]", "record")
    ip, port = value
    if not isinstance(ip, str) or len(ip) > 64 or type(port) is not int or \
            not 0 <= port <= 0xFFFF:
        raise KeeperError(f"{what} is not [ip, port]", "record")
    try:
        return (str(ipaddress.ip_address(ip)), port)
    except ValueError:
        raise KeeperError(f"{what}: not an IP address", "record") from None


def parse_kept_untrusted(record: object) -> Kept:
    """The :class:`Kept` of a record pushed by the keeper. Raises only :class:`KeeperError`."""
    if not isinstance(record, dict):
        raise KeeperError("record is not an object", "record")
    kind = record.get("t")
    if kind not in ("ice", "turn"):
        raise KeeperError("unknown connection kind", "record")
    allocation = record.get("a")
    if allocation is not None and (kind != "turn" or not isinstance(allocation, str)
                                   or len(allocation) > MAX_MESSAGE):
        raise KeeperError("bad allocation", "record")
    tls = record.get("tls")
    if tls is not None and kind != "turn":
        raise KeeperError("TLS state of a non-TURN connection", "record")
    slot = record.get("b")
    if slot is not None and (type(slot) is not int or not 0 <= slot < 1 << 24):
        raise KeeperError("bad board slot", "record")
    return Kept(str(kind), StreamAddr(_addr(record.get("c"), "client")),
                _addr(record.get("l"), "listener"),
                None if allocation is None else allocation.encode("utf-8", "replace"),
                None if tls is None else _kept_tls(tls, slot), slot)


def _same_uid(sock: socket.socket) -> bool:
    try:
        _, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                 _CRED.size))
    except OSError:
        return False
    return bool(uid == os.getuid())


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# -- the template side (selectors; no trio) --------------------------------------------------


class Keeper:
    """The fork template's keeper (an :class:`appliance.children.TemplateSource`): the
    module docstring's right-hand column."""

    def __init__(self, name: bytes, max_kept: int = MAX_KEPT) -> None:
        self.name = name
        self.max_kept = max_kept
        self.listener: socket.socket | None = None
        self.sel: selectors.BaseSelector | None = None
        #: each connected worker -> its kept connections: id -> (our fd copies, record);
        #: the connection's, and its worker's board when it has a slot (relay/board.py)
        self.workers: dict[socket.socket, dict[int, tuple[list[int], dict[str, Any]]]] = {}
        #: the worker that said hello last: orphans go to it
        self.live: socket.socket | None = None
        #: connections of dead workers, not pushed yet
        self.orphans: collections.deque[tuple[list[int], dict[str, Any]]] = collections.deque()
        self._next_id = -1
        self.kept = 0
        #: (st_dev, st_ino) of each worker's board -> the one descriptor of it we hold, and
        #: how many kept connections use it (:meth:`_hold`)
        self.boards: dict[tuple[int, int], int] = {}
        self.board_refs: dict[int, int] = {}

    # TemplateSource

    def register(self, sel: selectors.BaseSelector) -> None:
        self.sel = sel
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.bind(self.name)
            sock.listen(64)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()  # no keeper: the worker counts keeper-unavailable, kills close
            log.warning("relay standby: no keeper of TCP connections (%s)", exc)
            return
        self.listener = sock
        sel.register(sock, selectors.EVENT_READ, self._accept)

    def close_in_fork(self) -> None:
        """In the fork (the selector is closed already): drop every descriptor."""
        if self.listener is not None:
            self.listener.close()
        for conn, table in self.workers.items():
            conn.close()
            _close_fds([fds[0] for fds, _ in table.values()])
        _close_fds([fds[0] for fds, _ in self.orphans])
        _close_fds(list(self.boards.values()))  # each board once, however many use it
        self.workers.clear()
        self.orphans.clear()
        self.boards.clear()
        self.board_refs.clear()

    def close(self) -> None:
        """Stop serving (tests; the template simply exits)."""
        if self.sel is not None:
            for sock in [self.listener, *self.workers]:
                if sock is not None:
                    try:
                        self.sel.unregister(sock)
                    except (KeyError, ValueError):
                        pass
        self.close_in_fork()

    # the loop's callbacks

    def _accept(self, mask: int) -> None:
        assert self.listener is not None and self.sel is not None
        while (conn := accept_same_uid(self.listener)) is not None:
            self.workers[conn] = {}
            self.sel.register(conn, selectors.EVENT_READ,
                              functools.partial(self._readable, conn))

    def _readable(self, conn: socket.socket, mask: int) -> None:
        self._pump(conn, top=True)
        self._push()

    def _pump(self, conn: socket.socket, *, top: bool) -> None:
        """Apply every message ``conn`` has pending; at its EOF, its connections become
        orphans — after every other worker's pending messages were applied (``top``)."""
        while conn in self.workers:
            got = _receive_nowait(conn)
            if got is None:
                return
            msg, fds, flags = got
            if not msg:
                _close_fds(fds)
                if top:
                    self._drain_others(conn)
                self._orphan(conn)
                return
            self._apply(conn, msg, fds, flags, top)

    def _drain_others(self, conn: socket.socket) -> None:
        for other in list(self.workers):
            if other is not conn:
                self._pump(other, top=False)

    def _apply(self, conn: socket.socket, data: bytes, fds: list[int], flags: int,
               top: bool) -> None:
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise KeeperError("truncated", "too-long")
            msg = parse_message_untrusted(data)
            if msg.op == "adopt" or (msg.op == "keep" and len(fds) > 2) or (
                    msg.op != "keep" and fds):
                raise KeeperError("unexpected", "op")
        except KeeperError:
            _close_fds(fds)
            return
        table = self.workers[conn]
        if msg.op == "hello":
            if top:
                self._drain_others(conn)  # a dead predecessor's last drops, then its EOF
            self.live = conn
        elif msg.op == "drop":
            entry = table.pop(msg.ident, None)
            if entry is not None:
                self._release(entry[0])
                self.kept -= 1
        else:  # keep: a new connection (with its fd), or an update of a kept one's record
            assert msg.record is not None
            old = table.get(msg.ident)
            if not fds:
                if old is not None:
                    table[msg.ident] = (old[0], msg.record)
                return
            if old is not None:  # the same id again: the newer copy wins
                self._release(old[0])
                self.kept -= 1
            if self.kept >= self.max_kept:
                _close_fds(fds)
                table.pop(msg.ident, None)
                return
            table[msg.ident] = (self._hold(fds), msg.record)
            self.kept += 1

    def _hold(self, fds: list[int]) -> list[int]:
        """A kept connection's descriptors as held: its socket's, and its worker's board's
        — one descriptor per board however many connections use it (each message brings
        its own copy: the extra ones are closed), so a keeper of N connections holds N + 1
        descriptors, not 2N."""
        if len(fds) < 2:
            return list(fds)
        try:
            st = os.fstat(fds[1])
        except OSError:
            _close_fds(fds[1:])
            return fds[:1]
        key = (st.st_dev, st.st_ino)
        held = self.boards.get(key)
        if held is None:
            held = self.boards[key] = fds[1]
        else:
            _close_fds(fds[1:])
        self.board_refs[held] = self.board_refs.get(held, 0) + 1
        return [fds[0], held]

    def _release(self, fds: list[int]) -> None:
        """A kept connection's descriptors let go of (:meth:`_hold`'s other half)."""
        _close_fds(fds[:1])
        if len(fds) > 1:
            board = fds[1]
            left = self.board_refs.get(board, 1) - 1
            if left > 0:
                self.board_refs[board] = left
            else:
                self.board_refs.pop(board, None)
                self.boards = {k: v for k, v in self.boards.items() if v != board}
                _close_fds([board])

    def _orphan(self, conn: socket.socket) -> None:
        table = self.workers.pop(conn)
        if self.sel is not None:
            self.sel.unregister(conn)
        conn.close()
        self.orphans.extend(table.values())
        if self.live is conn:
            self.live = None
        if table:
            log.info("relay standby: %d TCP connections of a dead worker kept", len(table))

    def _push(self) -> None:
        """Hand every orphan to the live worker (it owns them from now on)."""
        live = self.live
        if live is None or not self.orphans:
            return
        table = self.workers[live]
        while self.orphans:
            fds, record = self.orphans[0]
            ident = self._next_id
            try:
                _send_waiting(live, encode_message(Message("adopt", ident, record)), fds)
            except (OSError, ValueError):
                return  # gone or stuck: they stay orphans (its EOF, or the next hello)
            self._next_id -= 1
            self.orphans.popleft()
            table[ident] = (fds, record)


def accept_same_uid(listener: socket.socket) -> socket.socket | None:
    """The next connection on a non-blocking unix ``listener`` from a process of our own
    uid (others are closed), non-blocking; None when there is none now."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # BlockingIOError: none now; anything else: none either
            return None
        if _same_uid(conn):
            conn.setblocking(False)
            return conn
        conn.close()


def _send_waiting(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """Send one message from the template's loop, waiting up to :data:`SEND_WAIT` for room."""
    deadline = time.monotonic() + SEND_WAIT
    while True:
        try:
            socket.send_fds(sock, [data], fds, socket.MSG_DONTWAIT)
            return
        except (BlockingIOError, InterruptedError):
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            select.select([], [sock], [], left)


# -- the worker side (trio) -------------------------------------------------------------------


class KeeperLink:
    """A worker's link to its keeper (the module docstring's left-hand column).

    ``keep``/``update``/``drop`` are called by the TCP listeners from any task and never
    block: a message the kernel will not take at once waits in a small per-id queue (the
    latest state of each connection, not every change) and :meth:`run` sends it. When the
    link breaks (the template died, or is not up yet) :meth:`run` reconnects every
    :data:`TICK` and sends every connection still kept again. ``adopt(sock, kept, ident)``
    is the listeners' taking over of a pushed connection; False: it is closed (shut down)
    and dropped. ``poll`` is called every tick (the TURN gate's kept-allocation changes)."""

    def __init__(self, name: bytes, counters: Counters,
                 adopt: Callable[[socket.socket, Kept, int, Board | None], bool | None],
                 poll: Callable[[], None] | None = None) -> None:
        self.name = name
        self.counters = counters
        self.adopt = adopt
        self.poll = poll
        self.sock: socket.socket | None = None
        #: id -> (the connection's socket, its latest record)
        self.kept: dict[int, tuple[socket.socket, dict[str, Any]]] = {}
        #: id -> what the keeper has yet to hear: "keep" (fd and record), "update", "drop"
        self.outbox: collections.OrderedDict[int, str] = collections.OrderedDict()
        self._ids = 0
        self._failing = False
        #: set once the link has said hello (tests wait on it)
        self.connected = trio.Event()
        #: the board kept connections publish what a successor needs exactly on
        #: (relay/board.py; its descriptor goes with each of them), set by the shell
        self.board: Board | None = None

    # -- the listeners' calls ---------------------------------------------------------------

    def keep(self, sock: socket.socket, record: dict[str, Any]) -> int:
        self._ids += 1
        ident = self._ids
        self.kept[ident] = (sock, record)
        self.outbox[ident] = "keep"
        self.counters.add("tcp_kept")
        self._flush()
        return ident

    def rekeep(self, ident: int, record: dict[str, Any]) -> None:
        """An adopted connection kept again under its id with a new record and descriptors
        (its slot is on our board now): the keeper replaces its copies."""
        entry = self.kept.get(ident)
        if entry is None:
            return
        self.kept[ident] = (entry[0], record)
        self.outbox[ident] = "keep"
        self._flush()

    def update(self, ident: int, record: dict[str, Any]) -> None:
        entry = self.kept.get(ident)
        if entry is None:
            return
        self.kept[ident] = (entry[0], record)
        if self.outbox.get(ident) != "keep":
            self.outbox[ident] = "update"
        self._flush()

    def follow(self) -> None:
        """A kept connection's request may have changed its record (a TURN/TCP ChannelBind,
        CreatePermission, Refresh): the changes go to the keeper now, before the client
        reads the answer and uses what it made, not at the next tick (a kill in between
        would give the successor a record without it)."""
        if self.poll is not None:
            self.poll()

    def drop(self, ident: int) -> None:
        if self.kept.pop(ident, None) is None:
            return
        if self.outbox.pop(ident, None) == "keep":
            return  # the keeper never heard of it
        self.outbox[ident] = "drop"
        self._flush()

    # -- sending ------------------------------------------------------------------------------

    def _flush(self) -> None:
        sock = self.sock
        while sock is not None and self.outbox:
            ident, what = next(iter(self.outbox.items()))
            entry = self.kept.get(ident)
            fds: list[int] = []
            if what == "drop":
                msg = Message("drop", ident)
            else:
                assert entry is not None
                msg = Message("keep", ident, entry[1])
                if what == "keep":
                    fileno = entry[0].fileno()
                    if fileno < 0:  # closed without a drop: nothing to keep
                        del self.outbox[ident]
                        continue
                    fds = [fileno]
                    if "b" in entry[1]:  # its slot's board goes with it
                        if self.board is None:  # pragma: no cover - a slot needs one
                            del self.outbox[ident]
                            continue
                        fds.append(self.board.fd)
            try:
                socket.send_fds(sock, [encode_message(msg)], fds, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return  # run() tries again next tick
            except (OSError, ValueError) as exc:
                self.counters.drop("keeper-send-failed")
                log.warning("relay: the keeper link broke (%s); reconnecting", exc)
                self._lost()
                return
            del self.outbox[ident]

    def _lost(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.connected = trio.Event()

    # -- connecting and receiving --------------------------------------------------------------

    def _connect(self) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.setblocking(False)
            sock.connect(self.name)
            if not _same_uid(sock):
                raise OSError("the keeper's socket belongs to another user")
            socket.send_fds(sock, [encode_message(Message("hello"))], [],
                            socket.MSG_DONTWAIT)
        except OSError:
            sock.close()
            if not self._failing:  # once per streak: its template is not up (yet)
                self._failing = True
                self.counters.drop("keeper-unavailable")
            return False
        self._failing = False
        self.sock = sock
        self.counters.add("keeper_connects")
        # A new keeper knows nothing: everything still kept is sent again, in order.
        self.outbox = collections.OrderedDict((ident, "keep") for ident in self.kept)
        self.connected.set()
        self._flush()
        return True

    def _receive(self) -> None:
        sock = self.sock
        while sock is not None and sock is self.sock:
            got = _receive_nowait(sock)
            if got is None:
                return
            data, fds, flags = got
            if not data:
                _close_fds(fds)
                log.warning("relay: the keeper went away (its standby exited); reconnecting")
                self._lost()
                return
            self._adopt(data, fds, flags)

    def take_handed(self, data: bytes, fds: list[int], flags: int) -> None:
        """An ``adopt`` from the worker this one replaces in a rolling restart
        (:mod:`.handover`): taken over as the keeper's pushes are, but kept under an id of
        our own, and handed to our keeper (the new fork template's, once it is up) as if
        we had accepted it. Counted ``tcp_taken_over`` / ``handover-adopt-failed``."""
        self._adopt(data, fds, flags, handed=True)

    def _adopt(self, data: bytes, fds: list[int], flags: int, *, handed: bool = False) -> None:
        c = self.counters
        failed = "handover-adopt-failed" if handed else "keeper-adopt-failed"
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise KeeperError("truncated", "too-long")
            msg = parse_message_untrusted(data)
            if msg.op != "adopt" or not fds:
                raise KeeperError("not an adopt with a descriptor", "op")
            kept = parse_kept_untrusted(msg.record)
            # with a slot: the dead worker's board too; else just the socket
            if len(fds) != (1 if kept.slot is None else 2):
                raise KeeperError("descriptors", "op")
        except KeeperError:
            _close_fds(fds)
            c.drop(failed)
            return
        board = Board.attach(fds[1]) if len(fds) == 2 else None
        try:
            sock = socket.socket(fileno=fds[0])
        except OSError:
            _close_fds(fds[:1])
            if board is not None:
                board.close()
            c.drop(failed)
            return
        try:
            self._adopt_socket(sock, msg, kept, board, handed)
        finally:
            if board is not None:
                board.close()

    def _adopt_socket(self, sock: socket.socket, msg: Message, kept: Kept,
                      board: Board | None, handed: bool) -> None:
        c = self.counters
        failed = "handover-adopt-failed" if handed else "keeper-adopt-failed"
        assert msg.record is not None
        ident = msg.ident  # the keeper's id: ours now (the keeper says so)
        if handed:  # a predecessor's: our keeper has never heard of it
            self._ids += 1
            ident = self._ids
        self.kept[ident] = (sock, msg.record)
        taken = self.adopt(sock, kept, ident, board) if sock.type == socket.SOCK_STREAM \
            else False
        if taken is None:  # ours already: this copy is a duplicate; the connection lives on
            c.drop("keeper-duplicate")
            self.kept.pop(ident, None)
            if not handed:
                self.outbox[ident] = "drop"  # the keeper's copy goes, ours stays kept
            sock.close()  # (no shutdown: that would end the connection we hold)
            self._flush()
            return
        if not taken:
            c.drop(failed)
            self.kept.pop(ident, None)
            if not handed:
                self.outbox[ident] = "drop"
            try:  # the client sees it end (and restarts ICE), the keeper's copy included
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
            self._flush()
            return
        if handed:
            if ident in self.kept:  # (a TURN/TLS one with no room on our board is not)
                self.outbox[ident] = "keep"
            c.add("tcp_taken_over")
            self._flush()
        else:
            c.add("tcp_adopted")

    async def run(self) -> None:
        """Keep the link up, receive what the keeper pushes, send what waits; until
        cancelled."""
        try:
            while True:
                if self.sock is None:
                    # The kept records follow their allocations while there is no keeper
                    # too: what it is told first on (re)connecting is their latest state.
                    if self.poll is not None:
                        self.poll()
                    if not self._connect():
                        await trio.sleep(TICK)
                        continue
                sock = self.sock
                assert sock is not None
                with trio.move_on_after(TICK):
                    await trio.lowlevel.wait_readable(sock)
                self._receive()
                self._flush()
                if self.poll is not None:
                    self.poll()
        finally:
            if self.sock is not None:
                self.sock.close()
                self.sock = None
