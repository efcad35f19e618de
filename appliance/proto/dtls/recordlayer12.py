"""The DTLS 1.2 record layer, sending side (RFC 6347 §4.1, §4.2.3): :class:`RecordLayer12`.

Records numbered per epoch (0 and 1) and sealed with the epoch's AEAD, flights fragmented
and packed into datagrams of at most ``mtu`` bytes, alerts and application data queued as
single records (:class:`~.recordlayer.RecordLayer`). Receiving (epochs 0 and 1, a 64-entry
anti-replay window per epoch marked only after authentication, invalid records silently
dropped, next-epoch records buffered until keys exist) is :class:`~.engine12.Engine12`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.proto.dtls._wire import DTLS_1_2, ContentType
from appliance.proto.dtls.crypto import RecordCipher
from appliance.proto.dtls.events import Counters
from appliance.proto.dtls.record import (
    HANDSHAKE_HEADER_LEN,
    RECORD_HEADER_LEN,
    HandshakeFragment,
    Record,
)
from appliance.proto.dtls.recordlayer import RecordLayer


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One element of a flight, kept in plaintext so retransmissions get fresh record
    sequence numbers (RFC 6347 §4.2.4: "each retransmission is a new record")."""

    content_type: ContentType
    epoch: int
    msg_type: int  # handshake only
    message_seq: int  # handshake only
    body: bytes


Flight = list[Outgoing]

# --- send ---------------------------------------------------------------------------


class RecordLayer12(RecordLayer[Outgoing]):
    """Records out: numbered per epoch (0 and 1), epoch 1 sealed with the AEAD."""

    def __init__(self, mtu: int, counters: Counters) -> None:
        super().__init__(mtu, counters)
        self.write_seq = [0, 0]
        self.write_cipher: RecordCipher | None = None

    def install_write(self, cipher: RecordCipher) -> None:
        self.write_cipher = cipher
        self.write_epoch = 1

    def encode_record(self, content_type: int, epoch: int, payload: bytes) -> bytes:
        seq = self.write_seq[epoch]
        self.write_seq[epoch] = seq + 1
        if epoch:
            assert self.write_cipher is not None
            payload = self.write_cipher.encrypt(content_type, DTLS_1_2, epoch, seq, payload)
        return Record(content_type, DTLS_1_2, epoch, seq, payload).__bytes__()

    def emit_flight(self) -> None:
        """Fragment and pack the flight into datagrams of at most ``mtu`` bytes."""
        assert self.flight is not None
        self.send(self.flight)

    def send(self, flight: Flight) -> None:
        """``flight`` on the wire now, without making it the one retransmitted."""
        datagram = bytearray()
        mtu = self.mtu
        for out in flight:
            cipher_overhead = self.write_cipher.overhead if out.epoch and self.write_cipher else 0
            overhead = RECORD_HEADER_LEN + cipher_overhead
            if out.content_type != ContentType.HANDSHAKE:
                if len(datagram) + overhead + len(out.body) > mtu:
                    self.tx.append(bytes(datagram))
                    datagram = bytearray()
                datagram += self.encode_record(out.content_type, out.epoch, out.body)
                continue
            offset = 0
            total = len(out.body)
            while True:
                room = mtu - len(datagram) - overhead - HANDSHAKE_HEADER_LEN
                # Start a new datagram rather than send a sliver of a fragment.
                if room < min(total - offset, 64) or room <= 0:
                    self.tx.append(bytes(datagram))
                    datagram = bytearray()
                    continue
                chunk = out.body[offset : offset + room]
                frag = HandshakeFragment(out.msg_type, total, out.message_seq, offset, chunk)
                datagram += self.encode_record(ContentType.HANDSHAKE, out.epoch, bytes(frag))
                offset += len(chunk)
                if offset >= total:
                    break
        if datagram:
            self.tx.append(bytes(datagram))
