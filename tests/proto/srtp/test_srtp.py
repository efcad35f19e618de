"""SRTP keying split (RFC 5764 §4.2) and pylibsrtp sessions."""

from __future__ import annotations

import pytest

from appliance.proto.errors import LocalProtocolError, RemoteProtocolError
from appliance.proto.srtp import (
    SrtpError,
    SrtpProfile,
    SrtpSession,
    exporter_length,
    srtp_key_material,
)

PROFILES = [
    SrtpProfile.AEAD_AES_128_GCM,
    SrtpProfile.AEAD_AES_256_GCM,
    SrtpProfile.AES128_CM_HMAC_SHA1_80,
    SrtpProfile.AES128_CM_HMAC_SHA1_32,
]


def rtp(seq: int, payload: bytes = b"\x11" * 160) -> bytes:
    return (
        bytes([0x80, 0x6F])
        + seq.to_bytes(2, "big")
        + (seq * 960).to_bytes(4, "big")
        + b"\x00\x00\xbe\xef"
        + payload
    )


RTCP_RR = bytes([0x81, 201, 0, 7]) + b"\x00\x00\xbe\xef" + b"\x00" * 24


@pytest.mark.parametrize(
    ("profile", "key", "salt", "total"),
    [
        (SrtpProfile.AES128_CM_HMAC_SHA1_80, 16, 14, 60),
        (SrtpProfile.AEAD_AES_128_GCM, 16, 12, 56),
        (SrtpProfile.AEAD_AES_256_GCM, 32, 12, 88),
    ],
)
def test_profile_lengths(profile: SrtpProfile, key: int, salt: int, total: int) -> None:
    assert (profile.key_length, profile.salt_length, exporter_length(profile)) == (key, salt, total)


def test_key_split_follows_rfc5764_layout() -> None:
    profile = SrtpProfile.AES128_CM_HMAC_SHA1_80
    export = bytes(range(60))
    client_local, client_remote = srtp_key_material(export, profile, "client")
    # client_write_key | server_write_key | client_salt | server_salt
    assert client_local.key == bytes(range(0, 16)) and client_local.salt == bytes(range(32, 46))
    assert client_remote.key == bytes(range(16, 32)) and client_remote.salt == bytes(range(46, 60))
    server_local, server_remote = srtp_key_material(export, profile, "server")
    assert (server_local, server_remote) == (client_remote, client_local)
    assert "key=<16 bytes>" in repr(client_local)


def test_key_split_accepts_the_dtls_role_enum() -> None:
    from appliance.proto.dtls import Role

    export = bytes(56)
    assert srtp_key_material(
        export, SrtpProfile.AEAD_AES_128_GCM, Role.SERVER
    ) == srtp_key_material(export, SrtpProfile.AEAD_AES_128_GCM, "server")


def test_key_split_misuse() -> None:
    with pytest.raises(LocalProtocolError):
        srtp_key_material(bytes(59), SrtpProfile.AES128_CM_HMAC_SHA1_80, "client")
    with pytest.raises(LocalProtocolError):
        srtp_key_material(bytes(60), SrtpProfile.AES128_CM_HMAC_SHA1_80, "peer")


def sessions(profile: SrtpProfile) -> tuple[SrtpSession, SrtpSession]:
    export = bytes((i * 7 + 3) % 256 for i in range(exporter_length(profile)))
    c = srtp_key_material(export, profile, "client")
    s = srtp_key_material(export, profile, "server")
    return SrtpSession(profile, *c), SrtpSession(profile, *s)


@pytest.mark.parametrize("profile", PROFILES)
def test_round_trip_rtp_and_rtcp(profile: SrtpProfile) -> None:
    client, server = sessions(profile)
    for seq in range(5):
        protected = client.protect(rtp(seq))
        assert protected != rtp(seq)
        assert server.unprotect(protected) == rtp(seq)
    assert client.unprotect_rtcp(server.protect_rtcp(RTCP_RR)) == RTCP_RR
    assert server.counters.unprotected == 5


@pytest.mark.parametrize("profile", PROFILES)
def test_replay_is_rejected_and_counted(profile: SrtpProfile) -> None:
    client, server = sessions(profile)
    packet = client.protect(rtp(1))
    server.unprotect(packet)
    with pytest.raises(SrtpError) as info:
        server.unprotect(packet)
    assert info.value.hint == "replay" and isinstance(info.value, RemoteProtocolError)
    assert server.counters.replayed == 1
    rtcp = client.protect_rtcp(RTCP_RR)
    server.unprotect_rtcp(rtcp)
    with pytest.raises(SrtpError):
        server.unprotect_rtcp(rtcp)
    assert server.counters.replayed == 2


@pytest.mark.parametrize("profile", PROFILES)
def test_forgery_is_rejected_and_counted(profile: SrtpProfile) -> None:
    client, server = sessions(profile)
    packet = bytearray(client.protect(rtp(2)))
    packet[20] ^= 0x01
    with pytest.raises(SrtpError) as info:
        server.unprotect(bytes(packet))
    assert info.value.hint == "auth"
    assert server.counters.auth_failed == 1
    # The genuine packet still passes: a forgery does not poison the replay window.
    assert server.unprotect(client.protect(rtp(3))) == rtp(3)


def test_own_packets_do_not_unprotect_with_own_session() -> None:
    client, _ = sessions(SrtpProfile.AEAD_AES_128_GCM)
    with pytest.raises(SrtpError):
        client.unprotect(client.protect(rtp(1)))


def test_garbage_is_srtp_error() -> None:
    _, server = sessions(SrtpProfile.AEAD_AES_128_GCM)
    for junk in (b"", b"\x80", b"\x80\x00" + b"\x00" * 10, b"\xff" * 40):
        with pytest.raises(SrtpError):
            server.unprotect(junk)
        with pytest.raises(SrtpError):
            server.unprotect_rtcp(junk)


def test_wrong_key_lengths_are_local_errors() -> None:
    c, s = srtp_key_material(bytes(56), SrtpProfile.AEAD_AES_128_GCM, "client")
    with pytest.raises(LocalProtocolError):
        SrtpSession(SrtpProfile.AEAD_AES_256_GCM, c, s)
