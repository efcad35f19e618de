"""What signaling knows and does: its configuration, and the session operations of the
HTTP API over the control channel (docs/control-protocol.md).

:class:`SignalingState` is put together from three parts, one responsibility each:

* :class:`~.registry.SessionRegistry` (registry.py) — the sessions signaling knows and
  their JSON (what ``GET /v1/sessions/{id}`` answers when the transceiver cannot);
* :class:`~.placement.Placement` (placement.py) — which transceiver gets the next create,
  creates in flight counted as load;
* :class:`~.health.ProcessHealth` (health.py) — the control endpoints, their liveness
  (told by the supervisor, or found out by polling) and readiness;
* :class:`~.call_events.CallEvents` (call_events.py) — how every call's end is heard (the
  transceivers' ``events`` long-poll).

What is left here is the I/O between them: each operation asks a transceiver over its
control client and hands the answer to the registry. Anything the HTTP layer should answer
is raised as a :class:`~.problems.Problem`.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from .. import recordings
from ..control import ControlError, check_params
from .admission import LIMIT, PRIOR_COST, Admission
from .call_events import CallEvents
from .geo import IngressChoice, IngressMap
from .health import POLL_TIMEOUT, Endpoint, ProcessHealth
from .ice_servers import TurnAdvert
from .placement import Placement, Refused
from .problems import Problem, from_control
from .proxied import RealClients
from .registry import LOST, SESSION_ID, SessionRecord, SessionRegistry, new_etag
from .sip_config import SipSettings
from .tokens import ClientTokens
from .webhooks import Endpoint as WebhookEndpoint
from .webhooks import Webhooks

log = logging.getLogger(__name__)


@dataclass
class SignalingConfig:
    """Everything the HTTP API needs; built by the ``signaling`` CLI or the supervisor."""

    http: tuple[str, int] = ("127.0.0.1", 8080)
    transceivers: Mapping[int, str] = field(default_factory=dict)  # id -> control address
    relays: Mapping[str, str] = field(default_factory=dict)  # worker name -> control address
    public_addresses: list[str] = field(default_factory=lambda: ["127.0.0.1"])
    udp_port: int = 3478
    #: the relays' public ICE-TCP port (RFC 6544 passive candidates beside the UDP ones, the
    #: same addresses); None: UDP only. Behind a load balancer, the port clients reach.
    tcp_port: int | None = None
    #: a second UDP port on the same addresses, answered as a lower-priority host candidate
    #: after each UDP one: what TURN clients relay to when ``udp_port`` is below 1024, which
    #: Chromium will not relay to (issue 40 item 2; docs/turn.md). None: no such candidate.
    relayed_media_port: int | None = None
    api_token: str | None = None
    auth_required: bool | None = None  # None: decided by the bind address (loopback = no)
    #: where the relays splice HTTPS from the media port (``--relay-https``, proxied.py):
    #: connections open with a PROXY v2 header naming the real client. None: not served.
    relay_https: tuple[str, int] | None = None
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
    realtime_agent: str = "realtime"  # the agent of /v1/realtime/calls (appliance/signaling/realtime_http.py)
    live_agent: str = "assistant"  # the agent of GET /v1/live/sessions (signaling/live_ws.py)
    # Admission (admission.py, issue 23): busy share admitted up to, prior call cost.
    admission_limit: float = LIMIT
    admission_call_cost: float = PRIOR_COST
    # Webhooks (webhooks.py): the endpoints, and how often live calls are checked for an end.
    webhooks: list[WebhookEndpoint] = field(default_factory=list)
    #: where the transceivers write call recordings (appliance up: <state dir>/recordings;
    #: None: GET …/recording answers 404), served by realtime_http.py
    recordings_dir: Path | None = None
    #: the quota and retention of the recordings signaling writes itself (a stored GPT-Live
    #: WebSocket session), the transceivers' --recording-quota / --recording-retention
    recording_quota: int = recordings.DEFAULT_QUOTA
    recording_retention: float = recordings.DEFAULT_RETENTION
    sip: SipSettings | None = None  # --sip: phone calls (sip_server.py); None: off
    #: the relays' TURN servers and the secret to mint their credentials with
    #: (ice_servers.py); None: no TURN advertised (--no-turn, or no secret known)
    turn: TurnAdvert | None = None

    def requires_auth(self) -> bool:
        """A token is needed even from a client on this host (a non-loopback bind, or
        forced). Otherwise only a request whose real client is elsewhere needs one
        (rules.authorize_header, proxied.py)."""
        if self.auth_required is not None:
            return self.auth_required
        return not is_loopback(self.http[0])

    def reachable_from_elsewhere(self) -> bool:
        """Clients on other hosts can reach the API: it must have a token to ask them for."""
        return self.requires_auth() or self.relay_https is not None


@functools.lru_cache(maxsize=64)
def is_loopback(host: str) -> bool:
    """Cached: asked on every request (``requires_auth``) for the same bind address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
        #: open relay hops -> real clients (proxied.py; filled by serve_relay_https)
        self.real_clients = RealClients()
        self.api_token = config.api_token
        self.registry = SessionRegistry(clock)
        self.health = ProcessHealth(
            config.transceivers, config.relays, control_timeout=config.control_timeout,
            managed=config.managed, clock=clock,
            on_transceiver_lost=self.registry.transceiver_lost,
        )
        self.placement = Placement(self.health.transceivers)
        self.admission = Admission(self.health.transceivers, self.placement.placing,
                                   limit=config.admission_limit,
                                   prior_cost=config.admission_call_cost)
        self.health.observer = self.admission
        self.http_responses: dict[int, int] = {}
        self.ingress_picks: dict[str, int] = {}  # region ("" = default) -> answers
        self.webhooks = Webhooks(list(config.webhooks), clock=clock)
        #: how every call's end is heard: the transceivers' ``events`` (call_events.py)
        self.call_events = CallEvents(self.registry, self.health, lambda: self.clock())
        #: hang up a phone call (sip_http.py sets it): DELETE /v1/sessions/{id} of one
        self.hang_up_phone: Callable[[str], None] | None = None

    # -- the parts, as the HTTP layer and the supervisor see them ------------------------

    @property
    def sessions(self) -> dict[str, SessionRecord]:
        return self.registry.sessions

    @property
    def transceivers(self) -> dict[int, Endpoint]:
        return self.health.transceivers

    @property
    def relays(self) -> dict[str, Endpoint]:
        return self.health.relays

    @property
    def supervisor_info(self) -> dict[str, Any]:
        return self.health.supervisor_info

    @supervisor_info.setter
    def supervisor_info(self, info: dict[str, Any]) -> None:
        self.health.supervisor_info = info

    def endpoints(self) -> list[Endpoint]:
        return self.health.endpoints()

    def process_info(self, role: str, key: str, **info: Any) -> None:
        self.health.process_info(role, key, **info)

    def process_up(self, role: str, key: str) -> None:
        self.health.process_up(role, key)

    async def process_down(self, role: str, key: str, reason: str = "process exited") -> None:
        await self.health.process_down(role, key, reason)

    async def refresh(self) -> None:
        await self.health.refresh()

    async def ready(self) -> tuple[bool, dict[str, Any]]:
        """Ready when a transceiver and a relay answer (health.py) *and* some answering
        transceiver has headroom for one more call: a load balancer stops sending to a
        signaling whose every transceiver is full (issue 23)."""
        ok, detail = await self.health.ready()
        answering = detail.get("transceivers", [])
        full = [k for k in answering if not self.admission.admits(int(k))]
        if full:  # (absent when none is: the body stays what it was before admission)
            detail["full"] = full
        if ok and answering and len(full) == len(answering):
            ok = False
            detail["reason"] = "overloaded"
        # The headroom admission decides on, per answering transceiver (issue 32).
        detail["headroom"] = {k: self.admission.view(int(k)) for k in answering}
        return ok, detail

    def health_view(self) -> list[dict[str, Any]]:
        view = self.health.health_view()
        for p in view:  # each transceiver's admission figures beside its load
            if p.get("role") == "transceiver":
                p["admission"] = self.admission.view(int(p["id"]))
        return view

    def lookup(self, sid: str) -> SessionRecord:
        return self.registry.lookup(sid)

    def pick_order(self) -> list[int]:
        """Up transceivers, best placement first (placement.py)."""
        return self.placement.order(self.health.up_transceivers(), self.registry.active_counts())

    # -- ingress --------------------------------------------------------------------------

    def candidates(self) -> list[list[Any]]:
        """The default candidates: every public address with the relays' UDP port, then
        (lower priority: the answer ranks candidates in this order) with the relayed-media
        port when there is one."""
        out = [[addr, self.config.udp_port] for addr in self.config.public_addresses]
        if self.config.relayed_media_port is not None:
            out += [[addr, self.config.relayed_media_port]
                    for addr in self.config.public_addresses]
        return out

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

    # -- operations (raise Problem for anything the HTTP layer should answer) ----------------

    async def create_session(
        self,
        offer: str,
        agent: str | None,
        owner: str | None,
        *,
        ingress: IngressChoice | None = None,
        params: Callable[[str], dict[str, Any]] | None = None,
        id_prefix: str = "",
    ) -> tuple[SessionRecord, str]:
        """Create a session on the best transceiver that takes it. ``params(session_id)``
        gives the per-call parameters the agent sees as ``ctx.params`` (a function, since
        each attempt mints its own id; size-capped by control.check_params); ``id_prefix``
        starts the id (``"rtc_"`` for a realtime call)."""
        candidates = (
            self.candidates() if ingress is None else [[h, p] for h, p in ingress.candidates]
        )
        order = self.pick_order()
        if not order:
            raise Problem(503, "no-transceiver", "no transceiver is available", {"Retry-After": "1"})
        # Admission (admission.py): only where one more call fits, decided before any
        # create is sent; no await between this and in_flight() below, so a burst of
        # POSTs sees each other's placements.
        order = [k for k in order if self.admission.admits(k, agent)]
        if not order:
            self.admission.refused += 1
            raise Problem(503, "overloaded", "every transceiver is at capacity: retry later",
                          {"Retry-After": str(self.admission.retry_after)})
        tcp = {} if self.config.tcp_port is None else {
            "tcp_candidates": [[h, self.config.tcp_port]
                               for h in dict.fromkeys(h for h, _ in candidates)]}

        def build(k: int) -> dict[str, Any]:
            sid = id_prefix + secrets.token_urlsafe(12)  # each attempt its own id
            req: dict[str, Any] = {"op": "create", "session_id": sid, "offer": offer,
                                   "agent": agent, "candidates": candidates, **tcp}
            if params is not None:
                try:
                    req["params"] = check_params(params(sid))
                except ValueError as exc:
                    raise Problem(400, "bad-params", str(exc)) from None
            return req

        got = await self.placement.place(order, admits=lambda k: self.admission.admits(k, agent),
                                         peers=self.health.transceivers, build=build)
        if isinstance(got, Refused):
            if not got.tried:  # every admitted one filled up meanwhile
                self.admission.refused += 1
                raise Problem(503, "overloaded", "every transceiver is at capacity: retry later",
                              {"Retry-After": str(self.admission.retry_after)})
            last = got.tried[-1]
            if last is None:
                raise Problem(503, "no-transceiver", "no transceiver answered", {"Retry-After": "1"})
            problem = from_control(last)  # draining, full or overloaded
            problem.headers.setdefault("Retry-After", str(self.admission.retry_after))
            raise problem
        k, resp, sid = got.k, got.response, got.request["session_id"]
        if not resp.get("ok"):
            raise from_control(resp)
        answer = resp.get("answer")
        if not isinstance(answer, str) or not answer:
            raise Problem(502, "bad-transceiver-answer", f"transceiver {k} returned no SDP answer")
        self.admission.placed(k)
        rec = SessionRecord(
            id=sid,
            transceiver=k,
            etag=new_etag(),
            created_at=self.clock(),
            created_mono=trio.current_time(),
            owner=owner,
            agent=agent,
        )
        self.registry.add(rec)
        self.call_events.placed(k)
        if ingress is not None and ingress.region is not None:
            log.info("session %s created on transceiver %s, ingress %s (by %s)",
                     sid, k, ingress.region, ingress.reason)
        else:
            log.info("session %s created on transceiver %s", sid, k)
        return rec, answer

    def _live_endpoint(self, rec: SessionRecord) -> Endpoint:
        if rec.ended:
            raise Problem(404, "session-ended", f"session {rec.id} has ended ({rec.end_reason})")
        ep = self.health.transceivers.get(rec.transceiver)
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
        if rec.kind == "phone":
            raise Problem(409, "phone-call", f"{rec.id} is a phone call: it has no ICE to patch")
        ep = self._live_endpoint(rec)
        resp = await self._call(ep, {"op": "patch", "session_id": rec.id, "sdpfrag": sdpfrag})
        answer = resp.get("sdpfrag") or ""
        return answer if isinstance(answer, str) else ""

    async def delete_session(self, rec: SessionRecord, reason: str = "deleted") -> None:
        """End the session; if its transceiver had already ended it (consent timeout, the
        agent hung up, ...), the record keeps the transceiver's reason and time, not ours.
        A phone call is hung up as ``…/hangup`` would (a BYE): its record ends when the
        transceiver's ``events`` say so."""
        if rec.kind == "phone":
            self._live_endpoint(rec)  # 404 session-ended when it is over
            if self.hang_up_phone is None:
                raise Problem(409, "phone-call", f"{rec.id} is a phone call and SIP is off")
            self.hang_up_phone(rec.id)
            return
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
        if not SESSION_ID.match(sid):
            raise Problem(404, "unknown-session", f"no session {sid!r}")
        rec = self.registry.sessions.get(sid)
        candidates = [rec.transceiver] if rec is not None else list(self.health.transceivers)
        if rec is not None and rec.ended:
            return rec.view()
        for k in candidates:
            ep = self.health.transceivers.get(k)
            if ep is None or not ep.up:
                continue
            try:
                with trio.move_on_after(POLL_TIMEOUT):
                    resp = await ep.client.request({"op": "get", "session_id": sid})
                    if resp.get("ok") and isinstance(resp.get("session"), dict):
                        obj: dict[str, Any] = resp["session"]
                        rec = rec or self.registry.adopt(obj, k)
                        if rec is not None:
                            self.registry.observe(rec, obj)
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
            for k, ep in self.health.transceivers.items():
                if ep.up:
                    nursery.start_soon(one, k, ep)

        self.registry.purge()
        for k, objs in answered.items():
            self.registry.reconcile(k, objs, asked_at=started)
        return self.registry.views()

    async def aclose(self) -> None:
        await self.health.aclose()
