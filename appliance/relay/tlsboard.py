"""Where a TURN/TLS connection's sequence numbers survive its worker (issue 40 item 2).

A kept TURN/TLS connection (relay/keeper.py) needs, besides its keys (sent to the keeper
once, in its record), the read and write **sequence numbers** of its records
(proto/dtls/tlsrecord.py) at the moment the worker dies — they change with every record,
far too often to send. So they are written to a **board**: a memfd shared with the keeper
(its descriptor goes with every kept TLS connection), a fixed slot per connection. The
successor maps the dead worker's board and reads the slot.

A number on the board is only right together with *where in the stream* it holds: a kill
can come between a ``send`` and the store that follows it, or while a record is half
written. So each direction's entry is a pair of states ``(generation, sequence, stream
offset)`` — the last one known to be in the kernel (*committed*) and the one that holds if
what is being handed to the kernel right now goes in whole (*pending*) — and the successor
compares them with the kernel's own count of the stream (``TCP_INFO``'s bytes received and
acked, less ``SIOCINQ``/``SIOCOUTQ``: the bytes the application read and wrote): the state
whose offset matches is the one, and when neither matches (a record half written or half
read) the connection cannot go on and is closed, as before (its client restarts ICE). A
store can itself be cut short by the kill, so each entry is written into the slot's other
half and then switched to by a single byte.

Layout: slot ``i`` at ``i * SLOT``; per direction (read at 0, write at 128) a selector byte
and two halves of six little-endian u64 (committed gen, seq, offset; pending gen, seq,
offset) at +8 and +64.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
import struct
import termios

SLOT = 256
READ = 0
WRITE = 128
_HALF = struct.Struct("<6Q")
_HALVES = (8, 64)
#: struct tcp_info (linux/tcp.h): tcpi_bytes_acked and tcpi_bytes_received (u64) at 120, 128
_TCP_INFO_LEN = 136
_ACKED = struct.Struct("=QQ")

State = tuple[int, int, int]  # (key generation, sequence number, stream offset)


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


class TlsBoard:
    """One worker life's board (module docstring): ``create`` a fresh one, or ``attach`` to a
    descriptor pushed with an adopted connection (read only what the slot says)."""

    def __init__(self, fd: int, slots: int) -> None:
        self.fd = fd
        self.slots = slots
        self.mm = mmap.mmap(fd, slots * SLOT, mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE)
        self._free = list(range(slots - 1, -1, -1))
        self._sel: dict[int, int] = {}  # slot*2 + direction -> the half in use

    @classmethod
    def create(cls, slots: int) -> TlsBoard:
        fd = os.memfd_create("appliance-tls-board")  # close-on-exec
        try:
            os.ftruncate(fd, slots * SLOT)
            return cls(fd, slots)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, fd: int) -> TlsBoard | None:
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
        self.mm[base : base + SLOT] = bytes(SLOT)
        self._sel.pop(slot * 2, None)
        self._sel.pop(slot * 2 + 1, None)
        return slot

    def free(self, slot: int) -> None:
        self._free.append(slot)

    def write(self, slot: int, direction: int, committed: State, pending: State) -> None:
        base = slot * SLOT + direction
        key = slot * 2 + (direction != READ)
        half = 1 - self._sel.get(key, 0)
        _HALF.pack_into(self.mm, base + _HALVES[half], *committed, *pending)
        self.mm[base] = half  # one byte: the switch a kill cannot cut in two
        self._sel[key] = half

    def read(self, slot: int, direction: int) -> tuple[State, State]:
        if not 0 <= slot < self.slots:
            raise ValueError("no such slot")
        base = slot * SLOT + direction
        half = self.mm[base]
        if half > 1:
            raise ValueError("not a board slot")
        v = _HALF.unpack_from(self.mm, base + _HALVES[half])
        return (v[0], v[1], v[2]), (v[3], v[4], v[5])


def resolve(entry: tuple[State, State], offset: int) -> tuple[int, int] | None:
    """(generation, sequence) of the board entry whose stream offset is the kernel's
    ``offset``, or None when neither is (module docstring)."""
    committed, pending = entry
    if committed[2] == offset:
        return committed[0], committed[1]
    if pending[2] == offset:
        return pending[0], pending[1]
    return None
