"""SIP transactions (RFC 3261 §17, with the RFC 6026 fixes), time passed in.

Four machines, each a small object the endpoint (``ua.py``) keeps in a table keyed by
:func:`server_key` / :func:`client_key`, with the house verbs (docs/style.md rule 18):
``handle_input(now, message)`` (the requests or responses that matched it),
``handle_timeout(now)``, ``poll_timeout()`` and ``poll_output()`` until None, which gives
:class:`Send` (bytes for the transaction's own ``addr``/``transport``: the endpoint wraps
them in ``Transmit``), :class:`Received` (a response for the endpoint), :class:`TimedOut`
(Timer B/F: a 408 for the endpoint) and :class:`NoAck` (Timer H, or L with no ACK). The
endpoint's operations are plain methods: ``send_response`` and ``ack_2xx`` on a server
transaction; a client transaction's request is its first output. Nothing here knows
about dialogs.

=================  ========================================================================
machine            states and timers (unreliable transport; on TCP/TLS the retransmission
                   timers never run and the "linger" timers are 0)
=================  ========================================================================
INVITE server      Proceeding -(1xx)-> Proceeding -(2xx)-> Accepted (RFC 6026 §7.1: 2xx
§17.2.1            retransmitted at T1, 2T1, … ≤ T2 until the dialog sees the ACK —
                   §13.3.1.4's UAS-core duty, kept here because it is per transaction —
                   Timer L = 64·T1 ends it) -(300-699)-> Completed (Timer G retransmits,
                   Timer H = 64·T1 gives up) -(ACK)-> Confirmed (Timer I = T4) -> Terminated.
                   A retransmitted INVITE re-sends the last response (absorbing it).
non-INVITE server  Trying -(1xx)-> Proceeding -(final)-> Completed (Timer J = 64·T1) ->
§17.2.2            Terminated; a retransmitted request re-sends the last response.
INVITE client      Calling (Timer A from T1 doubling, Timer B = 64·T1) -(1xx)-> Proceeding
§17.1.1            -(300-699)-> Completed (ACK sent here, §17.1.1.3; Timer D = 32 s) ;
                   -(2xx)-> Accepted (RFC 6026 §7.2, Timer M = 64·T1: 2xx retransmissions
                   go up so the UAC core re-sends its ACK).
non-INVITE client  Trying (Timer E from T1 doubling ≤ T2, Timer F = 64·T1) -(1xx)->
§17.1.2            Proceeding (E at T2) -(final)-> Completed (Timer K = T4) -> Terminated.
=================  ========================================================================

Matching (§17.2.3 / §17.1.3): a branch starting with the magic cookie ``z9hG4bK`` plus the
top Via's sent-by plus the method (ACK matches its INVITE; CANCEL is a transaction of its
own, §9.2, but finds the INVITE it cancels through the same branch). Without the cookie
(RFC 2543 peers) the fallback key is Call-ID, CSeq number, From tag, top Via and
Request-URI — enough for retransmission absorption, which is all the fallback is for.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from appliance.proto.sip.message import Request, Response

T1 = 0.5
T2 = 4.0
T4 = 5.0
MAGIC = "z9hG4bK"

Key = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Timers:
    """RFC 3261 §17.1.1.1's T1/T2/T4 (tests shrink them; trunks never need to)."""

    t1: float = T1
    t2: float = T2
    t4: float = T4


class State(enum.Enum):
    TRYING = "trying"
    CALLING = "calling"
    PROCEEDING = "proceeding"
    COMPLETED = "completed"
    CONFIRMED = "confirmed"
    ACCEPTED = "accepted"
    TERMINATED = "terminated"


def server_key(req: Request) -> Key:
    """§17.2.3: the key a request (or its retransmission, or the ACK of a non-2xx) maps to."""
    via = req.vias[0]
    method = "INVITE" if req.method == "ACK" else req.method
    branch = via.branch or ""
    if branch.startswith(MAGIC):
        return (branch, via.sent_by, method)
    # RFC 2543 fallback (§17.2.3, second half), simplified: To tag left out so the ACK
    # (whose To carries our tag) still finds the INVITE transaction.
    return ("2543", req.call_id, req.cseq.seq, req.from_.tag, str(via), str(req.uri), method)


def client_key(branch: str, method: str) -> Key:
    """§17.1.3: the top Via branch we generated plus the CSeq method."""
    return (branch, "INVITE" if method == "ACK" else method)


def response_client_key(resp: Response) -> Key | None:
    vias = resp.vias
    if not vias or not vias[0].branch:
        return None
    return client_key(vias[0].branch or "", resp.cseq.method)


@dataclass(frozen=True, slots=True)
class Send:
    """A message for the transaction's peer (its ``addr`` over its ``transport``)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Received:
    """A response the client transaction passes up to the endpoint."""

    response: Response


@dataclass(frozen=True, slots=True)
class TimedOut:
    """Timer B or F fired: the endpoint treats the request as answered 408 (§17.1.1.2)."""


@dataclass(frozen=True, slots=True)
class NoAck:
    """The server transaction's final response was never acknowledged (Timer H; Timer L
    ending an Accepted transaction whose 2xx got no ACK)."""


Output = Send | Received | TimedOut | NoAck


class _Timed:
    __slots__ = ("_out", "timers")

    def __init__(self) -> None:
        #: timer name -> absolute deadline
        self.timers: dict[str, float] = {}
        self._out: deque[Output] = deque()

    def poll_timeout(self) -> float | None:
        return min(self.timers.values()) if self.timers else None

    def poll_output(self) -> Output | None:
        """The next output in the order it was queued; None when drained."""
        return self._out.popleft() if self._out else None

    def _due(self, now: float) -> list[str]:
        due = sorted((t, name) for name, t in self.timers.items() if t <= now)
        for _, name in due:
            del self.timers[name]
        return [name for _, name in due]


class ServerTransaction(_Timed):
    """§17.2.1 (INVITE) or §17.2.2 (non-INVITE) server transaction."""

    __slots__ = ("acked", "addr", "interval", "invite", "last", "last_status", "owner",
                 "reliable", "request", "state", "transport", "tm")

    def __init__(self, request: Request, addr: tuple[str, int], transport: str,
                 timers: Timers = Timers()) -> None:
        super().__init__()
        self.request = request
        self.addr = addr
        self.transport = transport
        self.reliable = transport != "udp"
        self.invite = request.method == "INVITE"
        self.tm = timers
        self.state = State.PROCEEDING if self.invite else State.TRYING
        self.last: bytes | None = None
        self.last_status = 0
        self.interval = timers.t1
        #: the ACK of our 2xx reached the dialog (Accepted state stops retransmitting)
        self.acked = False
        #: the endpoint's call id this transaction belongs to, if any
        self.owner: str | None = None

    @property
    def done(self) -> bool:
        return self.state is State.TERMINATED

    def send_response(self, now: float, status: int, data: bytes) -> None:
        """A response from the TU. Responses after the final one are ignored (the caller
        checked its own state; this keeps the machine total)."""
        if self.state in (State.COMPLETED, State.CONFIRMED, State.ACCEPTED, State.TERMINATED):
            return
        self.last, self.last_status = data, status
        tm = self.tm
        if status < 200:
            self.state = State.PROCEEDING
        elif not self.invite:
            self.state = State.COMPLETED
            self.timers["J"] = now + (0.0 if self.reliable else 64 * tm.t1)
        elif status < 300:
            # RFC 6026 §8.5: Accepted; the 2xx is retransmitted end to end on every transport
            # (§13.3.1.4: a UDP hop may lie beyond a TCP one) until the ACK or Timer L.
            self.state = State.ACCEPTED
            self.interval = tm.t1
            self.timers["G2xx"] = now + tm.t1
            self.timers["L"] = now + 64 * tm.t1
        else:
            self.state = State.COMPLETED
            if not self.reliable:
                self.interval = tm.t1
                self.timers["G"] = now + tm.t1
            self.timers["H"] = now + 64 * tm.t1
        self._out.append(Send(data))

    def handle_input(self, now: float, data: Request) -> None:
        """A request that matched this transaction: a retransmission, or the ACK of a
        non-2xx final response. Never passed up to the TU."""
        if data.method == "ACK":
            if self.state is State.COMPLETED and self.invite:
                self.state = State.CONFIRMED
                self.timers.pop("G", None)
                self.timers.pop("H", None)
                self.timers["I"] = now + (0.0 if self.reliable else self.tm.t4)
            return
        if self.state is State.TRYING or self.last is None:
            return  # §17.2.2: retransmissions in Trying are discarded
        if self.state in (State.PROCEEDING, State.COMPLETED, State.ACCEPTED):
            self._out.append(Send(self.last))

    def ack_2xx(self) -> None:
        """The dialog matched the ACK of our 2xx: stop retransmitting (Timer L still
        absorbs late INVITE retransmissions, RFC 6026 §8.7)."""
        self.acked = True
        self.timers.pop("G2xx", None)

    def handle_timeout(self, now: float) -> None:
        """Retransmissions (Timer G), and :class:`NoAck` when Timer H fires or Timer L ends
        an Accepted transaction whose 2xx was never acknowledged."""
        for name in self._due(now):
            if name in ("G", "G2xx") and self.last is not None:
                self._out.append(Send(self.last))
                self.interval = min(2 * self.interval, self.tm.t2)
                self.timers[name] = now + self.interval
            elif name == "H":
                self.state = State.TERMINATED
                self.timers.clear()
                self._out.append(NoAck())
            elif name == "L":
                self.state = State.TERMINATED
                self.timers.clear()
                if not self.acked:
                    self._out.append(NoAck())
            elif name in ("I", "J"):
                self.state = State.TERMINATED
                self.timers.clear()


class ClientTransaction(_Timed):
    """§17.1.1 (INVITE) or §17.1.2 (non-INVITE) client transaction."""

    __slots__ = ("addr", "interval", "invite", "last_ack", "owner", "purpose", "reliable",
                 "request", "state", "tm", "transport", "wire")

    def __init__(self, request: Request, addr: tuple[str, int], transport: str, now: float,
                 timers: Timers = Timers()) -> None:
        super().__init__()
        self.request = request
        self.wire = bytes(request)
        self.addr = addr
        self.transport = transport
        self.reliable = transport != "udp"
        self.invite = request.method == "INVITE"
        self.tm = timers
        self.state = State.CALLING if self.invite else State.TRYING
        self.interval = timers.t1
        self.last_ack: bytes | None = None
        self.owner: str | None = None
        self.purpose = request.method
        if not self.reliable:
            self.timers["A" if self.invite else "E"] = now + timers.t1
        self.timers["B" if self.invite else "F"] = now + 64 * timers.t1
        self._out.append(Send(self.wire))  # the request itself is the first output

    @property
    def done(self) -> bool:
        return self.state is State.TERMINATED

    def handle_input(self, now: float, data: Response) -> None:
        """A response that matched this transaction: :class:`Received` when it goes up,
        nothing when it is absorbed; the ACK of a non-2xx final is sent here."""
        resp = data
        st, tm = self.state, self.tm
        if st is State.TERMINATED:
            return
        out = self._out
        if self.invite:
            if st in (State.CALLING, State.PROCEEDING):
                self.timers.pop("A", None)
                if resp.status < 200:
                    self.state = State.PROCEEDING
                    self.timers.pop("B", None)  # §17.1.1.2: Timer B only guards Calling
                elif resp.status < 300:
                    self.state = State.ACCEPTED
                    self.timers.clear()
                    self.timers["M"] = now + 64 * tm.t1
                else:
                    self.state = State.COMPLETED
                    self.timers.clear()
                    self.timers["D"] = now + (0.0 if self.reliable else 32.0)
                    self.last_ack = bytes(ack_for_non_2xx(self.request, resp))
                    out.append(Send(self.last_ack))
                out.append(Received(resp))
            elif st is State.COMPLETED and resp.status >= 300 and self.last_ack is not None:
                out.append(Send(self.last_ack))  # §17.1.1.2: retransmitted final: ACK again
            elif st is State.ACCEPTED and 200 <= resp.status < 300:
                out.append(Received(resp))  # the UAC core re-sends its ACK for each 2xx
            return
        if st in (State.TRYING, State.PROCEEDING):
            if resp.status < 200:
                self.state = State.PROCEEDING
            else:
                self.state = State.COMPLETED
                self.timers.clear()
                self.timers["K"] = now + (0.0 if self.reliable else tm.t4)
            out.append(Received(resp))

    def handle_timeout(self, now: float) -> None:
        """Retransmissions (Timers A and E), and :class:`TimedOut` when Timer B or F fires
        (§17.1.1.2: the TU treats it as a 408)."""
        for name in self._due(now):
            if name == "A":
                self._out.append(Send(self.wire))
                self.interval *= 2  # §17.1.1.2: Timer A doubles without a cap
                self.timers["A"] = now + self.interval
            elif name == "E":
                self._out.append(Send(self.wire))
                if self.state is State.PROCEEDING:
                    self.interval = self.tm.t2
                else:
                    self.interval = min(2 * self.interval, self.tm.t2)
                self.timers["E"] = now + self.interval
            elif name in ("B", "F"):
                self.state = State.TERMINATED
                self.timers.clear()
                self._out.append(TimedOut())
            elif name in ("D", "K", "M"):
                self.state = State.TERMINATED
                self.timers.clear()


def ack_for_non_2xx(invite: Request, resp: Response) -> Request:
    """§17.1.1.3: the ACK the INVITE client transaction itself sends for a 300-699."""
    keep = ("Call-ID", "From", "Route")
    headers: list[tuple[str, str]] = [("Via", invite.get_all("Via")[0])]
    headers += [(k, v) for k, v in invite.headers if k in keep]
    headers.append(("To", resp.get("To") or ""))
    headers.append(("CSeq", f"{invite.cseq.seq} ACK"))
    headers.append(("Max-Forwards", "70"))
    return Request("ACK", invite.uri, tuple(headers))

