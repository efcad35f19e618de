"""SRTP for DTLS-SRTP: profiles, RFC 5764 §4.2 key split, and pylibsrtp sessions."""

from appliance.proto.srtp.profile import DEFAULT_SRTP_PROFILES, SrtpProfile
from appliance.proto.srtp.session import (
    EXPORTER_LABEL,
    KeyingMaterial,
    SrtpError,
    SrtpSession,
    exporter_length,
    srtp_key_material,
)

__all__ = [
    "DEFAULT_SRTP_PROFILES",
    "EXPORTER_LABEL",
    "KeyingMaterial",
    "SrtpError",
    "SrtpProfile",
    "SrtpSession",
    "exporter_length",
    "srtp_key_material",
]
