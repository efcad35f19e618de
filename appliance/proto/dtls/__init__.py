"""Sans-IO DTLS 1.2 (RFC 6347) for WebRTC on ``cryptography`` primitives.

Modules: ``_wire`` (constants, bounds-checked reader, :class:`DtlsError`), ``record``
(record/fragment codecs, reassembly, anti-replay), ``messages`` (handshake bodies),
``crypto`` (PRF, EMS, AEAD records, ECDHE, signatures), ``certificate`` (self-signed
ECDSA certificate, SDP fingerprints), ``connection`` (the state machine).
"""

from appliance.proto.dtls._wire import (
    AlertDescription,
    AlertLevel,
    CipherSuite,
    ContentType,
    DtlsError,
    NamedGroup,
)
from appliance.proto.dtls.certificate import Certificate, fingerprint_of
from appliance.proto.dtls.connection import (
    DEFAULT_CIPHER_SUITES,
    ApplicationData,
    ConnectionClosed,
    Counters,
    DtlsConnection,
    Event,
    FalseStart,
    HandshakeComplete,
    Role,
    State,
)

__all__ = [
    "DEFAULT_CIPHER_SUITES",
    "AlertDescription",
    "AlertLevel",
    "ApplicationData",
    "Certificate",
    "CipherSuite",
    "ConnectionClosed",
    "ContentType",
    "Counters",
    "DtlsConnection",
    "DtlsError",
    "Event",
    "FalseStart",
    "HandshakeComplete",
    "NamedGroup",
    "Role",
    "State",
    "fingerprint_of",
]
