"""The PROXY header a front proxy writes at the start of a TCP connection (v1 and v2),
parsed incrementally: every prefix of a header is "need more", the whole is the addresses,
and anything else raises only ProxyError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.proxy import STREAM, ProxyError, encode_header
from appliance.proto.proxy.stream import MAX_V1, parse_stream_header_untrusted

V1 = b"PROXY TCP4 192.0.2.7 198.51.100.1 51234 443\r\n"
V1_6 = b"PROXY TCP6 2001:db8::7 2001:db8::1 51234 443\r\n"
V2 = encode_header(("192.0.2.7", 51234), ("198.51.100.1", 443), transport=STREAM)
V2_6 = encode_header(("2001:db8::7", 51234), ("2001:db8::1", 443), transport=STREAM)


@pytest.mark.parametrize(("header", "src", "dst"), [
    (V1, ("192.0.2.7", 51234), ("198.51.100.1", 443)),
    (V1_6, ("2001:db8::7", 51234), ("2001:db8::1", 443)),
    (V2, ("192.0.2.7", 51234), ("198.51.100.1", 443)),
    (V2_6, ("2001:db8::7", 51234), ("2001:db8::1", 443)),
])
def test_a_header_arriving_in_pieces(header: bytes, src: tuple[str, int],
                                     dst: tuple[str, int]) -> None:
    tls = b"\x16\x03\x01\x02\x00"  # what follows it stays for the caller
    for cut in range(len(header)):
        assert parse_stream_header_untrusted(header[:cut]) is None, cut
    assert parse_stream_header_untrusted(header + tls) == (src, dst, len(header))


@pytest.mark.parametrize(("data", "hint"), [
    (b"\x16\x03\x01", "signature"),  # TLS with no header: the proxy was not configured
    (b"GET / HTTP/1.1\r\n", "signature"),
    (b"PROXY UNKNOWN\r\n", "local"),
    (b"PROXY UNKNOWN 1.2.3.4 5.6.7.8 1 2\r\n", "local"),
    (b"PROXY TCP4 192.0.2.7 198.51.100.1 51234\r\n", "syntax"),
    (b"PROXY TCP4 2001:db8::7 198.51.100.1 1 2\r\n", "syntax"),
    (b"PROXY TCP4 192.0.2.7 198.51.100.1 051234 443\r\n", "syntax"),
    (b"PROXY TCP4 192.0.2.7 198.51.100.1 65536 443\r\n", "syntax"),
    (b"PROXY UDP4 192.0.2.7 198.51.100.1 1 2\r\n", "syntax"),
    (b"PROXY TCP4 " + b"1" * MAX_V1, "length"),
    (encode_header(("192.0.2.7", 1), ("198.51.100.1", 2)), "family"),  # DGRAM: UDP
    (V2[:12] + b"\x20\x11\x00\x00", "local"),  # the proxy's own health check
    (V2[:12] + b"\x22" + V2[13:], "command"),
])
def test_what_is_not_a_client_header_is_refused(data: bytes, hint: str) -> None:
    with pytest.raises(ProxyError) as info:
        parse_stream_header_untrusted(data)
    assert info.value.hint == hint


@given(st.binary(max_size=300))
def test_any_bytes_raise_only_proxy_error(data: bytes) -> None:
    try:
        got = parse_stream_header_untrusted(data)
    except ProxyError:
        return
    if got is not None:
        assert 0 < got[2] <= len(data)


@given(st.binary(max_size=40), st.sampled_from([V1, V1_6, V2, V2_6]))
def test_a_header_with_junk_after_it_parses_to_its_own_length(tail: bytes,
                                                              header: bytes) -> None:
    got = parse_stream_header_untrusted(header + tail)
    assert got is not None and got[2] == len(header)
