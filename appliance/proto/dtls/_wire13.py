"""DTLS 1.3 wire constants (RFC 9147, RFC 8446) kept apart from the 1.2 registries.

The 1.2 enums in :mod:`._wire` are iterated by tests and interop suites that only speak
1.2, so 1.3-only code points live here: the version number (RFC 9147 §5.3), the TLS 1.3
cipher suites (RFC 8446 §B.4), groups including the hybrid X25519MLKEM768
(draft-ietf-tls-ecdhe-mlkem §4), the ACK content type (RFC 9147 §7), the new handshake
types and extensions (RFC 8446 §4, §4.2) and the downgrade sentinels (RFC 8446 §4.1.3).
"""

from __future__ import annotations

import enum
import hashlib

# RFC 9147 §5.3: DTLS 1.3 is {254, 252}; legacy_version stays {254, 253}.
DTLS_1_3 = 0xFEFC


class CipherSuite13(enum.IntEnum):
    TLS_AES_128_GCM_SHA256 = 0x1301
    TLS_AES_256_GCM_SHA384 = 0x1302
    TLS_CHACHA20_POLY1305_SHA256 = 0x1303


class Group13(enum.IntEnum):
    """RFC 8446 §4.2.7 NamedGroup values we can offer in a key_share."""

    secp256r1 = 23
    x25519 = 29
    X25519MLKEM768 = 0x11EC  # draft-ietf-tls-ecdhe-mlkem §4 (Chromium's default)


class ContentType13(enum.IntEnum):
    ALERT = 21
    HANDSHAKE = 22
    APPLICATION_DATA = 23
    ACK = 26  # RFC 9147 §7


class HandshakeType13(enum.IntEnum):
    CLIENT_HELLO = 1
    SERVER_HELLO = 2
    HELLO_VERIFY_REQUEST = 3  # from a DTLS 1.2 server (RFC 9147 §5.3: clients must cope)
    NEW_SESSION_TICKET = 4
    ENCRYPTED_EXTENSIONS = 8
    CERTIFICATE = 11
    CERTIFICATE_REQUEST = 13
    CERTIFICATE_VERIFY = 15
    FINISHED = 20
    KEY_UPDATE = 24
    MESSAGE_HASH = 254  # RFC 8446 §4.4.1, only ever inside the transcript


class Ext13(enum.IntEnum):
    supported_groups = 10
    signature_algorithms = 13
    use_srtp = 14
    pre_shared_key = 41
    early_data = 42
    supported_versions = 43
    cookie = 44
    psk_key_exchange_modes = 45
    certificate_authorities = 47
    signature_algorithms_cert = 50
    key_share = 51
    connection_id = 54


# RFC 8446 §4.1.3: a HelloRetryRequest is a ServerHello with this random.
HRR_RANDOM = hashlib.sha256(b"HelloRetryRequest").digest()
# RFC 8446 §4.1.3: the last 8 bytes of ServerHello.random from a 1.3-capable server that
# negotiates 1.2 (…01) or below (…00). DTLS uses the same values.
DOWNGRADE_TLS12 = b"DOWNGRD\x01"
DOWNGRADE_TLS11 = b"DOWNGRD\x00"
DOWNGRADE_SENTINELS = (DOWNGRADE_TLS12, DOWNGRADE_TLS11)

#: The version names the ``versions=`` constructor option takes.
VERSION_NAMES = frozenset({"1.2", "1.3"})


def parse_versions(text: str) -> frozenset[str]:
    """``"1.2,1.3"`` (a ``--dtls-versions`` flag) -> ``frozenset({"1.2", "1.3"})``."""
    names = frozenset(v.strip() for v in text.split(",") if v.strip())
    if not names or not names <= VERSION_NAMES:
        raise ValueError(f"DTLS versions must be a non-empty subset of 1.2,1.3: {text!r}")
    return names
