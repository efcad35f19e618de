"""The one Server-Sent Events decoder (appliance/proto/sse.py): every line ending, comments
and multi-line data, a CRLF split across reads, its bounds, and hypothesis: whole or in
pieces, the same events or its own error, never anything else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.proto.sse import MAX_EVENT, SseDecoder, SseError


def decode(*pieces: bytes) -> list[tuple[str, str]]:
    d = SseDecoder()
    out = []
    for piece in pieces:
        d.handle_input(piece)
        while (ev := d.poll_event()) is not None:
            out.append(ev)
    d.handle_eof()
    while (ev := d.poll_event()) is not None:
        out.append(ev)
    return out


STREAM = (b": keep-alive\r\nevent: response.created\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n"
          b"id: 7\nretry: 10\ndata: [DONE]\n\ndata:x\rdata: y\r\r")


def test_the_decoder_reads_every_line_ending_comment_and_multiline_data() -> None:
    assert decode(STREAM) == [("response.created", '{"a":\n1}'), ("message", "[DONE]"),
                              ("message", "x\ny")]


def test_byte_at_a_time_is_the_same_stream() -> None:
    """A CRLF split between two reads is one line end, not two (a blank line would
    dispatch an event early)."""
    assert decode(*(STREAM[i : i + 1] for i in range(len(STREAM)))) == decode(STREAM)


def test_an_overlong_line_and_bad_utf8_are_the_decoders_error() -> None:
    with pytest.raises(SseError):
        decode(b"data: " + b"x" * (1 << 20))
    with pytest.raises(SseError):
        decode(b"data: \xff\n\n")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512), st.integers(1, 17))
def test_fuzz_the_decoder_raises_only_its_error(data: bytes, step: int) -> None:
    """Whole and in pieces: the same events, or SseError, never anything else."""
    try:
        whole = decode(data)
    except SseError:
        whole = None
    try:
        pieces = decode(*(data[i : i + step] for i in range(0, len(data), step)))
    except SseError:
        pieces = None
    assert (whole is None) == (pieces is None)
    if whole is not None:
        assert whole == pieces


def test_an_overlong_event_is_the_decoders_error() -> None:
    line = b"data: " + b"x" * (MAX_EVENT // 8) + b"\n"
    with pytest.raises(SseError):
        decode(line * 9)


def test_many_lines_in_one_read_are_read_in_one_pass() -> None:
    """A read of many short events (a fast stream) is every event, in order."""
    stream = b"".join(b"data: %d\r\n\r\n" % i for i in range(5000))
    assert decode(stream) == [("message", str(i)) for i in range(5000)]
