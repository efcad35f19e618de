"""What every part of the SIP endpoint shares: its configuration, tables and counters, and
the dialog-level sending both halves use (responses through server transactions, requests
through client transactions, BYE and CANCEL, ending and forgetting a call). The UAS
(:mod:`.uas`) and UAC (:mod:`.uac`) halves build on it; :class:`~.ua.SipEndpoint` joins them
behind the house verbs."""

from __future__ import annotations

import secrets
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from appliance.proto.ratelimit import TokenBuckets
from appliance.proto.sip.dialog import CallState, Dialog
from appliance.proto.sip.errors import SipUsageError
from appliance.proto.sip.events import (
    Addr,
    CallEnded,
    Output,
    Transmit,
)
from appliance.proto.sip.message import (
    RawMessage,
    Request,
    Response,
)
from appliance.proto.sip.policy import Decision, loopback_only
from appliance.proto.sip.transaction import (
    MAGIC,
    ClientTransaction,
    Key,
    NoAck,
    Received,
    Send,
    ServerTransaction,
    State,
    TimedOut,
    Timers,
    client_key,
)

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, NOTIFY, REFER"
ACCEPT = "application/sdp, application/dtmf-relay, message/sipfrag"
REASONS = {
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


class EndpointBase:
    """The state and shared sending of :class:`~.ua.SipEndpoint` (module docstring)."""

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

    def sip_call_id(self, call_id: str) -> str | None:
        """The SIP ``Call-ID`` header value of a call this endpoint still holds (for an
        outbound call, the one :meth:`invite` generated); None once it is forgotten."""
        call = self._calls.get(call_id)
        return None if call is None else call.sip_call_id

    def _call(self, call_id: str, *states: CallState) -> Dialog:
        call = self._calls.get(call_id)
        if call is None or call.state not in states:
            raise SipUsageError(f"call is not in state {' / '.join(s.value for s in states)}")
        return call

    def _drain(self, now: float, txn: ServerTransaction | ClientTransaction) -> None:
        """Everything a transaction has to say, in order: its messages go out to its peer,
        what it passes up is acted on here (the one place the endpoint reads a
        transaction's outputs)."""
        while (o := txn.poll_output()) is not None:
            if isinstance(o, Send):
                self._out.append(Transmit(o.data, txn.addr, txn.transport))
            elif isinstance(txn, ClientTransaction):
                if isinstance(o, Received):
                    self._on_client_response(now, txn, o.response)
                elif isinstance(o, TimedOut):
                    self._client_timed_out(now, txn)
            elif isinstance(o, NoAck) and txn.owner is not None:
                self._server_failed(now, txn)

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
        return Response(status, reason or REASONS.get(status, "Unknown"), tuple(headers), body)

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
        txn.send_response(now, status, bytes(resp))
        self._drain(now, txn)

    def _send_minimal(self, req: Request, status: int, reason: str, limit: int, addr: Addr,
                      transport: str) -> None:
        """Issue 28 item 6: to an unverified UDP source nothing larger than its request."""
        data = bytes(self._response(req, status, reason, tag=secrets.token_hex(4), minimal=True))
        if transport == "udp" and len(data) > limit:
            self.counters["too-large-to-answer"] += 1
            return
        self._out.append(Transmit(data, addr, transport))

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

    def _start_client(self, now: float, call: Dialog, req: Request) -> None:
        if len(self._client) >= self.config.max_transactions:
            raise SipUsageError("client transaction table full")
        txn = ClientTransaction(req, call.addr, call.transport, now, self.config.timers)
        txn.owner = call.call_id
        self._client[client_key(req.branch or "", req.method)] = txn
        self._drain(now, txn)  # the request itself

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

    def _inviting(self, call_id: str) -> bool:
        """Whether our INVITE for this call still waits for its final response."""
        return any(c.owner == call_id and c.invite and c.state in (State.CALLING, State.PROCEEDING)
                   for c in self._client.values())

    def _active_invites(self) -> int:
        return sum(1 for t in self._server.values() if t.invite and t.state is State.PROCEEDING)

    # -- what the UAS and UAC halves provide (ua.py's SipEndpoint has both) ------------------

    def _on_client_response(self, now: float, txn: ClientTransaction, up: Response) -> None:
        raise NotImplementedError

    def _client_timed_out(self, now: float, txn: ClientTransaction) -> None:
        raise NotImplementedError

    def _server_failed(self, now: float, txn: ServerTransaction) -> None:
        raise NotImplementedError
