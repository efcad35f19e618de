"""RFC 6525 stream reconfiguration for :class:`SctpAssociation` (a mixin: the state lives on
the association, the rules live here).

Outgoing (§5.1.2): ``reset_streams()`` marks streams closing (no more sends); once their
queued data has been given TSNs, one Outgoing SSN Reset Request carries them with the
Sender's Last Assigned TSN. At most one request is in flight (§5.1.1); it is retransmitted
on its own timer (RTO, counted against the association's error limit). "In progress"
answers are retried; "performed" resets the streams' SSNs to 0 and reports
``StreamsReset(outgoing=...)``; anything else reports ``StreamResetFailed``.

Incoming (§5.2.2): requests are taken in sequence-number order; a request is performed
once every TSN up to its last assigned TSN has arrived (until then the answer is "in
progress", and data that overtakes it is held by the receiver); a retransmitted request
gets the same answer again (§5.2.1 case: seq == expected - 1). Incoming SSN Reset, SSN/TSN
Reset and Add Streams requests are answered "denied" (WebRTC never sends them).
"""

from __future__ import annotations

from collections import deque

from appliance.proto.sctp import chunks as c
from appliance.proto.sctp.events import Event, StreamResetFailed, StreamsReset
from appliance.proto.sctp.receiver import M32, Receiver
from appliance.proto.sctp.sender import RtoEstimator, Sender

MAX_STREAMS_PER_REQUEST = 256


class ReconfigMixin:
    sender: Sender
    receiver: Receiver | None
    _events: deque[Event]
    _ctrl: list[bytes]
    _rto: RtoEstimator

    def _init_reconfig(self) -> None:
        self._closing: set[int] = set()  # streams with sending disabled until reset
        self._reset_wanted: set[int] = set()  # not yet in a request
        self._req_seq = 0  # §5.1.1: our next request sequence number
        self._req: c.OutgoingResetRequest | None = None
        self._req_deadline: float | None = None
        self._req_retry_in_progress = False
        self._peer_seq = 0  # the peer's next expected request sequence number
        self._last_response: c.ReconfigResponse | None = None
        self._deferred_seq: int | None = None

    def _init_tsn_state(self, my_initial_tsn: int) -> None:
        self._req_seq = my_initial_tsn  # §5.1.1: initialised to the initial TSN

    def _init_peer_reconfig(self, peer_initial_tsn: int) -> None:
        self._peer_seq = peer_initial_tsn

    def _reconfig_deadline(self) -> float | None:
        return self._req_deadline

    # --- outgoing ---------------------------------------------------------------------------

    def _maybe_send_reconfig(self, now: float) -> None:
        if self._req is not None or not self._reset_wanted:
            return
        ready = tuple(sorted(s for s in self._reset_wanted if not self.sender.has_queued(s)))
        # One request must fit one packet with room to spare: at most 256 streams (528
        # bytes); the rest go in the next request once this one is answered.
        ready = ready[:MAX_STREAMS_PER_REQUEST]
        if not ready:
            return
        self._reset_wanted.difference_update(ready)
        self._req = c.OutgoingResetRequest(self._req_seq, (self._peer_seq - 1) & M32,
                                           self.sender.last_assigned_tsn, ready)
        self._send_request(now)

    def _send_request(self, now: float) -> None:
        assert self._req is not None
        self._ctrl.append(bytes(c.ReconfigChunk((self._req,))))
        self._req_deadline = now + self._rto.rto

    def _reconfig_timeout(self, now: float) -> bool:
        """Retransmit the request; True if the association must fail (§5.1.1 / §8.3)."""
        if self._req_deadline is None or now < self._req_deadline:
            return False
        if self._req_retry_in_progress:
            self._req_retry_in_progress = False  # "in progress" retries do not count
        else:
            self.sender.error_count += 1
            if self.sender.error_count > self.sender.max_retransmissions:
                self._req_deadline = None
                return True
            self._rto.back_off()
        self._send_request(now)
        return False

    def _on_response(self, resp: c.ReconfigResponse) -> None:
        req = self._req
        if req is None or resp.response_seq != req.request_seq:
            return  # stale or duplicate answer
        if resp.result == c.ReconfigResult.IN_PROGRESS:
            self._req_retry_in_progress = True  # resend after the timer, same seq
            return
        self._req = None
        self._req_deadline = None
        self._req_seq = (self._req_seq + 1) & M32
        self._closing.difference_update(req.streams)
        if resp.result in (c.ReconfigResult.SUCCESS_PERFORMED,
                           c.ReconfigResult.SUCCESS_NOTHING_TO_DO):
            self.sender.reset_ssns(req.streams)
            self._events.append(StreamsReset(outgoing=req.streams))
        else:
            self._events.append(StreamResetFailed(req.streams, resp.result))

    # --- incoming ---------------------------------------------------------------------------

    def _on_reconfig(self, now: float, chunk: c.ReconfigChunk) -> None:
        for p in chunk.params:
            if isinstance(p, c.ReconfigResponse):
                self._on_response(p)
            elif isinstance(p, c.OutgoingResetRequest):
                self._on_outgoing_request(p)
            elif isinstance(p, c.IncomingResetRequest):
                self._deny(p.request_seq)
            elif p.request_seq is not None:
                self._deny(p.request_seq)
        self._maybe_send_reconfig(now)

    def _respond(self, seq: int, result: int) -> None:
        resp = c.ReconfigResponse(seq, result)
        self._ctrl.append(bytes(c.ReconfigChunk((resp,))))
        if result != c.ReconfigResult.IN_PROGRESS:
            self._last_response = resp

    def _deny(self, seq: int) -> None:
        if seq == self._peer_seq:
            self._peer_seq = (self._peer_seq + 1) & M32
            self._respond(seq, c.ReconfigResult.DENIED)
        else:
            self._answer_old(seq)

    def _answer_old(self, seq: int) -> None:
        last = self._last_response
        if last is not None and seq == last.response_seq:
            self._respond(seq, last.result)  # a retransmitted request: same answer
        else:
            self._respond(seq, c.ReconfigResult.ERROR_BAD_SEQUENCE_NUMBER)

    def _on_outgoing_request(self, req: c.OutgoingResetRequest) -> None:
        rx = self.receiver
        assert rx is not None
        if req.request_seq != self._peer_seq:
            self._answer_old(req.request_seq)
            return
        if self._deferred_seq == req.request_seq:
            self._respond(req.request_seq, c.ReconfigResult.IN_PROGRESS)
            return
        if rx.request_reset(req.last_tsn, req.streams):
            self._performed(req.request_seq, req.streams or ())
        else:
            self._deferred_seq = req.request_seq
            self._respond(req.request_seq, c.ReconfigResult.IN_PROGRESS)

    def _performed(self, seq: int, streams: tuple[int, ...]) -> None:
        self._peer_seq = (seq + 1) & M32
        self._respond(seq, c.ReconfigResult.SUCCESS_PERFORMED)
        self._events.append(StreamsReset(incoming=streams))

    def _after_data_reconfig(self, now: float) -> None:
        """After new DATA / FORWARD TSN: a deferred incoming reset may now be performed
        (answered at once rather than waiting for the peer's retransmission)."""
        if self._deferred_seq is None or self.receiver is None:
            return
        streams = self.receiver.poll_performed_reset()
        if streams is not None:
            seq, self._deferred_seq = self._deferred_seq, None
            self._performed(seq, streams)
