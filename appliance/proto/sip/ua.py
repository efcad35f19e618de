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
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from appliance.proto.ratelimit import TokenBuckets
from appliance.proto.sip import auth
from appliance.proto.sip.dialog import CallState, Dialog, dtmf_relay, sipfrag_status
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
    parse_name_addr_untrusted,
    parse_untrusted,
    parse_uri_untrusted,
)
from appliance.proto.sip.policy import Decision, cidr_policy, loopback_only
from appliance.proto.sip.transaction import (
    MAGIC,
    ClientTransaction,
    Key,
    ServerTransaction,
    State,
    Timers,
    client_key,
    response_client_key,
    server_key,
)

__all__ = [  # the endpoint's vocabulary, importable from here as before the split
    "Addr", "CallAcked", "CallAnswered", "CallCancelled", "CallEnded", "CallFailed",
    "CallProgress", "CallState", "Decision", "Dtmf", "EndpointConfig", "Event",
    "IncomingCall", "Output", "ReInvite", "ReInviteAnswered", "ReferProgress", "SipEndpoint",
    "Transmit", "cidr_policy", "loopback_only",
]

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, NOTIFY, REFER"
ACCEPT = "application/sdp, application/dtmf-relay, message/sipfrag"
#: methods we know but do not serve: 405 with Allow (§8.2.1); anything else is 501
_KNOWN = frozenset({"REGISTER", "SUBSCRIBE", "PUBLISH", "MESSAGE", "PRACK", "UPDATE"})
_REASONS = {
    100: "Trying", 180: "Ringing", 183: "Session Progress", 200: "OK", 202: "Accepted",
    400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
    408: "Request Timeout", 413: "Request Entity Too Large", 414: "Request-URI Too Long",
    415: "Unsupported Media Type", 416: "Unsupported URI Scheme", 420: "Bad Extension",
    480: "Temporarily Unavailable", 481: "Call/Transaction Does Not Exist",
    482: "Loop Detected", 486: "Busy Here", 487: "Request Terminated",
    488: "Not Acceptable Here", 491: "Request Pending", 500: "Server Internal Error",
    501: "Not Implemented", 503: "Service Unavailable", 505: "Version Not Supported",
    513: "Message Too Large", 603: "Decline",
}


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    host: str  # our address for Via / Contact
    port: int = 5060  # UDP and TCP
    tls_port: int | None = None  # TLS listener (Contact sips:), when there is one
    user_agent: str = "appliance"
    allow: Callable[[str], Decision] = loopback_only
    rate: float = 20.0  # new transactions per second per source IP
    burst: float = 40.0
    rate_sources: int = 4096
    max_invites: int = 64  # concurrent INVITE server transactions
    max_transactions: int = 4096
    ring_timeout: float = 120.0  # unanswered incoming call -> 480
    timers: Timers = field(default_factory=Timers)


class SipEndpoint:
    """The UA core plus its transactions. Not thread-safe; one per SIP listener set."""

    def __init__(self, config: EndpointConfig) -> None:
        self.config = config
        self._out: deque[Output] = deque()
        self._server: dict[Key, ServerTransaction] = {}
        self._client: dict[Key, ClientTransaction] = {}
        self._calls: dict[str, Dialog] = {}
        #: (SIP Call-ID, our tag) -> call id
        self._dialogs: dict[tuple[str, str], str] = {}
        self._buckets: TokenBuckets[str] = TokenBuckets(config.rate, config.burst,
                                                         config.rate_sources)
        #: drop and refusal reasons -> count (the shell exports them as metrics)
        self.counters: Counter[str] = Counter()
        #: trunk IP -> our outbound calls through it (their answers pass the allow hook)
        self._dialed: Counter[str] = Counter()

    def stats(self) -> dict[str, int]:
        """Table sizes for the metrics (gauges; ``counters`` holds the totals)."""
        return {"server_transactions": len(self._server),
                "client_transactions": len(self._client), "calls": len(self._calls),
                "pending_invites": self._active_invites()}

    # ------------------------------------------------------------ house verbs

    def poll_output(self) -> Output | None:
        """The next output in the order it was queued; None when drained."""
        return self._out.popleft() if self._out else None

    def poll_timeout(self) -> float | None:
        deadlines = [d for t in self._server.values() if (d := t.deadline()) is not None]
        deadlines += [d for t in self._client.values() if (d := t.deadline()) is not None]
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
            self._send(txn, txn.receive_request(now, msg))
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
            d = st.deadline()
            if d is not None and d <= now:
                out, failure = st.handle_timeout(now)
                self._send(st, out)
                if failure and st.owner is not None:
                    self._server_failed(now, st)
            if st.done:
                del self._server[key]
        for key, ct in list(self._client.items()):
            d = ct.deadline()
            if d is not None and d <= now:
                out, timed_out = ct.handle_timeout(now)
                self._send_client(ct, out)
                if timed_out:
                    self._client_timed_out(now, ct)
            if ct.done:
                del self._client[key]
        for call in list(self._calls.values()):
            if call.ring_deadline is not None and call.ring_deadline <= now:
                call.ring_deadline = None
                if call.state in (CallState.INCOMING, CallState.EARLY):
                    self.reject(now, call.call_id, 480)
                    self.counters["ring-timeout"] += 1

    # ------------------------------------------------------------ user operations

    def ringing(self, now: float, call_id: str) -> None:
        call = self._call(call_id, CallState.INCOMING, CallState.EARLY)
        call.move(CallState.EARLY)
        self._respond(now, call.invite_txn, 180, contact=True, call=call)

    def accept(self, now: float, call_id: str, answer_sdp: bytes) -> None:
        """200 OK with our SDP; retransmitted until the ACK (or 64·T1, then BYE)."""
        call = self._call(call_id, CallState.INCOMING, CallState.EARLY)
        call.move(CallState.ANSWERED)
        call.ring_deadline = None
        self._respond(now, call.invite_txn, 200, contact=True, call=call, body=answer_sdp,
                      extra=(("Allow", ALLOW), ("Supported", "replaces")))

    def reject(self, now: float, call_id: str, status: int = 603, reason: str | None = None,
               warning: str | None = None) -> None:
        if not 300 <= status <= 699:
            raise SipUsageError("a rejection needs a 3xx-6xx status")
        call = self._call(call_id, CallState.INCOMING, CallState.EARLY)
        extra = (("Warning", warning),) if warning else ()
        self._respond(now, call.invite_txn, status, reason=reason, call=call, extra=extra)
        self._end(call, f"rejected {status}", "local")

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

    def answer_reinvite(self, now: float, call_id: str, answer_sdp: bytes) -> None:
        call = self._call(call_id, CallState.CONFIRMED)
        if call.reinvite_txn is None:
            raise SipUsageError("no re-INVITE is waiting for an answer")
        txn, call.reinvite_txn = call.reinvite_txn, None
        self._respond(now, txn, 200, contact=True, call=call, body=answer_sdp)

    def reject_reinvite(self, now: float, call_id: str, status: int = 488,
                        warning: str | None = None) -> None:
        call = self._call(call_id, CallState.CONFIRMED)
        if call.reinvite_txn is None:
            raise SipUsageError("no re-INVITE is waiting for an answer")
        txn, call.reinvite_txn = call.reinvite_txn, None
        self._respond(now, txn, status, call=call,
                      extra=(("Warning", warning),) if warning else ())

    def reinvite(self, now: float, call_id: str, offer_sdp: bytes) -> None:
        """A re-INVITE from our side (§14.1): hold (``a=sendonly``), unhold, codec change.
        The answer comes back as :class:`ReInviteAnswered`."""
        call = self._call(call_id, CallState.CONFIRMED)
        busy = call.reinvite_txn is not None or self._inviting(call_id)
        if busy:
            raise SipUsageError("a re-INVITE is already in progress (§14.1)")
        self._start_client(now, call, self._in_dialog(call, "INVITE", body=offer_sdp))

    def refer(self, now: float, call_id: str, target_uri: str) -> None:
        """REFER (RFC 3515) inside the call; progress comes back as ReferProgress."""
        call = self._call(call_id, CallState.CONFIRMED)
        parse_uri_untrusted(target_uri)  # our caller's input: refuse a broken URI early
        local = parse_name_addr_untrusted(call.local_hdr)
        req = self._in_dialog(call, "REFER", extra=(("Refer-To", f"<{target_uri}>"),
                                                    ("Referred-By", f"<{local.uri}>")))
        self._start_client(now, call, req)

    def info_dtmf(self, now: float, call_id: str, digit: str, duration_ms: int = 250) -> None:
        call = self._call(call_id, CallState.CONFIRMED)
        body = f"Signal={digit}\r\nDuration={duration_ms}\r\n".encode()
        req = self._in_dialog(call, "INFO", body=body, ctype="application/dtmf-relay")
        self._start_client(now, call, req)

    def invite(self, now: float, target: str, from_uri: str, sdp: bytes, addr: Addr,
               transport: str = "udp", credentials: auth.Credentials | None = None,
               headers: Iterable[tuple[str, str]] = ()) -> str:
        """Place a call to ``target`` through the trunk at ``addr``; returns its call id."""
        uri = parse_uri_untrusted(target)
        parse_uri_untrusted(from_uri)
        call_id = "sip_" + secrets.token_hex(12)
        call = Dialog(call_id, f"{secrets.token_hex(12)}@{self.config.host}", addr, transport,
                     outbound=True)
        call.local_hdr = f"<{from_uri}>;tag={call.local_tag}"
        call.remote_hdr = f"<{target}>"
        call.remote_target = uri
        call.credentials = credentials
        self._calls[call_id] = call
        self._dialed[addr[0]] += 1
        req = self._build_invite(call, sdp, tuple(headers), ())
        call.invite = req
        self._start_client(now, call, req)
        return call_id

    def sip_call_id(self, call_id: str) -> str | None:
        """The SIP ``Call-ID`` header value of a call this endpoint still holds (for an
        outbound call, the one :meth:`invite` generated); None once it is forgotten."""
        call = self._calls.get(call_id)
        return None if call is None else call.sip_call_id

    # ------------------------------------------------------------ internals: sending

    def _call(self, call_id: str, *states: CallState) -> Dialog:
        call = self._calls.get(call_id)
        if call is None or call.state not in states:
            raise SipUsageError(f"call is not in state {' / '.join(s.value for s in states)}")
        return call

    def _send(self, txn: ServerTransaction, datagrams: list[bytes]) -> None:
        for d in datagrams:
            self._out.append(Transmit(d, txn.addr, txn.transport))

    def _send_client(self, txn: ClientTransaction, datagrams: list[bytes]) -> None:
        for d in datagrams:
            self._out.append(Transmit(d, txn.addr, txn.transport))

    def _response(self, req: Request | RawMessage, status: int, reason: str | None = None,
                  *, tag: str | None = None, contact: bool = False,
                  extra: Iterable[tuple[str, str]] = (), body: bytes = b"",
                  ctype: str = "application/sdp", minimal: bool = False,
                  transport: str = "udp") -> Response:
        """§8.2.6: Via (all, in order), From, To (+ our tag), Call-ID, CSeq copied."""
        headers: list[tuple[str, str]] = []
        vias_seen = False
        for k, v in req.headers:
            if k == "Via":
                if minimal and vias_seen:
                    continue
                vias_seen = True
                headers.append((k, v))
            elif k == "To":
                if tag and "tag=" not in v.lower().replace(" ", ""):
                    v = f"{v};tag={tag}"
                headers.append((k, v))
            elif k in ("From", "Call-ID", "CSeq"):
                headers.append((k, v))
        if contact:
            headers.append(("Contact", self._contact(transport)))
        headers.extend(extra)
        if body:
            headers.append(("Content-Type", ctype))
        return Response(status, reason or _REASONS.get(status, "Unknown"), tuple(headers), body)

    def _respond(self, now: float, txn: ServerTransaction | None, status: int,
                 reason: str | None = None, *, call: Dialog | None = None,
                 contact: bool = False, extra: Iterable[tuple[str, str]] = (),
                 body: bytes = b"", ctype: str = "application/sdp") -> None:
        if txn is None:
            return
        tag = call.local_tag if call is not None and status > 100 else None
        if call is None and status > 100 and txn.request.to.tag is None:
            tag = secrets.token_hex(6)  # §8.2.6.2: a final response outside a dialog
        resp = self._response(txn.request, status, reason, tag=tag, contact=contact,
                              extra=extra, body=body, ctype=ctype, transport=txn.transport)
        self._send(txn, txn.respond(now, status, bytes(resp)))

    def _send_minimal(self, req: Request, status: int, reason: str, limit: int, addr: Addr,
                      transport: str) -> None:
        """Issue 28 item 6: to an unverified UDP source nothing larger than its request."""
        data = bytes(self._response(req, status, reason, tag=secrets.token_hex(4), minimal=True))
        if transport == "udp" and len(data) > limit:
            self.counters["too-large-to-answer"] += 1
            return
        self._out.append(Transmit(data, addr, transport))

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
        reason = e.reason if e.status == 400 else _REASONS.get(e.status, e.reason)
        resp = self._response(partial, e.status, reason, tag=secrets.token_hex(4), minimal=True)
        self._out.append(Transmit(bytes(resp), addr, transport))

    def _port(self, transport: str) -> int:
        if transport == "tls" and self.config.tls_port is not None:
            return self.config.tls_port
        return self.config.port

    def _contact(self, transport: str) -> str:
        """Where the peer sends this dialog's next requests (§8.1.1.8): on the transport
        the dialog uses, so a TCP/TLS caller does not come back over UDP."""
        host, port = self.config.host, self._port(transport)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        if transport == "tls":
            return f"<sip:{host}:{port};transport=tls>"
        if transport == "tcp":
            return f"<sip:{host}:{port};transport=tcp>"
        return f"<sip:{host}:{port}>"

    def _via(self, transport: str) -> tuple[str, str]:
        branch = MAGIC + secrets.token_hex(10)
        t = transport.upper()
        host = self.config.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return branch, f"SIP/2.0/{t} {host}:{self._port(transport)};branch={branch};rport"

    def _in_dialog(self, call: Dialog, method: str, *, extra: Iterable[tuple[str, str]] = (),
                   body: bytes = b"", ctype: str = "application/sdp",
                   seq: int | None = None) -> Request:
        """§12.2.1.1: a request within the dialog."""
        if seq is None:
            call.local_seq += 1
            seq = call.local_seq
        _, via = self._via(call.transport)
        headers: list[tuple[str, str]] = [
            ("Via", via), ("Max-Forwards", "70"), ("From", call.local_hdr),
            ("To", call.remote_hdr), ("Call-ID", call.sip_call_id), ("CSeq", f"{seq} {method}"),
        ]
        headers += [("Route", r) for r in call.route_set]
        if method != "ACK":
            headers.append(("Contact", self._contact(call.transport)))
        headers.extend(extra)
        if body:
            headers.append(("Content-Type", ctype))
        return Request(method, call.remote_target, tuple(headers), body)

    def _build_invite(self, call: Dialog, sdp: bytes, headers: tuple[tuple[str, str], ...],
                      authz: tuple[tuple[str, str], ...]) -> Request:
        _, via = self._via(call.transport)
        hs: list[tuple[str, str]] = [
            ("Via", via), ("Max-Forwards", "70"), ("From", call.local_hdr),
            ("To", call.remote_hdr), ("Call-ID", call.sip_call_id),
            ("CSeq", f"{call.local_seq} INVITE"), ("Contact", self._contact(call.transport)),
            ("Allow", ALLOW), ("User-Agent", self.config.user_agent), *headers, *authz,
        ]
        if sdp:
            hs.append(("Content-Type", "application/sdp"))
        return Request("INVITE", call.remote_target, tuple(hs), sdp)

    def _start_client(self, now: float, call: Dialog, req: Request) -> None:
        if len(self._client) >= self.config.max_transactions:
            raise SipUsageError("client transaction table full")
        txn = ClientTransaction(req, call.addr, call.transport, now, self.config.timers)
        txn.owner = call.call_id
        self._client[client_key(req.branch or "", req.method)] = txn
        self._send_client(txn, txn.start())

    def _send_bye(self, now: float, call: Dialog) -> None:
        self._start_client(now, call, self._in_dialog(call, "BYE"))

    def _send_cancel(self, now: float, call: Dialog) -> None:
        """§9.1: CANCEL copies the INVITE's Request-URI, Call-ID, To, From, CSeq number and
        its single Via (same branch), so the server finds the transaction."""
        inv = call.invite
        if inv is None:
            return
        keep = ("Via", "From", "To", "Call-ID", "Route")
        hs = [(k, v) for k, v in inv.headers if k in keep]
        hs.append(("CSeq", f"{inv.cseq.seq} CANCEL"))
        hs.append(("Max-Forwards", "70"))
        self._start_client(now, call, Request("CANCEL", inv.uri, tuple(hs)))

    def _end(self, call: Dialog, reason: str, by: str, *, forget: bool = True) -> None:
        if call.state is not CallState.ENDED:
            call.move(CallState.ENDED)
            call.ring_deadline = None
            self._out.append(CallEnded(call.call_id, reason, by))
        if forget:
            self._forget(call)

    def _forget(self, call: Dialog) -> None:
        if self._calls.pop(call.call_id, None) is not None and call.outbound:
            self._dialed[call.addr[0]] -= 1
            if self._dialed[call.addr[0]] <= 0:
                del self._dialed[call.addr[0]]
        self._dialogs.pop((call.sip_call_id, call.local_tag), None)

    # ------------------------------------------------------------ internals: receiving

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

    def _dispatch(self, now: float, req: Request, txn: ServerTransaction) -> None:
        m = req.method
        if m != "CANCEL":
            if not (req.uri.is_sip or req.uri.scheme == "tel"):
                self._respond(now, txn, 416)
                return
            required = [r for r in req.get_all("Require") if r]
            if required:  # §8.2.2.3: we support no extension a request can require
                self._respond(now, txn, 420, extra=[("Unsupported", r) for r in required])
                return
        to_tag = req.to.tag
        if m == "CANCEL":
            self._on_cancel(now, req, txn)
        elif to_tag:
            self._in_dialog_request(now, req, txn, to_tag)
        elif m == "INVITE":
            self._on_invite(now, req, txn)
        elif m == "OPTIONS":
            self._respond(now, txn, 200, extra=(("Allow", ALLOW), ("Accept", ACCEPT),
                                                ("Supported", "replaces")))
        elif m in ("BYE", "INFO", "NOTIFY", "REFER"):
            self._respond(now, txn, 481)
        elif m in _KNOWN:
            self._respond(now, txn, 405, extra=(("Allow", ALLOW),))
        else:
            self._respond(now, txn, 501)

    def _inviting(self, call_id: str) -> bool:
        """Whether our INVITE for this call still waits for its final response."""
        return any(c.owner == call_id and c.invite and c.state in (State.CALLING, State.PROCEEDING)
                   for c in self._client.values())

    def _active_invites(self) -> int:
        return sum(1 for t in self._server.values() if t.invite and t.state is State.PROCEEDING)

    def _on_invite(self, now: float, req: Request, txn: ServerTransaction) -> None:
        if any(c.sip_call_id == req.call_id and not c.outbound for c in self._calls.values()):
            self._respond(now, txn, 482)  # §8.2.2.2 merged request (a forked copy)
            return
        if self._active_invites() > self.config.max_invites:
            self.counters["invite-cap"] += 1
            self._respond(now, txn, 503, extra=(("Retry-After", "5"),))
            return
        if req.body and req.content_type != "application/sdp":
            self._respond(now, txn, 415, extra=(("Accept", "application/sdp"),))
            return
        # §17.2.1: 100 Trying at once (our TU answers later than 200 ms, the webhook)
        self._respond(now, txn, 100)
        call = Dialog("sip_" + secrets.token_hex(12), req.call_id, txn.addr, txn.transport,
                     outbound=False)
        contacts = req.contacts
        call.remote_tag = req.from_.tag
        call.remote_hdr = req.get("From") or ""
        call.local_hdr = f"{req.get('To')};tag={call.local_tag}"
        call.remote_target = contacts[0].uri if contacts else req.from_.uri
        call.route_set = tuple(req.get_all("Record-Route"))  # §12.1.1: UAS keeps the order
        call.remote_seq = req.cseq.seq
        call.invite = req
        call.invite_txn = txn
        call.ring_deadline = now + self.config.ring_timeout
        txn.owner = call.call_id
        self._calls[call.call_id] = call
        self._dialogs[(req.call_id, call.local_tag)] = call.call_id
        self._out.append(IncomingCall(call.call_id, req, req.body, req.headers, txn.addr,
                                      txn.transport))

    def _on_cancel(self, now: float, req: Request, txn: ServerTransaction) -> None:
        inv = self._server.get(server_key(replace(req, method="INVITE")))
        if inv is None or not inv.invite:
            self._respond(now, txn, 481)
            return
        call = self._calls.get(inv.owner or "")
        # §9.2: the 200 to CANCEL carries the To tag the INVITE's responses carry
        self._respond(now, txn, 200, call=call)
        if inv.state is State.PROCEEDING and call is not None:
            # §9.2: the INVITE gets 487; the call is over
            self._respond(now, inv, 487, call=call)
            call.move(CallState.ENDED)
            call.ring_deadline = None
            self._out.append(CallCancelled(call.call_id))
            self._forget(call)

    def _on_ack(self, now: float, req: Request) -> None:
        tag = req.to.tag
        cid = self._dialogs.get((req.call_id, tag or ""))
        call = self._calls.get(cid or "")
        if call is None:
            self.counters["stray-ack"] += 1
            return
        for txn in (call.invite_txn,):
            if txn is not None and txn.state is State.ACCEPTED and txn.request.cseq.seq == req.cseq.seq:
                txn.ack_2xx()
        # re-INVITE 2xx ACKs: find the Accepted server transaction of that CSeq
        for st in self._server.values():
            if (st.owner == call.call_id and st.invite and st.state is State.ACCEPTED
                    and st.request.cseq.seq == req.cseq.seq):
                st.ack_2xx()
        if call.state is CallState.ANSWERED:
            call.move(CallState.CONFIRMED)
            self._out.append(CallAcked(call.call_id, req.body))
        elif call.state is CallState.ENDED and call.bye_after_ack:
            call.bye_after_ack = False
            self._send_bye(now, call)
            self._forget(call)

    def _in_dialog_request(self, now: float, req: Request, txn: ServerTransaction,
                           to_tag: str) -> None:
        cid = self._dialogs.get((req.call_id, to_tag))
        call = self._calls.get(cid or "")
        if call is not None and call.state is CallState.ENDED and req.method == "BYE" \
                and call.remote_tag == req.from_.tag:
            # we hung up while our 200 waited for its ACK and the caller hung up too
            self._respond(now, txn, 200, call=call)
            call.bye_after_ack = False
            self._forget(call)
            return
        if call is None or call.remote_tag != req.from_.tag or call.state is CallState.ENDED:
            self._respond(now, txn, 481)
            return
        seq = req.cseq.seq
        if call.remote_seq is not None and seq <= call.remote_seq:
            self._respond(now, txn, 500, "CSeq Out Of Order")  # §12.2.2
            return
        call.remote_seq = seq
        txn.owner = call.call_id
        m = req.method
        if m == "BYE":
            self._respond(now, txn, 200, call=call)
            self._end(call, "bye", "remote")
        elif m == "INVITE":
            self._on_reinvite(now, req, txn, call)
        elif m == "INFO":
            self._on_info(now, req, txn, call)
        elif m == "NOTIFY":
            self._on_notify(now, req, txn, call)
        elif m == "OPTIONS":
            self._respond(now, txn, 200, call=call, extra=(("Allow", ALLOW), ("Accept", ACCEPT)))
        elif m == "REFER":
            self._respond(now, txn, 403, "Transfers From The Far End Are Not Accepted", call=call)
        elif m in _KNOWN:
            self._respond(now, txn, 405, call=call, extra=(("Allow", ALLOW),))
        else:
            self._respond(now, txn, 501, call=call)

    def _on_reinvite(self, now: float, req: Request, txn: ServerTransaction, call: Dialog) -> None:
        if call.state is not CallState.CONFIRMED:
            # §14.2: a re-INVITE before our 2xx was ACKed -> 500 with Retry-After
            self._respond(now, txn, 500, call=call, extra=(("Retry-After", "1"),))
            return
        pending = call.reinvite_txn is not None or self._inviting(call.call_id)
        if pending:
            self._respond(now, txn, 491, call=call)  # §14.2 glare
            return
        if req.body and req.content_type != "application/sdp":
            self._respond(now, txn, 415, call=call, extra=(("Accept", "application/sdp"),))
            return
        self._respond(now, txn, 100)
        contacts = req.contacts
        if contacts:
            call.remote_target = contacts[0].uri  # §12.2.2 target refresh
        call.reinvite_txn = txn
        self._out.append(ReInvite(call.call_id, req.body))

    def _on_info(self, now: float, req: Request, txn: ServerTransaction, call: Dialog) -> None:
        ctype = req.content_type
        if ctype == "application/dtmf-relay":
            got = dtmf_relay(req.body)
            if got is None:
                self._respond(now, txn, 400, "Bad dtmf-relay Body", call=call)
                return
            self._respond(now, txn, 200, call=call)
            self._out.append(Dtmf(call.call_id, got[0], got[1]))
        elif ctype == "application/dtmf":
            digit = req.body.strip().decode("ascii", "replace").upper()
            if len(digit) != 1 or digit not in "0123456789*#ABCD":
                self._respond(now, txn, 400, "Bad dtmf Body", call=call)
                return
            self._respond(now, txn, 200, call=call)
            self._out.append(Dtmf(call.call_id, digit, 250))
        elif not req.body:
            self._respond(now, txn, 200, call=call)  # an INFO keep-alive
        else:
            self._respond(now, txn, 415, call=call, extra=(("Accept", ACCEPT),))

    def _on_notify(self, now: float, req: Request, txn: ServerTransaction, call: Dialog) -> None:
        event = (req.get("Event") or "").split(";")[0].strip().lower()
        if event != "refer":
            self._respond(now, txn, 489, "Bad Event", call=call)
            return
        self._respond(now, txn, 200, call=call)
        state = (req.get("Subscription-State") or "").split(";")[0].strip().lower()
        got = sipfrag_status(req.body) if req.content_type == "message/sipfrag" else None
        if got is not None:
            self._out.append(ReferProgress(call.call_id, got[0], got[1],
                                           final=state == "terminated" or got[0] >= 200))
        elif state == "terminated":
            self._out.append(ReferProgress(call.call_id, 0, "subscription terminated", True))

    def _on_response(self, now: float, resp: Response) -> None:
        key = response_client_key(resp)
        txn = self._client.get(key) if key is not None else None
        if txn is None:
            self.counters["stray-response"] += 1
            return
        out, up = txn.receive_response(now, resp)
        self._send_client(txn, out)
        if up is None:
            return
        call = self._calls.get(txn.owner or "")
        if call is None:
            return
        if txn.purpose == "INVITE" and txn.request.to.tag is not None:
            self._reinvite_response(call, txn, up)
        elif txn.purpose == "INVITE":
            self._invite_response(now, call, txn, up)
        elif txn.purpose == "REFER":
            if up.status >= 200:
                self._out.append(ReferProgress(call.call_id, up.status, up.reason,
                                               final=up.status >= 300))
            if up.status in (408, 481):
                self._end(call, f"{up.status} to REFER", "remote")
        elif txn.purpose in ("INFO",) and up.status in (408, 481):
            self._end(call, f"{up.status} to {txn.purpose}", "remote")

    def _reinvite_response(self, call: Dialog, txn: ClientTransaction, resp: Response) -> None:
        if resp.status < 200:
            return
        if resp.status < 300:
            # §13.2.2.4: the ACK of a 2xx (sent again for each retransmitted 2xx)
            ack = self._in_dialog(call, "ACK", seq=txn.request.cseq.seq)
            first = txn.last_ack is None
            txn.last_ack = bytes(ack)
            self._out.append(Transmit(txn.last_ack, call.addr, call.transport))
            contacts = resp.contacts
            if contacts:
                call.remote_target = contacts[0].uri  # §12.2.1.2 target refresh
            if not first:
                return
        elif resp.status in (408, 481):
            self._end(call, f"{resp.status} to re-INVITE", "remote")
        self._out.append(ReInviteAnswered(call.call_id, resp.status, resp.body))

    def _invite_response(self, now: float, call: Dialog, txn: ClientTransaction,
                         resp: Response) -> None:
        status = resp.status
        if status < 200:
            if call.state is CallState.OUTGOING:
                call.move(CallState.OUT_EARLY)
            elif call.state is CallState.ENDED and call.cancel_pending:
                call.cancel_pending = False
                self._send_cancel(now, call)
                return
            if status > 100 and call.state is CallState.OUT_EARLY:
                self._out.append(CallProgress(call.call_id, status, resp.reason))
            return
        if status < 300:
            if call.ack_wire is not None:
                # a 2xx retransmission: our ACK was lost (§13.2.2.4)
                self._out.append(Transmit(call.ack_wire, call.addr, call.transport))
                return
            call.remote_tag = resp.to.tag
            call.remote_hdr = resp.get("To") or call.remote_hdr
            contacts = resp.contacts
            if contacts:
                call.remote_target = contacts[0].uri
            call.route_set = tuple(reversed(resp.get_all("Record-Route")))  # §12.1.2
            self._dialogs[(call.sip_call_id, call.local_tag)] = call.call_id
            ack = self._in_dialog(call, "ACK", seq=txn.request.cseq.seq)
            call.ack_wire = bytes(ack)
            self._out.append(Transmit(call.ack_wire, call.addr, call.transport))
            if call.state is CallState.ENDED:
                # we hung up while the 2xx was on its way (§15.1.1 race): ACK, then BYE
                self._send_bye(now, call)
                self._forget(call)
                return
            call.move(CallState.CONFIRMED)
            self._out.append(CallAnswered(call.call_id, resp.body))
            return
        if status in (401, 407) and call.credentials is not None and not call.auth_tried \
                and call.state is not CallState.ENDED:
            if self._answer_challenge(now, call, resp):
                return
        if call.state is not CallState.ENDED:
            call.move(CallState.ENDED)
            self._out.append(CallFailed(call.call_id, status, resp.reason))
        self._forget(call)

    def _answer_challenge(self, now: float, call: Dialog, resp: Response) -> bool:
        """RFC 3261 §22.2: re-send the INVITE once with Authorization; same Call-ID and
        From tag, CSeq + 1, a new branch."""
        name = "WWW-Authenticate" if resp.status == 401 else "Proxy-Authenticate"
        creds, inv = call.credentials, call.invite
        if creds is None or inv is None:
            return False
        for value in resp.get_all(name):
            try:
                ch = auth.parse_challenge_untrusted(value)
            except SipError:
                continue
            if not auth.usable(ch) or (creds.realm is not None and creds.realm != ch.realm):
                continue
            call.auth_tried = True
            header = "Authorization" if resp.status == 401 else "Proxy-Authorization"
            value_out = auth.authorization(ch, creds, "INVITE", str(inv.uri))
            call.local_seq += 1
            extra = tuple((k, v) for k, v in inv.headers
                          if k not in ("Via", "Max-Forwards", "From", "To", "Call-ID", "CSeq",
                                       "Contact", "Allow", "User-Agent", "Content-Type",
                                       "Content-Length", "Authorization",
                                       "Proxy-Authorization"))
            req = self._build_invite(call, inv.body, extra, ((header, value_out),))
            call.invite = req
            self._start_client(now, call, req)
            return True
        return False

    def _server_failed(self, now: float, txn: ServerTransaction) -> None:
        call = self._calls.get(txn.owner or "")
        if call is None:
            return
        if txn is call.invite_txn and call.state in (CallState.ANSWERED, CallState.ENDED):
            # §13.3.1.4: no ACK for our 2xx within 64·T1: confirm, then BYE
            if call.state is CallState.ANSWERED or call.bye_after_ack:
                call.bye_after_ack = False
                self._send_bye(now, call)
            self._end(call, "no ACK", "local")

    def _client_timed_out(self, now: float, txn: ClientTransaction) -> None:
        call = self._calls.get(txn.owner or "")
        if call is None:
            return
        if txn.purpose == "INVITE":
            if call.state in (CallState.OUTGOING, CallState.OUT_EARLY):
                call.move(CallState.ENDED)
                self._out.append(CallFailed(call.call_id, 408, "Request Timeout"))
            self._forget(call)
        elif txn.purpose == "REFER":
            self._out.append(ReferProgress(call.call_id, 408, "Request Timeout", True))
        elif txn.purpose == "BYE":
            self._forget(call)
