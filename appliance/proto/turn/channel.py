"""ChannelData messages (RFC 8656 §12.4, §12.5) and the stream framing of TURN over TCP/TLS.

ChannelData is TURN's 4-byte alternative to a Send/Data indication once a channel is bound::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |         Channel Number        |            Length             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                                                               |
    /                       Application Data                        /
    /                                                               /
    |                                                               |
    |                               +-------------------------------+
    |                               |
    +-------------------------------+

* Channel numbers are 0x4000-0x7FFF, the range of RFC 5766 §11 that clients still use
  (coturn's ``turnutils_uclient`` picks them at random in it), although RFC 8656 §12 narrowed
  it to 0x4000-0x4FFF: 0x5000-0x7FFF overlap QUIC's first bytes (RFC 9443), and the media
  port carries no QUIC, so ChannelData (first byte 0x40-0x7F) still collides with nothing
  there. A number outside 0x4000-0x7FFF is refused (``channel-range``).
* ``Length`` counts the application data only. Over UDP padding is optional and a datagram
  may be longer than ``4 + Length`` (the rest is ignored); it must not be shorter (§12.5:
  "the ChannelData message ... is discarded").
* Over TCP and TLS every ChannelData message is padded to a multiple of 4 bytes (§12.5), and a
  stream carries STUN messages (whose length field counts everything after the 20-byte header,
  always a multiple of 4) and ChannelData messages back to back, told apart by the first two
  bits: ``00`` STUN, ``01`` ChannelData (RFC 8656 §12; RFC 6062 §4.1 reuses the same framing
  for its control connection). :class:`StreamFramer` splits such a stream into messages;
  :func:`message_spans_untrusted` is the same rule for a reader that peeks and takes only
  whole messages out of the kernel (the relay: a killed worker leaves its TURN/TCP
  connections at a message boundary for its successor, relay/keeper.py).
  RFC 4571 framing (ICE-TCP) is a different thing (:mod:`appliance.proto.framing`).

Deliberately omitted: RFC 6062 TCP *allocations* (Connect, ConnectionBind, data
connections): the appliance relays UDP only.
"""

from __future__ import annotations

from typing import NoReturn

from .errors import TurnError

__all__ = [
    "CHANNEL_MAX",
    "CHANNEL_MIN",
    "StreamFramer",
    "channel_data_header",
    "encode_channel_data",
    "message_spans_untrusted",
    "parse_channel_data_untrusted",
]

CHANNEL_MIN = 0x4000
CHANNEL_MAX = 0x7FFF  # RFC 5766 §11 (RFC 8656 §12: 0x4FFF), see above
#: Largest message a TURN stream may carry here: a STUN message or a ChannelData message
#: holding one relayed datagram of the relay's size (filter.MAX_DATAGRAM) with room to spare.
STREAM_MAX = 4096


def parse_channel_data_untrusted(buf: bytes | bytearray | memoryview) -> tuple[int, int]:
    """``(channel, length)`` of a ChannelData message; the data is ``buf[4:4+length]``.
    Raises only :class:`TurnError` (a datagram shorter than its header says, a first byte
    that is not 0x40-0x7F)."""
    n = len(buf)
    if n < 4:
        raise TurnError("shorter than a ChannelData header", hint="channel-short")
    channel = (buf[0] << 8) | buf[1]
    if not CHANNEL_MIN <= channel <= CHANNEL_MAX:
        raise TurnError(f"channel number 0x{channel:04x} out of range", hint="channel-range")
    length = (buf[2] << 8) | buf[3]
    if 4 + length > n:
        raise TurnError("ChannelData shorter than its length field", hint="channel-short")
    return channel, length


def channel_data_header(channel: int, length: int) -> bytes:
    """The 4-byte header of a ChannelData message (ValueError for a caller's bad values)."""
    if not CHANNEL_MIN <= channel <= CHANNEL_MAX or not 0 <= length <= 0xFFFF:
        raise ValueError("channel or length out of range")
    return bytes((channel >> 8, channel & 0xFF, length >> 8, length & 0xFF))


def encode_channel_data(
    channel: int, data: bytes | bytearray | memoryview, *, pad: bool = False
) -> bytes:
    """A ChannelData message; ``pad`` rounds it up to 4 bytes, as TCP and TLS need (§12.5)."""
    out = channel_data_header(channel, len(data)) + bytes(data)
    if pad:
        out += b"\x00" * (-len(data) & 3)
    return out


def _message_size(buf: bytes | bytearray | memoryview, pos: int, max_message: int) -> int:
    """Bytes the message at ``buf[pos:]`` occupies on a stream (its padding included), or
    -1 while its 4-byte header is incomplete. Raises only :class:`TurnError` (the hints of
    :class:`StreamFramer`), as soon as the bytes in show the stream is broken."""
    if len(buf) - pos < 4:
        if len(buf) > pos and buf[pos] & 0x80:
            raise TurnError("TURN stream broken: not-turn", hint="not-turn")
        return -1
    top = buf[pos] >> 6
    length = (buf[pos + 2] << 8) | buf[pos + 3]
    if top == 0:  # STUN: 20-byte header + length (a multiple of 4, RFC 8489 §5)
        if length & 3:
            raise TurnError("TURN stream broken: stun-length", hint="stun-length")
        total = 20 + length
    elif top == 1:  # ChannelData: 4-byte header + data, padded to 4 on a stream
        total = 4 + length + (-length & 3)
    else:
        raise TurnError("TURN stream broken: not-turn", hint="not-turn")
    if total > max_message + 3:
        raise TurnError("TURN stream broken: frame-too-long", hint="frame-too-long")
    return total


def message_spans_untrusted(buf: bytes | bytearray | memoryview,
                            max_message: int = STREAM_MAX) -> tuple[list[tuple[int, int]],
                                                                     int, int]:
    """The whole messages at the start of a TURN stream's bytes ``buf``: ``(spans, end,
    want)`` — ``spans`` the ``(offset, length)`` of each (a ChannelData message without its
    padding, as :class:`StreamFramer` delivers it), ``end`` the bytes they occupy, padding
    included, ``want`` how many bytes from ``end`` on the next message occupies (4 while its
    header is incomplete; 0 when ``buf`` ends at a boundary). Raises only
    :class:`TurnError`, with :class:`StreamFramer`'s hints."""
    n = len(buf)
    spans: list[tuple[int, int]] = []
    pos = 0
    while pos < n:
        total = _message_size(buf, pos, max_message)
        if total < 0:
            return spans, pos, 4
        if n - pos < total:
            return spans, pos, total
        if buf[pos] >> 6 == 1:
            spans.append((pos, 4 + ((buf[pos + 2] << 8) | buf[pos + 3])))
        else:
            spans.append((pos, total))
        pos += total
    return spans, pos, 0


class StreamFramer:
    """Bytes of a TURN-over-TCP/TLS stream in, whole messages out (RFC 8656 §12.5).

    A clockless sans-IO core (docs/style.md rule 18): :meth:`handle_input` takes bytes in any
    split, :meth:`poll_output` returns each complete STUN or ChannelData message (a
    ChannelData message *without* its stream padding), then None. A message announcing more
    than ``max_message`` bytes, or a first byte that is neither STUN (0x00-0x3F) nor
    ChannelData (0x40-0x7F), breaks the stream: :class:`TurnError` (``frame-too-long``,
    ``not-turn``), then for every later call — there is no way to find the next boundary.
    At most ``max_message + 3`` bytes of a partial message are held.
    """

    __slots__ = ("_buf", "_failed", "max_message")

    def __init__(self, max_message: int = STREAM_MAX) -> None:
        if not 20 <= max_message <= 0xFFFF + 20:
            raise ValueError("max_message must be 20..65555")
        self.max_message = max_message
        self._buf = bytearray()
        self._failed: str | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def held(self) -> bytes:
        """The bytes of a message not complete yet (a successor that takes the stream over
        feeds them to its own framer first: relay/board.py)."""
        return bytes(self._buf)

    def handle_input(self, data: bytes | bytearray | memoryview) -> None:
        """Bytes read from the stream, in order. Raises only :class:`TurnError`."""
        self._fail_again()
        self._buf += data
        self._need()

    def _fail_again(self) -> None:
        if self._failed is not None:
            raise TurnError("stream already failed", hint=self._failed)

    def _need(self) -> int:
        """Bytes the next message occupies on the stream (its padding included), or -1 when
        its header is not complete yet; checks the cap as soon as the length is known."""
        try:
            return _message_size(self._buf, 0, self.max_message)
        except TurnError as exc:
            self._fail(str(exc.hint))

    def _fail(self, reason: str) -> NoReturn:
        self._failed = reason
        self._buf.clear()
        raise TurnError(f"TURN stream broken: {reason}", hint=reason)

    def poll_output(self) -> bytes | None:
        """The next complete message (ChannelData without its padding), or None until more
        bytes arrive. Raises only :class:`TurnError`."""
        self._fail_again()
        need = self._need()
        if need < 0 or len(self._buf) < need:
            return None
        buf = self._buf
        if buf[0] >> 6 == 1:
            out = bytes(buf[: 4 + ((buf[2] << 8) | buf[3])])
        else:
            out = bytes(buf[:need])
        del buf[:need]
        return out
