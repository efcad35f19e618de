"""The flow-vouch messages (appliance.proto.proxy.vouch, issue 20): round trips, and that
nothing but an authentic, exact message parses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.proxy import ProxyError, StreamAddr
from appliance.proto.proxy import parse_untrusted as parse_proxy
from appliance.proto.proxy.vouch import (
    LEN_V4,
    LEN_V6,
    Kind,
    Vouch,
    VouchError,
    derive_key,
    encode,
    is_local,
    parse_untrusted,
)

KEY = derive_key(b"routing-secret-0123456789abcdef")
OTHER = derive_key(b"another-secret-0123456789abcdef")
Q4 = Vouch(Kind.QUERY, ("198.51.100.7", 50000), ("203.0.113.1", 3478), 3, b"nonce-01")
V6 = Vouch(Kind.VOUCH, ("2001:db8::7", 1), ("2001:db8::1", 3478), 65535, b"nonce-02")


T4 = Vouch(Kind.QUERY, StreamAddr(("198.51.100.7", 50000)), ("203.0.113.1", 3478), 3,
           b"nonce-03")
T6 = Vouch(Kind.VOUCH, StreamAddr(("2001:db8::7", 1)), ("2001:db8::1", 3478), 7, b"nonce-04")


@pytest.mark.parametrize("msg", [Q4, V6, T4, T6])
def test_round_trip(msg: Vouch) -> None:
    """A TCP client (StreamAddr) comes back as one, never equal to the UDP client."""
    data = encode(msg, KEY)
    assert len(data) == (LEN_V4 if msg in (Q4, T4) else LEN_V6)
    assert type(parse_untrusted(data, [KEY]).client) is type(msg.client)
    assert is_local(data)
    assert parse_untrusted(data, [OTHER, KEY]) == msg  # any of the relay's secrets


def test_a_relayed_datagram_reader_drops_it() -> None:
    """Readers of the fixed datagram format drop a LOCAL header (command error)."""
    with pytest.raises(ProxyError) as exc:
        parse_proxy(encode(Q4, KEY))
    assert exc.value.hint == "command"


def test_wrong_key_and_any_bit_flip_are_refused() -> None:
    data = encode(Q4, KEY)
    with pytest.raises(VouchError) as exc:
        parse_untrusted(data, [OTHER])
    assert exc.value.hint == "mac"
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 0x01
        with pytest.raises(VouchError):
            parse_untrusted(bytes(flipped), [KEY])


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="nonce"):
        encode(Vouch(Kind.QUERY, Q4.client, Q4.public, 0, b"short"), KEY)


@given(st.binary(max_size=120))
def test_fuzz_only_vouch_error(data: bytes) -> None:
    try:
        msg = parse_untrusted(data, [KEY])
    except VouchError:
        return
    assert encode(msg, KEY) == data  # pragma: no cover - a forgery would land here


@given(st.integers(0, LEN_V4 - 1))
def test_every_truncation_is_refused(n: int) -> None:
    with pytest.raises(VouchError):
        parse_untrusted(encode(Q4, KEY)[:n], [KEY])
