"""What both record layers share, and the interface the connection drives them through.

:class:`RecordLayer` owns the outgoing side common to DTLS 1.2 (:mod:`.recordlayer12`) and
1.3 (:mod:`.recordlayer13`): the queue of datagrams ready to send, single records (alerts,
ACKs, application data) packed into datagrams of at most ``mtu`` bytes, and the current
flight, kept in plaintext so every retransmission is new records (RFC 6347 §4.2.4,
RFC 9147 §5.8). The versions differ in how a record is sealed (:meth:`encode_record`)
and how a flight is cut into records (:meth:`emit_flight`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

from appliance.proto.dtls._wire import AlertDescription, AlertLevel, ContentType
from appliance.proto.dtls.events import Counters

M = TypeVar("M")


class RecordLayer(Generic[M]):
    """Records out of one connection; ``M`` is the version's flight element."""

    def __init__(self, mtu: int, counters: Counters) -> None:
        self.mtu = mtu
        self.counters = counters
        self.tx: deque[bytes] = deque()
        #: the epoch alerts (and, in 1.3, application data and ACKs) go out in
        self.write_epoch = 0
        self.flight: list[M] | None = None
        self._pending: list[bytes] = []

    def encode_record(self, content_type: int, epoch: int, payload: bytes) -> bytes:
        """One record of ``payload``, sealed with ``epoch``'s keys, with the next number."""
        raise NotImplementedError

    def emit_flight(self) -> None:
        """(Re)send :attr:`flight` as datagrams of at most ``mtu`` bytes."""
        raise NotImplementedError

    def _flight_started(self) -> None:
        """Hook: a new flight replaces the previous one."""

    def new_flight(self, flight: list[M], *, emit: bool = True) -> None:
        self.flight = flight
        self._flight_started()
        if emit:
            self.emit_flight()

    def queue_record(self, content_type: int, epoch: int, payload: bytes) -> None:
        """A single record (alert, ACK, application data) packed at the next poll."""
        self._pending.append(self.encode_record(content_type, epoch, payload))

    def queue_alert(self, level: AlertLevel, description: AlertDescription) -> None:
        self.queue_record(ContentType.ALERT, self.write_epoch, bytes((level, description)))

    def pack(self, records: Iterable[bytes]) -> None:
        """Whole records into as few datagrams of at most ``mtu`` bytes as they fit."""
        datagram = bytearray()
        for record in records:
            if datagram and len(datagram) + len(record) > self.mtu:
                self.tx.append(bytes(datagram))
                datagram = bytearray()
            datagram += record
        if datagram:
            self.tx.append(bytes(datagram))

    def poll_transmit(self) -> bytes | None:
        if self._pending:
            self.pack(self._pending)
            self._pending.clear()
        return self.tx.popleft() if self.tx else None
