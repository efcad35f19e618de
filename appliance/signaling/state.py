"""What signaling knows: the control endpoints, the session registry, tokens and health.

Signaling owns no WebRTC state. The registry remembers, per session id it minted, which
transceiver owns it, the current ETag (RFC 9725 §4.3), who may change it (client-token
``jti``), and the last session object a transceiver reported, so a session whose transceiver
died can still be listed, as ended with reason ``"transceiver lost"``.

Endpoints are believed up until proven otherwise: under ``appliance up`` the supervisor flips
them (:meth:`SignalingState.process_down` / :meth:`SignalingState.process_up`) as children
die and come back; run alone, :meth:`SignalingState.refresh` does it after
:data:`LOST_AFTER` consecutive failed polls.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from ..control import ControlClient, ControlError
from .geo import IngressChoice, IngressMap
from .metrics import Histogram
from .problems import Problem, from_control
from .tokens import ClientTokens

log = logging.getLogger(__name__)

# Setup steps whose latency goes into the histogram (timeline keys of docs/control-protocol.md).
SETUP_STEPS = ("answer_sent", "ice_nominated", "dtls_done", "first_rtp_in", "first_rtp_out")
MAX_RECORDS = 10_000  # bounded memory: ended sessions are forgotten oldest first past this
ENDED_RETENTION = 3600.0  # seconds an ended session stays listed
PURGE_EVERY = 1.0  # seconds between retention sweeps (a sweep walks every record)
_SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
POLL_TIMEOUT = 1.0  # a stats/list poll that takes longer counts as a failure
LOST_AFTER = 3  # consecutive failed polls before a standalone signaling gives up on a peer
LOST = "transceiver lost"


@dataclass
class SignalingConfig:
    """Everything the HTTP API needs; built by the ``signaling`` CLI or the supervisor."""

    http: tuple[str, int] = ("127.0.0.1", 8080)
    transceivers: Mapping[int, str] = field(default_factory=dict)  # id -> control address
    relays: Mapping[str, str] = field(default_factory=dict)  # worker name -> control address
    public_addresses: list[str] = field(default_factory=lambda: ["127.0.0.1"])
    udp_port: int = 3478
    api_token: str | None = None
    auth_required: bool | None = None  # None: decided by the bind address (loopback = no)
    tls_cert: str | None = None
    tls_key: str | None = None
    webui_dir: Path | None = None
    max_body: int = 64 * 1024
    body_timeout: float = 10.0  # seconds for a request body to arrive in full (else 408)
    client_token_ttl: float = 600.0
    client_token_max_ttl: float = 3600.0
    control_timeout: float = 5.0
    managed: bool = False  # True under the supervisor: it, not polling, decides who is lost
    events_interval: float = 1.0
    ingress: IngressMap = field(default_factory=IngressMap)  # geo-steered ingress (geo.py)

    def requires_auth(self) -> bool:
        if self.auth_required is not None:
            return self.auth_required
        return not is_loopback(self.http[0])


@functools.lru_cache(maxsize=64)
def is_loopback(host: str) -> bool:
    """Cached: asked on every request (``requires_auth``) for the same bind address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class Endpoint:
    """One control peer (a transceiver or a relay worker) and what we last heard from it."""

    role: str
    key: str
    address: str
    client: ControlClient
    up: bool = True
    failures: int = 0
    last_ok: float | None = None  # trio time
    last_error: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    process: dict[str, Any] = field(default_factory=dict)  # pid/restarts from the supervisor

    def view(self, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": self.role,
            "id": self.key,
            "control": self.address,
            "up": self.up,
            "answering": self.failures == 0 and self.last_ok is not None,
            "last_ok_age_s": None if self.last_ok is None else round(now - self.last_ok, 3),
            "error": self.last_error,
            "counters": self.stats.get("counters", {}),
        }
        if "sessions_by_state" in self.stats:
            out["sessions_by_state"] = self.stats["sessions_by_state"]
        if "flows" in self.stats:
            out["flows"] = self.stats["flows"]
        out.update(self.process)
        return out


@dataclass
class SessionRecord:
    id: str
    transceiver: int
    etag: str
    created_at: float  # Unix seconds (state clock)
    created_mono: float  # trio time, to order against in-flight list polls
    owner: str | None = None  # jti of the client token that created it
    agent: str | None = None
    ended_at: float | None = None
    end_reason: str | None = None
    last: dict[str, Any] | None = None
    observed: set[str] = field(default_factory=set)

    @property
    def ended(self) -> bool:
        return self.end_reason is not None

    def view(self) -> dict[str, Any]:
        """The session object from what signaling remembers (used when the transceiver
        cannot tell us any more)."""
        base: dict[str, Any] = {
            "id": self.id,
            "state": "new",
            "end_reason": None,
            "transceiver": self.transceiver,
            "agent": self.agent,
            "client_address": None,
            "relay_flow": None,
            "codec": None,
            "created_at": self.created_at,
            "ended_at": None,
            "packets_in": 0,
            "packets_out": 0,
            "bytes_in": 0,
            "bytes_out": 0,
            "rtt_ms": None,
            "jitter_ms": None,
            "loss": None,
            "timeline": {},
        }
        if self.last:
            base.update(self.last)
        if self.ended:
            base.update(state="ended", end_reason=self.end_reason, ended_at=self.ended_at)
        return base


def new_etag() -> str:
    return f'"{secrets.token_hex(8)}"'


def etag_matches(if_match: str, etag: str) -> bool:
    """RFC 9110 §13.1.1: ``*`` matches any current representation; otherwise a list of
    entity-tags compared strongly (a weak ``W/`` tag never matches)."""
    value = if_match.strip()
    if value == "*":
        return True
    return any(tag.strip() == etag for tag in value.split(","))


class SignalingState:
    def __init__(
        self,
        config: SignalingConfig,
        *,
        clock: Callable[[], float] = time.time,
        token_key: bytes | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.tokens = ClientTokens(token_key)
        self.api_token = config.api_token
        self.started_at = clock()
        self.transceivers: dict[int, Endpoint] = {
            int(k): Endpoint("transceiver", str(k), a, ControlClient(a, timeout=config.control_timeout))
            for k, a in sorted(config.transceivers.items())
        }
        self.relays: dict[str, Endpoint] = {
            str(k): Endpoint("relay", str(k), a, ControlClient(a, timeout=config.control_timeout))
            for k, a in sorted(config.relays.items())
        }
        self.sessions: dict[str, SessionRecord] = {}
        # Records not known to have ended, so placing a session does not walk the whole
        # registry (up to MAX_RECORDS, mostly ended); ended ones are dropped lazily.
        self._live: dict[str, SessionRecord] = {}
        self._purged_at = -math.inf
        self.assigned: dict[int, int] = dict.fromkeys(self.transceivers, 0)
        # Creates sent to each transceiver and not answered yet. A burst of POSTs (20 callers
        # at once) is placed before any answer comes back: counted only once answered, every
        # one of them saw the same loads and went to the same transceiver, which then set up
        # all 20 on its one core while the other idled (docs/performance.md, "Setup time").
        self.placing: dict[int, int] = dict.fromkeys(self.transceivers, 0)
        self.setup_hist = {step: Histogram() for step in SETUP_STEPS}
        self.sessions_lost = 0
        self.http_responses: dict[int, int] = {}
        self.supervisor_info: dict[str, Any] = {}
        self.ingress_picks: dict[str, int] = {}  # region ("" = default) -> answers

    # -- endpoints ------------------------------------------------------------------------

    def endpoints(self) -> list[Endpoint]:
        return [*self.transceivers.values(), *self.relays.values()]

    def candidates(self) -> list[list[Any]]:
        """The default candidates: every public address with the relays' UDP port."""
        return [[addr, self.config.udp_port] for addr in self.config.public_addresses]

    def pick_ingress(
        self, *, peer: str | None, forwarded_for: list[str], region: str | None
    ) -> IngressChoice:
        """The relay ingress to advertise for a request (geo.py); the default candidates
        when no geo map is configured or nothing in it matches."""
        default = [(str(a), int(p)) for a, p in self.candidates()]
        choice = self.config.ingress.pick(default, peer=peer, forwarded_for=forwarded_for,
                                          region=region)
        self.ingress_picks[choice.region or ""] = self.ingress_picks.get(choice.region or "", 0) + 1
        return choice

    def process_info(self, role: str, key: str, **info: Any) -> None:
        """The supervisor reports pid, restarts, state of the child behind an endpoint."""
        ep = self.transceivers.get(int(key)) if role == "transceiver" else self.relays.get(key)
        if ep is not None:
            ep.process.update(info)

    def process_up(self, role: str, key: str) -> None:
        ep = self.transceivers.get(int(key)) if role == "transceiver" else self.relays.get(key)
        if ep is not None:
            ep.up = True
            ep.failures = 0
            ep.last_error = None

    async def process_down(self, role: str, key: str, reason: str = "process exited") -> None:
        """A child is gone: stop routing to it and, for a transceiver, end its sessions."""
        ep = self.transceivers.get(int(key)) if role == "transceiver" else self.relays.get(key)
        if ep is None:
            return
        ep.up = False
        ep.last_error = reason
        ep.stats = {}
        await ep.client.aclose()  # the next request reconnects to the new process
        if role == "transceiver":
            self.transceiver_lost(int(key))

    def transceiver_lost(self, k: int) -> int:
        """Mark every live session of transceiver ``k`` ended, reason "transceiver lost"."""
        now = self.clock()
        n = 0
        for rec in self.sessions.values():
            if rec.transceiver == k and not rec.ended:
                rec.ended_at, rec.end_reason = now, LOST
                n += 1
        if n:
            self.sessions_lost += n
            log.warning("transceiver %s lost: %d session(s) ended", k, n)
        return n

    # -- registry ---------------------------------------------------------------------------

    def active_counts(self) -> dict[int, int]:
        """Live sessions per transceiver, from the live index (pruned as it is walked)."""
        counts: dict[int, int] = {}
        for sid in [sid for sid, r in self._live.items() if r.ended or self.sessions.get(sid) is not r]:
            del self._live[sid]
        for r in self._live.values():
            if (r.last or {}).get("state") != "ended":
                counts[r.transceiver] = counts.get(r.transceiver, 0) + 1
        return counts

    def pick_order(self) -> list[int]:
        """Live transceivers, least loaded first (then fewest ever assigned, so equal loads
        alternate). A create still in flight counts as load: concurrent POSTs spread."""
        live = [k for k, ep in self.transceivers.items() if ep.up]
        active = self.active_counts()
        placing = self.placing
        return sorted(live, key=lambda k: (active.get(k, 0) + placing.get(k, 0),
                                           self.assigned.get(k, 0), k))

    def _add(self, rec: SessionRecord) -> None:
        self.sessions[rec.id] = rec
        if not rec.ended:
            self._live[rec.id] = rec
        self.purge(force=False)
        if len(self.sessions) > MAX_RECORDS:
            # Forget the oldest ended records down to 90 % of the cap, so the sort runs once
            # per MAX_RECORDS/10 new sessions rather than on every one at the cap.
            ended = sorted((r for r in self.sessions.values() if r.ended), key=lambda r: r.created_at)
            for r in ended[: len(self.sessions) - MAX_RECORDS * 9 // 10]:
                del self.sessions[r.id]

    def purge(self, *, force: bool = True) -> None:
        """Forget sessions that ended more than :data:`ENDED_RETENTION` seconds ago. Every
        record is looked at, so when a session is added (``force=False``) it runs at most
        every :data:`PURGE_EVERY` s: retention is an hour, a second more does not matter."""
        now = self.clock()
        if not force and now - self._purged_at < PURGE_EVERY:
            return
        self._purged_at = now
        horizon = now - ENDED_RETENTION
        for sid in [s for s, r in self.sessions.items() if r.ended and (r.ended_at or 0) < horizon]:
            del self.sessions[sid]

    def _adopt(self, obj: dict[str, Any], k: int) -> SessionRecord | None:
        """A session a transceiver knows but we do not (signaling restarted): remember it."""
        sid = obj.get("id")
        if not isinstance(sid, str):
            return None
        created = obj.get("created_at")
        rec = SessionRecord(
            id=sid,
            transceiver=k,
            etag=new_etag(),
            created_at=float(created) if isinstance(created, int | float) else self.clock(),
            created_mono=trio.current_time(),
            agent=obj.get("agent") if isinstance(obj.get("agent"), str) else None,
        )
        self._add(rec)
        return rec

    def _observe(self, rec: SessionRecord, obj: dict[str, Any]) -> None:
        rec.last = obj
        if obj.get("state") == "ended" and not rec.ended:
            rec.end_reason = str(obj.get("end_reason") or "ended")
            ended_at = obj.get("ended_at")
            rec.ended_at = float(ended_at) if isinstance(ended_at, int | float) else self.clock()
        timeline = obj.get("timeline")
        if not isinstance(timeline, dict):
            return
        for step in SETUP_STEPS:
            ms = timeline.get(step)
            if step in rec.observed or not isinstance(ms, int | float) or not math.isfinite(ms):
                continue
            rec.observed.add(step)
            self.setup_hist[step].observe(max(0.0, float(ms)) / 1000.0)

    # -- operations (raise Problem for anything the HTTP layer should answer) ----------------

    async def create_session(
        self,
        offer: str,
        agent: str | None,
        owner: str | None,
        *,
        ingress: IngressChoice | None = None,
    ) -> tuple[SessionRecord, str]:
        candidates = (
            self.candidates() if ingress is None else [[h, p] for h, p in ingress.candidates]
        )
        order = self.pick_order()
        if not order:
            raise Problem(503, "no-transceiver", "no transceiver is available", {"Retry-After": "1"})
        last: Problem | None = None
        for k in order:
            ep = self.transceivers[k]
            sid = secrets.token_urlsafe(12)
            req = {
                "op": "create",
                "session_id": sid,
                "offer": offer,
                "agent": agent,
                "candidates": candidates,
            }
            self.placing[k] = self.placing.get(k, 0) + 1
            try:
                resp = await ep.client.request(req)
            except ControlError as exc:
                log.warning("transceiver %s did not answer create: %s", k, exc)
                ep.last_error = str(exc)
                last = Problem(503, "no-transceiver", "no transceiver answered", {"Retry-After": "1"})
                continue
            finally:
                self.placing[k] -= 1
            if not resp.get("ok"):
                problem = from_control(resp)
                if problem.status == 503:  # draining or full: another one may take it
                    last = problem
                    continue
                raise problem
            answer = resp.get("answer")
            if not isinstance(answer, str) or not answer:
                raise Problem(502, "bad-transceiver-answer", f"transceiver {k} returned no SDP answer")
            self.assigned[k] = self.assigned.get(k, 0) + 1
            rec = SessionRecord(
                id=sid,
                transceiver=k,
                etag=new_etag(),
                created_at=self.clock(),
                created_mono=trio.current_time(),
                owner=owner,
                agent=agent,
            )
            self._add(rec)
            if ingress is not None and ingress.region is not None:
                log.info("session %s created on transceiver %s, ingress %s (by %s)",
                         sid, k, ingress.region, ingress.reason)
            else:
                log.info("session %s created on transceiver %s", sid, k)
            return rec, answer
        assert last is not None
        raise last

    def lookup(self, sid: str) -> SessionRecord:
        rec = self.sessions.get(sid) if _SESSION_ID.match(sid) else None
        if rec is None:
            raise Problem(404, "unknown-session", f"no session {sid!r}")
        return rec

    def _live_endpoint(self, rec: SessionRecord) -> Endpoint:
        if rec.ended:
            raise Problem(404, "session-ended", f"session {rec.id} has ended ({rec.end_reason})")
        ep = self.transceivers.get(rec.transceiver)
        if ep is None:
            raise Problem(404, "session-ended", f"session {rec.id} has ended ({LOST})")
        return ep

    async def _call(self, ep: Endpoint, req: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = await ep.client.request(req)
        except ControlError as exc:
            ep.last_error = str(exc)
            raise Problem(
                503, "transceiver-unavailable", f"transceiver {ep.key} did not answer",
                {"Retry-After": "1"},
            ) from exc
        if not resp.get("ok"):
            raise from_control(resp)
        return resp

    async def patch_session(self, rec: SessionRecord, sdpfrag: str) -> str:
        ep = self._live_endpoint(rec)
        resp = await self._call(ep, {"op": "patch", "session_id": rec.id, "sdpfrag": sdpfrag})
        answer = resp.get("sdpfrag") or ""
        return answer if isinstance(answer, str) else ""

    async def delete_session(self, rec: SessionRecord, reason: str = "deleted") -> None:
        """End the session; if its transceiver had already ended it (consent timeout, the
        agent hung up, ...), the record keeps the transceiver's reason and time, not ours."""
        ep = self._live_endpoint(rec)
        ended_at: Any = None
        try:
            resp = await self._call(ep, {"op": "delete", "session_id": rec.id, "reason": reason})
            # The transceiver answers with the session's end_reason/ended_at after the delete:
            # ours if it ended it now, the earlier one if it had already ended.
            if isinstance(resp.get("end_reason"), str) and resp["end_reason"]:
                reason, ended_at = resp["end_reason"], resp.get("ended_at")
        except Problem as p:
            if p.status != 404:
                raise
            # The transceiver ended it and has already forgotten it: keep what we last saw
            # of it, else say so as a list poll would ("gone"), not "deleted".
            last = rec.last or {}
            if last.get("state") == "ended" and last.get("end_reason"):
                reason, ended_at = str(last["end_reason"]), last.get("ended_at")
            else:
                reason = "gone"
        rec.end_reason = reason
        rec.ended_at = float(ended_at) if isinstance(ended_at, int | float) else self.clock()
        log.info("session %s deleted (%s)", rec.id, reason)

    async def get_session(self, sid: str) -> dict[str, Any]:
        if not _SESSION_ID.match(sid):
            raise Problem(404, "unknown-session", f"no session {sid!r}")
        rec = self.sessions.get(sid)
        candidates = [rec.transceiver] if rec is not None else list(self.transceivers)
        if rec is not None and rec.ended:
            return rec.view()
        for k in candidates:
            ep = self.transceivers.get(k)
            if ep is None or not ep.up:
                continue
            try:
                with trio.move_on_after(POLL_TIMEOUT):
                    resp = await ep.client.request({"op": "get", "session_id": sid})
                    if resp.get("ok") and isinstance(resp.get("session"), dict):
                        obj: dict[str, Any] = resp["session"]
                        rec = rec or self._adopt(obj, k)
                        if rec is not None:
                            self._observe(rec, obj)
                            return rec.view()
                        return obj
            except ControlError:
                continue
        if rec is None:
            raise Problem(404, "unknown-session", f"no session {sid!r}")
        return rec.view()  # its transceiver did not answer in time: the last thing we knew

    async def list_sessions(self) -> list[dict[str, Any]]:
        started = trio.current_time()
        answered: dict[int, list[dict[str, Any]]] = {}

        async def one(k: int, ep: Endpoint) -> None:
            with trio.move_on_after(POLL_TIMEOUT):
                try:
                    resp = await ep.client.request({"op": "list"})
                except ControlError:
                    return
                sessions = resp.get("sessions")
                if resp.get("ok") and isinstance(sessions, list):
                    answered[k] = [s for s in sessions if isinstance(s, dict)]

        async with trio.open_nursery() as nursery:
            for k, ep in self.transceivers.items():
                if ep.up:
                    nursery.start_soon(one, k, ep)

        self.purge()
        now = self.clock()
        for k, objs in answered.items():
            seen = set()
            for obj in objs:
                sid = obj.get("id")
                rec = self.sessions.get(sid) if isinstance(sid, str) else None
                if rec is None:
                    rec = self._adopt(obj, k)
                if rec is not None:
                    self._observe(rec, obj)
                    seen.add(rec.id)
            # A live record its transceiver no longer lists (and which existed before we
            # asked) was purged there: it has ended, whatever the reason was.
            for rec in self.sessions.values():
                if (
                    rec.transceiver == k
                    and not rec.ended
                    and rec.id not in seen
                    and rec.created_mono < started
                ):
                    rec.ended_at, rec.end_reason = now, "gone"
        return [r.view() for r in sorted(self.sessions.values(), key=lambda r: r.created_at)]

    # -- health -------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Poll every endpoint's ``stats`` once (bounded by :data:`POLL_TIMEOUT`)."""

        async def one(ep: Endpoint) -> None:
            ok = False
            with trio.move_on_after(POLL_TIMEOUT):
                try:
                    resp = await ep.client.request({"op": "stats"})
                    ok = bool(resp.get("ok"))
                    if ok:
                        ep.stats = {k: v for k, v in resp.items() if k != "ok"}
                    else:
                        ep.last_error = str(resp.get("detail"))
                except ControlError as exc:
                    ep.last_error = str(exc)
            if ok:
                if not ep.up and not self.config.managed:
                    log.info("%s %s answers again", ep.role, ep.key)
                    ep.up = True
                ep.failures, ep.last_ok, ep.last_error = 0, trio.current_time(), None
                return
            if ep.last_error is None:
                ep.last_error = f"no answer within {POLL_TIMEOUT:.1f} s"
            ep.failures += 1
            if not self.config.managed and ep.up and ep.failures >= LOST_AFTER:
                log.warning("%s %s stopped answering: %s", ep.role, ep.key, ep.last_error)
                ep.up = False
                if ep.role == "transceiver":
                    self.transceiver_lost(int(ep.key))

        async with trio.open_nursery() as nursery:
            for ep in self.endpoints():
                nursery.start_soon(one, ep)

    async def ready(self) -> tuple[bool, dict[str, Any]]:
        """Ready when at least one transceiver and one relay worker answer ``stats`` now."""
        answering: dict[str, list[str]] = {"transceiver": [], "relay": []}

        async def one(ep: Endpoint) -> None:
            with trio.move_on_after(POLL_TIMEOUT):
                try:
                    resp = await ep.client.request({"op": "stats"})
                except ControlError:
                    return
                if resp.get("ok"):
                    answering[ep.role].append(ep.key)

        async with trio.open_nursery() as nursery:
            for ep in self.endpoints():
                if ep.up:
                    nursery.start_soon(one, ep)
        ok = bool(answering["transceiver"]) and bool(answering["relay"])
        return ok, {"transceivers": sorted(answering["transceiver"]), "relays": sorted(answering["relay"])}

    def health_view(self) -> list[dict[str, Any]]:
        now = trio.current_time()
        me: dict[str, Any] = {
            "role": "signaling",
            "id": "0",
            "up": True,
            "answering": True,
            "pid": os.getpid(),
            "uptime_s": round(self.clock() - self.started_at, 3),
        }
        me.update(self.supervisor_info)
        return [me, *(ep.view(now) for ep in self.endpoints())]

    async def aclose(self) -> None:
        for ep in self.endpoints():
            await ep.client.aclose()
