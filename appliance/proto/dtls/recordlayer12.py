"""The DTLS 1.2 record layer of a :class:`~.conn12_protocol.Conn12` (RFC 6347 §4.1, §4.2.3).

Receive: epochs 0 and 1 only, a 64-entry anti-replay window per epoch (§4.1.2.6) marked
only after authentication, invalid records silently dropped (§4.1.2.7), next-epoch
records buffered until keys exist (§4.1), handshake fragments reassembled in order
(§4.2.3) and handed up through ``_handle_message``. Send: records numbered per epoch and
sealed with the epoch's AEAD, flights fragmented and packed into datagrams of at most
``mtu`` bytes, alerts and application data queued as single records.

Functions of the connection, not a separate object, so the state stays in
:class:`~.connection.Dtls12Connection` (see :mod:`.conn12_protocol`).
"""

from __future__ import annotations

from appliance.proto.dtls._wire import (
    DTLS_1_2,
    AlertDescription,
    AlertLevel,
    ContentType,
    DtlsError,
    HandshakeType,
)
from appliance.proto.dtls.conn12_protocol import Conn12, Flight
from appliance.proto.dtls.events import ApplicationData, State
from appliance.proto.dtls.record import (
    HANDSHAKE_HEADER_LEN,
    MAX_PLAINTEXT_LEN,
    RECORD_HEADER_LEN,
    HandshakeFragment,
    Reassembler,
    Record,
    parse_handshake_fragments_untrusted,
)

# How many records of the next epoch we hold while the keys for it are not yet derived
# (RFC 6347 §4.1 allows buffering them; a reordered Finished would otherwise be lost).
_MAX_EARLY_RECORDS = 32


# --- receive ------------------------------------------------------------------------


def handle_record(c: Conn12, now: float, record: Record) -> None:
    if record.epoch == 0:
        if not c._replay[0].check(record.sequence_number):
            c.counters.replays_dropped += 1
            return
        # Epoch 0 is unauthenticated; once the peer talks in epoch 1 only its
        # retransmitted handshake records are still meaningful in epoch 0.
        if c._peer_epoch1_seen and record.content_type != ContentType.HANDSHAKE:
            c.counters.records_dropped += 1
            return
        c._replay[0].mark(record.sequence_number)
        c._last_epoch0_seq = max(c._last_epoch0_seq, record.sequence_number)
        handle_plaintext(c, now, record.content_type, 0, record.fragment)
    elif record.epoch == 1:
        if c._read_cipher is None:
            if len(c._early_records) < _MAX_EARLY_RECORDS:
                c._early_records.append(record)
            else:
                c.counters.records_dropped += 1
            return
        if not c._replay[1].check(record.sequence_number):
            c.counters.replays_dropped += 1
            return
        try:
            plaintext = c._read_cipher.decrypt(
                record.content_type, record.version, 1, record.sequence_number, record.fragment
            )
        except DtlsError:
            # RFC 6347 §4.1.2.7: forged or corrupted records are dropped, not fatal.
            c.counters.auth_failures += 1
            return
        if len(plaintext) > MAX_PLAINTEXT_LEN:
            c.counters.records_dropped += 1
            return
        # Mark only after authentication so forgeries cannot move the window.
        c._replay[1].mark(record.sequence_number)
        c._peer_epoch1_seen = True
        handle_plaintext(c, now, record.content_type, 1, plaintext)
    else:
        # Later epochs would need renegotiation, which we refuse.
        c.counters.records_dropped += 1


def drain_early_records(c: Conn12, now: float) -> None:
    while (
        c._early_records and c._read_cipher is not None and c.state is not State.CLOSED
    ):
        early, c._early_records = c._early_records, []
        for record in early:
            handle_record(c, now, record)


def handle_plaintext(c: Conn12, now: float, content_type: int, epoch: int, payload: bytes) -> None:
    if content_type == ContentType.HANDSHAKE:
        try:
            fragments = parse_handshake_fragments_untrusted(payload)
        except DtlsError:
            c.counters.records_dropped += 1
            return
        for frag in fragments:
            handle_fragment(c, now, frag, epoch)
            if c.state is State.CLOSED:
                return
    elif content_type == ContentType.CHANGE_CIPHER_SPEC:
        # The epoch is explicit in every DTLS record, so CCS carries no information we
        # need; we only check that it is well-formed (RFC 5246 §7.1).
        if payload != b"\x01":
            c.counters.records_dropped += 1
    elif content_type == ContentType.ALERT:
        handle_alert(c, payload)
    elif content_type == ContentType.APPLICATION_DATA:
        if epoch == 0:
            # RFC 5246 §6.2: application data is never sent unprotected.
            c.counters.records_dropped += 1
        elif c.state is State.ESTABLISHED:
            c._events.append(ApplicationData(payload))
        elif len(c._early_app_data) < _MAX_EARLY_RECORDS:
            # The peer's Finished was reordered behind its first data: hold it.
            c._early_app_data.append(payload)


def handle_alert(c: Conn12, payload: bytes) -> None:
    if len(payload) != 2:
        c.counters.records_dropped += 1
        return
    level, description = payload
    try:
        desc = AlertDescription(description)
    except ValueError:
        desc = AlertDescription.internal_error if level == AlertLevel.FATAL else None  # type: ignore[assignment]
        if desc is None:
            return
    if desc is AlertDescription.close_notify:
        # RFC 5246 §7.2.1: answer close_notify with our own and stop.
        if c._write_cipher is not None:
            queue_alert(c, AlertLevel.WARNING, AlertDescription.close_notify)
        c._close_locally(desc, "peer sent close_notify", by_peer=True)
    elif level == AlertLevel.FATAL:
        c._close_locally(desc, f"peer sent fatal {desc.name}", by_peer=True)
    # Warnings (no_renegotiation, …) need no action.


def handle_fragment(c: Conn12, now: float, frag: HandshakeFragment, epoch: int) -> None:
    if c.state is State.SERVER_WAIT_CLIENT_HELLO:
        if frag.msg_type != HandshakeType.CLIENT_HELLO or epoch != 0:
            return
        # Before a ClientHello is accepted nothing is committed (stateless cookies,
        # RFC 6347 §4.2.1): a client may restart at message_seq 0 or continue at 1
        # after a HelloVerifyRequest, so follow whatever sequence it uses.
        if (
            frag.message_seq != c._reassembler.next_seq
            and frag.message_seq < Reassembler.WINDOW
        ):
            c._reassembler.clear()
            c._reassembler.next_seq = frag.message_seq
    if (
        c.state is State.ESTABLISHED
        and epoch == 0
        and frag.message_seq >= c._reassembler.next_seq
    ):
        return  # unauthenticated new handshake after the fact: ignore
    if not c._reassembler.add(frag, epoch):
        # An old message: the peer is retransmitting (RFC 6347 §4.2.4). Trigger once per
        # datagram and only on first fragments, so a fragmented flight does not make us
        # answer once per fragment.
        if frag.fragment_offset == 0:
            c._dup_seen = True
        return
    while (msg := c._reassembler.pop()) is not None:
        c._handle_message(now, msg)
        if c.state is State.CLOSED:
            return


# --- send ---------------------------------------------------------------------------


def encode_record(c: Conn12, content_type: int, epoch: int, payload: bytes) -> bytes:
    seq = c._write_seq[epoch]
    c._write_seq[epoch] = seq + 1
    if epoch:
        assert c._write_cipher is not None
        payload = c._write_cipher.encrypt(content_type, DTLS_1_2, epoch, seq, payload)
    return Record(content_type, DTLS_1_2, epoch, seq, payload).__bytes__()


def send_new_flight(
    c: Conn12, now: float, flight: Flight, *, arm_timer: bool = True, emit: bool = True
) -> None:
    c._flight = flight
    # A new flight means the previous one got through: start again from the initial
    # timer (RFC 6347 §4.2.4.1 backs off only on loss).
    c._rto = c._initial_rto
    c._retransmit_count = 0
    c._retransmit_at = now + c._rto if arm_timer else None
    if emit:
        emit_flight(c, flight)


def emit_flight(c: Conn12, flight: Flight) -> None:
    """Fragment and pack a flight into datagrams of at most ``mtu`` bytes."""
    datagram = bytearray()
    for out in flight:
        cipher_overhead = c._write_cipher.overhead if out.epoch and c._write_cipher else 0
        overhead = RECORD_HEADER_LEN + cipher_overhead
        if out.content_type != ContentType.HANDSHAKE:
            if len(datagram) + overhead + len(out.body) > c.mtu:
                c._tx.append(bytes(datagram))
                datagram = bytearray()
            datagram += encode_record(c, out.content_type, out.epoch, out.body)
            continue
        offset = 0
        total = len(out.body)
        while True:
            room = c.mtu - len(datagram) - overhead - HANDSHAKE_HEADER_LEN
            # Start a new datagram rather than send a sliver of a fragment.
            if room < min(total - offset, 64) or room <= 0:
                c._tx.append(bytes(datagram))
                datagram = bytearray()
                continue
            chunk = out.body[offset : offset + room]
            frag = HandshakeFragment(out.msg_type, total, out.message_seq, offset, chunk)
            datagram += encode_record(c, ContentType.HANDSHAKE, out.epoch, bytes(frag))
            offset += len(chunk)
            if offset >= total:
                break
    if datagram:
        c._tx.append(bytes(datagram))


def queue_alert(c: Conn12, level: AlertLevel, description: AlertDescription) -> None:
    epoch = 1 if c._write_cipher is not None else 0
    c._pending_records.append(
        encode_record(c, ContentType.ALERT, epoch, bytes((level, description)))
    )


def pack_pending(c: Conn12) -> None:
    datagram = bytearray()
    for record in c._pending_records:
        if datagram and len(datagram) + len(record) > c.mtu:
            c._tx.append(bytes(datagram))
            datagram = bytearray()
        datagram += record
    if datagram:
        c._tx.append(bytes(datagram))
    c._pending_records.clear()
