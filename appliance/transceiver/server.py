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
others carry on. The control channel
(docs/control-protocol.md) creates, patches, deletes and reports sessions.

Drain (issue 10, rolling upgrades): ``{"op": "drain"}`` (or :meth:`Transceiver.drain`)
refuses new sessions (``503 draining``) and sets :attr:`Transceiver.drained` once no session
is left. With ``exit_when_drained`` :func:`serve_transceiver` then returns (the CLI exits 0);
without it the transceiver keeps serving the control channel, refusing sessions.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
import math
import secrets
import socket
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Any

import trio

from appliance import recordings
from appliance.agents import AgentError, resolve
from appliance.control import check_params, serve_control
from appliance.logs import loggable_url, redact
from appliance.netio.sockets import udp_socket
from appliance.phone_params import PhoneParams
from appliance.proto.errors import LocalProtocolError
from appliance.proto.proxy import STREAM, ProxyError, StreamAddr, parse_transport_untrusted
from appliance.proto.proxy.vouch import is_local
from appliance.proto.ratelimit import GcraTable
from appliance.proto.sdp import (
    SdpError,
    build_answer,
    build_sdpfrag_answer,
    parse_offer_untrusted,
    parse_sdpfrag_untrusted,
)
from appliance.proto.stun import StunError, peek_username_untrusted
from appliance.proto.ufrag import UfragCodec
from appliance.realtime import sideband

from .admission import DtlsSetup
from .call import Addr
from .load import TransceiverLoad
from .opus import DEFAULT_COMPLEXITY
from .pacer import Pacer
from .phone_session import DIGITS, LEG_COUNTERS, PhoneSession
from .recording import CallRecording, RecordingSettings
from .session import EndedSession, Session, _fmt
from .stages import MediaConfig
from .vouch import VouchResponder

try:  # optional C extension (setup.py): sendmmsg batching, Linux only
    from appliance.netio import _mmsg
except ImportError:  # pragma: no cover - not built (no compiler/headers) or not Linux
    _mmsg = None  # type: ignore[assignment]

#: A call of any kind in the one table (both are :class:`~.shell.CallShell` call kinds)
Call = Session | PhoneSession

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
CALL_EVENTS_WAIT = 30.0  # the longest an ``events`` poll may wait
#: an ``events`` answer stops adding events past this much JSON (a line is at most 1 MiB)
CALL_EVENTS_BYTES = 256 * 1024
MAX_SESSION_ID = 128
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
#: Defence in depth behind signaling's admission (issue 23, docs/operations.md
#: "Admission"): a create is refused ``503 overloaded`` when the measured busy share
#: (headroom.py) plus the creates since the last window, at this transceiver's cost per
#: call, reaches this. Above signaling's admission limit (0.85), so that only a burst
#: signaling could not see (another signaling, a stale report) reaches it.
REFUSE_BUSY = 0.95


@dataclass(frozen=True, slots=True)
class TransceiverConfig:
    id: int
    secrets: tuple[bytes, ...]
    listen: Addr = ("127.0.0.1", 4000)
    control: str | None = None  # Unix socket path or host:port; None: no control server
    cluster: int = 0
    agent: str = "echo"
    #: agent specs resolved in a worker thread at start (``--preload``): the assistant's
    #: speech models load before the first call asks for them, not inside its set-up
    preload: tuple[str, ...] = ()
    max_sessions: int = 500
    exit_when_drained: bool = False  # serve_transceiver returns once drained and idle
    opus_complexity: int = DEFAULT_COMPLEXITY  # encoder complexity of every PCM session
    # DTLS versions a call's handshake may negotiate (--dtls-versions; docs/dtls13.md).
    dtls_versions: frozenset[str] = frozenset({"1.2", "1.3"})
    # DTLS 1.2 False Start (RFC 7918) as client: only the SCTP INIT goes with our Finished,
    # a data channel half a round trip sooner (docs/sctp.md "Setup latency").
    dtls_false_start: bool = True
    # Queue what sessions send while a receive batch is handled and send it with one
    # sendmmsg (module docstring); False, or the C extension not built: one sendto each.
    batch_sends: bool = True
    # Receive with one recvmmsg per RECV_MSGS datagrams (the same C extension); False, or
    # not built: one recvfrom_into each.
    batch_recv: bool = True
    # Lower the Opus complexity of the calls step by step as headroom shrinks (degrade.py).
    adaptive_complexity: bool = True
    refuse_busy: float = REFUSE_BUSY  # see REFUSE_BUSY
    # Run the headroom meter's tick task (the CLI does: `appliance transceiver` is a process
    # of its own). Off by default in process: the meter reads the whole process's CPU, which
    # in a test or benchmark includes its clients; tests feed TransceiverLoad.handle_tick (load.py).
    measure_load: bool = False
    # What the headroom counts (--headroom, headroom.py): "core", what the CPUs it may run on
    # have left (issue 32), or "own", its own CPU only (a core of its own: before issue 32).
    headroom: str = "core"
    # Recordings (recording.py, docs/recordings.md): where they go (None: no call can be
    # recorded), whether calls are recorded unless they say otherwise (--record), the
    # directory's quota in bytes and how long a recording is kept.
    recordings_dir: str | None = None
    record: bool = False
    recording_quota: int = recordings.DEFAULT_QUOTA
    recording_retention: float = recordings.DEFAULT_RETENTION


@dataclass(frozen=True, slots=True)
class TransceiverAddresses:
    """What :func:`serve_transceiver` reports when ready."""

    udp: Addr
    control: str | None
    transceiver: Transceiver | None = None  # for the CLI's drain-on-SIGTERM


def _error(status: int, code: str, detail: str) -> dict[str, Any]:
    return {"ok": False, "status": status, "code": code, "detail": detail}


def _ice_pwd() -> str:
    # RFC 8445 §5.3: >= 128 bits, ICE characters; base64 of 18 bytes is 24 of them.
    return base64.b64encode(secrets.token_bytes(18)).decode()


class Transceiver:
    """Session tables, the datagram dispatcher and the control operations."""

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
        while True:
            await trio.lowlevel.wait_readable(sock)
            now = trio.current_time()
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
        got: list[tuple[int, tuple[str, int]]] = []
        pos = 0  # got[pos:] are read and not yet handled
        while True:
            if pos >= len(got):
                await trio.lowlevel.wait_readable(sock)
            now = trio.current_time()
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
            try:
                session.handle_input(now, bytes(payload), (client, public, relay))
            except Exception:
                self._failed(session)
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
        try:
            session.handle_input(now, bytes(payload), (client, public, relay))
        except Exception:
            self._failed(session)

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

    def _find(self, req: dict[str, Any]) -> Session | EndedSession | dict[str, Any]:
        sid = req.get("session_id")
        if not isinstance(sid, str):
            return _error(400, "bad-request", "session_id must be a string")
        session = self.calls.get(sid)
        if type(session) is not Session:  # (a phone call has its phone.* ops)
            for old in self.ended:
                if old.id == sid:
                    return old
            return _error(404, "unknown-session", f"no session {sid!r} on this transceiver")
        return session

    # -- control operations --------------------------------------------------------------

    async def handle_control(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        if op.startswith("realtime."):  # the sideband (appliance/realtime/sideband.py)
            return await sideband.handle_op(op, req, self._session_state)
        if op == "events":  # the one op that waits (signaling's long-poll)
            return await self._events(req)
        handler = getattr(self, "_op_" + op.replace(".", "_"), None)
        if handler is None:
            return _error(400, "unknown-op", f"unknown op {op!r}")
        if op == "create":
            spec = req.get("agent") or self.config.agent
            if isinstance(spec, str):
                await self.warm(spec)
        result: dict[str, Any] = handler(req)
        return result

    async def warm(self, spec: str) -> None:
        """Resolve an agent spec once in a worker thread, so the op's own ``resolve`` finds
        its models loaded: the assistant's first resolve loads Whisper, Silero and the
        turn model (~1 s), which inside the op stalled every call of this transceiver and
        the new call's set-up (issue 38 item 8b). A spec that fails is left to the op,
        which answers it 400."""
        if spec in self._warmed:
            return
        try:
            await trio.to_thread.run_sync(resolve, spec)
        except AgentError:
            return
        if len(self._warmed) < 256:  # bounded: specs come from callers
            self._warmed.add(spec)

    async def preload(self) -> None:
        """``--preload``: warm each spec at start, one after another, in a worker thread."""
        for spec in self.config.preload:
            started = time.perf_counter()
            await self.warm(spec)
            log.info("preloaded agent %s in %.2f s", spec, time.perf_counter() - started)

    def _session_state(self, sid: str) -> str | None:
        """A WebRTC or a phone session's state (the sideband attaches to either)."""
        call = self.calls.get(sid)
        if type(call) is PhoneSession:
            return call.state
        if any(old.get("id") == sid for old in self.ended_phones):
            return "ended"
        found = self._find({"session_id": sid})
        return None if isinstance(found, dict) else found.state

    def _op_create(self, req: dict[str, Any]) -> dict[str, Any]:
        """A call of either leg kind: ``leg`` ``"webrtc"`` (the default: an SDP offer) or
        ``"phone"`` (its leg options: :meth:`_create_phone`)."""
        leg = req.get("leg", "webrtc")
        if leg == "phone":
            return self._create_phone(req)
        if leg != "webrtc":
            return _error(400, "bad-leg", "leg must be \"webrtc\" or \"phone\"")
        now = trio.current_time()
        if self.draining:
            return _error(503, "draining", "this transceiver is draining")
        if len(self.calls) >= self.config.max_sessions:
            return _error(503, "full", f"{self.config.max_sessions} sessions is the limit")
        if self.load.overloaded(req.get("agent")):  # before any SDP or DTLS work (issue 23)
            self.counters["sessions_refused_overloaded"] += 1
            return _error(503, "overloaded",
                          f"no headroom for another call (busy {100 * self.load.meter.busy:.0f} %)")
        sid = req.get("session_id")
        if not isinstance(sid, str) or not 0 < len(sid) <= MAX_SESSION_ID:
            return _error(400, "bad-request", "session_id must be a 1..128 character string")
        if sid in self.calls:
            return _error(409, "session-exists", f"session {sid!r} already exists")
        offer_text = req.get("offer")
        if not isinstance(offer_text, str):
            return _error(400, "bad-request", "offer must be SDP text")
        candidates = _candidates(req.get("candidates"))
        if isinstance(candidates, dict):
            return candidates
        tcp = _candidates(req.get("tcp_candidates")) if req.get("tcp_candidates") else []
        if isinstance(tcp, dict):
            return tcp
        agent_spec = req.get("agent")
        if agent_spec is not None and not isinstance(agent_spec, str):
            return _error(400, "bad-request", "agent must be a string or null")
        try:
            agent = resolve(agent_spec or self.config.agent)
        except AgentError as exc:
            return _error(400, "unknown-agent", str(exc))
        try:
            params = check_params(req.get("params"))  # per-call, for ctx.params
            media = MediaConfig.from_params_untrusted(params)  # stages/config.py
        except ValueError as exc:
            return _error(400, "bad-params", str(exc))
        media = self._recording_choice(sid, media)
        ufrag = self.codec.mint(cluster=self.config.cluster, transceiver=self.config.id)
        pwd = _ice_pwd()
        fingerprint = self.dtls_setup.fingerprint(time.time())
        ssrc, cname = secrets.randbits(32), secrets.token_hex(8)
        try:
            offer = parse_offer_untrusted(offer_text)
            answer = build_answer(
                offer, ice_ufrag=ufrag, ice_pwd=pwd, fingerprint=fingerprint,
                candidates=candidates, ssrc=ssrc, cname=cname,
                session_id=secrets.randbits(62), datachannel=True, tcp_candidates=tcp,
                # actpass -> a=setup:active (we start DTLS, one round trip sooner), except
                # while DTLS cookie mode is on: then the client starts it and admission.py
                # bounds what it costs (docs/adr-dtls-active.md).
                prefer_active=not self.admission.active(now),
            )
        except SdpError as exc:
            return _error(exc.status, exc.code, exc.detail)
        except LocalProtocolError as exc:
            return _error(400, "bad-request", str(exc))
        dtls = self.dtls_setup.connection(answer)  # (admission.py)
        session = Session(
            session_id=sid, transceiver=self.config.id, agent=agent, answer=answer,
            candidates=candidates,
            local_ufrag=ufrag, local_pwd=pwd, dtls=dtls, ssrc=ssrc, cname=cname,
            send=self.send, now=now, on_end=self._on_end, counters=self.counters,
            pacer=self.pacer, opus_complexity=self.load.complexity.complexity, params=params,
            media=media,
            gate=self.dtls_setup.gate,
        )
        assert self._nursery is not None
        self.calls[sid] = session
        self.by_ufrag[ufrag] = session
        if tcp:
            self.tcp_candidates[sid] = tcp
        self.counters["sessions_created"] += 1
        self.load.created()
        self._nursery.start_soon(session.run)
        self._start_recording(session)
        session.mark_answer_sent(trio.current_time())
        log.info("session %s created: agent %s ufrag %s", sid, loggable_url(agent.name),
                 redact(ufrag))
        return {"ok": True, "answer": answer.text, "ufrag": ufrag}

    def _recording_choice(self, sid: str, media: MediaConfig) -> MediaConfig:
        """The call's ``record``: its own choice, else the server's default; only where
        there is a recordings directory and the id can name a file."""
        want = self.config.record if media.record is None else media.record
        if want and self.config.recordings_dir is None:
            log.warning("session %s asked for a recording; this transceiver has no "
                        "recordings directory (--recordings-dir): not recorded", sid)
            want = False
        elif want and not recordings.safe_id(sid):
            log.warning("session %s: this id cannot name a recording file: not recorded",
                        redact(sid))
            want = False
        return media if media.record is want else media.with_(record=want)

    def _start_recording(self, call: Call) -> None:
        """The call's recording, if its media config asked (``_recording_choice``): any
        call kind, once it has a pipeline (a pending phone call: when it is answered)."""
        pipeline = call.pipeline
        if pipeline is None or not pipeline.config.record or pipeline.stages.recorder is None:
            return
        if call.id in self.recordings or call.id not in self.calls:
            return  # already recording (a re-INVITE), or ended
        assert self.config.recordings_dir is not None and self._nursery is not None
        rec = CallRecording(
            pipeline.stages.recorder, call.id,
            RecordingSettings(Path(self.config.recordings_dir), self.config.recording_quota,
                              self.config.recording_retention), self.counters)
        pipeline.stages.recording = rec
        self.recordings[call.id] = rec
        self.counters["recordings_started"] += 1
        self._nursery.start_soon(rec.run)

    def _op_patch(self, req: dict[str, Any]) -> dict[str, Any]:
        found = self._find(req)
        if isinstance(found, dict):
            return found
        if isinstance(found, EndedSession) or found.state == "ended":
            return _error(404, "unknown-session", f"session {found.id!r} has ended")
        session = found
        body = req.get("sdpfrag")
        if not isinstance(body, str):
            return _error(400, "bad-request", "sdpfrag must be text")
        try:
            frag = parse_sdpfrag_untrusted(body)
        except SdpError as exc:
            return _error(exc.status, exc.code, exc.detail)
        call = session.call
        remote = call.ice.remote_ufrag or ""
        if not frag.is_ice_restart(remote):
            return {"ok": True, "sdpfrag": ""}  # trickle: a lite agent needs no candidates
        # RFC 8445 §9 / RFC 9725 §4.4.1: new credentials both ways; media keeps flowing on
        # the old pair until the client nominates with the new ones.
        ufrag = self.codec.mint(cluster=self.config.cluster, transceiver=self.config.id)
        pwd = _ice_pwd()
        call.restart_ice(ufrag, pwd, frag.ice_ufrag, frag.ice_pwd)
        for old in [u for u, s in self.by_ufrag.items() if s is session]:
            del self.by_ufrag[old]
        self.by_ufrag[ufrag] = session
        candidates = _candidates(req.get("candidates"))
        if isinstance(candidates, dict):
            candidates = session.candidates
        text = build_sdpfrag_answer(ufrag, pwd, candidates, answer=call.answer,
                                    tcp_candidates=self.tcp_candidates.get(session.id, ()))
        log.info("session %s ICE restart, new ufrag %s", session.id, redact(ufrag))
        return {"ok": True, "sdpfrag": text}

    def _op_delete(self, req: dict[str, Any]) -> dict[str, Any]:
        found = self._find(req)
        if isinstance(found, dict):
            return found
        reason = req.get("reason")
        found.end(reason if isinstance(reason, str) and reason else "deleted")
        # An already-ended session keeps its own reason: tell signaling which one it is.
        return {"ok": True, "end_reason": found.end_reason, "ended_at": found.ended_at}

    def _op_list(self, req: dict[str, Any]) -> dict[str, Any]:
        """Every call, either kind (its session object's ``kind`` says which)."""
        live = [c.describe() for c in self.calls.values()]
        return {"ok": True, "sessions": live + [s.describe() for s in self.ended]
                + list(self.ended_phones)}

    def _op_get(self, req: dict[str, Any]) -> dict[str, Any]:
        found = self._find(req)
        if isinstance(found, dict):
            phone = self._op_phone_get(req)  # a phone call is a call like any
            return phone if phone.get("ok") else found
        return {"ok": True, "session": found.describe()}

    def _op_stats(self, req: dict[str, Any]) -> dict[str, Any]:
        by_state = dict.fromkeys(("new", "connecting", "connected"), 0)
        phones = 0
        for c in self.calls.values():
            if type(c) is Session:
                by_state[c.state] = by_state.get(c.state, 0) + 1
            else:
                phones += 1
        now = trio.current_time()
        admission = {"cookie_mode": self.admission.active(now),
                     "handshakes": self.admission.handshakes,
                     "switched_on": self.admission.switched_on}
        return {"ok": True, "transceiver": self.config.id, "counters": dict(self.counters),
                "sessions_by_state": by_state, "phones": phones,
                "draining": self.draining,
                "dtls_admission": admission, "load": self.load.view()}

    def _op_drain(self, req: dict[str, Any]) -> dict[str, Any]:
        self.drain()
        return {"ok": True, "sessions": sum(type(c) is Session for c in self.calls.values()),
                "exit_when_drained": self.config.exit_when_drained}


    # -- phone calls (phone_session.py; docs/control-protocol.md "Phone calls") ----------

    def _create_phone(self, req: dict[str, Any]) -> dict[str, Any]:
        """``create`` with ``leg: "phone"``, a phone call's media: answering (``phone`` = PhoneParams, media at once) or
        pending our own offer (``phone`` absent; ``call_id`` and ``agent`` given; the
        answer comes as ``phone.answered``)."""
        now = trio.current_time()
        if self.draining:
            return _error(503, "draining", "this transceiver is draining")
        if len(self.calls) >= self.config.max_sessions:
            return _error(503, "full", f"{self.config.max_sessions} sessions is the limit")
        phone_req = req.get("phone")  # (its agent: what one more call of it would cost)
        if self.load.overloaded(phone_req.get("agent") if isinstance(phone_req, dict)
                           else req.get("agent")):
            self.counters["sessions_refused_overloaded"] += 1
            return _error(503, "overloaded",
                          f"no headroom for another call (busy {100 * self.load.meter.busy:.0f} %)")
        sid = req.get("session_id")
        if not isinstance(sid, str) or not 0 < len(sid) <= MAX_SESSION_ID:
            return _error(400, "bad-request", "session_id must be a 1..128 character string")
        if sid in self.calls:
            return _error(409, "session-exists", f"session {sid!r} already exists")
        params: PhoneParams | None = None
        call_id: Any
        agent_spec: Any
        try:
            if req.get("phone") is not None:
                params = PhoneParams.from_json_untrusted(req.get("phone"))
                call_id, agent_spec, session_cfg = params.call_id, params.agent, params.session
            else:
                call_id, agent_spec = req.get("call_id"), req.get("agent")
                session_cfg = check_params(req.get("session"))
                if not isinstance(call_id, str) or not 0 < len(call_id) <= MAX_SESSION_ID:
                    raise ValueError("call_id must be a 1..128 character string")
                if agent_spec is not None and not isinstance(agent_spec, str):
                    raise ValueError("agent must be a string or null")
            # ctx.params as a WebRTC Realtime call has them (realtime_http.py), so the
            # Realtime agent and the stages read a phone call's session config the same way
            ctx_params = {**check_params(req.get("params")),
                          "realtime": {"session": session_cfg, "dcid": None, "call_id": call_id}}
            media = MediaConfig.from_params_untrusted(ctx_params)
        except ValueError as exc:
            return _error(400, "bad-params", str(exc))
        media = self._recording_choice(sid, media)  # recorded like a WebRTC call
        try:
            agent = resolve(agent_spec or self.config.agent)
        except AgentError as exc:
            return _error(400, "unknown-agent", str(exc))
        try:
            phone = PhoneSession(
                session_id=sid, call_id=call_id, transceiver=self.config.id, agent=agent,
                params=params, send=self.send, now=now, on_end=self._on_end,
                on_event=self._call_event, on_latched=self._phone_latched,
                counters=self.counters, pacer=self.pacer,
                opus_complexity=self.load.complexity.complexity, session_params=ctx_params,
                media=media)
        except ValueError as exc:
            return _error(400, "bad-params", str(exc))
        self.calls[sid] = phone
        self._index_phone(phone)
        self.counters["phones_created"] += 1
        self.load.created()
        assert self._nursery is not None
        self._nursery.start_soon(phone.run)
        self._start_recording(phone)  # (a pending call: once answered)
        log.info("phone %s created (%s): agent %s", sid,
                 "pending an answer" if params is None else params.codec,
                 loggable_url(agent.name))
        return {"ok": True, "session_id": sid, "ssrc": phone.ssrc}

    def _live_phone(self, req: dict[str, Any]) -> PhoneSession | dict[str, Any]:
        sid = req.get("session_id")
        if not isinstance(sid, str):
            return _error(400, "bad-request", "session_id must be a string")
        phone = self.calls.get(sid)
        if type(phone) is not PhoneSession:
            return _error(404, "unknown-session", f"no phone session {sid!r} on this transceiver")
        return phone

    def _op_phone_answered(self, req: dict[str, Any]) -> dict[str, Any]:
        return self._phone_params_op(req, answered=True)

    def _op_phone_update(self, req: dict[str, Any]) -> dict[str, Any]:
        return self._phone_params_op(req, answered=False)

    def _phone_params_op(self, req: dict[str, Any], *, answered: bool) -> dict[str, Any]:
        phone = self._live_phone(req)
        if isinstance(phone, dict):
            return phone
        try:
            params = PhoneParams.from_json_untrusted(req.get("phone"))
            self._unindex_phone(phone)
            if answered:
                phone.answered(params, trio.current_time())
            else:
                phone.update(params, trio.current_time())
        except ValueError as exc:
            return _error(400, "bad-params", str(exc))
        finally:
            if phone.state != "ended":
                self._index_phone(phone)
        self._start_recording(phone)  # its first pipeline, if it is to be recorded
        return {"ok": True, "state": phone.state}

    def _op_phone_dtmf(self, req: dict[str, Any]) -> dict[str, Any]:
        """``{"digit": "5", "duration_ms": 100}``: a SIP INFO digit for the agent; with
        ``"send": "123"`` instead, digits we send the far end (RFC 4733)."""
        phone = self._live_phone(req)
        if isinstance(phone, dict):
            return phone
        send = req.get("send")
        if send is not None:
            if not isinstance(send, str) or not 0 < len(send) <= 32:
                return _error(400, "bad-request", "send must be 1..32 DTMF digits")
            try:
                phone.send_dtmf(trio.current_time(), send)
            except ValueError as exc:
                return _error(400, "bad-request", str(exc))
            return {"ok": True}
        digit, ms = req.get("digit"), req.get("duration_ms", 100)
        if not isinstance(digit, str) or digit not in DIGITS:
            return _error(400, "bad-request", "digit must be one of 0-9 * # A-D")
        if isinstance(ms, bool) or not isinstance(ms, int) or not 0 <= ms <= 60_000:
            ms = 100
        phone.dtmf_from_signaling(digit, ms)
        return {"ok": True}

    def _op_phone_end(self, req: dict[str, Any]) -> dict[str, Any]:
        sid = req.get("session_id")
        phone = self._phone(sid)
        if phone is None:
            for old in self.ended_phones:
                if old.get("id") == sid:
                    return {"ok": True, "end_reason": old.get("end_reason")}
            return _error(404, "unknown-session", f"no phone session {sid!r} on this transceiver")
        reason = req.get("reason")
        phone.end(reason if isinstance(reason, str) and reason else "deleted")
        return {"ok": True, "end_reason": phone.end_reason}

    def _op_phone_get(self, req: dict[str, Any]) -> dict[str, Any]:
        sid = req.get("session_id")
        phone = self._phone(sid)
        if phone is not None:
            return {"ok": True, "session": phone.describe()}
        for old in self.ended_phones:
            if old.get("id") == sid:
                return {"ok": True, "session": dict(old)}
        return _error(404, "unknown-session", f"no phone session {sid!r} on this transceiver")

    def _op_phone_list(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "epoch": self.epoch,
                "sessions": [p.describe() for p in self.calls.values()
                             if type(p) is PhoneSession]}

    async def _events(self, req: dict[str, Any]) -> dict[str, Any]:
        """Signaling's long-poll, for every call: the events after ``after`` (of this
        ``epoch``), waiting up to ``wait`` seconds for one. A different epoch (we
        restarted) starts from 0. An ``ended`` event carries the call's ended session
        object (``session``) while this transceiver still keeps it (the last
        :data:`RECENTLY_ENDED` of each kind), so signaling needs no ``get`` or ``list``."""
        after, wait = req.get("after", 0), req.get("wait", 0)
        if req.get("epoch") != self.epoch:
            after = 0
        if isinstance(after, bool) or not isinstance(after, int):
            after = 0
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0:
            wait = 0
        if after > self.event_seq:
            after = 0
        if self.event_seq <= after and wait > 0:
            with trio.move_on_after(min(float(wait), CALL_EVENTS_WAIT)):
                await self._events_wake.wait()
        ended: dict[str, dict[str, Any]] = {old.id: old.describe() for old in self.ended}
        ended.update((str(old.get("id")), old) for old in self.ended_phones)
        events: list[dict[str, Any]] = []
        size, nxt = 0, after
        for seq, ev in self.call_events:
            if seq <= after:
                continue
            out = dict(ev, seq=seq)
            if ev["type"] == "ended" and ev["call_id"] in ended:
                out["session"] = ended[ev["call_id"]]
            n = len(json.dumps(out))
            if n > CALL_EVENTS_BYTES and "session" in out:
                del out["session"]  # too big to carry: signaling keeps what it knew
                n = len(json.dumps(out))
            if events and (size + n > CALL_EVENTS_BYTES or len(events) >= 512):
                break  # the rest in the next answer (``next`` is the last one sent)
            events.append(out)
            size, nxt = size + n, seq
        if not events:
            nxt = self.event_seq
        return {"ok": True, "epoch": self.epoch, "next": nxt, "events": events,
                "live": sorted(self.calls)}

    # -- call events, phone tables -------------------------------------------------------

    def _call_event(self, event: dict[str, Any]) -> None:
        self.event_seq += 1
        self.call_events.append((self.event_seq, event))
        self._events_wake.set()
        self._events_wake = trio.Event()

    def _phone(self, sid: object) -> PhoneSession | None:
        call = self.calls.get(sid) if isinstance(sid, str) else None
        return call if type(call) is PhoneSession else None

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

def _candidates(value: object) -> list[tuple[str, int]] | dict[str, Any]:
    bad = _error(400, "bad-request", "candidates must be a non-empty list of [ip, port]")
    if not isinstance(value, list) or not value:
        return bad
    out: list[tuple[str, int]] = []
    for item in value:
        if not isinstance(item, list | tuple) or len(item) != 2:
            return bad
        ip, port = item
        if not isinstance(ip, str) or not isinstance(port, int) or not 0 < port < 65536:
            return bad
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            return bad
        out.append((ip, port))
    return out


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

