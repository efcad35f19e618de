"""Events, roles, states and counters shared by the DTLS 1.2 and 1.3 engines.

The caller-facing vocabulary of :class:`~appliance.proto.dtls.DtlsConnection` whichever
version was negotiated (STYLE.md rule 3: frozen, slotted events; states are an Enum).
The 1.3 engine reports its position in the handshake with the nearest of these states.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from appliance.proto.dtls._wire import AlertDescription, CipherSuite, CipherSuite13
from appliance.proto.srtp.profile import SrtpProfile


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


class State(enum.Enum):
    """Where the handshake is; each waiting state names the message it wants next."""

    CLIENT_IDLE = "client-idle"
    CLIENT_WAIT_SERVER_HELLO = "client-wait-server-hello"  # flight 1 or 3 sent
    CLIENT_WAIT_CERTIFICATE = "client-wait-certificate"
    CLIENT_WAIT_KEY_EXCHANGE = "client-wait-server-key-exchange"
    CLIENT_WAIT_HELLO_DONE = "client-wait-hello-done"  # CertificateRequest optional
    CLIENT_WAIT_FINISHED = "client-wait-finished"  # flight 5 sent
    SERVER_WAIT_CLIENT_HELLO = "server-wait-client-hello"  # flight 0 (or 2: HVR sent)
    SERVER_WAIT_CERTIFICATE = "server-wait-certificate"  # flight 4 sent
    SERVER_WAIT_KEY_EXCHANGE = "server-wait-client-key-exchange"
    SERVER_WAIT_CERTIFICATE_VERIFY = "server-wait-certificate-verify"
    SERVER_WAIT_FINISHED = "server-wait-finished"
    ESTABLISHED = "established"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class HandshakeComplete:
    srtp_profile: SrtpProfile | None
    cipher_suite: CipherSuite | CipherSuite13
    peer_fingerprint: str | None  # "sha-256 AB:…"; None only when verification opted out
    version: str = "1.2"  # "1.2" or "1.3": what was negotiated


@dataclass(frozen=True, slots=True)
class FalseStart:
    """Client with ``false_start``: flight 5 is sent and the keys are final (RFC 7918); the
    exporter works from now on. :class:`HandshakeComplete` follows with the server's Finished.

    Also a DTLS 1.3 *server* with ``half_rtt``: its flight (…Finished) is sent, so the
    application traffic and exporter secrets are final (RFC 8446 §7.1) and it may send
    "0.5-RTT data" (RFC 8446 §4.4.4, Appendix E.1: to a client not yet authenticated);
    :class:`HandshakeComplete` follows with the client's Finished. ``peer_fingerprint`` is
    then None (the client's certificate has not arrived)."""

    srtp_profile: SrtpProfile | None
    cipher_suite: CipherSuite | CipherSuite13
    peer_fingerprint: str | None


@dataclass(frozen=True, slots=True)
class ApplicationData:
    data: bytes


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The connection is over. ``alert`` is the alert sent or received (None: timeout/close)."""

    alert: AlertDescription | None
    by_peer: bool
    reason: str = ""


Event = HandshakeComplete | FalseStart | ApplicationData | ConnectionClosed

@dataclass(slots=True)
class Counters:
    """Per-connection drop counters for metrics."""

    records_dropped: int = 0
    replays_dropped: int = 0
    auth_failures: int = 0
    retransmissions: int = 0
    #: HelloVerifyRequests sent (ClientHellos without a valid cookie while cookies are on)
    hello_verify_requests: int = 0
    #: retransmissions a repeated peer flight did not trigger (DUP_RETRANSMIT_INTERVAL)
    retransmissions_suppressed: int = 0


#: A retransmission triggered by the peer repeating its flight (RFC 6347 §4.2.4) happens at
#: most this often; the timer-driven ones are not affected. Peers retransmit on their own
#: timer (≥ 50 ms in browsers, 1 s by the RFC), so a genuine repeat is always answered.
DUP_RETRANSMIT_INTERVAL = 0.05


@dataclass(frozen=True, slots=True)
class Transmit:
    """``poll_output``: one datagram to send to the peer."""

    data: bytes
