"""The transceiver's trio shell: one shared UDP socket, the call table, the control server.

Datagram path (DESIGN.md "Relay ↔ transceiver datagram format", "Transceiver behaviour")::

    relay ──PROXY v2(src=client, dst=public) + client datagram──► our socket
       parse header (drop+count if bad) → is the first byte STUN's (RFC 7983)?
       STUN  → session by server ufrag (USERNAME before ':'), else by client address
       else  → session by client address (learnt from authenticated checks)
       → Session.handle_input(now, datagram, (client, public, relay)): one method; the
         call does the rest (kinds, ICE, DTLS and its admission, SRTP, SCTP; call.py)
    session replies: PROXY(src=client, dst=public) + payload → the internal address that
    the flow's last packet came from

Hot path: one task waits for readability, then drains the socket with non-blocking
``recvfrom_into`` into one preallocated buffer, up to ``BATCH`` datagrams per wake-up, and
hands each to its session synchronously (no per-packet task switch or channel). What the
sessions send meanwhile (the echo, STUN answers, DTLS flights) is queued and goes out in one
``sendmmsg`` when the drain ends, or ``FLUSH_AFTER`` into a long one (the relay's optional
C extension, ``appliance.netio._mmsg``; per-datagram ``sendto`` without it). Measured
(docs/performance.md, "Transceiver", sixth pass): 4-7 % less CPU per echoed packet at 60
PCM sessions, and the relay is woken once per batch instead of once per datagram. Sends
from other tasks (pacer, agents, timers) go out at once. Sends never block: a full socket buffer drops the datagram and counts it (UDP
semantics, never a stalled loop). The clock is read once per batch.

One table holds every call, WebRTC or phone (:attr:`Transceiver.calls`: each a
:class:`~.shell.CallShell`, so each gets the same timers, pacing, agent, ``stats``,
recording and teardown); the indexes that route datagrams to a call differ by leg
(``by_ufrag``/``by_client`` for ICE, ``phone_by_*`` for RTP from a trunk). Calls run in
a nursery of their own; a call whose handler raises is ended (``internal-error``) and the
others carry on. The control channel (docs/control-protocol.md) creates, patches, deletes
and reports calls: :meth:`Transceiver.handle_control` dispatches each ``op`` here, and the
operations are ops.py's (:class:`~.ops.ControlOps`, a mixin of :class:`Transceiver`); what
a WebRTC ``create`` answers in SDP is negotiate.py's (``accept_offer``), and whether there
is room for one more call is load.py's (:class:`~.load.TransceiverLoad`). This module keeps what the datagram
path touches: the socket, the dispatcher and the tables it routes by.

Drain (issue 10, rolling upgrades): ``{"op": "drain"}`` (or :meth:`Transceiver.drain`)
refuses new sessions (``503 draining``) and sets :attr:`Transceiver.drained` once no session
is left. With ``exit_when_drained`` :func:`serve_transceiver` then returns (the CLI exits 0);
without it the transceiver keeps serving the control channel, refusing sessions.
"""

from __future__ import annotations

import logging
import math
import secrets
import socket
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from time import perf_counter, thread_time
from typing import Any

import trio

from appliance.control import serve_control
from appliance.netio.sockets import udp_socket
from appliance.proto.proxy import STREAM, ProxyError, StreamAddr, parse_transport_untrusted
from appliance.proto.proxy.vouch import is_local
from appliance.proto.ratelimit import GcraTable
from appliance.proto.stun import StunError, peek_username_untrusted
from appliance.proto.ufrag import UfragCodec
from appliance.realtime import sideband

from .admission import DtlsSetup
from .call import Addr, Source
from .load import TransceiverLoad
from .ops import Call, ControlOps, error
from .pacer import Pacer
from .phone_session import LEG_COUNTERS, PhoneSession
from .recording import CallRecording
from .session import EndedSession, Session, _fmt
from .settings import TransceiverConfig
from .vouch import VouchResponder

try:  # optional C extension (setup.py): sendmmsg batching, Linux only
    from appliance.netio import _mmsg
except ImportError:  # pragma: no cover - not built (no compiler/headers) or not Linux
    _mmsg = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

BATCH = 256
#: Datagrams per ``recvmmsg`` (``_mmsg.recv_batch``), each in a slot of ``BUFSIZE``.
RECV_MSGS = 8
#: PROXY headers whose parse is kept (dispatch): one per flow a relay forwards.
PROXY_CACHE = 4096
#: Sends queued during a receive batch wait at most this long (plus the datagram being
#: handled) before they go out, however long the batch.
FLUSH_AFTER = 0.0005
#: A receive batch yields to the session tasks (the pacer above all) after this long, however
#: many datagrams are left: a bulk data-channel transfer keeps the socket full, and a
#: 256-datagram batch of SCTP (~40 µs each) held every call's audio back by 10-20 ms, enough
#: for the echo's 60 ms bound to drop frames (bench/datachannel.py, audio beside a transfer).
YIELD_AFTER = 0.002
BUFSIZE = 65536 + 256
SOCKET_BUFFER = 4 << 20
RECENTLY_ENDED = 256  # ended sessions kept for list/get (end_reason, final stats)
CALL_EVENTS = 4096  # call events kept for signaling's ``events`` long-poll
# Early drop (issue 9, ICE password-guessing storm): STUN from a client address that is no
# session's known flow passes a per-address budget (GCRA: 10/s, burst 20) *before* its
# USERNAME is decoded; known flows always pass. A browser's checks from a new address stay
# well inside it (a few per pair, then the address is a known flow). The table is bounded:
# a new address at the cap clears it, which only ever makes the budget more lenient
# (appliance.proto.ratelimit.GcraTable).
STUN_SOURCE_RATE = 10.0  # per second
STUN_SOURCE_BURST = 20.0
STUN_SOURCES = 16384


COUNTER_NAMES = (
    "datagrams_in", "bytes_in", "datagrams_out", "bytes_out",
    "drop_proxy", "drop_unknown_ufrag", "drop_unknown_flow", "drop_stun_malformed",
    "drop_stun_rate", "drop_kind", "drop_srtp", "drop_rtp_before_dtls",
    "drop_rtp_payload_type", "drop_send",
    "dtls_client_hellos", "dtls_hello_verify", "dtls_handshakes_started",
    "session_errors", "sessions_created", "sessions_ended", "flows_forgotten",
    "sessions_refused_overloaded", "complexity_changes",
    "recordings_started", "recordings_stopped",
    "phones_created", "phones_ended", "drop_phone_no_relay", "drop_phone_pending",
    # the phone legs' own counts (phone_session.py folds them in), from the start, so
    # /metrics shows them at 0 before the first phone call rather than not at all
    *(f"phone_{name}" for name in LEG_COUNTERS), "phone_dtmf_in",
)


@dataclass(frozen=True, slots=True)
class TransceiverAddresses:
    """What :func:`serve_transceiver` reports when ready."""

    udp: Addr
    control: str | None
    transceiver: Transceiver | None = None  # for the CLI's drain-on-SIGTERM


def _pending(sock: socket.socket) -> bool:
    """Is a datagram waiting in ``sock`` (non-blocking)? Asked only when a receive batch
    stopped at its bound without finding the socket empty (TransceiverLoad.behind_since)."""
    try:
        sock.recv(1, socket.MSG_PEEK)
    except OSError:  # BlockingIOError: nothing waits (or an error report, read by this)
        return False
    return True


class Transceiver(ControlOps):
    """The socket, the datagram dispatcher, the one call table and its indexes, and the
    control dispatch (the operations are :class:`~.ops.ControlOps`'s)."""

    def __init__(self, config: TransceiverConfig, sock: socket.socket) -> None:
        self.config = config
        self.sock = sock
        self.codec = UfragCodec(config.secrets)
        self.counters: dict[str, int] = dict.fromkeys(COUNTER_NAMES, 0)
        #: every live call, WebRTC (:class:`Session`) or phone (:class:`PhoneSession`): the
        #: one table admission, load, drain and recordings count
        self.calls: dict[str, Call] = {}
        self._warmed: set[str] = set()  # agent specs resolved once off the loop (warm)
        self.by_ufrag: dict[str, Session] = {}
        self.by_client: dict[Addr, Session] = {}
        #: a session's ICE-TCP passive candidates (control "tcp_candidates"), for restarts
        self.tcp_candidates: dict[str, list[tuple[str, int]]] = {}
        #: STUN budgets of client addresses that are no session's known flow
        self.stun_budget: GcraTable[Addr] = GcraTable(
            STUN_SOURCE_RATE, STUN_SOURCE_BURST, STUN_SOURCES)
        self.ended: deque[EndedSession] = deque(maxlen=RECENTLY_ENDED)  # describe() only
        self.draining = False
        self.drained = trio.Event()  # set once draining with no session left
        self._nursery: trio.Nursery | None = None
        self.pacer = Pacer()  # one pacing task for every session (pacer.py)
        # DTLS: the certificate, and admission under load (issue 9; admission.py explains
        # why and when), which each call consults for the ClientHellos it gets.
        self.dtls_setup = DtlsSetup(wall=time.time(), versions=config.dtls_versions,
                                    false_start=config.dtls_false_start)
        self.admission = self.dtls_setup.admission
        # While the receive loop drains a batch: what the sessions send, as send_batch items
        # (header, offset, length, address) with the datagram as the header. None: send now.
        self._queued: list[tuple[bytes, int, int, Addr]] | None = None
        #: PROXY header bytes -> (client, public, payload offset) (dispatch)
        self._proxy_cache: dict[bytes, tuple[Addr, Addr, int]] = {}
        self._send_batch = _mmsg.send_batch if (_mmsg is not None and config.batch_sends) else None
        #: headroom, call costs, complexity and the refusal under load (load.py)
        self.load = TransceiverLoad(
            self.calls, self.counters, self.pacer, agent=config.agent,
            headroom=config.headroom, opus_complexity=config.opus_complexity,
            adaptive_complexity=config.adaptive_complexity, refuse_busy=config.refuse_busy)
        #: the live calls' recordings (recording.py), told when their call ends
        self.recordings: dict[str, CallRecording] = {}
        #: relay workers' "is this client yours?" (vouch.py; relay failover, issue 20)
        # Phone calls (phone_session.py, docs/sip.md "Media"): their own tables, asked only
        # when by_client misses, so a WebRTC packet pays nothing for them.
        self.phone_by_client: dict[Addr, PhoneSession] = {}
        self.phone_by_remote: dict[Addr, PhoneSession] = {}  # the signalled RTP address
        self.phone_by_ip: dict[str, dict[str, PhoneSession]] = {}  # the SIP source's IP
        self.ended_phones: deque[dict[str, Any]] = deque(maxlen=RECENTLY_ENDED)
        #: what signaling's ``events`` long-poll reads, for every call: (seq, event), bounded
        self.call_events: deque[tuple[int, dict[str, Any]]] = deque(maxlen=CALL_EVENTS)
        self.event_seq = 0
        self.epoch = secrets.token_hex(8)  # a restarted transceiver: a new epoch
        self._events_wake = trio.Event()
        self.vouch = VouchResponder(config.id, config.secrets, self.by_client, self.send,
                                    self.counters, other=self._phone_vouch)

    # -- UDP ---------------------------------------------------------------------------

    def send(self, data: bytes, addr: Addr) -> None:
        queued = self._queued
        if queued is not None:
            # send_batch takes bytes headers only; sessions always pass bytes.
            queued.append((data if type(data) is bytes else bytes(data), 0, 0, addr))
            return
        try:
            self.sock.sendto(data, addr)
        except OSError:  # BlockingIOError (buffer full) included: UDP may drop
            self.counters["drop_send"] += 1
            return
        self.counters["datagrams_out"] += 1
        self.counters["bytes_out"] += len(data)

    def _flush(self) -> None:
        """Send what was queued during a receive batch: one ``sendmmsg`` per 256 datagrams
        (per-datagram failures — a full buffer — are dropped and counted, as in :meth:`send`)."""
        queued, self._queued = self._queued, None
        if not queued:
            return
        counters = self.counters
        if self._send_batch is not None:
            sent, nbytes, failed = self._send_batch(self.sock.fileno(), b"", queued)
            counters["datagrams_out"] += sent
            counters["bytes_out"] += nbytes
            counters["drop_send"] += failed
            return
        for data, _, _, addr in queued:
            self.send(data, addr)

    async def receive_loop(self) -> None:
        if _mmsg is not None and self.config.batch_recv:
            await self._receive_loop_mmsg()
            return
        sock = self.sock
        buf = bytearray(BUFSIZE)
        view = memoryview(buf)
        counters = self.counters
        dispatch = self.dispatch
        batching = self._send_batch is not None
        load = self.load
        while True:
            await trio.lowlevel.wait_readable(sock)
            now = trio.current_time()
            if load.behind_since is None:  # (see TransceiverLoad.behind_since)
                load.behind_since = now
            n_in = bytes_in = 0
            if batching:
                self._queued = []
                flush_at = perf_counter() + FLUSH_AFTER
            full = True  # unless the socket runs dry first
            yield_at = perf_counter() + YIELD_AFTER
            try:
                for _ in range(BATCH):
                    try:
                        n, relay = sock.recvfrom_into(buf)
                    except BlockingIOError:
                        full = False
                        load.behind_since = None
                        break
                    except OSError:
                        continue  # e.g. ICMP port unreachable reported on a later recv
                    n_in += 1
                    bytes_in += n
                    dispatch(now, view[:n], (relay[0], relay[1]))
                    t = perf_counter()
                    if t > yield_at:
                        break  # (full stays True: the checkpoint below lets others run)
                    if batching and t > flush_at:
                        # A long batch (a backlog of PCM sessions, each ~0.2 ms of codec
                        # work): what is queued goes out now, not after the whole batch.
                        self._flush()
                        self._queued = []
                        flush_at = t + FLUSH_AFTER
            finally:
                if batching:
                    self._flush()
                counters["datagrams_in"] += n_in
                counters["bytes_in"] += bytes_in
            if full:
                if load.behind_since is not None and not _pending(sock):
                    load.behind_since = None  # the batch ended as the socket ran dry
                # A full batch: let the session tasks (pacers, agents) run before more.
                await trio.lowlevel.checkpoint()

    async def _receive_loop_mmsg(self) -> None:
        """:meth:`receive_loop` with one ``recvmmsg`` per :data:`RECV_MSGS` datagrams
        (``_mmsg.recv_batch``) instead of a ``recvfrom_into`` each. The batch, yield and
        flush bounds are per datagram, as there: datagrams already read when the loop
        yields stay in the buffer and are handled first after the checkpoint."""
        sock = self.sock
        buf = bytearray(BUFSIZE * RECV_MSGS)
        view = memoryview(buf)
        counters = self.counters
        dispatch = self.dispatch
        recv = partial(_mmsg.recv_batch, sock.fileno(), buf, BUFSIZE, 0, BUFSIZE, RECV_MSGS)
        batching = self._send_batch is not None
        load = self.load
        got: list[tuple[int, tuple[str, int]]] = []
        pos = 0  # got[pos:] are read and not yet handled
        while True:
            if pos >= len(got):
                await trio.lowlevel.wait_readable(sock)
            now = trio.current_time()
            if load.behind_since is None:  # (see TransceiverLoad.behind_since)
                load.behind_since = now
            n_in = bytes_in = 0
            t = perf_counter()
            if batching:
                self._queued = []
            flush_at = t + FLUSH_AFTER
            yield_at = t + YIELD_AFTER
            full = True  # unless the socket runs dry first
            try:
                for _ in range(BATCH):
                    if pos >= len(got):
                        pos = 0
                        try:
                            got = recv()
                        except OSError:  # e.g. ICMP port unreachable reported on a later recv
                            got = []
                            continue
                        if not got:
                            full = False
                            load.behind_since = None
                            break
                    n, relay = got[pos]
                    off = pos * BUFSIZE
                    pos += 1
                    n_in += 1
                    bytes_in += n
                    dispatch(now, view[off : off + n], relay)
                    t = perf_counter()
                    if t > yield_at:
                        break  # (full stays True: the checkpoint below lets others run)
                    if batching and t > flush_at:
                        self._flush()  # a long batch: see receive_loop
                        self._queued = []
                        flush_at = t + FLUSH_AFTER
            finally:
                if batching:
                    self._flush()
                counters["datagrams_in"] += n_in
                counters["bytes_in"] += bytes_in
            if full:
                if (load.behind_since is not None and pos >= len(got)
                        and not _pending(sock)):
                    load.behind_since = None  # the batch ended as the socket ran dry
                await trio.lowlevel.checkpoint()

    @property
    def stun_tat(self) -> dict[Addr, float]:
        """The STUN budget's table: unknown client address -> GCRA theoretical arrival."""
        return self.stun_budget.tat

    def dispatch(self, now: float, data: memoryview, relay: Addr) -> None:
        """One datagram from a relay (PROXY header + client datagram)."""
        # The PROXY header of a flow is the same bytes on every datagram: parsed once and
        # looked up by those bytes (as the relay does), a parse of its own only on a miss.
        # A hit is exactly a re-parse: the key holds the whole header, its length field
        # included, so a datagram shorter than its header never matches.
        cache = self._proxy_cache
        key = bytes(data[:16 + (data[14] << 8 | data[15])]) if len(data) >= 16 else b""
        parsed = cache.get(key)
        if parsed is None:
            try:
                client, public, offset, transport = parse_transport_untrusted(data)
            except ProxyError:
                if is_local(data):
                    self.vouch.handle_datagram(data, relay)  # a relay worker's query
                    return
                self.counters["drop_proxy"] += 1
                return
            if transport == STREAM:
                # ICE-TCP (RFC 6544): a flow of its own, keyed apart from a UDP one from the
                # same ip:port; replies to it carry a STREAM header (call.Flow).
                client = StreamAddr(client)
            if len(cache) >= PROXY_CACHE:
                cache.clear()  # bounded; refilled by the flows still sending
            cache[key] = parsed = (client, public, offset)
        else:
            client, public, offset = parsed
        payload = data[offset:]
        if payload and payload[0] < 4:  # STUN (RFC 7983 §7): routed by its USERNAME
            if client not in self.by_client and not self.stun_budget.allow(client, now):
                self.counters["drop_stun_rate"] += 1
                return
            session = self._route_stun(payload, client)
            if session is None:
                return
            if session.state == "connected":  # consent checks
                try:
                    session.handle_input(now, bytes(payload), (client, public, relay))
                except Exception:
                    self._failed(session)
            else:
                self._setting_up(session, now, payload, (client, public, relay))
            if client in session.flows and session.state != "ended":
                self.by_client[client] = session
            return
        session = self.by_client.get(client)
        if session is None:
            phone = self.phone_by_client.get(client) or self._phone_for(client)
            if phone is None:
                self.counters["drop_unknown_flow"] += 1
                return
            try:
                phone.handle_input(now, bytes(payload), (client, public, relay))
            except Exception:
                self.counters["session_errors"] += 1
                log.exception("phone %s: handler failed; ending it", phone.id)
                phone.end("internal-error")
            return
        if session.state != "connected":
            self._setting_up(session, now, payload, (client, public, relay))
            return
        try:
            session.handle_input(now, bytes(payload), (client, public, relay))
        except Exception:
            self._failed(session)

    def _setting_up(self, session: Session, now: float, payload: memoryview,
                    source: Source) -> None:
        """A datagram of a session not yet connected (ICE, the DTLS handshake): its CPU is
        setup, counted apart from what the calls cost running (load.py ``add_setup``)."""
        t0 = thread_time()
        try:
            session.handle_input(now, bytes(payload), source)
        except Exception:
            self._failed(session)
        self.load.add_setup(thread_time() - t0)
        if session.state == "connected":  # this datagram finished the handshake
            self.load.joined(session.id, now)

    def _route_stun(self, payload: memoryview, client: Addr) -> Session | None:
        try:
            username = peek_username_untrusted(payload)
        except StunError:
            username = None  # a response or indication: only its flow's session may care
        if username is not None:
            ufrag = username.split(b":", 1)[0].decode("ascii", "replace")
            session = self.by_ufrag.get(ufrag)
            if session is None:
                self.counters["drop_unknown_ufrag"] += 1
            return session
        session = self.by_client.get(client)
        if session is None:
            self.counters["drop_stun_malformed"] += 1
        return session

    def _failed(self, session: Session) -> None:
        """A session's handler raised (called from its ``except``): end that one only."""
        self.counters["session_errors"] += 1
        log.exception("session %s: handler failed; ending it", session.id)
        session.end("internal-error")

    # -- session table -------------------------------------------------------------------

    def _on_end(self, call: Call) -> None:
        """Any call ended (its shell's teardown): out of the table and its kind's indexes;
        its recording finishes."""
        if self.calls.pop(call.id, None) is None:
            return
        recording = self.recordings.pop(call.id, None)
        if recording is not None:
            recording.call_ended()  # its task writes the rest and finalises the file
        self.load.ended()
        if isinstance(call, Session):
            self._session_ended(call)
        else:
            self._phone_ended(call)
        # the one "this call ended" signaling hears, for either kind (``events``)
        self._call_event({"type": "ended", "call_id": call.id,
                          "kind": "phone" if isinstance(call, PhoneSession) else "webrtc",
                          "reason": call.end_reason or "ended"})
        self._check_drained()

    def _session_ended(self, session: Session) -> None:
        self.counters["sessions_ended"] += 1
        self.tcp_candidates.pop(session.id, None)
        self.admission.finished(session.call)  # (the call's close did; a no-op then)
        for ufrag in [u for u, s in self.by_ufrag.items() if s is session]:
            del self.by_ufrag[ufrag]
        for client in [c for c, s in self.by_client.items() if s is session]:
            del self.by_client[client]
        self.ended.append(EndedSession(session))

    def drain(self) -> None:
        """Take no new session; :attr:`drained` is set when the last one has ended."""
        if not self.draining:
            self.draining = True
            log.info("draining: no new sessions; %d session(s) left", len(self.calls))
        self._check_drained()

    def _check_drained(self) -> None:
        if self.draining and not self.calls and not self.drained.is_set():
            log.info("drained: no session left")
            self.drained.set()

    # -- control operations --------------------------------------------------------------

    async def handle_control(self, req: dict[str, Any]) -> dict[str, Any]:
        """One control request (docs/control-protocol.md): ``op`` -> ``_op_<op>`` (dots as
        underscores) of ops.py, the sideband's ``realtime.*``, or the ``events`` poll."""
        op = req["op"]
        if op.startswith("realtime."):  # the sideband (appliance/realtime/sideband.py)
            return await sideband.handle_op(op, req, self._session_state)
        if op == "events":  # the one op that waits (signaling's long-poll)
            return await self._events(req)
        handler = getattr(self, "_op_" + op.replace(".", "_"), None)
        if handler is None:
            return error(400, "unknown-op", f"unknown op {op!r}")
        if op == "create":
            spec = req.get("agent") or self.config.agent
            if isinstance(spec, str):
                await self.warm(spec)
            t0 = thread_time()  # the offer, the answer, the keys: setup (load.py)
            try:
                created: dict[str, Any] = handler(req)
            finally:
                self.load.add_setup(thread_time() - t0)
            return created
        result: dict[str, Any] = handler(req)
        return result

    # -- call events, phone tables -------------------------------------------------------

    def _call_event(self, event: dict[str, Any]) -> None:
        self.event_seq += 1
        self.call_events.append((self.event_seq, event))
        self._events_wake.set()
        self._events_wake = trio.Event()

    def _phone_ended(self, phone: PhoneSession) -> None:
        self.counters["phones_ended"] += 1
        self._unindex_phone(phone)
        for client in [c for c, p in self.phone_by_client.items() if p is phone]:
            del self.phone_by_client[client]
        self.ended_phones.append(phone.describe())

    def _phone_latched(self, phone: PhoneSession, addr: Addr) -> None:
        if len(self.phone_by_client) < 65536 or addr in self.phone_by_client:
            self.phone_by_client[addr] = phone

    def _index_phone(self, phone: PhoneSession) -> None:
        params = phone.params
        if params is None:
            return
        self.phone_by_remote[params.remote] = phone
        if params.remote_rtcp is not None:
            self.phone_by_remote[params.remote_rtcp] = phone
        self.phone_by_ip.setdefault(params.trunk_ip, {})[phone.id] = phone

    def _unindex_phone(self, phone: PhoneSession) -> None:
        for addr in [a for a, p in self.phone_by_remote.items() if p is phone]:
            del self.phone_by_remote[addr]
        for ip in [ip for ip, m in self.phone_by_ip.items() if phone.id in m]:
            del self.phone_by_ip[ip][phone.id]
            if not self.phone_by_ip[ip]:
                del self.phone_by_ip[ip]

    def _phone_for(self, client: Addr) -> PhoneSession | None:
        """The phone call a datagram from a new source belongs to (the vouch rule): its
        signalled address, else the oldest call from that IP not latched yet. Several
        unlatched calls from one NATed IP are told apart by nothing in plain RTP: the
        oldest gets it (docs/sip.md "Media": a trunk that sends from its signalled
        address, the usual case, is never ambiguous). The match is remembered."""
        host = client[0]
        if not isinstance(host, str):
            return None
        phone = self.phone_by_remote.get((host, client[1]))
        if phone is None:
            for cand in self.phone_by_ip.get(host, {}).values():
                if cand.vouches_for((host, client[1])):
                    phone = cand
                    break
        if phone is not None and phone.vouches_for((host, client[1])):
            self._phone_latched(phone, (host, client[1]))
            return phone
        return None

    def _phone_vouch(self, client: Addr, public: Addr, relay: Addr) -> bool:
        """The relay's "is this client yours?" for a phone source (vouch.py)."""
        phone = self.phone_by_client.get(client) or self._phone_for(client)
        if phone is None or not phone.vouches_for(client):
            return False
        phone.via_relay(public, relay)
        return True

def _bind(listen: Addr) -> socket.socket:
    # No SO_REUSEPORT (one transceiver per port) and the system's IPV6_V6ONLY default.
    return udp_socket(listen, buffer=SOCKET_BUFFER, v6only=None)


async def serve_transceiver(
    config: TransceiverConfig,
    *,
    task_status: trio.TaskStatus[TransceiverAddresses] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one transceiver until cancelled; reports its bound UDP and control addresses."""
    sock = _bind(config.listen)
    try:
        bound = sock.getsockname()
        udp: Addr = (bound[0], bound[1])
        tr = Transceiver(config, sock)
        async with trio.open_nursery() as nursery:
            control: str | None = None
            if config.control is not None:
                control = await nursery.start(serve_control, config.control, tr.handle_control)
            async with trio.open_nursery() as sessions:
                tr._nursery = sessions
                sessions.start_soon(tr.receive_loop)
                sessions.start_soon(tr.pacer.run)
                if config.measure_load:
                    sessions.start_soon(tr.load.measure_loop)
                if config.preload:
                    sessions.start_soon(tr.preload)
                log.info("transceiver %d listening on %s", config.id, _fmt(udp))
                task_status.started(TransceiverAddresses(udp, control, tr))
                if not config.exit_when_drained:
                    await trio.sleep(math.inf)
                await tr.drained.wait()
                log.info("transceiver %d drained: exiting", config.id)
                nursery.cancel_scope.cancel()
    finally:
        sock.close()

