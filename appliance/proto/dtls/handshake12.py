"""DTLS 1.2 handshake dispatch and what both roles share (RFC 5246 §7.3, RFC 6347 §4.2).

:func:`handle_message` checks each reassembled message against the transition table
(:data:`_ACCEPTS`, STYLE.md rule 3) and the epoch it came in, parses it and calls the
engine's handler for its type (``_HANDLERS``, built in :mod:`.engine12` from
:mod:`.handshake12_server` and :mod:`.handshake12_client`); a handler returns
``(next_flight, alert | None)`` (STYLE.md rule 4, pion's ``flight*handler.go``). Finished
(RFC 5246 §7.4.9) is handled here for both roles, with the helpers both sides use: peer
certificate checks (RFC 8122 §5), the extended master secret and epoch-1 keys (RFC 7627),
transcript bookkeeping.
"""

from __future__ import annotations

import hmac

from appliance.proto.dtls._wire import (
    AlertDescription,
    AlertLevel,
    ContentType,
    DtlsError,
    HandshakeType,
)
from appliance.proto.dtls.certificate import check_peer_certificate
from appliance.proto.dtls.conn_protocol import Conn12, HandlerResult
from appliance.proto.dtls.crypto import (
    SUITES,
    derive_epoch_keys,
    extended_master_secret,
    finished_verify_data,
    transcript_hash,
)
from appliance.proto.dtls.events import (
    ApplicationData,
    FalseStart,
    HandshakeComplete,
    Role,
    State,
)
from appliance.proto.dtls.messages import (
    CertificateMessage,
    Finished,
    HandshakeBody,
    parse_handshake_body_untrusted,
)
from appliance.proto.dtls.record import HandshakeMessage, handshake_header
from appliance.proto.dtls.recordlayer12 import Flight, Outgoing

# The transition table: which handshake messages each state accepts (RFC 5246 §7.3
# message order). Anything else is an unexpected_message.
_ACCEPTS: dict[State, frozenset[HandshakeType]] = {
    State.CLIENT_WAIT_SERVER_HELLO: frozenset(
        {HandshakeType.HELLO_VERIFY_REQUEST, HandshakeType.SERVER_HELLO}
    ),
    State.CLIENT_WAIT_CERTIFICATE: frozenset({HandshakeType.CERTIFICATE}),
    State.CLIENT_WAIT_KEY_EXCHANGE: frozenset({HandshakeType.SERVER_KEY_EXCHANGE}),
    State.CLIENT_WAIT_HELLO_DONE: frozenset(
        {HandshakeType.CERTIFICATE_REQUEST, HandshakeType.SERVER_HELLO_DONE}
    ),
    State.CLIENT_WAIT_FINISHED: frozenset({HandshakeType.FINISHED}),
    State.SERVER_WAIT_CLIENT_HELLO: frozenset({HandshakeType.CLIENT_HELLO}),
    State.SERVER_WAIT_CERTIFICATE: frozenset(
        {HandshakeType.CERTIFICATE, HandshakeType.CLIENT_KEY_EXCHANGE}
    ),
    State.SERVER_WAIT_KEY_EXCHANGE: frozenset({HandshakeType.CLIENT_KEY_EXCHANGE}),
    State.SERVER_WAIT_CERTIFICATE_VERIFY: frozenset({HandshakeType.CERTIFICATE_VERIFY}),
    State.SERVER_WAIT_FINISHED: frozenset({HandshakeType.FINISHED}),
}



def handle_message(c: Conn12, now: float, msg: HandshakeMessage) -> None:
    if c.state is State.ESTABLISHED:
        # A new handshake on an established association is a renegotiation attempt
        # (HelloRequest or ClientHello); RFC 5746 §4.4/§4.2: refuse with a warning.
        c.rl.queue_alert(AlertLevel.WARNING, AlertDescription.no_renegotiation)
        return
    allowed = _ACCEPTS.get(c.state, frozenset())
    if msg.msg_type not in allowed:
        raise DtlsError(
            f"{type_name(msg.msg_type)} in state {c.state.value}",
            hint=AlertDescription.unexpected_message,
        )
    # Finished is the only message protected by epoch 1 (RFC 5246 §7.4.9); anything
    # else in epoch 1, or a plaintext Finished, is an attack or a broken peer.
    if (msg.msg_type == HandshakeType.FINISHED) != (msg.epoch == 1):
        raise DtlsError(
            "handshake message in the wrong epoch", hint=AlertDescription.unexpected_message
        )
    raw = handshake_header(msg.msg_type, len(msg.body), msg.message_seq) + msg.body
    try:
        body = parse_handshake_body_untrusted(msg.msg_type, msg.body)
    except DtlsError:
        if c.state is State.SERVER_WAIT_CLIENT_HELLO and c._cookie_secret is not None:
            return  # stateless phase: drop rather than answer unverified senders
        raise
    handler = c._HANDLERS[msg.msg_type]
    flight, alert = handler(c, now, body, raw, msg)
    if alert is not None:
        raise DtlsError(f"{type_name(msg.msg_type)} refused", hint=alert)
    if flight is not None:
        c._send_flight(now, flight)
        if c._false_start and c.state is State.CLIENT_WAIT_FINISHED:
            # Flight 5 is queued (only it moves a client here with a flight): RFC 7918
            # §3, our keys are final and the server is authenticated (certificate
            # against the SDP fingerprint, ServerKeyExchange signature), so the caller
            # may send from now on; anything it sends goes out behind our Finished.
            assert c._suite is not None
            c._events.append(FalseStart(c._srtp_profile, c._suite, c._peer_fingerprint))


def type_name(msg_type: int) -> str:
    try:
        return HandshakeType(msg_type).name
    except ValueError:
        return f"type {msg_type}"


def on_finished(
    c: Conn12, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
) -> HandlerResult:
    assert (
        isinstance(body, Finished)
        and c._suite is not None
        and c._master_secret is not None
    )
    hash_name = SUITES[c._suite].hash_name
    label = b"server finished" if c.role is Role.CLIENT else b"client finished"
    expected = finished_verify_data(
        hash_name, c._master_secret, label, bytes(c._transcript)
    )
    # RFC 5246 §7.4.9: a wrong verify_data is fatal decrypt_error.
    if not hmac.compare_digest(expected, body.verify_data):
        return None, AlertDescription.decrypt_error
    c._transcript += raw
    flight: Flight | None = None
    if c.role is Role.SERVER:
        # Flight 6: ChangeCipherSpec + Finished. No timer: we resend it only when the
        # client retransmits flight 5 (RFC 6347 §4.2.4, the final flight case).
        flight = [
            Outgoing(ContentType.CHANGE_CIPHER_SPEC, 0, 0, 0, b"\x01"),
            handshake_out(
                c,
                Finished(
                    finished_verify_data(
                        hash_name,
                        c._master_secret,
                        b"server finished",
                        bytes(c._transcript),
                    )
                ),
                epoch=1,
            ),
        ]
    complete(c, now)
    if flight is not None:
        c._send_flight(now, flight, arm_timer=False)
    else:
        # Client: nothing left to retransmit; the server is done too.
        c.rl.flight = None
    return None, None


def on_certificate(
    c: Conn12, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
) -> HandlerResult:
    """The peer's Certificate, either role. A server must send one (RFC 5246 §7.4.2); a
    client may send none (§7.4.6), and CertificateVerify follows only a non-empty one
    (§7.4.8), so the server's next state is the ClientKeyExchange either way."""
    assert isinstance(body, CertificateMessage)
    if c.role is Role.CLIENT and not body.certificates:
        return None, AlertDescription.handshake_failure
    alert = accept_peer_certificate(c, body)
    if alert is not None:
        return None, alert
    c._transcript += raw
    c._state = (State.CLIENT_WAIT_KEY_EXCHANGE if c.role is Role.CLIENT
                else State.SERVER_WAIT_KEY_EXCHANGE)
    return None, None


def accept_peer_certificate(c: Conn12, body: CertificateMessage) -> AlertDescription | None:
    if not body.certificates:
        # RFC 5246 §7.4.6: the client may send none; we then require that SDP did not
        # promise a fingerprint.
        return (
            AlertDescription.handshake_failure
            if c._remote_fingerprints is not None
            else None
        )
    alert, c._peer_fingerprint, c._peer_public_key = check_peer_certificate(
        body.certificates[0], c._remote_fingerprints
    )
    return alert


def derive_keys(c: Conn12, pre_master: bytes) -> None:
    assert c._suite is not None
    hash_name = SUITES[c._suite].hash_name
    session_hash = transcript_hash(hash_name, bytes(c._transcript))
    c._master_secret = extended_master_secret(hash_name, pre_master, session_hash)
    keys = derive_epoch_keys(
        c._suite, c._master_secret, c._client_random, c._server_random
    )
    write, c._read_cipher = (keys.client, keys.server) if c.role is Role.CLIENT else (
        keys.server, keys.client)
    c.rl.install_write(write)


def complete(c: Conn12, now: float) -> None:
    assert c._suite is not None
    c._state = State.ESTABLISHED
    c._retransmit_at = None
    c._reassembler.clear()
    c._key_share = None  # forward secrecy: the ephemeral key is no longer needed
    c._events.append(
        HandshakeComplete(c._srtp_profile, c._suite, c._peer_fingerprint)
    )
    for data in c._early_app_data:
        c._events.append(ApplicationData(data))
    c._early_app_data.clear()


def append_transcript(c: Conn12, out: Outgoing) -> Outgoing:
    c._transcript += (
        handshake_header(out.msg_type, len(out.body), out.message_seq) + out.body
    )
    return out


def handshake_out(c: Conn12, body: HandshakeBody, epoch: int = 0) -> Outgoing:
    seq = c._send_message_seq
    c._send_message_seq += 1
    return Outgoing(ContentType.HANDSHAKE, epoch, body.msg_type, seq, bytes(body))
