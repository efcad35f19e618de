"""Sans-IO DTLS 1.2 (RFC 6347) and 1.3 (RFC 9147) for WebRTC on ``cryptography``.

Modules: ``_wire`` (constants, bounds-checked reader, :class:`DtlsError`), ``record``
(record/fragment codecs, reassembly, anti-replay), ``messages`` (handshake bodies),
``crypto`` (PRF, EMS, AEAD records, ECDHE, signatures), ``certificate`` (self-signed
ECDSA certificate, SDP fingerprints), ``events`` (what callers see), ``connection`` (the
1.2 state machine), ``versioned`` (:class:`DtlsConnection`: version negotiation). DTLS
1.3: ``_wire13``, ``record13`` (unified header, ACK), ``messages13``, ``keyschedule13``,
``recordlayer13``, ``conn13_protocol`` (the handshake state enum and the connection
surface the handlers use), ``handshake13``, ``connection13``. See docs/dtls13.md.
"""

from appliance.proto.dtls._wire import (
    AlertDescription,
    AlertLevel,
    CipherSuite,
    ContentType,
    DtlsError,
    NamedGroup,
)
from appliance.proto.dtls._wire13 import CipherSuite13, Group13, parse_versions
from appliance.proto.dtls.certificate import Certificate, fingerprint_of
from appliance.proto.dtls.connection import DEFAULT_CIPHER_SUITES
from appliance.proto.dtls.events import (
    ApplicationData,
    ConnectionClosed,
    Counters,
    Event,
    FalseStart,
    HandshakeComplete,
    Role,
    State,
)
from appliance.proto.dtls.keyschedule13 import HAVE_MLKEM
from appliance.proto.dtls.versioned import DEFAULT_VERSIONS, DtlsConnection

__all__ = [
    "DEFAULT_CIPHER_SUITES",
    "DEFAULT_VERSIONS",
    "HAVE_MLKEM",
    "CipherSuite13",
    "Group13",
    "parse_versions",
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
