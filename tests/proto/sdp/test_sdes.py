"""RFC 4568 ``a=crypto`` (appliance/proto/sdp/sdes.py): parse, build, choose, key, redact,
and fuzz (only SdpError may escape)."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.errors import LocalProtocolError
from appliance.proto.sdp import SdpError
from appliance.proto.sdp.sdes import (
    CryptoAttribute,
    CryptoSuite,
    KeyParam,
    answer_crypto,
    choose_crypto,
    generate_crypto,
    usable,
)

#: RFC 4568 §9.2's example offer line.
RFC_EXAMPLE = ("1 AES_CM_128_HMAC_SHA1_80 "
               "inline:PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR|2^20|1:4")


def test_rfc4568_example() -> None:
    a = CryptoAttribute.parse_untrusted(RFC_EXAMPLE)
    assert a.tag == 1 and a.known_suite is CryptoSuite.AES_CM_128_HMAC_SHA1_80
    assert len(a.material) == 30 and a.master_key() + a.master_salt() == a.material
    assert len(a.master_key()) == 16 and len(a.master_salt()) == 14
    assert a.keys[0].lifetime == 1 << 20 and a.keys[0].mki == (1, 4)
    assert a.build() == RFC_EXAMPLE
    assert CryptoAttribute.parse_untrusted("a=crypto:" + RFC_EXAMPLE + "\r\n") == a
    assert not usable(a)  # MKI: pylibsrtp cannot key it


@pytest.mark.parametrize(("suite", "size"), [
    (CryptoSuite.AES_CM_128_HMAC_SHA1_80, 30),
    (CryptoSuite.AES_CM_128_HMAC_SHA1_32, 30),
    (CryptoSuite.AEAD_AES_128_GCM, 28),  # RFC 7714 §14.2: 128-bit key, 96-bit salt
    (CryptoSuite.AEAD_AES_256_GCM, 44),
])
def test_generate_round_trip(suite: CryptoSuite, size: int) -> None:
    rnd = bytes(range(size))
    a = generate_crypto(7, suite, rnd)
    assert a.material == rnd and suite.material_length == size
    text = a.build()
    assert text == f"7 {suite.value} inline:{base64.b64encode(rnd).decode()}"
    b = CryptoAttribute.parse_untrusted(text)
    assert b == a and usable(b)
    assert a.line() == "a=crypto:" + text
    with pytest.raises(LocalProtocolError):
        generate_crypto(7, suite, rnd[:-1])


def test_key_material_never_in_repr_or_str() -> None:
    rnd = b"\x11" * 30
    a = generate_crypto(1, CryptoSuite.AES_CM_128_HMAC_SHA1_80, rnd)
    b64 = base64.b64encode(rnd).decode()
    for text in (repr(a), str(a), f"{a}", repr(a.keys[0]), str(a.keys[0]), repr([a])):
        assert b64 not in text and "\\x11" not in text and "inline" not in text
        assert "30 bytes" in text or "30" in text


def test_lifetime_forms_and_wsh() -> None:
    key = base64.b64encode(bytes(30)).decode()
    a = CryptoAttribute.parse_untrusted(
        f"2 AES_CM_128_HMAC_SHA1_32 inline:{key}|1048576 WSH=64")
    assert a.keys[0].lifetime == 1 << 20 and a.session_params == ("WSH=64",)
    assert a.build().endswith("|1048576 WSH=64")  # decimal stays decimal
    assert usable(a)
    short = CryptoAttribute.parse_untrusted(f"2 AES_CM_128_HMAC_SHA1_32 inline:{key}|2^10")
    assert not usable(short)  # would expire mid-call


def test_unpadded_base64_is_accepted() -> None:
    # 28 bytes -> 40 characters with "=" padding; some stacks drop it.
    raw = bytes(range(28))
    text = base64.b64encode(raw).decode().rstrip("=")
    a = CryptoAttribute.parse_untrusted(f"1 AEAD_AES_128_GCM inline:{text}")
    assert a.material == raw


def test_choose_prefers_gcm_then_80_and_skips_unusable() -> None:
    k30 = base64.b64encode(bytes(30)).decode()
    k28 = base64.b64encode(bytes(28)).decode()
    offers = [CryptoAttribute.parse_untrusted(t) for t in (
        f"1 AES_CM_128_HMAC_SHA1_32 inline:{k30}",
        f"2 AES_CM_128_HMAC_SHA1_80 inline:{k30} UNENCRYPTED_SRTP",
        f"3 AES_CM_128_HMAC_SHA1_80 inline:{k30}",
        f"4 F8_128_HMAC_SHA1_80 inline:{k30}",
        f"5 AEAD_AES_128_GCM inline:{k28};inline:{k28}",
    )]
    chosen = choose_crypto(offers)
    assert chosen is not None and chosen.tag == 3
    assert choose_crypto(offers, [CryptoSuite.AES_CM_128_HMAC_SHA1_32]).tag == 1  # type: ignore[union-attr]
    assert choose_crypto(offers[3:]) is None
    answer = answer_crypto(chosen, b"\x22" * 30)
    assert (answer.tag, answer.suite, answer.material) == (3, chosen.suite, b"\x22" * 30)


@pytest.mark.parametrize("bad", [
    "", "1", "1 AES_CM_128_HMAC_SHA1_80", "x AES_CM_128_HMAC_SHA1_80 inline:AAAA",
    "1234567890 AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 40,
    "1 AES_CM_128_HMAC_SHA1_80 key:" + "A" * 40,
    "1 AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 36,  # 27 bytes: wrong size for the suite
    "1 AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 39 + "!",
    "1 AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 40 + "|2^99",
    "1 AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 40 + "|1:0",
    "1 AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 40 + "|256:1",
    "1 AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 40 + "|1:4|2^20",  # lifetime after MKI
    "1 AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 40 + "|0",
    "1 AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 40 + "|1|2|3",
    "1 AES-CM inline:" + "A" * 40,
    "1 AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 40 + " \x7f",
    "1 AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 2000,
])
def test_malformed_raises_sdp_error(bad: str) -> None:
    with pytest.raises(SdpError) as info:
        CryptoAttribute.parse_untrusted(bad)
    assert info.value.code == "malformed" and info.value.status == 400


def test_non_ascii_bytes() -> None:
    with pytest.raises(SdpError):
        CryptoAttribute.parse_untrusted(b"1 AES\xff inline:AAAA")
    a = CryptoAttribute.parse_untrusted(RFC_EXAMPLE.encode())
    assert a.tag == 1


def test_caller_built_values_are_checked() -> None:
    with pytest.raises(LocalProtocolError):
        CryptoAttribute(10**10, "AES_CM_128_HMAC_SHA1_80", (KeyParam(bytes(30)),))
    with pytest.raises(LocalProtocolError):
        CryptoAttribute(1, "AES_CM_128_HMAC_SHA1_80", ())
    unknown = CryptoAttribute(1, "NULL_HMAC_SHA1_80", (KeyParam(bytes(30)),))
    with pytest.raises(LocalProtocolError):
        unknown.master_key()


def _parse(data: str | bytes) -> None:
    try:
        a = CryptoAttribute.parse_untrusted(data)
    except SdpError:
        return
    # Whatever parses re-parses from what we build (possibly normalised) to the same value.
    assert CryptoAttribute.parse_untrusted(a.build()) == a
    usable(a)
    repr(a)


@given(st.binary(max_size=300))
def test_fuzz_bytes(data: bytes) -> None:
    _parse(data)


@given(st.text(max_size=120))
def test_fuzz_text(data: str) -> None:
    _parse(data)


_TOKENS = st.sampled_from(["1", "99", " ", "  ", "AES_CM_128_HMAC_SHA1_80", "AEAD_AES_128_GCM",
                           "inline:", "INLINE:", base64.b64encode(bytes(30)).decode(),
                           base64.b64encode(bytes(28)).decode(), "|", "2^", "20", ":", "4",
                           ";", "=", "WSH=64", "KDR=1", "\t", "a=crypto:"])


@given(st.lists(_TOKENS, max_size=20))
def test_fuzz_structured(tokens: list[str]) -> None:
    _parse("".join(tokens))


@given(st.binary(min_size=1, max_size=120))
def test_fuzz_byte_at_a_time_prefixes(data: bytes) -> None:
    """Every prefix of a mutated valid line: only SdpError escapes."""
    base = bytearray(RFC_EXAMPLE.encode())
    for i, b in enumerate(data[: len(base)]):
        base[i % len(base)] ^= b & 0x7F
    for end in range(0, len(base) + 1, 7):
        _parse(bytes(base[:end]))
