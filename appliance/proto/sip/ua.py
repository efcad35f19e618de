"""``SipEndpoint``: a sans-IO SIP user agent for phone calls (RFC 3261 §8, §12-§15; RFC
3515 REFER; RFC 3581 rport), driven with the house verbs.

::

    shell                                  SipEndpoint
    ─────                                  ───────────
    datagram / framed stream message ──►  handle_input(now, data, addr, transport)
                                            │ keep-alive CRLF? ─► pong on streams
                                            │ allow(source)?  ── DROP ─► counted
                                            │                 └─ REFUSE ─► minimal 403
                                            │ parse_untrusted  ── SipError ─► 400/413/513
                                            │ Via received/rport filled (§18.2.1, RFC 3581)
                                            │ response ─► client transaction ─► call
                                            │ request  ─► server transaction match?
                                            │              yes ─► absorbed (last response)
                                            │              ACK  ─► dialog (2xx ACK)
                                            │ new: token bucket per source, table cap
                                            │   CANCEL ─► 200 + 487 to its INVITE
                                            │   To tag ─► dialog? no ─► 481
                                            │   INVITE ─► 100 Trying, IncomingCall
                                            │   OPTIONS ─► 200 Allow/Accept
                                            │   other  ─► 405 / 501
    poll_output() until None          ◄──  Transmit(data, addr, transport) | events
    poll_timeout() / handle_timeout(now)   transaction timers, ring timeout
    ringing/accept/reject/hangup/refer/    user operations (plain methods)
    answer_reinvite/invite

Calls are named by an id of ours (``sip_…``), never by the peer's Call-ID (an untrusted
string that could end up in a URL path). Where this endpoint departs from the letter of
the RFC, deliberately:

* responses on UDP go back to the packet's source address and port, always (§18.2.2 sends
  to the Via ``sent-by`` without ``rport``): an endpoint that answers to an address the
  request did not come from is a reflector;
* in-dialog requests go to the address the dialog's INVITE came from (or was sent to), not
  to the remote target's host: symmetric signalling for trunks and softphones behind NAT
  (the Request-URI is still the remote target, the Route set is still sent);
* no Route-based strict routing (RFC 2543 ``lr``-less proxies): a trunk faces us directly;
* inbound digest authentication (trunks without fixed addresses) is not here: the allow
  hook decides; a trunk we *call* needs no entry in it: while a call placed through it
  lives, its responses and that dialog's requests are served (:meth:`_known_peer`).

Outbound INVITEs answer one 401/407 challenge (:mod:`.auth`); credentials are never in a
``repr`` or an event.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

from appliance.proto.sip.base import REASONS, EndpointConfig
from appliance.proto.sip.dialog import CallState
from appliance.proto.sip.errors import SipError, SipUsageError
from appliance.proto.sip.events import (
    Addr,
    CallAcked,
    CallAnswered,
    CallCancelled,
    CallEnded,
    CallFailed,
    CallProgress,
    Dtmf,
    Event,
    IncomingCall,
    Output,
    ReferProgress,
    ReInvite,
    ReInviteAnswered,
    Transmit,
)
from appliance.proto.sip.message import (
    RawMessage,
    Request,
    Response,
    parse_untrusted,
)
from appliance.proto.sip.policy import Decision, cidr_policy, loopback_only
from appliance.proto.sip.transaction import (
    ServerTransaction,
    State,
    response_client_key,
    server_key,
)
from appliance.proto.sip.uac import UacMixin
from appliance.proto.sip.uas import UasMixin

__all__ = [  # the endpoint's vocabulary, importable from here as before the split
    "Addr", "CallAcked", "CallAnswered", "CallCancelled", "CallEnded", "CallFailed",
    "CallProgress", "CallState", "Decision", "Dtmf", "EndpointConfig", "Event",
    "IncomingCall", "Output", "ReInvite", "ReInviteAnswered", "ReferProgress", "SipEndpoint",
    "Transmit", "cidr_policy", "loopback_only",
]


class SipEndpoint(UasMixin, UacMixin):
    """The UA core: the UAS (:mod:`.uas`) and UAC (:mod:`.uac`) halves over their shared
    state (:mod:`.base`), behind the house verbs; ``hangup`` is here because it ends a call
    of either kind. Not thread-safe; one per SIP listener set."""

    def poll_output(self) -> Output | None:
        """The next output in the order it was queued; None when drained."""
        return self._out.popleft() if self._out else None

    def poll_timeout(self) -> float | None:
        deadlines = [d for t in self._server.values() if (d := t.poll_timeout()) is not None]
        deadlines += [d for t in self._client.values() if (d := t.poll_timeout()) is not None]
        deadlines += [c.ring_deadline for c in self._calls.values() if c.ring_deadline is not None]
        return min(deadlines) if deadlines else None

    def handle_input(self, now: float, data: bytes, addr: Addr, transport: str = "udp") -> None:
        """One datagram (UDP) or one message cut by :class:`StreamFramer` (TCP/TLS).
        Never raises for the peer's bytes."""
        if not data.strip(b"\r\n"):
            # RFC 5626 §3.5.1: a CRLFCRLF ping on a stream is answered by one CRLF
            if transport != "udp" and b"\r\n\r\n" in data:
                self._out.append(Transmit(b"\r\n", addr, transport))
            return
        decision = self.config.allow(addr[0])
        dialed = decision is not Decision.ALLOW and self._dialed.get(addr[0], 0) > 0
        if decision is Decision.DROP and not dialed:
            self.counters["dropped-source"] += 1
            return
        try:
            msg = parse_untrusted(data, stream=transport != "udp")
        except SipError as e:
            self.counters["malformed"] += 1
            if decision is Decision.ALLOW and isinstance(e.partial, RawMessage):
                self._reply_to_partial(now, e, e.partial, addr, transport)
            return
        if dialed and self._known_peer(msg, addr):
            decision = Decision.ALLOW  # a trunk we called, about that call
        elif decision is Decision.DROP:
            self.counters["dropped-source"] += 1
            return
        if decision is Decision.REFUSE:
            self.counters["refused-source"] += 1
            if not self._buckets.allow(addr[0], now):
                self.counters["rate-limited"] += 1  # a scanner's flood gets few 403s
                return
            if isinstance(msg, Request) and msg.method != "ACK":
                self._send_minimal(msg, 403, "Forbidden", len(data), addr, transport)
            return
        if isinstance(msg, Response):
            self._on_response(now, msg)
            return
        msg = self._stamp_via(msg, addr)
        key = server_key(msg)
        txn = self._server.get(key)
        if txn is not None and not (msg.method == "ACK" and txn.state is State.ACCEPTED):
            txn.handle_input(now, msg)
            self._drain(now, txn)
            return
        if msg.method == "ACK":
            self._on_ack(now, msg)  # the ACK of a 2xx is its own transaction (§17.1.1.3)
            return
        if not self._buckets.allow(addr[0], now):
            self.counters["rate-limited"] += 1
            return
        if len(self._server) >= self.config.max_transactions:
            self.counters["table-full"] += 1
            return
        txn = ServerTransaction(msg, addr, transport, self.config.timers)
        self._server[key] = txn
        self._dispatch(now, msg, txn)

    def _known_peer(self, msg: Request | Response, addr: Addr) -> bool:
        """A message from a trunk we placed a call through that the allow hook does not
        serve: its responses to our transactions, and the requests inside the dialogs of
        our calls through it (BYE, re-INVITE) — nothing else (a new INVITE from it is
        still refused). The branch, Call-ID and tags it must echo are our random values."""
        if isinstance(msg, Response):
            key = response_client_key(msg)
            txn = self._client.get(key) if key is not None else None
            return txn is not None and txn.addr[0] == addr[0]
        tag = msg.to.tag
        if not tag or msg.method == "CANCEL":
            return False
        call = self._calls.get(self._dialogs.get((msg.call_id, tag)) or "")
        return call is not None and call.outbound and call.addr[0] == addr[0]

    def handle_timeout(self, now: float) -> None:
        for key, st in list(self._server.items()):
            d = st.poll_timeout()
            if d is not None and d <= now:
                st.handle_timeout(now)
                self._drain(now, st)
            if st.done:
                del self._server[key]
        for key, ct in list(self._client.items()):
            d = ct.poll_timeout()
            if d is not None and d <= now:
                ct.handle_timeout(now)
                self._drain(now, ct)
            if ct.done:
                del self._client[key]
        for call in list(self._calls.values()):
            if call.ring_deadline is not None and call.ring_deadline <= now:
                call.ring_deadline = None
                if call.state in (CallState.INCOMING, CallState.EARLY):
                    self.reject(now, call.call_id, 480)
                    self.counters["ring-timeout"] += 1

    def hangup(self, now: float, call_id: str) -> None:
        """BYE on an answered call, 603 on a ringing one, CANCEL on our pending INVITE."""
        call = self._calls.get(call_id)
        if call is None or call.state is CallState.ENDED:
            raise SipUsageError("no such call")
        if call.state in (CallState.INCOMING, CallState.EARLY):
            self.reject(now, call_id, 603)
            return
        if call.state is CallState.ANSWERED:
            # §15: "MUST NOT send a BYE ... until it has received an ACK ... or until the
            # server transaction times out"
            call.bye_after_ack = True
            self._end(call, "hangup", "local", forget=False)
            return
        if call.state is CallState.OUTGOING:
            call.cancel_pending = True  # §9.1: CANCEL only after a provisional response
            self._end(call, "hangup", "local", forget=False)
            return
        if call.state is CallState.OUT_EARLY:
            self._send_cancel(now, call)
            self._end(call, "hangup", "local", forget=False)
            return
        self._send_bye(now, call)
        self._end(call, "hangup", "local")

    def _reply_to_partial(self, now: float, e: SipError, partial: RawMessage, addr: Addr,
                          transport: str) -> None:
        """A request that broke a rule after its header list parsed: answer the status the
        error names when Via/From/To/Call-ID/CSeq are there to address it (§8.2.6)."""
        if partial.method in (None, "ACK"):
            return
        names = {k for k, _ in partial.headers}
        if not {"Via", "From", "To", "Call-ID", "CSeq"} <= names:
            return
        # the peer can only match a response whose routing headers parse: when one of
        # them is the broken part, a 400 would be noise (and itself malformed)
        probe = Response(400, "", partial.headers)
        try:
            probe.vias  # noqa: B018
            probe.from_  # noqa: B018
            probe.to  # noqa: B018
            probe.cseq  # noqa: B018
            if not probe.call_id or " " in probe.call_id:
                raise SipError("Bad Call-ID")
        except SipError:
            self.counters["unanswerable"] += 1
            return
        if sum(1 for k, _ in partial.headers if k in ("From", "To", "CSeq", "Call-ID")) > 4:
            self.counters["unanswerable"] += 1
            return
        if not self._buckets.allow(addr[0], now):
            self.counters["rate-limited"] += 1
            return
        reason = e.reason if e.status == 400 else REASONS.get(e.status, e.reason)
        resp = self._response(partial, e.status, reason, tag=secrets.token_hex(4), minimal=True)
        self._out.append(Transmit(bytes(resp), addr, transport))

    @staticmethod
    def _stamp_via(req: Request, addr: Addr) -> Request:
        """§18.2.1 / RFC 3581 §4: fill ``received`` and ``rport`` on the top Via."""
        vias = req.vias
        stamped = str(vias[0].with_received(addr[0], addr[1]))
        headers: list[tuple[str, str]] = []
        done = False
        for k, v in req.headers:
            if k == "Via" and not done:
                headers.append((k, stamped))
                done = True
            else:
                headers.append((k, v))
        return replace(req, headers=tuple(headers))
