"""The DTLS 1.3 record layer of one connection: epochs, keys, replay windows, flights.

RFC 9147 §4 (record formats; epoch 0 keeps DTLSPlaintext, later epochs use the unified
header with encrypted record numbers, §4.2.3), §4.2.1-4.2.2 (epoch and sequence number
reconstruction: the newest installed epoch with matching low bits, the sequence number
closest to the next expected one), §4.5.1 (anti-replay, after deprotection), §4.5.2
(invalid records are dropped), §5.8 and §7 (flights are retransmitted until implicitly
acknowledged or ACKed; ACKs name record numbers, and only fragments not yet acknowledged
are resent).

Epochs (RFC 9147 §6.1): 0 plaintext, 2 handshake, 3 application, 4+ after KeyUpdate;
1 (0-RTT) is never used. Read keys are kept for the three newest epochs so reordered
records of the previous one still open.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.proto.dtls._wire import DTLS_1_2, ContentType13, DtlsError
from appliance.proto.dtls.events import Counters
from appliance.proto.dtls.keyschedule13 import AEAD_TAG_LEN, RecordProtection13
from appliance.proto.dtls.record import (
    HANDSHAKE_HEADER_LEN,
    RECORD_HEADER_LEN,
    HandshakeFragment,
    Record,
    ReplayWindow,
)
from appliance.proto.dtls.record13 import (
    UNIFIED_HEADER_LEN,
    CiphertextRecord,
    apply_mask,
    encode_header,
    reconstruct_seq,
    split_inner_plaintext_untrusted,
)
from appliance.proto.dtls.recordlayer import RecordLayer

# Unified header + inner content type byte + AEAD tag.
CIPHERTEXT_OVERHEAD = UNIFIED_HEADER_LEN + 1 + AEAD_TAG_LEN
_KEEP_READ_EPOCHS = 3


@dataclass(frozen=True, slots=True)
class OutMessage:
    """A handshake message of a flight, kept whole so retransmissions get new records."""

    epoch: int
    msg_type: int
    message_seq: int
    body: bytes


class _ReadEpoch:
    __slots__ = ("prot", "window", "top")

    def __init__(self, prot: RecordProtection13) -> None:
        self.prot = prot
        self.window = ReplayWindow()
        self.top = -1


class RecordLayer13(RecordLayer[OutMessage]):
    """Sealing, opening and flight bookkeeping; the handshake lives in engine13."""

    def __init__(self, mtu: int, counters: Counters) -> None:
        super().__init__(mtu, counters)
        self._write: dict[int, tuple[RecordProtection13, list[int]]] = {}  # epoch -> (keys, [next seq])
        self._seq0 = 0
        self._read: dict[int, _ReadEpoch] = {}
        self.window0 = ReplayWindow()
        # Flight bookkeeping for selective retransmission (RFC 9147 §7.1).
        self._sent: dict[tuple[int, int], tuple[int, int]] = {}  # record no. -> fragment
        self._acked: set[tuple[int, int]] = set()  # (message_seq, offset)
        self._pieces: set[tuple[int, int]] = set()
        self.last_number = (0, 0)

    # --- keys -------------------------------------------------------------------------

    def install_write(self, epoch: int, prot: RecordProtection13) -> None:
        self._write[epoch] = (prot, [0])

    def install_read(self, epoch: int, prot: RecordProtection13) -> None:
        self._read[epoch] = _ReadEpoch(prot)
        for old in sorted(self._read)[:-_KEEP_READ_EPOCHS]:
            del self._read[old]

    def has_read(self, epoch: int) -> bool:
        return epoch in self._read

    @property
    def max_read_epoch(self) -> int:
        return max(self._read, default=0)

    def continue_epoch0(self, seq: int) -> None:
        """Our epoch-0 record numbers continue from the peer's (as the 1.2 code does)."""
        self._seq0 = max(self._seq0, seq)

    @property
    def next_seq0(self) -> int:
        return self._seq0

    # --- send -------------------------------------------------------------------------

    def encode_record(self, content_type: int, epoch: int, payload: bytes) -> bytes:
        """One record; its number (epoch, sequence number), which an ACK names, is left in
        :attr:`last_number`."""
        if epoch == 0:
            seq = self._seq0
            self._seq0 += 1
            self.last_number = (0, seq)
            return bytes(Record(content_type, DTLS_1_2, 0, seq, payload))
        prot, counter = self._write[epoch]
        seq = counter[0]
        counter[0] = seq + 1
        inner = payload + bytes((content_type,))
        header = encode_header(epoch, seq, len(inner) + AEAD_TAG_LEN)
        ciphertext = prot.seal(seq, header, inner)
        self.last_number = (epoch, seq)
        return apply_mask(header, 2, prot.mask(ciphertext)) + ciphertext

    def _flight_started(self) -> None:
        self._sent.clear()
        self._acked.clear()
        self._pieces.clear()

    def emit_flight(self) -> None:
        """Resend the flight's unacknowledged fragments, packed into datagrams of at most
        ``mtu``. Fragment boundaries depend only on the MTU, so an ACK of a fragment of one
        transmission also covers the same fragment of the next."""
        assert self.flight is not None
        records: list[bytes] = []
        for out in self.flight:
            overhead = RECORD_HEADER_LEN if out.epoch == 0 else CIPHERTEXT_OVERHEAD
            step = self.mtu - overhead - HANDSHAKE_HEADER_LEN
            total = len(out.body)
            for offset in range(0, max(total, 1), step):
                piece = (out.message_seq, offset)
                self._pieces.add(piece)
                if piece in self._acked:
                    continue
                chunk = out.body[offset : offset + step]
                frag = HandshakeFragment(out.msg_type, total, out.message_seq, offset, chunk)
                records.append(self.encode_record(ContentType13.HANDSHAKE, out.epoch, bytes(frag)))
                self._sent[self.last_number] = piece
        self.pack(records)

    def on_ack(self, numbers: tuple[tuple[int, int], ...]) -> bool:
        """Mark ACKed fragments; True once every fragment of the flight is acknowledged."""
        if self.flight is None:
            return False
        for number in numbers:
            piece = self._sent.get(number)
            if piece is not None:
                self._acked.add(piece)
        return bool(self._pieces) and self._pieces <= self._acked

    def flight_done(self) -> None:
        self.flight = None
        self._sent.clear()

    # --- receive ----------------------------------------------------------------------

    def match_epoch(self, bits: int) -> int | None:
        """RFC 9147 §4.2.2: the newest installed epoch whose low two bits match."""
        for epoch in sorted(self._read, reverse=True):
            if epoch & 3 == bits:
                return epoch
        return None

    def open_untrusted(self, rec: CiphertextRecord, epoch: int) -> tuple[int, int, bytes] | None:
        """``(seq, content type, content)``; None (counted) when the record is dropped."""
        st = self._read[epoch]
        if len(rec.ciphertext) < 16 + 1:
            # RFC 9147 §4.2.3: too short to unmask; handled as a deprotection failure.
            self.counters.records_dropped += 1
            return None
        header = apply_mask(rec.header, rec.seq_len, st.prot.mask(rec.ciphertext))
        wire = int.from_bytes(header[1 : 1 + rec.seq_len], "big")
        seq = reconstruct_seq(wire, 8 * rec.seq_len, st.top + 1)
        if seq < 0 or not st.window.check(seq):
            self.counters.replays_dropped += 1
            return None
        try:
            inner = st.prot.open(seq, header, rec.ciphertext)
        except DtlsError:
            self.counters.auth_failures += 1
            return None
        # RFC 9147 §4.5.1: the window moves only after deprotection.
        st.window.mark(seq)
        st.top = max(st.top, seq)
        content_type, content = split_inner_plaintext_untrusted(inner)
        return seq, content_type, content
