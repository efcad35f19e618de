"""The transceiver's ICE-lite agent: RFC 8445 §2.5 (lite implementations), §6.1.1 (a lite
agent is always controlled), §7.3 (responding to connectivity checks: §7.3.1.1 role
conflicts, §7.3.1.4 USE-CANDIDATE, §7.3.1.5 nomination), §9 (ICE restart) and RFC 7675
(consent freshness, from the side that receives the checks).

Sans-IO, with the verbs of docs/style.md rule 18: ``handle_input(now, data, addr)``,
``poll_output()`` until None (:class:`~.events.Transmit` datagrams first, then events),
``poll_timeout()``, ``handle_timeout(now)``; ``poll_transmit()`` / ``poll_event()`` are the
split spellings :class:`~appliance.transceiver.call.ServerCall` uses on its per-packet path
(no wrapper object per answer), ``handle_datagram`` the older name of ``handle_input``. ``addr``
is the client's address as the client's NAT presents it (the transceiver takes it from the
PROXY v2 header), and every answer is addressed to it.

What is answered, and why (a lite agent never *initiates* anything, so what it answers is
its whole attack surface):

==========================================  =================================================
input                                       action
==========================================  =================================================
any datagram from a source that is not      drop *before parsing*, ``rate_limited += 1``
trusted (see below) when the unverified-    (parsing costs ~18 µs and the HMAC ~11 µs in
source budget is spent                      CPython; a guessing storm must not buy either)
not STUN / malformed / no FINGERPRINT       drop, ``malformed += 1``
indication, response, other method          drop, ``ignored += 1`` (indications are
                                            keepalives, RFC 8445 §11; we send no requests)
no USERNAME, or ufrag that is not ours      drop, ``unknown_ufrag += 1``: answering would
                                            confirm which ufrags exist (an oracle) and
                                            reflect traffic at spoofed sources
our ufrag, bad/missing MESSAGE-INTEGRITY    401 without MESSAGE-INTEGRITY (RFC 8489 §9.1.3),
or wrong remote ufrag                       ``AuthFailure`` event, at most
                                            ``max_401_per_second`` answers (no
                                            amplification: a 48-byte answer to a request
                                            that is at least as large, and only to senders
                                            that know the session's ufrag)
authenticated, unknown comprehension-       420 + UNKNOWN-ATTRIBUTES, signed (§6.3.1)
required attributes
authenticated, ICE-CONTROLLED               487 Role Conflict, signed (§7.3.1.1; see below)
authenticated check                         success: XOR-MAPPED-ADDRESS = addr,
                                            MESSAGE-INTEGRITY, FINGERPRINT (§7.3.1.2)
==========================================  =================================================

Cost limit before parsing (password-guessing storms). Every datagram that reaches the agent
claims our ufrag (the transceiver routes by it), so anyone who sniffed the ufrag can make us
parse a check and compute its HMAC at line rate — enough to overflow the transceiver's socket
and starve every call it carries. So, before any parsing, the source address is classified:

* *trusted* — always processed: the selected (nominated) address; up to ``_VERIFIED_CAP``
  addresses that have passed MESSAGE-INTEGRITY (they proved the password; kept across an
  ICE restart, since it is still the same client); and, while nothing is nominated yet, the
  first ``trusted_sources`` distinct sources (a client's few candidates reach us at once).
* *same IP as a verified address* — a port-only NAT rebinding; these share their own token
  bucket (``unverified_checks_per_second``, burst of one second's worth);
* *anyone else* — share another bucket of the same size.

Over budget: drop silently and count ``rate_limited`` (no 401, no ``AuthFailure``).
Both buckets (and the 401 cap) are :mod:`appliance.proto.ratelimit`'s.

Trade-off (NAT rebinding vs. storms): without a storm both buckets are full, so a rebound or
new address is verified and can nominate at once, and from then on it is trusted. During a
storm from other IPs, a *port* rebinding still gets its own untouched bucket and nominates
as fast as without one. A client that changes IP (Wi-Fi to LTE) during a storm aimed at its
own session competes with the storm for the shared bucket: each of its checks gets through
with probability ≈ rate / storm rate, so it may fail and the call may end on consent expiry
— that session was under attack anyway, and the alternative (verify every guess) loses
media on *every* session of the transceiver. An attacker that spoofs a trusted address
costs us HMACs but learns nothing: the answers go to the real owner of that address.

Deliberately omitted: peer-reflexive candidates and the triggered-check queue (§7.3.1.3,
§7.3.1.4 — a lite agent has neither, §2.5); 400 answers to requests without USERNAME (the
relay answers bare discovery requests itself); the RFC 5245 "no role attribute" case is
treated as controlling; the ICE-lite agent never sends consent checks itself (RFC 7675 §4:
it relies on the full agent's checks, which we treat as proof of consent).

States (an Enum, transitions in a table):

    NEW --check--> CONNECTED --USE-CANDIDATE--> NOMINATED
     |                 |                            |
     +-----------------+-- consent expired/close ---+--> CLOSED
"""

from __future__ import annotations

import enum
import hmac
from collections import deque

from appliance.proto.errors import LocalProtocolError
from appliance.proto.ice.events import (
    AuthFailure,
    CheckReceived,
    ConsentExpired,
    IceEvent,
    IceOutput,
    Nominated,
    Transmit,
)
from appliance.proto.ratelimit import FixedWindow, TokenBucket
from appliance.proto.stun import (
    Addr,
    AttrType,
    Class,
    Message,
    Method,
    StunError,
    binding_error,
    binding_success,
    verify_fingerprint,
    verify_integrity,
)

__all__ = ["IceLiteAgent", "IceState"]


class IceState(enum.Enum):
    NEW = "new"  # no valid check yet
    CONNECTED = "connected"  # valid checks answered, nothing nominated yet
    NOMINATED = "nominated"  # a pair is selected (``IceLiteAgent.selected``)
    CLOSED = "closed"  # consent expired or closed by the owner; terminal


class _Input(enum.Enum):
    CHECK = "check"
    NOMINATE = "nominate"
    EXPIRE = "expire"
    CLOSE = "close"


_S, _I = IceState, _Input
# (state, input) -> next state. Missing entries cannot happen: CLOSED drops input earlier.
_TRANSITIONS: dict[tuple[IceState, _Input], IceState] = {
    (_S.NEW, _I.CHECK): _S.CONNECTED,
    (_S.NEW, _I.NOMINATE): _S.NOMINATED,
    (_S.NEW, _I.CLOSE): _S.CLOSED,
    # NEW has no consent timer (it starts with the first valid check), so no EXPIRE.
    (_S.CONNECTED, _I.CHECK): _S.CONNECTED,
    (_S.CONNECTED, _I.NOMINATE): _S.NOMINATED,
    (_S.CONNECTED, _I.EXPIRE): _S.CLOSED,
    (_S.CONNECTED, _I.CLOSE): _S.CLOSED,
    # A check without USE-CANDIDATE never un-nominates (§8.1.1: nomination is final until
    # the controlling agent nominates another pair or restarts ICE).
    (_S.NOMINATED, _I.CHECK): _S.NOMINATED,
    (_S.NOMINATED, _I.NOMINATE): _S.NOMINATED,
    (_S.NOMINATED, _I.EXPIRE): _S.CLOSED,
    (_S.NOMINATED, _I.CLOSE): _S.CLOSED,
    (_S.CLOSED, _I.CLOSE): _S.CLOSED,
}

#: How many distinct (address -> flag) pairs we remember for ``CheckReceived`` reporting.
_SEEN_CAP = 16
#: How many addresses that passed MESSAGE-INTEGRITY stay exempt from the cost limit.
_VERIFIED_CAP = 8


def _check_credentials(ufrag: str, pwd: str) -> None:
    # RFC 8445 §5.3 asks for >= 4 and >= 22 ICE characters; we only refuse what would break
    # the USERNAME split or the HMAC key, so tests may use short values.
    if not ufrag or ":" in ufrag or not pwd:
        raise LocalProtocolError("ICE ufrag must be non-empty without ':'; pwd non-empty")


class IceLiteAgent:
    """ICE-lite, controlled, one component (rtcp-mux), any number of client addresses.

    Counters (plain ints, read them any time): ``checks_ok``, ``nominations``,
    ``auth_failures``, ``unknown_ufrag``, ``malformed``, ``ignored``, ``role_conflicts``,
    ``unknown_attributes``, ``dropped_closed``, ``rate_limited``.

    ``unverified_checks_per_second`` and ``trusted_sources`` set the cost limit described
    in the module docstring.
    """

    def __init__(
        self,
        local_ufrag: str,
        local_pwd: str,
        remote_ufrag: str | None = None,
        remote_pwd: str | None = None,
        consent_timeout: float = 30.0,
        *,
        max_401_per_second: int = 10,
        unverified_checks_per_second: float = 20.0,
        trusted_sources: int = 4,
    ) -> None:
        _check_credentials(local_ufrag, local_pwd)
        if consent_timeout <= 0:
            raise LocalProtocolError("consent_timeout must be positive")
        if unverified_checks_per_second <= 0 or trusted_sources < 0:
            raise LocalProtocolError(
                "unverified_checks_per_second must be positive, trusted_sources >= 0"
            )
        self.trusted_sources = trusted_sources
        rate = unverified_checks_per_second
        burst = max(1.0, rate)
        # Checks from sources that are not trusted (module docstring): one bucket for the
        # IPs of verified addresses (port rebinding), one for everybody else.
        self._kin_bucket = TokenBucket(rate, burst)
        self._bucket = TokenBucket(rate, burst)
        # Addresses that passed MESSAGE-INTEGRITY, oldest first (an ordered set), their IPs,
        # and the first sources seen before any nomination.
        self._verified: dict[Addr, None] = {}
        self._verified_ips: frozenset[str] = frozenset()
        self._early: set[Addr] = set()
        self.consent_timeout = consent_timeout
        self._set_credentials(local_ufrag, local_pwd, remote_ufrag, remote_pwd)
        self.state = IceState.NEW
        #: The nominated client address (where media goes), or None.
        self.selected: Addr | None = None
        # Time of the last valid check that proves consent: from any address before
        # nomination, from the selected address after (RFC 7675 consent is per pair).
        self._consent_at: float | None = None
        # After a restart the next nomination is reported even if the address is unchanged.
        self._renominate = False
        # After a restart, until the first check with the new credentials: that check's
        # address takes media at once (handle_input).
        self._provisional = False
        self._seen: dict[Addr, bool] = {}
        self._transmits: deque[tuple[bytes, Addr]] = deque()
        self._events: deque[IceEvent] = deque()
        # 401 answers: a fixed one-second window is enough — it bounds what a sender that
        # guessed or sniffed the ufrag can make us emit, whatever its rate.
        self._401s = FixedWindow(max_401_per_second)
        self.checks_ok = 0
        self.nominations = 0
        self.auth_failures = 0
        self.unknown_ufrag = 0
        self.malformed = 0
        self.ignored = 0
        self.role_conflicts = 0
        self.unknown_attributes = 0
        self.dropped_closed = 0
        self.rate_limited = 0

    # -- credentials --

    def _set_credentials(
        self, local_ufrag: str, local_pwd: str, remote_ufrag: str | None, remote_pwd: str | None
    ) -> None:
        self.local_ufrag = local_ufrag
        self.remote_ufrag = remote_ufrag
        # A lite agent never sends checks, so the remote password is only kept for callers.
        self.remote_pwd = remote_pwd
        self._local_ufrag_b = local_ufrag.encode("utf-8")
        # RFC 8445 §7.2.2 / RFC 8489 §9.1.1: short-term key = the password, UTF-8.
        self._key = local_pwd.encode("utf-8")

    def set_remote_credentials(self, remote_ufrag: str, remote_pwd: str | None = None) -> None:
        """Learn the client's ufrag (and pwd) late, e.g. from a trickled SDP fragment."""
        self.remote_ufrag = remote_ufrag
        self.remote_pwd = remote_pwd

    def restart(
        self,
        local_ufrag: str,
        local_pwd: str,
        remote_ufrag: str | None = None,
        remote_pwd: str | None = None,
    ) -> None:
        """ICE restart (RFC 8445 §9): new credentials, same session. The selected pair and
        the consent timer survive — media keeps flowing on the old pair until the controlling
        agent nominates with the new credentials, which is then reported as ``Nominated``
        even if the address did not change. Checks with the old ufrag are dropped."""
        if self.state is IceState.CLOSED:
            raise LocalProtocolError("cannot restart a closed ICE agent")
        _check_credentials(local_ufrag, local_pwd)
        self._set_credentials(local_ufrag, local_pwd, remote_ufrag, remote_pwd)
        self._renominate = True
        # The first check with the new credentials may move media before the nomination.
        self._provisional = self.selected is not None
        self._seen.clear()

    def close(self) -> None:
        """End the agent without an event (the owner already knows)."""
        self._fire(_Input.CLOSE)

    # -- the verbs --

    def handle_input(self, now: float, data: bytes, addr: Addr) -> None:
        # Consent is judged before the packet: a check arriving after the deadline (because
        # the shell had not yet called handle_timeout) must not resurrect the session.
        self._expire(now)
        if self.state is IceState.CLOSED:
            self.dropped_closed += 1
            return
        if addr != self.selected and addr not in self._verified and not self._admit(now, addr):
            self.rate_limited += 1
            return
        try:
            msg = Message.parse_untrusted(data)
        except StunError:
            self.malformed += 1
            return
        if msg.method is not Method.BINDING or msg.msg_class is not Class.REQUEST:
            self.ignored += 1
            return
        # RFC 8445 §7 / §18: checks carry FINGERPRINT, which is what tells STUN apart from
        # the DTLS and RTP sharing this 5-tuple; without it the packet is not a check.
        if not verify_fingerprint(data):
            self.malformed += 1
            return
        username = msg.username
        local, sep, remote = (username or "").partition(":")
        # §7.3: USERNAME is "our-ufrag:their-ufrag". Compare in constant time anyway: the
        # ufrag gates the 401 path below.
        if not sep or not hmac.compare_digest(local.encode("utf-8"), self._local_ufrag_b):
            self.unknown_ufrag += 1
            return
        tid = msg.transaction_id
        reason = None
        if not msg.has(AttrType.MESSAGE_INTEGRITY):
            reason = "missing MESSAGE-INTEGRITY"
        elif not verify_integrity(data, self._key):
            reason = "bad MESSAGE-INTEGRITY"
        elif self.remote_ufrag is not None and remote != self.remote_ufrag:
            # RFC 8489 §9.1.3: a username not currently valid gets 401 as well.
            reason = "wrong remote ufrag"
        if reason is not None:
            self.auth_failures += 1
            self._events.append(AuthFailure(addr, reason))
            if self._401s.allow(now):
                # RFC 8489 §9.1.3: no MESSAGE-INTEGRITY on a 401 (we cannot know the key the
                # requester holds is ours).
                self._transmits.append((binding_error(tid, 401), addr))
            return
        # From here on the request is authenticated: answers are signed.
        self._trust(addr)
        if msg.unknown_required:
            self.unknown_attributes += 1
            self._transmits.append(
                (
                    binding_error(
                        tid,
                        420,
                        integrity_key=self._key,
                        unknown_attributes=msg.unknown_required,
                    ),
                    addr,
                )
            )
            return
        if msg.ice_controlled is not None:
            # §7.3.1.1: both sides think they are controlled. The rule compares tie-breakers
            # and lets the larger one switch to controlling; a lite agent can never be
            # controlling (§6.1.1), which is the same as always having the smaller value,
            # so the answer is always 487 and the full agent switches role and retries.
            self.role_conflicts += 1
            self._transmits.append((binding_error(tid, 487, integrity_key=self._key), addr))
            return
        # §7.3.1.2: a valid check. XOR-MAPPED-ADDRESS is the source as we saw it (the PROXY
        # header's client address), which lets the client learn its server-reflexive address.
        self.checks_ok += 1
        self._transmits.append((binding_success(tid, addr, integrity_key=self._key), addr))
        nominate = msg.use_candidate
        if self._seen.get(addr) is not nominate:
            if addr not in self._seen and len(self._seen) >= _SEEN_CAP:
                del self._seen[next(iter(self._seen))]
            self._seen[addr] = nominate
            self._events.append(CheckReceived(addr, nominate))
        if self.selected is None or addr == self.selected:
            # RFC 7675: a valid check on the selected pair (or on any pair before one is
            # selected) refreshes consent.
            self._consent_at = now
        if nominate and (addr != self.selected or self._renominate):
            # §7.3.1.5 / §8.1.1: USE-CANDIDATE on a succeeded pair nominates it. A different
            # address after nomination means the client's NAT rebound (or it moved network):
            # the newest nomination wins, as the controlling agent asked for it with valid
            # credentials. Consent restarts with this very check.
            self.selected = addr
            self._consent_at = now
            self._renominate = self._provisional = False
            self.nominations += 1
            self._events.append(Nominated(addr))
            self._fire(_Input.NOMINATE)
        elif self._provisional:
            # §9: after an ICE restart, the first check with the new credentials. A client
            # restarts because it lost its pair (a network change; a TURN/TCP or TLS
            # connection that ended with a relay worker: docs/turn.md), so media moves to
            # this address now — the client reached us from it with credentials only it
            # holds, and our answer goes back the same way — not at the nomination a ping
            # interval later (Chromium: ~60 ms). The nomination is still reported (and may
            # move media again). Nomination itself needs no more than these credentials.
            # Once per restart: later checks, from anywhere, cannot move it.
            self._provisional = False
            if addr != self.selected:
                self.selected = addr
                self._consent_at = now
                self._events.append(Nominated(addr))
            self._fire(_Input.CHECK)
        else:
            self._fire(_Input.CHECK)

    def handle_timeout(self, now: float) -> None:
        self._expire(now)

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
        """The consent deadline, or None (closed, or no valid check yet: the shell's own
        session-setup timeout covers a client that never shows up)."""
        if self.state is IceState.CLOSED or self._consent_at is None:
            return None
        return self._consent_at + self.consent_timeout

    # -- internals --

    def _fire(self, inp: _Input) -> None:
        self.state = _TRANSITIONS[(self.state, inp)]

    def _expire(self, now: float) -> None:
        deadline = self.poll_timeout()
        if deadline is not None and now >= deadline:
            # RFC 7675 §5.1: consent expires exactly consent_timeout after the last proof.
            self._fire(_Input.EXPIRE)
            self._consent_at = None
            self._events.append(ConsentExpired())

    def _admit(self, now: float, addr: Addr) -> bool:
        """May a datagram from an address that is neither selected nor verified be parsed?"""
        if self.selected is None:
            early = self._early
            if addr in early:
                return True
            if len(early) < self.trusted_sources:
                early.add(addr)
                return True
        bucket = self._kin_bucket if addr[0] in self._verified_ips else self._bucket
        return bucket.take(now)

    def _trust(self, addr: Addr) -> None:
        verified = self._verified
        if addr in verified:
            return
        if len(verified) >= _VERIFIED_CAP:
            # Forget the oldest verified address that is not carrying media.
            for old in verified:
                if old != self.selected:
                    del verified[old]
                    break
        verified[addr] = None
        self._verified_ips = frozenset(a[0] for a in verified)

    @property
    def max_401_per_second(self) -> int:
        """The cap on 401 answers per second (settable)."""
        return self._401s.limit

    @max_401_per_second.setter
    def max_401_per_second(self, limit: int) -> None:
        self._401s.limit = limit
