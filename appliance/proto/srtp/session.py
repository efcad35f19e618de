"""DTLS-SRTP keying (RFC 5764 §4.2) and SRTP/SRTCP protection via pylibsrtp (libsrtp 2).

The exporter output is split as RFC 5764 §4.2 draws it::

    client_write_SRTP_master_key[key_len]
    server_write_SRTP_master_key[key_len]
    client_write_SRTP_master_salt[salt_len]
    server_write_SRTP_master_salt[salt_len]

The DTLS client protects with the client key/salt and the server with the server
key/salt. Replay protection and authentication are libsrtp's (RFC 3711 §3.3.2, 128-packet
window by default; RFC 7714 for AEAD-GCM). MKI is not supported (WebRTC never uses it).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import pylibsrtp

from appliance.proto.errors import LocalProtocolError, RemoteProtocolError
from appliance.proto.srtp.profile import SrtpProfile

EXPORTER_LABEL = b"EXTRACTOR-dtls_srtp"

_POLICY_PROFILE = {
    SrtpProfile.AES128_CM_HMAC_SHA1_80: pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    SrtpProfile.AES128_CM_HMAC_SHA1_32: pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
    SrtpProfile.AEAD_AES_128_GCM: pylibsrtp.Policy.SRTP_PROFILE_AEAD_AES_128_GCM,
    SrtpProfile.AEAD_AES_256_GCM: pylibsrtp.Policy.SRTP_PROFILE_AEAD_AES_256_GCM,
}


class SrtpError(RemoteProtocolError):
    """An SRTP/SRTCP packet was rejected. ``hint``: "replay", "auth" or "malformed"."""


@dataclass(frozen=True, slots=True, repr=False)
class KeyingMaterial:
    """One direction's SRTP master key and salt. ``repr`` hides the secret."""

    key: bytes
    salt: bytes

    def __repr__(self) -> str:
        return f"KeyingMaterial(key=<{len(self.key)} bytes>, salt=<{len(self.salt)} bytes>)"

    def __bytes__(self) -> bytes:
        return self.key + self.salt


def exporter_length(profile: SrtpProfile) -> int:
    """How many bytes to ask the DTLS exporter for (RFC 5764 §4.2: 2 × (key + salt))."""
    return 2 * (profile.key_length + profile.salt_length)


def srtp_key_material(
    connection_export: bytes, profile: SrtpProfile, role: str | enum.Enum
) -> tuple[KeyingMaterial, KeyingMaterial]:
    """``(local, remote)`` keying for our DTLS ``role`` ("client"/"server" or a Role enum)."""
    role_name = role.value if isinstance(role, enum.Enum) else role
    if role_name not in ("client", "server"):
        raise LocalProtocolError(f"role must be client or server, not {role!r}")
    k, s = profile.key_length, profile.salt_length
    if len(connection_export) != 2 * (k + s):
        raise LocalProtocolError(
            f"{profile.name} needs {2 * (k + s)} exported bytes, got {len(connection_export)}"
        )
    client = KeyingMaterial(connection_export[:k], connection_export[2 * k : 2 * k + s])
    server = KeyingMaterial(connection_export[k : 2 * k], connection_export[2 * k + s :])
    return (client, server) if role_name == "client" else (server, client)


@dataclass(slots=True)
class SrtpCounters:
    protected: int = 0
    unprotected: int = 0
    replayed: int = 0
    auth_failed: int = 0
    malformed: int = 0


class SrtpSession:
    """Outbound and inbound SRTP contexts for one DTLS-SRTP association (any SSRC)."""

    def __init__(self, profile: SrtpProfile, local: KeyingMaterial, remote: KeyingMaterial) -> None:
        for keying in (local, remote):
            if len(keying.key) != profile.key_length or len(keying.salt) != profile.salt_length:
                raise LocalProtocolError(f"key/salt lengths do not fit {profile.name}")
        self.profile = profile
        self.counters = SrtpCounters()
        self._tx = pylibsrtp.Session(self._policy(local, pylibsrtp.Policy.SSRC_ANY_OUTBOUND))
        self._rx = pylibsrtp.Session(self._policy(remote, pylibsrtp.Policy.SSRC_ANY_INBOUND))

    @classmethod
    def from_exporter(
        cls, export: Callable[[bytes, int], bytes], profile: SrtpProfile, role: str | enum.Enum
    ) -> SrtpSession:
        """Key a session from a DTLS exporter (RFC 5764 §4.2): ``export`` is the DTLS
        connection's ``export_keying_material``; passing the callable keeps this module free
        of any DTLS import (STYLE.md rule 8)."""
        material = export(EXPORTER_LABEL, exporter_length(profile))
        local, remote = srtp_key_material(material, profile, role)
        return cls(profile, local, remote)

    def _policy(self, keying: KeyingMaterial, ssrc_type: int) -> pylibsrtp.Policy:
        policy = pylibsrtp.Policy(
            key=bytes(keying), ssrc_type=ssrc_type, srtp_profile=_POLICY_PROFILE[self.profile]
        )
        # RFC 3711 §3.3.2 minimum is 64; a larger window tolerates more reordering.
        policy.window_size = 1024
        return policy

    def protect(self, rtp: bytes) -> bytes:
        out: bytes = self._tx.protect(rtp)
        self.counters.protected += 1
        return out

    def protect_rtcp(self, rtcp: bytes) -> bytes:
        out: bytes = self._tx.protect_rtcp(rtcp)
        self.counters.protected += 1
        return out

    def unprotect_untrusted(self, srtp: bytes) -> bytes:
        """Authenticate and decrypt an SRTP packet; replays and forgeries raise SrtpError."""
        try:
            out: bytes = self._rx.unprotect(srtp)
        except pylibsrtp.Error as exc:
            raise self._classify(exc) from None
        self.counters.unprotected += 1
        return out

    def unprotect_rtcp_untrusted(self, srtcp: bytes) -> bytes:
        try:
            out: bytes = self._rx.unprotect_rtcp(srtcp)
        except pylibsrtp.Error as exc:
            raise self._classify(exc) from None
        self.counters.unprotected += 1
        return out

    # Short names for callers that prefer the pylibsrtp vocabulary.
    unprotect = unprotect_untrusted
    unprotect_rtcp = unprotect_rtcp_untrusted

    def _classify(self, exc: Exception) -> SrtpError:
        text = str(exc)
        if "replay" in text:
            self.counters.replayed += 1
            return SrtpError(f"replayed packet: {text}", hint="replay")
        if "auth" in text:
            self.counters.auth_failed += 1
            return SrtpError(f"authentication failed: {text}", hint="auth")
        self.counters.malformed += 1
        return SrtpError(f"rejected packet: {text}", hint="malformed")
