"""Interop: our DTLS ↔ OpenSSL (pyOpenSSL over memory BIOs), both roles, every suite and
SRTP profile; exported SRTP keys agree and SRTP packets cross between the two stacks."""

from __future__ import annotations

import pytest
from interop.dtls_openssl_peer import OPENSSL_SUITE_NAMES, OpenSslPeer

from appliance.proto.dtls import (
    ApplicationData,
    Certificate,
    CipherSuite,
    DtlsConnection,
    FalseStart,
    HandshakeComplete,
    Role,
    State,
)
from appliance.proto.srtp import (
    EXPORTER_LABEL,
    SrtpProfile,
    SrtpSession,
    exporter_length,
    srtp_key_material,
)

pytestmark = pytest.mark.interop

NOW = 1_700_000_000.0
PROFILES = [
    SrtpProfile.AEAD_AES_128_GCM,
    SrtpProfile.AEAD_AES_256_GCM,
    SrtpProfile.AES128_CM_HMAC_SHA1_80,
]
_CERTS: dict[str, Certificate] = {}


def cert(name: str) -> Certificate:
    if name not in _CERTS:
        _CERTS[name] = Certificate.generate(NOW)
    return _CERTS[name]


def pump(ours: DtlsConnection, theirs: OpenSslPeer, rounds: int = 20) -> list[object]:
    events: list[object] = []
    for _ in range(rounds):
        theirs.step()
        moved = False
        for d in theirs.outgoing():
            ours.handle_datagram(NOW, d)
            moved = True
        while (d := ours.poll_transmit()) is not None:
            assert len(d) <= ours.mtu
            theirs.feed(d)
            moved = True
        while (e := ours.poll_event()) is not None:
            events.append(e)
        if not moved and theirs.done and ours.is_established:
            break
    return events


def rtp_packet(seq: int) -> bytes:
    return (
        bytes([0x80, 111])
        + seq.to_bytes(2, "big")
        + (1234).to_bytes(4, "big")
        + (0xCAFE).to_bytes(4, "big")
        + b"\x55" * 160
    )


def check_keys_and_srtp(
    ours: DtlsConnection, theirs: OpenSslPeer, profile: SrtpProfile, our_role: Role
) -> None:
    n = exporter_length(profile)
    mine = ours.export_keying_material(EXPORTER_LABEL, n)
    assert theirs.ssl.export_keying_material(EXPORTER_LABEL, n) == mine
    assert theirs.ssl.get_selected_srtp_profile() == profile.openssl_name.encode()
    their_role = "server" if our_role is Role.CLIENT else "client"
    local, remote = srtp_key_material(mine, profile, our_role)
    their_local, their_remote = srtp_key_material(
        theirs.ssl.export_keying_material(EXPORTER_LABEL, n), profile, their_role
    )
    assert (local, remote) == (their_remote, their_local)
    a = SrtpSession(profile, local, remote)
    b = SrtpSession(profile, their_local, their_remote)
    assert b.unprotect(a.protect(rtp_packet(1))) == rtp_packet(1)
    assert a.unprotect(b.protect(rtp_packet(7))) == rtp_packet(7)


def check_application_data(ours: DtlsConnection, theirs: OpenSslPeer) -> None:
    ours.send_application_data(b"from us")
    while (d := ours.poll_transmit()) is not None:
        theirs.feed(d)
    assert theirs.recv() == b"from us"
    theirs.ssl.send(b"from openssl")
    for d in theirs.outgoing():
        ours.handle_datagram(NOW, d)
    assert ours.poll_event() == ApplicationData(b"from openssl")


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("suite", list(CipherSuite))
def test_our_server_openssl_client(suite: CipherSuite, profile: SrtpProfile) -> None:
    theirs = OpenSslPeer(
        server=False,
        certificate=cert("openssl"),
        cipher=OPENSSL_SUITE_NAMES[suite],
        srtp=profile.openssl_name.encode(),
    )
    ours = DtlsConnection(
        Role.SERVER, cert("ours"), remote_fingerprints=[cert("openssl").fingerprint]
    )
    events = pump(ours, theirs)
    assert theirs.done
    complete = next(e for e in events if isinstance(e, HandshakeComplete))
    assert complete == HandshakeComplete(profile, suite, cert("openssl").fingerprint)
    assert theirs.ssl.get_cipher_name() == OPENSSL_SUITE_NAMES[suite]
    assert theirs.peer_fingerprint() == cert("ours").fingerprint
    check_keys_and_srtp(ours, theirs, profile, Role.SERVER)
    check_application_data(ours, theirs)


@pytest.mark.parametrize("cookies", [False, True], ids=["no-cookie", "openssl-cookie"])
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("suite", list(CipherSuite))
def test_our_client_openssl_server(suite: CipherSuite, profile: SrtpProfile, cookies: bool) -> None:
    theirs = OpenSslPeer(
        server=True,
        certificate=cert("openssl"),
        cipher=OPENSSL_SUITE_NAMES[suite],
        srtp=profile.openssl_name.encode(),
        cookies=cookies,
    )
    ours = DtlsConnection(
        Role.CLIENT,
        cert("ours"),
        remote_fingerprints=[cert("openssl").fingerprint],
        cipher_suites=[suite],
        srtp_profiles=[profile],
    )
    ours.start(NOW)
    events = pump(ours, theirs)
    assert theirs.done
    complete = next(e for e in events if isinstance(e, HandshakeComplete))
    assert complete == HandshakeComplete(profile, suite, cert("openssl").fingerprint)
    assert theirs.peer_fingerprint() == cert("ours").fingerprint
    check_keys_and_srtp(ours, theirs, profile, Role.CLIENT)
    check_application_data(ours, theirs)


def test_our_server_with_cookies_openssl_client() -> None:
    theirs = OpenSslPeer(server=False, certificate=cert("openssl"))
    ours = DtlsConnection(
        Role.SERVER,
        cert("ours"),
        remote_fingerprints=[cert("openssl").fingerprint],
        cookie_secret=b"secret" * 6,
        cookie_context=b"127.0.0.1:40000",
    )
    events = pump(ours, theirs)
    assert theirs.done and any(isinstance(e, HandshakeComplete) for e in events)
    check_keys_and_srtp(ours, theirs, SrtpProfile.AEAD_AES_128_GCM, Role.SERVER)


def test_server_preference_order_wins() -> None:
    # OpenSSL offers 80-bit AES-CM first; our server prefers AEAD-GCM.
    theirs = OpenSslPeer(
        server=False,
        certificate=cert("openssl"),
        srtp=b"SRTP_AES128_CM_SHA1_80:SRTP_AEAD_AES_256_GCM:SRTP_AEAD_AES_128_GCM",
    )
    ours = DtlsConnection(
        Role.SERVER, cert("ours"), remote_fingerprints=[cert("openssl").fingerprint]
    )
    events = pump(ours, theirs)
    complete = next(e for e in events if isinstance(e, HandshakeComplete))
    assert complete.srtp_profile is SrtpProfile.AEAD_AES_128_GCM


def test_wrong_fingerprint_alerts_openssl_client() -> None:
    from OpenSSL import SSL

    theirs = OpenSslPeer(server=False, certificate=cert("openssl"))
    ours = DtlsConnection(Role.SERVER, cert("ours"), remote_fingerprints=[cert("ours").fingerprint])
    with pytest.raises(SSL.Error, match="bad certificate"):
        pump(ours, theirs)


@pytest.mark.parametrize("suite", list(CipherSuite))
def test_our_false_start_client_sends_before_openssl_finished(suite: CipherSuite) -> None:
    """RFC 7918 against OpenSSL as the DTLS 1.2 server (what the transceiver does as client,
    docs/sctp.md "Setup latency"): application data sent on FalseStart, while OpenSSL's
    Finished is still held back, is read by OpenSSL once it has our flight 5; our side then
    completes on OpenSSL's Finished as usual."""
    profile = PROFILES[0]
    theirs = OpenSslPeer(server=True, certificate=cert("openssl"),
                         cipher=OPENSSL_SUITE_NAMES[suite], srtp=profile.openssl_name.encode())
    ours = DtlsConnection(Role.CLIENT, cert("ours"),
                          remote_fingerprints=[cert("openssl").fingerprint],
                          cipher_suites=[suite], srtp_profiles=[profile], false_start=True)
    ours.start(NOW)
    early = False
    held: list[bytes] = []
    for _ in range(20):
        theirs.step()
        for d in theirs.outgoing():
            if early:
                held.append(d)  # OpenSSL's Finished: not delivered yet
            else:
                ours.handle_datagram(NOW, d)
        while (e := ours.poll_event()) is not None:
            if isinstance(e, FalseStart):
                assert ours.state is State.CLIENT_WAIT_FINISHED
                ours.send_application_data(b"INIT behind our Finished")
                early = True
        while (d := ours.poll_transmit()) is not None:
            theirs.feed(d)
        if theirs.done:
            break
    assert early and theirs.done and not ours.is_established
    assert theirs.recv() == b"INIT behind our Finished"
    for d in held + theirs.outgoing():
        ours.handle_datagram(NOW, d)
    assert isinstance(ours.poll_event(), HandshakeComplete)
    check_keys_and_srtp(ours, theirs, profile, Role.CLIENT)
    check_application_data(ours, theirs)
