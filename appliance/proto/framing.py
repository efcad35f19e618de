"""RFC 4571 framing: datagrams over a byte stream, as ICE-TCP carries them (RFC 6544 §3).

RFC 4571 §2 prefixes every packet with its length as a 16-bit unsigned integer in network
order; nothing else is on the wire::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |             LENGTH            |  STUN / DTLS / SRTP packet ...
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

The format allows frames of up to 65 535 bytes; a receiver that relays them as datagrams
has no use for more than its datagram limit, so :class:`Deframer` takes a cap and refuses
(:class:`FramingError`, hint ``frame-too-long``) a frame whose *announced* length exceeds
it — before any of its body is buffered, so a peer cannot make it hold more than
``max_frame + 1`` bytes of partial frame. A zero-length frame is legal RFC 4571 and is
delivered as ``b""`` (the caller decides what an empty packet means).

Sans-IO, a *clockless* core in the verb shape of docs/style.md rule 18: nothing here depends
on time, so :meth:`Deframer.handle_input` takes no ``now`` and there are no timer verbs
(``poll_timeout`` / ``handle_timeout``). ``handle_input(data)`` takes bytes as they came off
the stream, in any split; :meth:`Deframer.poll_output` returns the complete frames in order,
each a bare ``bytes`` (immutable, and the only kind of output, so no wrapper object per
frame on the relay's TCP path), then None.
Deliberately omitted: RFC 4571's RTCP multiplexing rules (they are ICE's business above us).

:func:`frame_spans_untrusted` is the same rule for a reader that *peeks* at the stream and
takes only whole frames out of the kernel (the relay, so that a worker killed between two
reads leaves every connection at a frame boundary for its successor: relay/keeper.py): it
says where the whole frames in a buffer are, how many bytes they occupy, and how many bytes
the next, incomplete frame needs in all.
"""

from __future__ import annotations

from .errors import RemoteProtocolError

#: Largest length RFC 4571's 16-bit prefix can announce.
MAX_FRAME = 0xFFFF


class FramingError(RemoteProtocolError):
    """The stream broke RFC 4571 framing or our cap; ``hint`` is the drop reason."""


def encode_frame(payload: bytes | bytearray | memoryview) -> bytes:
    """``payload`` with its 2-byte RFC 4571 length prefix (ValueError above 65 535 bytes:
    a caller's bug, there is no way to frame it)."""
    n = len(payload)
    if n > MAX_FRAME:
        raise ValueError(f"an RFC 4571 frame holds at most {MAX_FRAME} bytes, not {n}")
    return n.to_bytes(2, "big") + bytes(payload)


#: ``(payload offset, payload length)`` of each whole frame, the bytes they occupy, and the
#: size (prefix included) of the incomplete frame after them, 0 when there is none.
Spans = tuple[list[tuple[int, int]], int, int]


def frame_spans_untrusted(buf: bytes | bytearray | memoryview,
                          max_frame: int = MAX_FRAME) -> Spans:
    """The whole RFC 4571 frames at the start of ``buf`` (module docstring): ``(spans, end,
    want)`` — ``spans`` the ``(offset, length)`` of each frame's payload, ``end`` the bytes
    those frames occupy, ``want`` how many bytes from ``end`` on the next frame occupies
    (2 while its prefix is incomplete; 0 when ``buf`` ends at a frame boundary). Raises only
    :class:`FramingError` (``frame-too-long``: a frame announces more than ``max_frame``,
    checked as soon as its prefix is in, like :class:`Deframer`)."""
    n = len(buf)
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        if n - pos < 2:
            return spans, pos, 0 if pos == n else 2
        need = (buf[pos] << 8) | buf[pos + 1]
        if need > max_frame:
            raise FramingError(f"frame of {need} bytes over the cap of {max_frame}",
                               hint="frame-too-long")
        if n - pos - 2 < need:
            return spans, pos, 2 + need
        spans.append((pos + 2, need))
        pos += 2 + need


class Deframer:
    """Bytes of one stream in, RFC 4571 frames out (the module docstring).

    After a :class:`FramingError` the stream is unusable (there is no way to find the next
    frame boundary): every later :meth:`handle_input` raises again.
    """

    __slots__ = ("_buf", "_failed", "_need", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        if not 0 < max_frame <= MAX_FRAME:
            raise ValueError(f"max_frame must be in 1..{MAX_FRAME}")
        self.max_frame = max_frame
        self._buf = bytearray()
        #: length of the frame whose body is being collected, or -1 when a prefix is due
        self._need = -1
        self._failed = False

    @property
    def buffered(self) -> int:
        """Bytes held that do not make a complete frame yet (bounded by ``max_frame + 1``
        once the complete frames are polled)."""
        return len(self._buf)

    def handle_input(self, data: bytes | bytearray | memoryview) -> None:
        """Bytes read from the stream, in order. Raises only :class:`FramingError`, when a
        frame announces more than ``max_frame`` bytes (then for every later call)."""
        self._check()
        self._buf += data
        self._check()

    def _check(self) -> None:
        # Only the next frame's prefix is looked at here: frames behind it are checked as
        # poll_output reaches them, so the bound holds for whatever the caller polls.
        if self._failed:
            raise FramingError("stream already failed", hint="frame-too-long")
        if self._need < 0 and len(self._buf) >= 2:
            need = (self._buf[0] << 8) | self._buf[1]
            if need > self.max_frame:
                self._failed = True
                self._buf.clear()
                raise FramingError(
                    f"frame of {need} bytes over the cap of {self.max_frame}",
                    hint="frame-too-long",
                )
            self._need = need
            del self._buf[:2]

    def poll_output(self) -> bytes | None:
        """The next complete frame, or None until more bytes arrive (drain until None after
        every ``handle_input``). Raises only :class:`FramingError` (the next frame announced
        more than the cap)."""
        self._check()
        need = self._need
        if need < 0 or len(self._buf) < need:
            return None
        frame = bytes(self._buf[:need])
        del self._buf[:need]
        self._need = -1
        return frame
