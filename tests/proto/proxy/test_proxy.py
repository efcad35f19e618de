from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.proxy import (
    DGRAM,
    HEADER_V4_LEN,
    HEADER_V6_LEN,
    SIGNATURE,
    STREAM,
    TLV_RELAY_ID,
    ProxyError,
    StreamAddr,
    encode_header,
    encode_tlv,
    parse_transport_untrusted,
    parse_untrusted,
    tlvs_untrusted,
    transport_of,
)

# A header as HAProxy's spec lays it out, by hand: UDP over IPv4 from 192.0.2.1:5000 to
# 198.51.100.2:3478.
HAPROXY_V4 = (
    SIGNATURE + bytes([0x21, 0x12, 0x00, 0x0C]) + bytes([192, 0, 2, 1, 198, 51, 100, 2])
    + (5000).to_bytes(2, "big") + (3478).to_bytes(2, "big")
)


def test_known_bytes_v4() -> None:
    assert encode_header(("192.0.2.1", 5000), ("198.51.100.2", 3478)) == HAPROXY_V4
    assert parse_untrusted(HAPROXY_V4 + b"payload") == (
        ("192.0.2.1", 5000), ("198.51.100.2", 3478), HEADER_V4_LEN)


def test_v6_round_trip() -> None:
    h = encode_header(("2001:db8::7", 40000), ("2001:db8::1", 3478))
    assert len(h) == HEADER_V6_LEN and h[13] == 0x22
    assert parse_untrusted(h + b"x") == (("2001:db8::7", 40000), ("2001:db8::1", 3478), 52)


def test_tlvs_skipped_and_readable() -> None:
    tlvs = encode_tlv(TLV_RELAY_ID, b"relay-1") + encode_tlv(0x04, b"")
    h = encode_header(("10.0.0.1", 1), ("10.0.0.2", 2), tlvs)
    src, dst, off = parse_untrusted(h + b"DATA")
    assert (h + b"DATA")[off:] == b"DATA"
    assert tlvs_untrusted(h) == [(TLV_RELAY_ID, b"relay-1"), (0x04, b"")]


# The same flow as an ICE-TCP client's frame (RFC 6544): TCP over IPv4, family byte 0x11.
HAPROXY_TCP4 = HAPROXY_V4[:13] + b"\x11" + HAPROXY_V4[14:]


def test_stream_v4_known_bytes() -> None:
    """An ICE-TCP frame's header differs from the UDP one in the transport nibble only."""
    assert encode_header(("192.0.2.1", 5000), ("198.51.100.2", 3478), transport=STREAM) == (
        HAPROXY_TCP4)
    assert parse_transport_untrusted(HAPROXY_TCP4 + b"x") == (
        ("192.0.2.1", 5000), ("198.51.100.2", 3478), HEADER_V4_LEN, STREAM)
    assert parse_transport_untrusted(HAPROXY_V4)[3] == DGRAM
    # Address-only readers see a STREAM header like a DGRAM one.
    assert parse_untrusted(HAPROXY_TCP4) == parse_untrusted(HAPROXY_V4)


def test_stream_v6_and_tlvs() -> None:
    tlvs = encode_tlv(TLV_RELAY_ID, b"r1")
    h = encode_header(("2001:db8::7", 40000), ("2001:db8::1", 443), tlvs, STREAM)
    assert h[13] == 0x21 and len(h) == HEADER_V6_LEN + len(tlvs)
    assert parse_transport_untrusted(h + b"x") == (
        ("2001:db8::7", 40000), ("2001:db8::1", 443), len(h), STREAM)
    assert tlvs_untrusted(h) == [(TLV_RELAY_ID, b"r1")]


def test_bad_transport_refused() -> None:
    with pytest.raises(ValueError, match="transport"):
        encode_header(("10.0.0.1", 1), ("10.0.0.2", 2), transport=3)


@given(
    st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535)),
    st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535)),
    st.sampled_from([DGRAM, STREAM]),
    st.binary(max_size=20),
)
def test_round_trip_any_transport(src, dst, transport: int, payload: bytes) -> None:  # type: ignore[no-untyped-def]
    h = encode_header(src, dst, encode_tlv(0xE1, payload[:5]), transport)
    assert parse_transport_untrusted(h + payload) == (src, dst, len(h), transport)


def test_mixed_families_refused() -> None:
    with pytest.raises(ValueError, match="family"):
        encode_header(("10.0.0.1", 1), ("::1", 2))


@pytest.mark.parametrize(
    ("mutate", "hint"),
    [
        (lambda b: b[:10], "short"),
        (lambda b: b"X" + b[1:], "signature"),
        (lambda b: b[:12] + b"\x20" + b[13:], "command"),  # LOCAL
        (lambda b: b[:12] + b"\x11" + b[13:], "command"),  # v1-ish
        (lambda b: b[:13] + b"\x31" + b[14:], "family"),  # UNIX stream
        (lambda b: b[:13] + b"\x13" + b[14:], "family"),  # unknown transport
        (lambda b: b[:13] + b"\x02" + b[14:], "family"),  # UNSPEC
        (lambda b: b[:14] + b"\x00\x40" + b[16:], "length"),  # longer than datagram
        (lambda b: b[:14] + b"\x00\x04" + b[16:], "length"),  # too short for IPv4
    ],
)
def test_rejections(mutate, hint: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProxyError) as exc:
        parse_untrusted(mutate(HAPROXY_V4))
    assert exc.value.hint == hint


def test_truncated_tlv() -> None:
    h = bytearray(encode_header(("10.0.0.1", 1), ("10.0.0.2", 2), encode_tlv(0xE0, b"abc")))
    h[-4:-2] = (9).to_bytes(2, "big")  # TLV claims more than the header holds
    with pytest.raises(ProxyError):
        tlvs_untrusted(bytes(h))


@given(st.binary(max_size=80))
def test_fuzz_random(data: bytes) -> None:
    try:
        parse_transport_untrusted(data)
        parse_untrusted(data)
        tlvs_untrusted(data)
    except ProxyError:
        pass


@given(st.integers(0, len(HAPROXY_V4)), st.binary(max_size=8), st.integers(0, 40),
       st.sampled_from([HAPROXY_V4, HAPROXY_TCP4]))
def test_fuzz_mutated(cut: int, junk: bytes, pos: int, base: bytes) -> None:
    data = bytearray(base + encode_tlv(0xE0, b"r"))
    data[pos:pos + len(junk)] = junk
    for buf in (bytes(data), bytes(data[:cut])):
        try:
            parse_transport_untrusted(buf)
            parse_untrusted(buf)
            tlvs_untrusted(buf)
        except ProxyError:
            pass


def test_stream_addr_is_an_address_but_a_different_key() -> None:
    """A UDP and a TCP flow from the same ip:port are two flows (RFC 6544 flows are keyed by
    transport too): StreamAddr never equals the plain tuple, and hashes apart from it."""
    udp = ("192.0.2.1", 5000)
    tcp = StreamAddr(udp)
    assert tcp[0] == "192.0.2.1" and tcp[1] == 5000 and len(tcp) == 2
    assert tcp != udp and udp != tcp and not (tcp == udp) and not (udp == tcp)
    assert tcp == StreamAddr(udp) and hash(tcp) == hash(StreamAddr(udp))
    table = {udp: "udp", tcp: "tcp"}
    assert table[udp] == "udp" and table[("192.0.2.1", 5000)] == "udp" and table[tcp] == "tcp"
    assert transport_of(tcp) == STREAM and transport_of(udp) == DGRAM
    # It encodes like the address it wraps.
    assert encode_header(tcp, ("198.51.100.2", 3478)) == HAPROXY_V4
    assert "StreamAddr" in repr(tcp)
