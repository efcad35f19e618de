"""The transceiver's control operations (docs/control-protocol.md "Transceiver
operations"): ``create`` for either leg kind, ``patch`` (a WebRTC call's ICE restart
or a phone call's new leg options), ``delete``, ``list`` and ``get`` (every call kind),
``stats``, ``drain``, ``dtmf`` (a phone call's), signaling's ``events`` long-poll, and what
``create`` sets up beside the call (its agent warmed off the loop, its recording).

:class:`ControlOps` is a mixin of :class:`~.server.Transceiver`, whose ``handle_control``
dispatches ``op`` to ``_op_<op>`` here. The ops read and fill the server's one call table
and its indexes through the server's own methods (``_on_end``, ``_index_phone``, …); they
never touch a socket, and nothing here is on the datagram path. What a ``create`` answers
in SDP is negotiate.py's (``accept_offer``); whether there is room for the call is load.py's.

The shell state the ops use is declared on the mixin (the server sets it): ops.py cannot
import server.py, which imports it (tests/test_import_cycles.py).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from appliance import recordings
from appliance.agents import AgentError, resolve
from appliance.control import check_params
from appliance.logs import loggable_url, redact
from appliance.phone_params import PhoneParams
from appliance.proto.errors import LocalProtocolError
from appliance.proto.sdp import SdpError, build_sdpfrag_answer, parse_sdpfrag_untrusted
from appliance.proto.ufrag import UfragCodec

from .admission import DtlsAdmission, DtlsSetup
from .call import Addr
from .load import TransceiverLoad
from .negotiate import accept_offer, ice_pwd
from .pacer import Pacer
from .phone_session import DIGITS, PhoneSession
from .recording import CallRecording, RecordingSettings
from .session import EndedSession, Session
from .settings import TransceiverConfig
from .stages import MediaConfig

#: A call of any kind in the one table (both are :class:`~.shell.CallShell` call kinds)
Call = Session | PhoneSession

log = logging.getLogger(__name__)

MAX_SESSION_ID = 128
CALL_EVENTS_WAIT = 30.0  # the longest an ``events`` poll may wait
#: an ``events`` answer stops adding events past this much JSON (a line is at most 1 MiB)
CALL_EVENTS_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Kept:
    """A recently ended call of either kind, as ``get``/``delete``/``patch`` find it: its
    reason, when, and its final session object (``info``)."""

    id: str
    end_reason: Any
    ended_at: Any
    info: dict[str, Any]


def error(status: int, code: str, detail: str) -> dict[str, Any]:
    """A control answer that refuses (docs/control-protocol.md: status, code, detail)."""
    return {"ok": False, "status": status, "code": code, "detail": detail}


def _candidates(value: object) -> list[tuple[str, int]] | dict[str, Any]:
    bad = error(400, "bad-request", "candidates must be a non-empty list of [ip, port]")
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


class ControlOps:
    """The control operations of one transceiver (module docstring)."""

    # The server's state the ops read and fill (server.Transceiver.__init__ sets each).
    config: TransceiverConfig
    counters: dict[str, int]
    codec: UfragCodec
    calls: dict[str, Call]
    by_ufrag: dict[str, Session]
    tcp_candidates: dict[str, list[tuple[str, int]]]
    ended: deque[EndedSession]
    ended_phones: deque[dict[str, Any]]
    recordings: dict[str, CallRecording]
    draining: bool
    pacer: Pacer
    dtls_setup: DtlsSetup
    admission: DtlsAdmission
    load: TransceiverLoad
    call_events: deque[tuple[int, dict[str, Any]]]
    event_seq: int
    epoch: str
    _events_wake: trio.Event
    _warmed: set[str]
    _nursery: trio.Nursery | None

    if TYPE_CHECKING:  # the server's methods the ops call (declared, not defined, here)
        def send(self, data: bytes, addr: Addr) -> None: ...
        def drain(self) -> None: ...
        def _on_end(self, call: Call) -> None: ...
        def _call_event(self, event: dict[str, Any]) -> None: ...
        def _phone_latched(self, phone: PhoneSession, addr: Addr) -> None: ...
        def _index_phone(self, phone: PhoneSession) -> None: ...
        def _unindex_phone(self, phone: PhoneSession) -> None: ...

    def _find(self, req: dict[str, Any]) -> Call | Kept | dict[str, Any]:
        """The call ``session_id`` names, either kind: live, or one of the recently ended
        (:class:`Kept`); else the error to answer."""
        sid = req.get("session_id")
        if not isinstance(sid, str):
            return error(400, "bad-request", "session_id must be a string")
        call = self.calls.get(sid)
        if call is not None:
            return call
        for old in self.ended:
            if old.id == sid:
                return Kept(old.id, old.end_reason, old.ended_at, old.describe())
        for info in self.ended_phones:
            if info.get("id") == sid:
                return Kept(sid, info.get("end_reason"), info.get("ended_at"), dict(info))
        return error(404, "unknown-session", f"no session {sid!r} on this transceiver")

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
        found = self._find({"session_id": sid})
        if isinstance(found, Kept):
            return "ended"
        return None if isinstance(found, dict) else found.state

    def _refuse_create(self, req: dict[str, Any], agent: object) -> dict[str, Any] | None:
        """Why a ``create`` of either leg kind is refused before any work, or None: this
        transceiver draining or full, no headroom for one more call of ``agent`` (issue
        23), a bad or taken ``session_id``."""
        if self.draining:
            return error(503, "draining", "this transceiver is draining")
        if len(self.calls) >= self.config.max_sessions:
            return error(503, "full", f"{self.config.max_sessions} sessions is the limit")
        if self.load.overloaded(agent):
            self.counters["sessions_refused_overloaded"] += 1
            return error(503, "overloaded",
                         f"no headroom for another call (busy {100 * self.load.meter.busy:.0f} %)")
        sid = req.get("session_id")
        if not isinstance(sid, str) or not 0 < len(sid) <= MAX_SESSION_ID:
            return error(400, "bad-request", "session_id must be a 1..128 character string")
        if sid in self.calls:
            return error(409, "session-exists", f"session {sid!r} already exists")
        return None

    def _op_create(self, req: dict[str, Any]) -> dict[str, Any]:
        """A call of either leg kind: ``leg`` ``"webrtc"`` (the default: an SDP offer) or
        ``"phone"`` (its leg options: :meth:`_create_phone`)."""
        leg = req.get("leg", "webrtc")
        if leg == "phone":
            return self._create_phone(req)
        if leg != "webrtc":
            return error(400, "bad-leg", "leg must be \"webrtc\" or \"phone\"")
        now = trio.current_time()
        refused = self._refuse_create(req, req.get("agent"))  # before any SDP or DTLS work
        if refused is not None:
            return refused
        sid = req["session_id"]
        offer_text = req.get("offer")
        if not isinstance(offer_text, str):
            return error(400, "bad-request", "offer must be SDP text")
        candidates = _candidates(req.get("candidates"))
        if isinstance(candidates, dict):
            return candidates
        tcp = _candidates(req.get("tcp_candidates")) if req.get("tcp_candidates") else []
        if isinstance(tcp, dict):
            return tcp
        agent_spec = req.get("agent")
        if agent_spec is not None and not isinstance(agent_spec, str):
            return error(400, "bad-request", "agent must be a string or null")
        try:
            agent = resolve(agent_spec or self.config.agent)
        except AgentError as exc:
            return error(400, "unknown-agent", str(exc))
        try:
            params = check_params(req.get("params"))  # per-call, for ctx.params
            media = MediaConfig.from_params_untrusted(params)  # stages/config.py
        except ValueError as exc:
            return error(400, "bad-params", str(exc))
        media = self._recording_choice(sid, media)
        ufrag = self.codec.mint(cluster=self.config.cluster, transceiver=self.config.id)
        try:
            accepted = accept_offer(
                offer_text, ufrag=ufrag, fingerprint=self.dtls_setup.fingerprint(time.time()),
                candidates=candidates, tcp_candidates=tcp,
                # actpass -> a=setup:active (we start DTLS, one round trip sooner), except
                # while DTLS cookie mode is on: then the client starts it and admission.py
                # bounds what it costs (docs/adr-dtls-active.md).
                prefer_active=not self.admission.active(now),
            )
        except SdpError as exc:
            return error(exc.status, exc.code, exc.detail)
        except LocalProtocolError as exc:
            return error(400, "bad-request", str(exc))
        answer = accepted.answer
        dtls = self.dtls_setup.connection(answer)  # (admission.py)
        session = Session(
            session_id=sid, transceiver=self.config.id, agent=agent, answer=answer,
            candidates=candidates, local_ufrag=ufrag, local_pwd=accepted.pwd, dtls=dtls,
            ssrc=accepted.ssrc, cname=accepted.cname,
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
                              self.config.recording_retention), self.counters,
            # the call's agent hears it (a GPT-Live session tells its client:
            # session_storage_failed)
            on_stop=lambda reason: call.host.push_event(
                {"type": "recording.stopped", "reason": reason}))
        pipeline.stages.recording = rec
        self.recordings[call.id] = rec
        self.counters["recordings_started"] += 1
        self._nursery.start_soon(rec.run)

    def _op_patch(self, req: dict[str, Any]) -> dict[str, Any]:
        """A live call's new media, by its kind: a WebRTC call's ``sdpfrag`` (trickle or
        an ICE restart, below), a phone call's leg options (``phone``, :meth:`_patch_phone`).
        The other kind's field is refused (409, naming the call's kind)."""
        found = self._find(req)
        if isinstance(found, dict):
            return found
        if isinstance(found, Kept) or found.state == "ended":
            return error(404, "unknown-session", f"session {found.id!r} has ended")
        if "sdpfrag" in req and "phone" in req:
            return error(400, "bad-request", "patch takes sdpfrag (a WebRTC call) or phone "
                         "(a phone call's leg options), not both")
        if isinstance(found, PhoneSession):
            if "sdpfrag" in req:
                return error(409, "not-webrtc", f"session {found.id!r} is a phone call: "
                             "an sdpfrag (ICE) is a WebRTC call's; send phone leg options")
            return self._patch_phone(found, req)
        if "phone" in req or "answered" in req:
            return error(409, "not-phone", f"session {found.id!r} is a WebRTC call: phone "
                         "leg options are a phone call's; send an sdpfrag")
        session = found
        body = req.get("sdpfrag")
        if not isinstance(body, str):
            return error(400, "bad-request", "sdpfrag must be text")
        try:
            frag = parse_sdpfrag_untrusted(body)
        except SdpError as exc:
            return error(exc.status, exc.code, exc.detail)
        call = session.call
        remote = call.ice.remote_ufrag or ""
        if not frag.is_ice_restart(remote):
            return {"ok": True, "sdpfrag": ""}  # trickle: a lite agent needs no candidates
        # RFC 8445 §9 / RFC 9725 §4.4.1: new credentials both ways; media keeps flowing on
        # the old pair until the client nominates with the new ones.
        ufrag = self.codec.mint(cluster=self.config.cluster, transceiver=self.config.id)
        pwd = ice_pwd()
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
        """End a call of either kind; an already-ended one keeps its own reason and says
        which (signaling keeps those, not ``reason``)."""
        found = self._find(req)
        if isinstance(found, dict):
            return found
        if not isinstance(found, Kept):
            reason = req.get("reason")
            found.end(reason if isinstance(reason, str) and reason else "deleted")
        return {"ok": True, "end_reason": found.end_reason, "ended_at": found.ended_at}

    def _op_list(self, req: dict[str, Any]) -> dict[str, Any]:
        """Every call, either kind (its session object's ``kind`` says which)."""
        live = [c.describe() for c in self.calls.values()]
        return {"ok": True, "sessions": live + [s.describe() for s in self.ended]
                + list(self.ended_phones)}

    def _op_get(self, req: dict[str, Any]) -> dict[str, Any]:
        """One call's session object, either kind (a phone call's has its ``phone``
        member), live or recently ended."""
        found = self._find(req)
        if isinstance(found, dict):
            return found
        return {"ok": True, "session": found.info if isinstance(found, Kept)
                else found.describe()}

    def _op_stats(self, req: dict[str, Any]) -> dict[str, Any]:
        # Every call kind by its session object's state (a phone call is new until its
        # leg runs, then connected): the appliance_sessions gauge and admission's per-call
        # cost count all the calls this transceiver carries. ``phones``: the phone ones.
        by_state = dict.fromkeys(("new", "connecting", "connected"), 0)
        phones = 0
        for c in self.calls.values():
            by_state[c.state] = by_state.get(c.state, 0) + 1
            phones += type(c) is not Session
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
        return {"ok": True, "sessions": len(self.calls),  # every call kind: drained waits for all
                "exit_when_drained": self.config.exit_when_drained}

    # -- phone calls (phone_session.py; docs/control-protocol.md "Phone calls") ----------

    def _create_phone(self, req: dict[str, Any]) -> dict[str, Any]:
        """``create`` with ``leg: "phone"``, a phone call's media: answering (``phone`` = PhoneParams, media at once) or
        pending our own offer (``phone`` absent; ``call_id`` and ``agent`` given; the
        answer comes as a ``patch`` with ``answered: true``)."""
        now = trio.current_time()
        phone_req = req.get("phone")  # (its agent: what one more call of it would cost)
        refused = self._refuse_create(req, phone_req.get("agent") if isinstance(phone_req, dict)
                                      else req.get("agent"))
        if refused is not None:
            return refused
        sid = req["session_id"]
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
            return error(400, "bad-params", str(exc))
        media = self._recording_choice(sid, media)  # recorded like a WebRTC call
        try:
            agent = resolve(agent_spec or self.config.agent)
        except AgentError as exc:
            return error(400, "unknown-agent", str(exc))
        try:
            phone = PhoneSession(
                session_id=sid, call_id=call_id, transceiver=self.config.id, agent=agent,
                params=params, send=self.send, now=now, on_end=self._on_end,
                on_event=self._call_event, on_latched=self._phone_latched,
                counters=self.counters, pacer=self.pacer,
                opus_complexity=self.load.complexity.complexity, session_params=ctx_params,
                media=media)
        except ValueError as exc:
            return error(400, "bad-params", str(exc))
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

    def _patch_phone(self, phone: PhoneSession, req: dict[str, Any]) -> dict[str, Any]:
        """``patch`` of a phone call: ``phone`` (PhoneParams) is the far end's new media.
        ``answered: true``: its answer to our offer, which starts a pending call's media
        (400 unless pending); else (the default) a re-INVITE: a direction change (hold)
        keeps the leg, a new address, codec or key makes a new one."""
        answered = req.get("answered", False)
        if not isinstance(answered, bool):
            return error(400, "bad-request", "answered must be true or false")
        try:
            params = PhoneParams.from_json_untrusted(req.get("phone"))
            self._unindex_phone(phone)
            if answered:
                phone.answered(params, trio.current_time())
            else:
                phone.update(params, trio.current_time())
        except ValueError as exc:
            return error(400, "bad-params", str(exc))
        finally:
            if phone.state != "ended":
                self._index_phone(phone)
        self._start_recording(phone)  # its first pipeline, if it is to be recorded
        return {"ok": True, "state": phone.state}

    def _op_dtmf(self, req: dict[str, Any]) -> dict[str, Any]:
        """A call's DTMF: ``{"digit": "5", "duration_ms": 100}``, a SIP INFO digit for the
        agent; with ``"send": "123"`` instead, digits we send the far end (RFC 4733). Only a
        phone call has a leg that carries digits: a WebRTC call answers 409."""
        phone = self._find(req)
        if isinstance(phone, dict):
            return phone
        if isinstance(phone, Kept) or phone.state == "ended":
            return error(404, "unknown-session", f"session {phone.id!r} has ended")
        if not isinstance(phone, PhoneSession):
            return error(409, "no-dtmf-leg", f"session {phone.id!r} is a WebRTC call: it has "
                         "no DTMF leg (only a phone call sends or receives digits)")
        send = req.get("send")
        if send is not None:
            if not isinstance(send, str) or not 0 < len(send) <= 32:
                return error(400, "bad-request", "send must be 1..32 DTMF digits")
            try:
                phone.send_dtmf(trio.current_time(), send)
            except ValueError as exc:
                return error(400, "bad-request", str(exc))
            return {"ok": True}
        digit, ms = req.get("digit"), req.get("duration_ms", 100)
        if not isinstance(digit, str) or digit not in DIGITS:
            return error(400, "bad-request", "digit must be one of 0-9 * # A-D")
        if isinstance(ms, bool) or not isinstance(ms, int) or not 0 <= ms <= 60_000:
            ms = 100
        phone.dtmf_from_signaling(digit, ms)
        return {"ok": True}

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
