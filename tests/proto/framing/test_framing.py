"""RFC 4571 framing (appliance.proto.framing): the ICE-TCP stream under any split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.framing import MAX_FRAME, Deframer, FramingError, encode_frame


def test_encode_known_bytes() -> None:
    assert encode_frame(b"abc") == b"\x00\x03abc"
    assert encode_frame(b"") == b"\x00\x00"
    assert encode_frame(bytes(MAX_FRAME))[:2] == b"\xff\xff"
    with pytest.raises(ValueError, match="at most"):
        encode_frame(bytes(MAX_FRAME + 1))


def test_frames_byte_at_a_time() -> None:
    stream = encode_frame(b"hello") + encode_frame(b"") + encode_frame(b"x" * 300)
    d = Deframer(400)
    out = []
    for i in range(len(stream)):
        d.handle_input(stream[i : i + 1])
        while (f := d.poll_output()) is not None:
            out.append(f)
    assert out == [b"hello", b"", b"x" * 300]
    assert d.buffered == 0


def test_over_cap_refused_before_body() -> None:
    """The announced length is checked on the prefix alone: the body is never buffered."""
    d = Deframer(100)
    with pytest.raises(FramingError) as exc:
        d.handle_input(b"\x00\x65")
    assert exc.value.hint == "frame-too-long"
    assert d.buffered == 0
    with pytest.raises(FramingError):  # the stream stays failed
        d.handle_input(b"\x00\x01a")
    with pytest.raises(FramingError):
        d.poll_output()


def test_over_cap_behind_a_good_frame() -> None:
    d = Deframer(10)
    d.handle_input(encode_frame(b"ok") + b"\x00\xff")
    assert d.poll_output() == b"ok"
    with pytest.raises(FramingError):
        d.poll_output()


def test_cap_bounds() -> None:
    for bad in (0, MAX_FRAME + 1):
        with pytest.raises(ValueError, match="max_frame"):
            Deframer(bad)


@given(st.lists(st.binary(max_size=80), max_size=10), st.lists(st.integers(1, 50), min_size=1))
def test_any_split_same_frames(frames: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(f) for f in frames)
    d = Deframer(80)
    out: list[bytes] = []
    pos = i = 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        d.handle_input(stream[pos : pos + step])
        pos += step
        i += 1
        while (f := d.poll_output()) is not None:
            out.append(f)
        assert d.buffered <= 81 + 50
    assert out == frames


@given(st.binary(max_size=400), st.integers(1, 300))
def test_fuzz_only_framing_error(data: bytes, cap: int) -> None:
    d = Deframer(cap)
    try:
        for i in range(0, len(data), 7):
            d.handle_input(data[i : i + 7])
            while d.poll_output() is not None:
                pass
    except FramingError:
        pass
