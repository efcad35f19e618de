"""The board: where a kept TCP connection's stream state survives its worker (issue 40 item 2).

A kept connection (relay/keeper.py) is handed to the worker's successor after a SIGKILL
as a copy of its descriptor and a record sent when it was kept. Two things about it change
far too often to send, yet a successor needs them exactly as they were at the kill:

* **what the worker had handed the kernel of its last write** — a kill can land while a
  frame is half in the kernel (the client's receive window full), and a stream cut inside
  a frame is a broken stream (RFC 4571 framing, TURN's, TLS records');
* for TURN over TLS, **the records' sequence numbers** (proto/dtls/tlsrecord.py), read and
  written.

So they are written to a **board**: a memfd the worker shares with its keeper (its
descriptor goes with each kept connection), a fixed slot per connection, which the
successor maps. Each entry is checked against the kernel's own count of the stream
(:func:`stream_offsets`: ``TCP_INFO``'s bytes received and acked, less ``SIOCINQ`` /
``SIOCOUTQ``, i.e. exactly the bytes the application read and wrote, whoever did), so a
kill between any two instructions of the worker leaves the successor either exact or sure
it cannot be:

* **Writes.** Before each ``send`` the worker publishes the bytes it is about to hand the
  kernel (``chunk``: whole frames — or the rest of one a previous send left half in —,
  at most :data:`CHUNK`, and the send is cut to them), where in the stream they start, and
  the TLS write state after them. The kernel then holds somewhere between none and all of
  them; the successor finds where (:func:`resume_out`), writes the rest first, and carries
  on with that state. What the worker had queued beyond the chunk was never in the kernel:
  it is lost like a datagram (a TLS record's sequence number with it, which the client
  never saw, so the successor's next record has the number the client expects).
* **Reads** (TLS only: ICE-TCP and TURN/TCP take whole frames out of the kernel, relay/tcp.py,
  so they need nothing here). Before each take of whole records the worker publishes the
  read state before it (*committed*) and after it (*pending*), each with its stream offset
  and the part of a TURN message the records left half read (a client may split one over
  two records: its first half is out of the kernel, only the board has it); the successor
  picks the one whose offset the kernel agrees with (:func:`resolve`) and starts its framer
  with that part.

An entry is written into the inactive half of its place and then switched to by one
byte, so a store cut short by the kill leaves the previous entry whole.

Layout of slot ``i`` at ``i * SLOT``: the write entry's selector byte at 0 and its halves
at 64 and 4192 (gen, seq, base offset, length as little-endian u64, then up to
:data:`CHUNK` bytes); the read entry's selector at 8320 and its halves at 8328 and 12616
(committed gen, seq, offset, pending gen, seq, offset, the two partial lengths as u64,
then the committed and the pending partial message, :data:`PARTIAL` bytes each).
"""

from __future__ import annotations

import collections
import fcntl
import mmap
import os
import socket
import struct
import termios

CHUNK = 4096
#: the most of a TURN message a TLS reader may hold half read (StreamFramer: a message of
#: at most MAX_DATAGRAM bytes and its padding, less one byte)
PARTIAL = 2112
_WRITE_SEL = 0
_WRITE_HEAD = struct.Struct("<4Q")
_WRITE_HALVES = (64, 64 + _WRITE_HEAD.size + CHUNK)
_READ_SEL = _WRITE_HALVES[1] + _WRITE_HEAD.size + CHUNK
_READ_HEAD = struct.Struct("<8Q")
_READ_HALVES = (_READ_SEL + 8, _READ_SEL + 8 + _READ_HEAD.size + 2 * PARTIAL)
SLOT = 17408  # sparse: a connection that never writes much touches the first two pages
#: a write entry's base offset meaning "cannot be carried on" (a frame longer than a chunk
#: sent whole, or bytes of unknown framing queued when the connection was kept)
NOT_RESUMABLE = (1 << 64) - 1
#: struct tcp_info (linux/tcp.h): tcpi_bytes_acked and tcpi_bytes_received (u64) at 120, 128
_TCP_INFO_LEN = 136
_ACKED = struct.Struct("=QQ")

State = tuple[int, int, int]  # (key generation, sequence number, stream offset)
#: a read state: (key generation, sequence number, stream offset, the half-read message)
ReadState = tuple[int, int, int, bytes]


def stream_offsets(sock: socket.socket) -> tuple[int, int]:
    """(bytes the application read, bytes it wrote) of a TCP connection since its start,
    from the kernel — whoever read or wrote them (the worker that died, its successor)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    if len(info) < _TCP_INFO_LEN:
        raise OSError("TCP_INFO without byte counts")
    acked, received = _ACKED.unpack_from(info, 120)
    unread = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]
    unacked = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    return received - unread, acked + unacked


class Board:
    """One worker life's board (module docstring): ``create`` a fresh one, or ``attach`` to a
    descriptor pushed with an adopted connection (read only what the slot says)."""

    def __init__(self, fd: int, slots: int) -> None:
        self.fd = fd
        self.slots = slots
        self.mm = mmap.mmap(fd, slots * SLOT, mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE)
        self._free = list(range(slots - 1, -1, -1))
        self._sel: dict[int, int] = {}  # slot * 2 + (1 for the write entry) -> half in use

    @classmethod
    def create(cls, slots: int) -> Board:
        fd = os.memfd_create("appliance-stream-board")  # close-on-exec; sparse until used
        try:
            os.ftruncate(fd, slots * SLOT)
            return cls(fd, slots)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, fd: int) -> Board | None:
        """The board behind a descriptor from the keeper (ours to close), or None when it is
        not one (wrong size)."""
        try:
            size = os.fstat(fd).st_size
            if size <= 0 or size % SLOT:
                raise OSError("not a board")
            return cls(fd, size // SLOT)
        except (OSError, ValueError):
            os.close(fd)
            return None

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)

    def alloc(self) -> int | None:
        if not self._free:
            return None
        slot = self._free.pop()
        base = slot * SLOT
        self.mm[base + _READ_SEL] = 0
        self.mm[base + _WRITE_SEL] = 0
        self._sel.pop(slot * 2, None)
        self._sel.pop(slot * 2 + 1, None)
        _READ_HEAD.pack_into(self.mm, base + _READ_HALVES[0], 0, 0, 0, 0, 0, 0, 0, 0)
        _WRITE_HEAD.pack_into(self.mm, base + _WRITE_HALVES[0], 0, 0, NOT_RESUMABLE, 0)
        return slot

    def free(self, slot: int) -> None:
        self._free.append(slot)

    def _switch(self, key: int) -> int:
        half = 1 - self._sel.get(key, 0)
        self._sel[key] = half
        return half

    # reads (TLS)

    def write_read(self, slot: int, committed: ReadState, pending: ReadState) -> None:
        c, p = committed[3], pending[3]
        if len(c) > PARTIAL or len(p) > PARTIAL:
            raise ValueError("partial message too long")
        at = slot * SLOT + _READ_HALVES[self._switch(slot * 2)]
        _READ_HEAD.pack_into(self.mm, at, *committed[:3], *pending[:3], len(c), len(p))
        at += _READ_HEAD.size
        self.mm[at : at + len(c)] = c
        self.mm[at + PARTIAL : at + PARTIAL + len(p)] = p
        self.mm[slot * SLOT + _READ_SEL] = self._sel[slot * 2]  # the switch: one byte

    def read_read(self, slot: int) -> tuple[ReadState, ReadState]:
        base = self._base(slot)
        half = self.mm[base + _READ_SEL]
        if half > 1:
            raise ValueError("not a board slot")
        at = base + _READ_HALVES[half]
        v = _READ_HEAD.unpack_from(self.mm, at)
        if v[6] > PARTIAL or v[7] > PARTIAL:
            raise ValueError("not a board slot")
        at += _READ_HEAD.size
        return ((v[0], v[1], v[2], bytes(self.mm[at : at + v[6]])),
                (v[3], v[4], v[5], bytes(self.mm[at + PARTIAL : at + PARTIAL + v[7]])))

    # writes

    def write_out(self, slot: int, gen: int, seq: int, base: int,
                  chunk: bytes | bytearray | memoryview) -> None:
        """Before a send: ``chunk`` is what it hands the kernel, from stream offset
        ``base``; ``(gen, seq)`` the TLS write state after it."""
        n = len(chunk)
        if n > CHUNK:
            raise ValueError("chunk too long")
        at = slot * SLOT + _WRITE_HALVES[self._switch(slot * 2 + 1)]
        _WRITE_HEAD.pack_into(self.mm, at, gen, seq, base, n)
        at += _WRITE_HEAD.size
        self.mm[at : at + n] = chunk
        self.mm[slot * SLOT + _WRITE_SEL] = self._sel[slot * 2 + 1]

    def read_out(self, slot: int) -> tuple[int, int, int, bytes]:
        """(gen, seq, base offset, chunk) of the last write entry."""
        base = self._base(slot)
        half = self.mm[base + _WRITE_SEL]
        if half > 1:
            raise ValueError("not a board slot")
        at = base + _WRITE_HALVES[half]
        gen, seq, start, n = _WRITE_HEAD.unpack_from(self.mm, at)
        if n > CHUNK:
            raise ValueError("not a board slot")
        at += _WRITE_HEAD.size
        return gen, seq, start, bytes(self.mm[at : at + n])

    def _base(self, slot: int) -> int:
        if not 0 <= slot < self.slots:
            raise ValueError("no such slot")
        return slot * SLOT


def resolve(entry: tuple[ReadState, ReadState], offset: int
            ) -> tuple[int, int, bytes] | None:
    """(generation, sequence, half-read message) of the read entry's state whose stream
    offset is the kernel's ``offset``, or None when neither is (module docstring)."""
    for gen, seq, at, partial in entry:
        if at == offset:
            return gen, seq, partial
    return None


def resume_out(entry: tuple[int, int, int, bytes], written: int
               ) -> tuple[int, int, bytes] | None:
    """What a successor writes first and the write state it carries on with, given the
    kernel's count of the bytes written: (gen, seq, the rest of the last chunk), or None
    when the kernel's count is not within the chunk (module docstring)."""
    gen, seq, base, chunk = entry
    if base == NOT_RESUMABLE or not base <= written <= base + len(chunk):
        return None
    return gen, seq, chunk[written - base :]


class Outgoing:
    """A kept connection's backlog as the board sees it (the worker's side of "Writes"):
    where each frame — or TLS record — queued on it ends in the stream, with the TLS write
    state after it; :meth:`chunk` publishes what the next send may hand the kernel."""

    __slots__ = ("board", "marks", "queued", "sent", "slot")

    def __init__(self, board: Board, slot: int, sent: int, queued: int,
                 gen: int = 0, seq: int = 0) -> None:
        self.board = board
        self.slot = slot
        #: stream offsets: bytes handed to the kernel, and queued in all
        self.sent = sent
        self.queued = queued
        #: (end offset, write gen, write seq) of each frame queued and not all sent
        self.marks: collections.deque[tuple[int, int, int]] = collections.deque()
        if queued > sent:  # queued before it was kept: its framing is not known here
            self.marks.append((queued, gen, seq))
            board.write_out(slot, 0, 0, NOT_RESUMABLE, b"")
        else:
            board.write_out(slot, gen, seq, sent, b"")

    def appended(self, n: int, gen: int = 0, seq: int = 0) -> None:
        """A whole frame (or record) of ``n`` bytes queued; (gen, seq) after it."""
        self.queued += n
        self.marks.append((self.queued, gen, seq))

    def chunk(self, backlog: bytearray) -> int:
        """Before a send of ``backlog`` (the bytes from :attr:`sent` on): publish the
        part the send may take and return its length."""
        limit = self.sent + CHUNK
        end = -1
        gen = seq = 0
        for e, g, s in self.marks:
            if e > limit:
                break
            end, gen, seq = e, g, s
        if end < 0:
            # A first frame longer than a chunk (not ours: frames are at most ~2 kB): sent
            # whole, and a kill meanwhile cannot be carried on.
            self.board.write_out(self.slot, 0, 0, NOT_RESUMABLE, b"")
            return len(backlog)
        n = end - self.sent
        self.board.write_out(self.slot, gen, seq, self.sent, memoryview(backlog)[:n])
        return n

    def wrote(self, n: int) -> None:
        """The kernel took ``n`` more bytes (no store: the published chunk covers it)."""
        self.sent += n
        marks = self.marks
        while marks and marks[0][0] <= self.sent:
            marks.popleft()

    def release(self) -> None:
        self.board.free(self.slot)
