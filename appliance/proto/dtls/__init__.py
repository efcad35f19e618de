"""Sans-IO DTLS 1.2 (RFC 6347) and 1.3 (RFC 9147) for WebRTC on ``cryptography``.

One connection class, :class:`DtlsConnection` (``connection``: the verbs and the version
choice), drives one handshake engine at a time over one record-layer interface:

* shared: ``_wire`` (1.2 and 1.3 constants, bounds-checked reader, :class:`DtlsError`), ``record``
  (record/fragment codecs, reassembly, anti-replay), ``messages`` (1.2 and 1.3 handshake bodies),
  ``crypto``, ``certificate``, ``events`` (what callers see), ``engine`` (what both engines
  share: verbs, timers, fragments in, alerts, closing), ``recordlayer`` (records out),
  ``conn_protocol`` (what the handshake handlers may touch of an engine);
* DTLS 1.2: ``engine12`` (state, records in), ``recordlayer12``, ``handshake12``
  (dispatch, Finished), ``handshake12_server``, ``handshake12_client``;
* DTLS 1.3: ``record13`` (unified header, ACK), ``keyschedule13``, ``recordlayer13``, ``engine13``, ``handshake13``.

See docs/dtls13.md.
"""

from appliance.proto.dtls._wire import (
    AlertDescription,
    AlertLevel,
    CipherSuite,
    CipherSuite13,
    ContentType,
    DtlsError,
    Group13,
    NamedGroup,
    parse_versions,
)
from appliance.proto.dtls.certificate import Certificate, fingerprint_of
from appliance.proto.dtls.connection import DEFAULT_VERSIONS, Connection, DtlsConnection
from appliance.proto.dtls.engine12 import DEFAULT_CIPHER_SUITES
from appliance.proto.dtls.events import (
    ApplicationData,
    ConnectionClosed,
    Counters,
    Event,
    FalseStart,
    HandshakeComplete,
    Role,
    State,
    Transmit,
)
from appliance.proto.dtls.keyschedule13 import HAVE_MLKEM

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
    "Connection",
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
    "Transmit",
    "fingerprint_of",
]
