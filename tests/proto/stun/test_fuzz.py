"""Fuzz every ``_untrusted`` STUN entry point: random bytes, STUN-shaped random attribute
soups, mutations of valid messages and every truncation prefix. Only ``StunError`` may
escape; the ``verify_*`` functions must never raise at all."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.stun import (
    AttrType,
    Message,
    StunError,
    binding_error,
    binding_request,
    binding_success,
    peek_username_untrusted,
    reflexive_response,
    verify_fingerprint,
    verify_integrity,
)

TID = bytes(range(12))
VALID = [
    binding_request(
        TID, username="abcd:efgh", password="pw", priority=7, controlling=9, use_candidate=True
    ),
    binding_request(TID),
    binding_success(TID, ("192.0.2.1", 3478), integrity_key=b"pw"),
    binding_success(TID, ("2001:db8::1", 3478), integrity_key=b"pw"),
    binding_error(TID, 420, integrity_key=b"pw", unknown_attributes=(0x7777,)),
]


def _check(data: bytes) -> None:
    """Run every parser over ``data``; anything but StunError fails the test."""
    parsers: list[Callable[[bytes], object]] = [
        Message.parse_untrusted,
        peek_username_untrusted,
        lambda b: peek_username_untrusted(memoryview(b)),
        lambda b: reflexive_response(b, ("203.0.113.1", 9)),
        lambda b: reflexive_response(b, ("2001:db8::2", 9)),
    ]
    for parse in parsers:
        try:
            parse(data)
        except StunError:
            pass
    assert verify_integrity(data, b"pw") in (True, False)
    assert verify_fingerprint(data) in (True, False)


@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    _check(data)


_ATTR_TYPES = st.one_of(st.sampled_from([int(t) for t in AttrType]), st.integers(0, 0xFFFF))


@st.composite
def stun_shaped(draw: st.DrawFn) -> bytes:
    """A valid header around random TLVs, so the attribute decoders get exercised."""
    body = b""
    for _ in range(draw(st.integers(0, 6))):
        atype = draw(_ATTR_TYPES)
        value = draw(st.binary(max_size=40))
        length = draw(st.one_of(st.just(len(value)), st.integers(0, 64)))
        body += atype.to_bytes(2, "big") + length.to_bytes(2, "big") + value
        body += b"\x00" * draw(st.sampled_from([0, -len(value) & 3]))
    mtype = draw(st.sampled_from([0x0001, 0x0101, 0x0111, 0x0011, 0x0003]))
    length = draw(st.one_of(st.just(len(body)), st.integers(0, 300)))
    return (
        (mtype.to_bytes(2, "big") + (length & 0xFFFF).to_bytes(2, "big") + b"\x21\x12\xa4\x42")
        + TID
        + body
    )


@given(stun_shaped())
def test_stun_shaped(data: bytes) -> None:
    _check(data)


@given(
    st.sampled_from(VALID),
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_mutated_valid_messages(base: bytes, edits: list[tuple[int, int]]) -> None:
    data = bytearray(base)
    for pos, value in edits:
        data[pos % len(data)] = value
    _check(bytes(data))


@given(st.sampled_from(VALID), st.integers(0, 120), st.binary(min_size=1, max_size=8))
def test_inserted_bytes(base: bytes, pos: int, junk: bytes) -> None:
    pos %= len(base) + 1
    _check(base[:pos] + junk + base[pos:])


def test_every_truncation_prefix() -> None:
    """Byte-at-a-time: every prefix of every valid message (the datagram analogue of
    feeding a stream one byte at a time) is either rejected with StunError or parsed."""
    for base in VALID:
        for n in range(len(base) + 1):
            _check(base[:n])
        assert Message.parse_untrusted(base).transaction_id == TID
