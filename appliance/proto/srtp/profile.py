"""SRTP protection profiles negotiated by DTLS-SRTP (RFC 5764 §4.1.2, RFC 7714 §14.2).

Kept free of pylibsrtp so that the DTLS core can name profiles without pulling in the
SRTP implementation (STYLE.md rule 8: SRTP keying stays out of the DTLS connection).
"""

from __future__ import annotations

import enum


class SrtpProfile(enum.IntEnum):
    """Wire ids from the IANA "DTLS-SRTP Protection Profiles" registry."""

    AES128_CM_HMAC_SHA1_80 = 0x0001
    AES128_CM_HMAC_SHA1_32 = 0x0002
    AEAD_AES_128_GCM = 0x0007
    AEAD_AES_256_GCM = 0x0008

    @property
    def key_length(self) -> int:
        """Master key bytes (RFC 5764 §4.1.2; RFC 7714 §12)."""
        return 32 if self is SrtpProfile.AEAD_AES_256_GCM else 16

    @property
    def salt_length(self) -> int:
        """Master salt bytes: 112 bits for AES-CM (RFC 3711 §8.2), 96 for GCM (RFC 7714 §12)."""
        return (
            14
            if self in (SrtpProfile.AES128_CM_HMAC_SHA1_80, SrtpProfile.AES128_CM_HMAC_SHA1_32)
            else 12
        )

    @property
    def openssl_name(self) -> str:
        """The name OpenSSL's ``SSL_CTX_set_tlsext_use_srtp`` uses."""
        return {
            SrtpProfile.AES128_CM_HMAC_SHA1_80: "SRTP_AES128_CM_SHA1_80",
            SrtpProfile.AES128_CM_HMAC_SHA1_32: "SRTP_AES128_CM_SHA1_32",
            SrtpProfile.AEAD_AES_128_GCM: "SRTP_AEAD_AES_128_GCM",
            SrtpProfile.AEAD_AES_256_GCM: "SRTP_AEAD_AES_256_GCM",
        }[self]


DEFAULT_SRTP_PROFILES: tuple[SrtpProfile, ...] = (
    SrtpProfile.AEAD_AES_128_GCM,
    SrtpProfile.AEAD_AES_256_GCM,
    SrtpProfile.AES128_CM_HMAC_SHA1_80,
)
