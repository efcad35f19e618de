from __future__ import annotations

import binascii

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.ufrag import (
    MAC_LEN,
    TEXT_LEN,
    UfragCodec,
    UfragError,
    load_secrets,
)

SECRET = b"s" * 32
ICE_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")


def test_round_trip_and_shape() -> None:
    codec = UfragCodec(SECRET)
    for cluster, k in [(0, 0), (1, 2), (65535, 65535), (300, 17)]:
        u = codec.mint(cluster=cluster, transceiver=k)
        assert len(u) == TEXT_LEN <= 32
        assert set(u) <= ICE_CHARS
        hint = codec.decode_untrusted(u)
        assert (hint.cluster, hint.transceiver, hint.version) == (cluster, k, 1)
        assert codec.decode_untrusted(u.encode()) == hint


def test_unique_per_session() -> None:
    codec = UfragCodec(SECRET)
    assert len({codec.mint(cluster=0, transceiver=1) for _ in range(1000)}) == 1000


def test_deterministic_with_nonce() -> None:
    codec = UfragCodec(SECRET)
    a = codec.mint(cluster=1, transceiver=2, nonce=b"1234567")
    assert a == codec.mint(cluster=1, transceiver=2, nonce=b"1234567")
    assert codec.decode_untrusted(a).nonce == b"1234567"


def test_other_secret_rejected() -> None:
    u = UfragCodec(b"a" * 32).mint(cluster=0, transceiver=0)
    with pytest.raises(UfragError) as exc:
        UfragCodec(b"b" * 32).decode_untrusted(u)
    assert exc.value.hint == "bad-mac"


def test_rotation_accepts_old_secret() -> None:
    old = UfragCodec(b"o" * 32).mint(cluster=0, transceiver=3)
    both = UfragCodec([b"n" * 32, b"o" * 32])
    assert both.decode_untrusted(old).transceiver == 3
    new = both.mint(cluster=0, transceiver=4)
    assert UfragCodec(b"n" * 32).decode_untrusted(new).transceiver == 4


@pytest.mark.parametrize("pos", range(TEXT_LEN))
def test_every_tampered_position_rejected(pos: int) -> None:
    codec = UfragCodec(SECRET)
    u = codec.mint(cluster=5, transceiver=6)
    flipped = "A" if u[pos] != "A" else "B"
    with pytest.raises(UfragError):
        codec.decode_untrusted(u[:pos] + flipped + u[pos + 1 :])


def test_forged_transceiver_field_rejected() -> None:
    codec = UfragCodec(SECRET)
    raw = bytearray(binascii.a2b_base64(codec.mint(cluster=0, transceiver=1)))
    raw[4] = 2  # route to transceiver 2 instead, keeping the MAC
    forged = binascii.b2a_base64(bytes(raw), newline=False).decode()
    with pytest.raises(UfragError) as exc:
        codec.decode_untrusted(forged)
    assert exc.value.hint == "bad-mac"


def test_version_checked() -> None:
    codec = UfragCodec(SECRET)
    raw = bytearray(binascii.a2b_base64(codec.mint(cluster=0, transceiver=1)))
    raw[0] = 9
    with pytest.raises(UfragError) as exc:
        codec.decode_untrusted(binascii.b2a_base64(bytes(raw), newline=False))
    assert exc.value.hint == "version"


@pytest.mark.parametrize("bad", ["", "abcd", "x" * 27, "x" * 29, "é" * 28, "=" * 28, "-" * 28])
def test_malformed(bad: str) -> None:
    with pytest.raises(UfragError) as exc:
        UfragCodec(SECRET).decode_untrusted(bad)
    assert exc.value.hint == "malformed"


def test_mac_is_truncated_hmac() -> None:
    assert MAC_LEN * 8 >= 64


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        UfragCodec(b"short")
    codec = UfragCodec(SECRET)
    with pytest.raises(ValueError, match="cluster"):
        codec.mint(cluster=70000, transceiver=0)
    with pytest.raises(ValueError, match="transceiver"):
        codec.mint(cluster=0, transceiver=-1)
    with pytest.raises(ValueError, match="nonce"):
        codec.mint(cluster=0, transceiver=0, nonce=b"x")


def test_load_secrets() -> None:
    assert load_secrets(b"# comment\n" + b"ab" * 16 + b"\n\nplain-text-secret-value\n") == [
        b"\xab" * 16,
        b"plain-text-secret-value",
    ]
    with pytest.raises(ValueError, match="no secret"):
        load_secrets(b"\n# nothing\n")


@given(st.one_of(st.binary(max_size=40), st.text(max_size=40)))
def test_fuzz_only_ufrag_error(data: bytes | str) -> None:
    try:
        UfragCodec(SECRET).decode_untrusted(data)
    except UfragError:
        pass
