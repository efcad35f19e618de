"""ChannelData codec and the TURN-over-TCP/TLS stream framing (RFC 8656 §12.4, §12.5)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.stun import AttrType, Class, Message, Method
from appliance.proto.turn import (
    StreamFramer,
    TurnError,
    channel_data_header,
    encode_channel_data,
    is_turn,
    message_spans_untrusted,
    parse_channel_data_untrusted,
)

STUN = Message(Method.ALLOCATE, Class.REQUEST, bytes(12),
               ((AttrType.REQUESTED_TRANSPORT, 17),)).encode()


def test_channel_data_known_bytes() -> None:
    assert encode_channel_data(0x4001, b"abc") == b"\x40\x01\x00\x03abc"
    assert encode_channel_data(0x4001, b"abc", pad=True) == b"\x40\x01\x00\x03abc\x00"
    assert encode_channel_data(0x4FFF, b"abcd", pad=True) == b"\x4f\xff\x00\x04abcd"
    assert channel_data_header(0x4000, 0) == b"\x40\x00\x00\x00"
    with pytest.raises(ValueError, match="range"):
        channel_data_header(0x8000, 1)


def test_parse_channel_data() -> None:
    assert parse_channel_data_untrusted(b"\x40\x01\x00\x03abc") == (0x4001, 3)
    # Over UDP trailing padding is allowed and ignored (§12.5).
    assert parse_channel_data_untrusted(b"\x40\x01\x00\x03abc\x00") == (0x4001, 3)
    for bad, hint in ((b"\x40\x01\x00", "channel-short"), (b"\x40\x01\x00\x04abc", "channel-short"),
                      (b"\x80\x00\x00\x00", "channel-range"), (b"\x3f\xff\x00\x00", "channel-range")):
        with pytest.raises(TurnError) as exc:
            parse_channel_data_untrusted(bad)
        assert exc.value.hint == hint


def test_demux_tells_turn_from_ice_dtls_and_rtp() -> None:
    assert is_turn(STUN)
    assert is_turn(b"\x40\x00\x00\x00")
    assert is_turn(b"\x00\x16")  # Send indication
    ice = Message(Method.BINDING, Class.REQUEST, bytes(12)).encode()
    assert is_turn(b"\x7f\xff\x00\x00")  # RFC 5766's range
    for other in (ice, b"\x01\x01", b"\x16\xfe\xfd", b"\x80\x6f", b"\x3f\x00", b"", b"\x00"):
        assert not is_turn(other), other
    # Responses and Data indications are the server's, never a client's.
    assert not is_turn(b"\x01\x03") and not is_turn(b"\x00\x17")


def _stream(*messages: bytes) -> bytes:
    out = b""
    for m in messages:
        out += m + (b"\x00" * (-len(m) & 3) if m[0] >> 6 == 1 else b"")
    return out


def test_stream_framer_splits_stun_and_padded_channel_data() -> None:
    msgs = [STUN, encode_channel_data(0x4000, b"abcde"), encode_channel_data(0x4001, b""), STUN]
    stream = _stream(*msgs)
    f = StreamFramer()
    out: list[bytes] = []
    for i in range(len(stream)):  # byte at a time
        f.handle_input(stream[i : i + 1])
        while (m := f.poll_output()) is not None:
            out.append(m)
    assert out == msgs and f.buffered == 0


@given(st.lists(st.integers(1, 40), max_size=20))
def test_stream_framer_any_split(cuts: list[int]) -> None:
    msgs = [encode_channel_data(0x4000 + i, bytes(range(i))) for i in range(7)] + [STUN]
    stream = _stream(*msgs)
    f = StreamFramer()
    out: list[bytes] = []
    pos = 0
    for cut in [*cuts, len(stream)]:
        f.handle_input(stream[pos : pos + cut])
        pos += cut
        while (m := f.poll_output()) is not None:
            out.append(m)
    assert out == msgs


@pytest.mark.parametrize(("data", "hint"), [
    (b"\x80", "not-turn"),
    (b"\xc0\x00\x00\x00", "not-turn"),
    (b"\x00\x03\x00\x05", "stun-length"),
    (b"\x40\x00\xff\xff", "frame-too-long"),
    (b"\x00\x03\xff\xfc", "frame-too-long"),
])
def test_stream_framer_breaks_on_bad_input(data: bytes, hint: str) -> None:
    f = StreamFramer(max_message=2048)

    def feed() -> None:
        f.handle_input(data)
        f.poll_output()

    with pytest.raises(TurnError) as exc:
        feed()
    assert exc.value.hint == hint
    assert f.buffered == 0
    with pytest.raises(TurnError):  # the stream stays broken
        f.handle_input(STUN)


def test_message_spans_of_a_stream_and_the_next_messages_size() -> None:
    msgs = [STUN, encode_channel_data(0x4000, b"abcde"), encode_channel_data(0x4001, b"")]
    stream = _stream(*msgs)
    spans, end, want = message_spans_untrusted(stream)
    assert [stream[o : o + n] for o, n in spans] == msgs and end == len(stream) and want == 0
    cut = len(_stream(msgs[0])) + 6  # into the padded ChannelData (4 + 5 + 3 bytes)
    assert message_spans_untrusted(stream[:cut]) == (spans[:1], cut - 6, 12)
    assert message_spans_untrusted(stream[: cut - 4]) == (spans[:1], cut - 6, 4)
    with pytest.raises(TurnError) as info:
        message_spans_untrusted(stream + b"\x80")
    assert info.value.hint == "not-turn"
