"""RFC 4571 framing (appliance.proto.framing): the ICE-TCP stream under any split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.framing import (
    MAX_FRAME,
    Deframer,
    FramingError,
    encode_frame,
    frame_spans_untrusted,
)


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


# -- frame_spans_untrusted: the peeking reader's view (relay/tcp.py, relay/keeper.py) -----


def test_spans_of_whole_frames_and_the_next_ones_size() -> None:
    stream = encode_frame(b"ab") + encode_frame(b"") + encode_frame(b"xyz")[:3]
    spans, end, want = frame_spans_untrusted(stream)
    assert [stream[o : o + n] for o, n in spans] == [b"ab", b""]
    assert end == 6 and want == 5  # the third frame: 2-byte prefix + 3 bytes
    assert frame_spans_untrusted(stream[:7]) == (spans, 6, 2)  # half a prefix
    assert frame_spans_untrusted(stream[:6]) == (spans, 6, 0)  # at a boundary
    assert frame_spans_untrusted(b"") == ([], 0, 0)


def test_spans_refuse_a_frame_over_the_cap_from_its_prefix() -> None:
    with pytest.raises(FramingError) as info:
        frame_spans_untrusted(encode_frame(b"ok") + b"\x00\x51", 80)
    assert info.value.hint == "frame-too-long"


@given(st.lists(st.binary(max_size=80), max_size=12), st.integers(0, 1200))
def test_spans_agree_with_the_deframer_on_every_prefix(frames: list[bytes], cut: int) -> None:
    """The peeking reader takes exactly the frames the Deframer would have delivered from
    the same bytes, and says how many more bytes the next one needs."""
    stream = b"".join(encode_frame(f) for f in frames)
    prefix = stream[: cut % (len(stream) + 1)]
    spans, end, want = frame_spans_untrusted(prefix, 80)
    d = Deframer(80)
    d.handle_input(prefix)
    expect = []
    while (f := d.poll_output()) is not None:
        expect.append(f)
    assert [prefix[o : o + n] for o, n in spans] == expect
    assert end == len(prefix) - d.buffered - (2 if d._need >= 0 else 0)
    if end < len(prefix):
        assert want > len(prefix) - end
    else:
        assert want == 0
    if want > 2:  # the prefix is in: that many bytes make the frame whole
        assert frame_spans_untrusted(stream[: end + want], 80)[1] == end + want


@given(st.binary(max_size=400), st.integers(1, 300))
def test_fuzz_spans_only_framing_error(data: bytes, cap: int) -> None:
    for prefix in (data, *(data[:i] for i in range(0, len(data), 13))):
        try:
            spans, end, want = frame_spans_untrusted(prefix, cap)
        except FramingError:
            continue
        assert end <= len(prefix) and all(o + n <= end for o, n in spans)
