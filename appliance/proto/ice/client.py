"""A minimal controlling ICE agent for one candidate pair, used by our load generator and
tests against ``IceLiteAgent``: RFC 8445 §7.2 (sending checks, aggressive nomination with
USE-CANDIDATE in every check until nominated), §7.2.5 (processing responses), §14.3
(retransmission: RTO 500 ms for a single pair), RFC 8489 §6.2.1 (Rc = 7 sends, the last one
waited for Rm = 16 RTO) and RFC 7675 §5.1 (consent checks every 5 s randomised to 0.8-1.2x,
consent lost 30 s after the last authenticated response).

Sans-IO with the verbs of docs/style.md rule 18 (``handle_input(now, data, addr)``,
``poll_output()`` until None, ``poll_timeout()``, ``handle_timeout(now)``; ``poll_transmit``
/ ``poll_event`` split the output stream for ``ClientPeer``); ``start(now)`` sends the first
check. Randomness
(transaction ids, tie-breaker, consent jitter) comes from the ``rng`` passed in, so a seeded
``random.Random`` makes a run reproducible.

Deliberately omitted: candidate gathering, pair formation and priorities (one pair, given),
answering incoming checks (the peer is lite and never sends any), the controlled role (a 487
is reported as ``CheckFailed``), regular nomination (§8.1.1 is legal either way against a
lite agent) and peer-reflexive candidates.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from dataclasses import dataclass

from appliance.proto.errors import LocalProtocolError
from appliance.proto.ice.events import (
    CheckFailed,
    CheckSucceeded,
    ConnectFailed,
    ConsentExpired,
    IceEvent,
    IceOutput,
    Nominated,
    Transmit,
)
from appliance.proto.stun import (
    Addr,
    Class,
    Message,
    Method,
    StunError,
    binding_request,
    verify_fingerprint,
    verify_integrity,
)

__all__ = ["ClientState", "IceClient"]

#: RFC 8445 §5.1.2.1 priority of a host candidate: type pref 126, local pref 65535, comp 1.
HOST_PRIORITY = (126 << 24) | (65535 << 8) | (256 - 1)


class ClientState(enum.Enum):
    NEW = "new"  # start() not called
    CHECKING = "checking"  # nominating check in flight
    NOMINATED = "nominated"  # pair nominated; consent checks running
    FAILED = "failed"  # nominating check never answered or rejected; terminal
    CLOSED = "closed"  # consent expired or closed by the owner; terminal


@dataclass(slots=True)
class _Transaction:
    tid: bytes
    data: bytes
    use_candidate: bool
    first_sent: float
    sends: int
    next_send: float | None  # None once all Rc transmissions are out
    interval: float
    give_up_at: float | None = None


class IceClient:
    """Controlling side of one pair. Counters: ``checks_sent``, ``retransmits``,
    ``responses_ok``, ``responses_rejected`` (bad integrity/fingerprint or wrong source),
    ``stray`` (unknown transaction or not a response), ``malformed``."""

    def __init__(
        self,
        local_ufrag: str,
        local_pwd: str,
        remote_ufrag: str,
        remote_pwd: str,
        remote_addr: Addr,
        *,
        rng: random.Random | None = None,
        tie_breaker: int | None = None,
        priority: int = HOST_PRIORITY,
        rto: float = 0.5,
        max_sends: int = 7,
        last_wait: float = 16.0,
        consent_interval: float = 5.0,
        consent_timeout: float = 30.0,
    ) -> None:
        if ":" in local_ufrag or ":" in remote_ufrag:
            raise LocalProtocolError("ICE ufrags cannot contain ':'")
        if max_sends < 1 or rto <= 0:
            raise LocalProtocolError("need max_sends >= 1 and rto > 0")
        self._rng = rng if rng is not None else random.SystemRandom()
        self.local_ufrag = local_ufrag
        self.remote_ufrag = remote_ufrag
        self.remote_addr = remote_addr
        # §7.2.2: requests are signed with the *remote* password; so are its responses.
        self._local_pwd = local_pwd
        self._remote_pwd = remote_pwd
        self._key = remote_pwd.encode("utf-8")
        self.tie_breaker = tie_breaker if tie_breaker is not None else self._rng.getrandbits(64)
        self.priority = priority
        self.rto = rto
        self.max_sends = max_sends
        self.last_wait = last_wait
        self.consent_interval = consent_interval
        self.consent_timeout = consent_timeout
        self.state = ClientState.NEW
        #: Our address as the lite agent saw it (XOR-MAPPED-ADDRESS), once known.
        self.mapped: Addr | None = None
        self._txn: _Transaction | None = None
        # Superseded transactions whose late responses still prove consent (RFC 7675 §5.1
        # only needs *a* response to a recent check).
        self._old: deque[_Transaction] = deque(maxlen=8)
        self._next_consent: float | None = None
        self._last_success: float | None = None
        self._transmits: deque[tuple[bytes, Addr]] = deque()
        self._events: deque[IceEvent] = deque()
        self.checks_sent = 0
        self.retransmits = 0
        self.responses_ok = 0
        self.responses_rejected = 0
        self.stray = 0
        self.malformed = 0

    # -- verbs --

    def start(self, now: float) -> None:
        if self.state is not ClientState.NEW:
            raise LocalProtocolError("IceClient already started")
        self.state = ClientState.CHECKING
        self._begin(now, use_candidate=True)

    def close(self) -> None:
        if self.state in (ClientState.NEW, ClientState.CHECKING, ClientState.NOMINATED):
            self.state = ClientState.CLOSED
        self._txn = None

    def restart(
        self, local_ufrag: str, local_pwd: str, remote_ufrag: str, remote_pwd: str, now: float
    ) -> None:
        """ICE restart (RFC 8445 §9): new credentials, nominate again on the same pair."""
        if self.state in (ClientState.NEW, ClientState.FAILED, ClientState.CLOSED):
            raise LocalProtocolError("restart needs a running client")
        self.local_ufrag, self._local_pwd = local_ufrag, local_pwd
        self.remote_ufrag, self._remote_pwd = remote_ufrag, remote_pwd
        self._key = remote_pwd.encode("utf-8")
        self._old.clear()  # responses to old-credential checks no longer verify anyway
        self.state = ClientState.CHECKING
        self._next_consent = None
        self._begin(now, use_candidate=True)

    def handle_input(self, now: float, data: bytes, addr: Addr) -> None:
        if self.state in (ClientState.NEW, ClientState.FAILED, ClientState.CLOSED):
            self.stray += 1
            return
        try:
            msg = Message.parse_untrusted(data)
        except StunError:
            self.malformed += 1
            return
        if msg.method is not Method.BINDING or msg.msg_class not in (Class.SUCCESS, Class.ERROR):
            self.stray += 1
            return
        txn = self._find(msg.transaction_id)
        if txn is None:
            self.stray += 1
            return
        # §7.2.5.2.1: the response must come from where the request went (symmetric), and
        # RFC 8489 §9.1.4: an unauthenticated response is discarded as if never received —
        # so a spoofed 401 cannot cut a transaction short.
        if (
            addr != self.remote_addr
            or not verify_fingerprint(data)
            or not verify_integrity(data, self._key)
        ):
            self.responses_rejected += 1
            return
        self._retire(txn)
        if msg.msg_class is Class.ERROR:
            code, reason = msg.error_code or (0, "")
            self._events.append(CheckFailed(addr, code, reason))
            if txn.use_candidate and self.state is ClientState.CHECKING:
                self.state = ClientState.FAILED
            return
        self.responses_ok += 1
        self.mapped = msg.xor_mapped_address
        self._last_success = now
        self._events.append(CheckSucceeded(addr, self.mapped, now - txn.first_sent))
        if txn.use_candidate and self.state is ClientState.CHECKING:
            # §8.1.1 (aggressive form): the check carried USE-CANDIDATE and succeeded, so
            # the pair is nominated on both sides.
            self.state = ClientState.NOMINATED
            self._events.append(Nominated(addr))
            self._next_consent = now + self._consent_delay()

    def handle_timeout(self, now: float) -> None:
        if self.state not in (ClientState.CHECKING, ClientState.NOMINATED):
            return
        if (
            self.state is ClientState.NOMINATED
            and self._last_success is not None
            and now >= self._last_success + self.consent_timeout
        ):
            # RFC 7675 §5.1: 30 s without an authenticated answer: stop sending.
            self.state = ClientState.CLOSED
            self._txn = None
            self._events.append(ConsentExpired())
            return
        txn = self._txn
        if txn is not None:
            if txn.next_send is not None and now >= txn.next_send:
                self._send(now, txn)
                self.retransmits += 1
            elif txn.give_up_at is not None and now >= txn.give_up_at:
                self._txn = None
                if txn.use_candidate and self.state is ClientState.CHECKING:
                    self.state = ClientState.FAILED
                    self._events.append(ConnectFailed())
                    return
        if (
            self.state is ClientState.NOMINATED
            and self._next_consent is not None
            and now >= self._next_consent
        ):
            # A consent check: a fresh transaction (new tid, RFC 7675 §5.1) replacing any
            # still-unanswered one, without USE-CANDIDATE (the pair is already nominated).
            self._begin(now, use_candidate=False)
            self._next_consent = now + self._consent_delay()

    def poll_output(self) -> IceOutput | None:
        """The next datagram to send (a :class:`~.events.Transmit`), else the next event;
        None when there is neither (drain until None after every ``handle_*``)."""
        if self._transmits:
            data, addr = self._transmits.popleft()
            return Transmit(data, addr)
        return self._events.popleft() if self._events else None

    def poll_transmit(self) -> tuple[bytes, Addr] | None:
        """Only the next datagram, as a plain tuple (the call's per-packet path keeps
        datagrams and events apart and allocates no wrapper)."""
        return self._transmits.popleft() if self._transmits else None

    def poll_event(self) -> IceEvent | None:
        """Only the next event (callers that keep datagrams and events apart)."""
        return self._events.popleft() if self._events else None

    handle_datagram = handle_input  # the older name, kept for existing callers

    def poll_timeout(self) -> float | None:
        if self.state not in (ClientState.CHECKING, ClientState.NOMINATED):
            return None
        times: list[float] = []
        txn = self._txn
        if txn is not None:
            if txn.next_send is not None:
                times.append(txn.next_send)
            elif txn.give_up_at is not None:
                times.append(txn.give_up_at)
        if self.state is ClientState.NOMINATED:
            if self._next_consent is not None:
                times.append(self._next_consent)
            if self._last_success is not None:
                times.append(self._last_success + self.consent_timeout)
        return min(times) if times else None

    # -- internals --

    def _consent_delay(self) -> float:
        # RFC 7675 §5.1: uniformly in [0.8, 1.2] x the interval, so many sessions started
        # together do not send in lockstep.
        return self.consent_interval * self._rng.uniform(0.8, 1.2)

    def _begin(self, now: float, *, use_candidate: bool) -> None:
        if self._txn is not None:
            self._old.append(self._txn)
        tid = self._rng.randbytes(12)
        data = binding_request(
            tid,
            username=f"{self.remote_ufrag}:{self.local_ufrag}",
            password=self._remote_pwd,
            priority=self.priority,
            controlling=self.tie_breaker,
            use_candidate=use_candidate,
        )
        self._txn = _Transaction(tid, data, use_candidate, now, 0, now, self.rto)
        self._send(now, self._txn)

    def _send(self, now: float, txn: _Transaction) -> None:
        # RFC 8489 §6.2.1: retransmit the identical request at RTO, 2 RTO, 4 RTO... after
        # the previous send; after the Rc-th send wait Rm x RTO for an answer.
        self._transmits.append((txn.data, self.remote_addr))
        self.checks_sent += 1
        txn.sends += 1
        if txn.sends < self.max_sends:
            txn.next_send = now + txn.interval
            txn.interval *= 2
        else:
            txn.next_send = None
            txn.give_up_at = now + self.last_wait * self.rto

    def _find(self, tid: bytes) -> _Transaction | None:
        if self._txn is not None and self._txn.tid == tid:
            return self._txn
        for old in self._old:
            if old.tid == tid:
                return old
        return None

    def _retire(self, txn: _Transaction) -> None:
        if txn is self._txn:
            self._txn = None
        else:
            self._old.remove(txn)
