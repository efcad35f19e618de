"""The TLS ClientHello peek the media port's TCP listener splits on (issue 40 item 4):
real hellos from the standard library's OpenSSL, every prefix, and hypothesis fuzzing
(whole and byte-at-a-time) asserting only :class:`DtlsError` escapes."""

from __future__ import annotations

import ssl

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.dtls import DtlsError
from appliance.proto.dtls.messages import parse_alpn_untrusted, parse_server_name_untrusted
from appliance.proto.dtls.tlspeek import HelloPeek, peek_client_hello_untrusted


def client_hello(server_name: str | None, alpn: list[str] | None,
                 version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3) -> bytes:
    """The first flight of an OpenSSL client (the test process's ``ssl`` module)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.maximum_version = version
    if alpn:
        ctx.set_alpn_protocols(alpn)
    out = ssl.MemoryBIO()
    obj = ctx.wrap_bio(ssl.MemoryBIO(), out, server_side=False, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
@pytest.mark.parametrize(("name", "alpn"), [
    (None, None), ("turn.example.com", ["stun.turn"]), ("Example.COM", ["h2", "http/1.1"]),
    (None, ["stun.turn"])])
def test_peek_reads_what_openssl_sent(name: str | None, alpn: list[str] | None,
                                      version: ssl.TLSVersion) -> None:
    hello = client_hello(name, alpn, version)
    # The random: bytes 11-42 of the record (header 5, handshake header 4, version 2).
    want = HelloPeek(None if name is None else name.lower(),
                     tuple(a.encode() for a in alpn or ()), hello[11:43])
    assert peek_client_hello_untrusted(hello) == want
    # Every proper prefix asks for more bytes, never guesses (a slow or split first read).
    for cut in range(len(hello)):
        assert peek_client_hello_untrusted(hello[:cut]) is None
    # Bytes after the hello (a client that sent early data, or the next record) are ignored.
    assert peek_client_hello_untrusted(hello + b"\x17\x03\x03") == want


@pytest.mark.parametrize("junk", [b"\x00\x00\x00\x00\x00", b"\x16\x02\x00\x00\x05",
                                  b"\x16\x03\x01\x00\x00", b"\x16\x03\x01\x40\x01",
                                  b"\x16\x03\x01\x00\x04\x02\x00\x00\x00"])
def test_peek_refuses_what_is_not_a_client_hello(junk: bytes) -> None:
    with pytest.raises(DtlsError):
        peek_client_hello_untrusted(junk)


def _only_dtls_error(data: bytes) -> None:
    try:
        peek_client_hello_untrusted(data)
    except DtlsError:
        pass


@given(st.binary(max_size=600))
def test_fuzz_peek_whole(data: bytes) -> None:
    _only_dtls_error(data)
    _only_dtls_error(b"\x16\x03\x01" + len(data).to_bytes(2, "big") + data)


HELLO = client_hello("turn.example.com", ["stun.turn", "h2"])


@given(st.integers(0, len(HELLO) - 1), st.integers(0, 255))
def test_fuzz_peek_byte_at_a_time(at: int, value: int) -> None:
    data = bytearray(HELLO)
    data[at] = value
    _only_dtls_error(bytes(data))
    _only_dtls_error(bytes(data[:at]) + bytes(data[at + 1:]))


@given(st.binary(max_size=200))
def test_fuzz_extension_payloads(data: bytes) -> None:
    for parse in (parse_alpn_untrusted, parse_server_name_untrusted):
        try:
            parse(data)
        except DtlsError:
            pass
