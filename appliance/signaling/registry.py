"""The session registry: which sessions signaling knows, and their JSON.

Signaling owns no WebRTC state. The registry remembers, per session id it minted (or
adopted from a transceiver after a restart of signaling), which transceiver owns it, the
current ETag (RFC 9725 §4.3), who may change it (client-token ``jti``), and the last session
object a transceiver reported, so a session whose transceiver died can still be listed, as
ended with reason ``"transceiver lost"``. It also takes the setup-time observations
(``appliance_session_setup_seconds``) from those objects, once per session and step, and
the turn waterfalls' (``appliance_turn_*_seconds``, :data:`TURN_SPANS`), once per turn.

No I/O here: the control-channel calls are state.py's; what they answer is handed in.
Memory is bounded: at most :data:`MAX_RECORDS` records (ended ones forgotten oldest first),
and ended sessions are forgotten :data:`ENDED_RETENTION` seconds after they ended.
"""

from __future__ import annotations

import logging
import math
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from appliance.session_info import SessionInfo

from .histogram import TURN_BUCKETS, Histogram
from .problems import Problem

# The name these log lines had before the registry left state.py (log filters key on it).
log = logging.getLogger("appliance.signaling.state")

# Setup steps whose latency goes into the histogram (timeline keys of docs/control-protocol.md).
SETUP_STEPS = ("answer_sent", "ice_nominated", "dtls_done", "first_rtp_in", "first_rtp_out")
#: The turn histograms (``appliance_turn_<name>_seconds``): name → the marks of a session
#: object's ``turns`` line it spans (session_info.py ``TURN_MARKS``; None: the end of turn,
#: 0 ms). Timed from the caller's end of speech — the VAD's pause — which is where a person
#: starts to wait, so ``first_sent`` is the pause a caller hears (issue 38 item 1 measures
#: the same from outside) and none of them is negative (a reply begun at a pause can have
#: its first token before the end of turn, never before the pause).
TURN_SPANS: dict[str, tuple[str, str | None]] = {
    "speech": ("speech_start_ms", "speech_end_ms"),
    "end_of_turn": ("speech_end_ms", None),
    "transcript": ("speech_end_ms", "transcript_ms"),
    "first_token": ("speech_end_ms", "first_token_ms"),
    "first_audio": ("speech_end_ms", "first_audio_ms"),
    "first_sent": ("speech_end_ms", "first_sent_ms"),
}
MAX_RECORDS = 10_000  # bounded memory: ended sessions are forgotten oldest first past this
ENDED_RETENTION = 3600.0  # seconds an ended session stays listed
PURGE_EVERY = 1.0  # seconds between retention sweeps (a sweep walks every record)
SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
LOST = "transceiver lost"


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
    turns_observed: int = 0  # the highest turn number taken into the turn histograms
    kind: str = "webrtc"  # or "phone" (session_info.KINDS): a SIP call, either direction

    @property
    def ended(self) -> bool:
        return self.end_reason is not None

    def view(self) -> dict[str, Any]:
        """The session object from what signaling remembers (used when the transceiver
        cannot tell us any more)."""
        # The one definition of the shape (appliance/session_info.py), nothing known yet.
        base = SessionInfo.placeholder(self.id, self.transceiver, self.created_at,
                                       self.agent).to_json()
        base["kind"] = self.kind
        if self.last:
            base.update(self.last)
        if self.ended:
            base.update(state="ended", end_reason=self.end_reason, ended_at=self.ended_at)
        return base


def turn_spans(line: dict[str, Any]) -> dict[str, float]:
    """A ``turns`` line's :data:`TURN_SPANS` in seconds, those whose marks it has (a turn
    cut short by the caller has no ``first_sent``; an agent may report fewer marks)."""
    def mark(key: str | None) -> float | None:
        if key is None:
            return 0.0
        value = line.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            return None
        return float(value) if math.isfinite(value) else None

    out: dict[str, float] = {}
    for name, (start, end) in TURN_SPANS.items():
        a, b = mark(start), mark(end)
        if a is not None and b is not None:
            out[name] = max(0.0, b - a) / 1000.0
    return out


def new_etag() -> str:
    return f'"{secrets.token_hex(8)}"'


def etag_matches(if_match: str, etag: str) -> bool:
    """RFC 9110 §13.1.1: ``*`` matches any current representation; otherwise a list of
    entity-tags compared strongly (a weak ``W/`` tag never matches)."""
    value = if_match.strip()
    if value == "*":
        return True
    return any(tag.strip() == etag for tag in value.split(","))


class SessionRegistry:
    """The records, the live index, retention, and the setup histograms."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.sessions: dict[str, SessionRecord] = {}
        # Records not known to have ended, so placing a session does not walk the whole
        # registry (up to MAX_RECORDS, mostly ended); ended ones are dropped lazily.
        self._live: dict[str, SessionRecord] = {}
        self._purged_at = -math.inf
        self.setup_hist = {step: Histogram() for step in SETUP_STEPS}
        self.turn_hist = {name: Histogram(TURN_BUCKETS) for name in TURN_SPANS}
        self.sessions_lost = 0

    def get(self, sid: str) -> SessionRecord | None:
        """The record of ``sid``, None for an unknown or malformed id."""
        return self.sessions.get(sid) if SESSION_ID.match(sid) else None

    def lookup(self, sid: str) -> SessionRecord:
        rec = self.get(sid)
        if rec is None:
            raise Problem(404, "unknown-session", f"no session {sid!r}")
        return rec

    def active_counts(self) -> dict[int, int]:
        """Live sessions per transceiver, from the live index (pruned as it is walked)."""
        counts: dict[int, int] = {}
        for sid in [sid for sid, r in self._live.items() if r.ended or self.sessions.get(sid) is not r]:
            del self._live[sid]
        for r in self._live.values():
            if (r.last or {}).get("state") != "ended":
                counts[r.transceiver] = counts.get(r.transceiver, 0) + 1
        return counts

    def add(self, rec: SessionRecord) -> None:
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

    def adopt(self, obj: dict[str, Any], k: int) -> SessionRecord | None:
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
            kind="phone" if obj.get("kind") == "phone" else "webrtc",
        )
        self.add(rec)
        return rec

    def observe(self, rec: SessionRecord, obj: dict[str, Any]) -> None:
        """What a transceiver last said of ``rec``: kept for its view, its end noted, each
        setup step's latency observed once."""
        rec.last = obj
        if obj.get("state") == "ended" and not rec.ended:
            rec.end_reason = str(obj.get("end_reason") or "ended")
            ended_at = obj.get("ended_at")
            rec.ended_at = float(ended_at) if isinstance(ended_at, int | float) else self.clock()
        self._observe_turns(rec, obj.get("turns"))
        timeline = obj.get("timeline")
        if not isinstance(timeline, dict):
            return
        for step in SETUP_STEPS:
            ms = timeline.get(step)
            if step in rec.observed or not isinstance(ms, int | float) or not math.isfinite(ms):
                continue
            rec.observed.add(step)
            self.setup_hist[step].observe(max(0.0, float(ms)) / 1000.0)

    def _observe_turns(self, rec: SessionRecord, turns: Any) -> None:
        """Each turn line not seen before (a higher ``turn`` number) into the histograms;
        a session object keeps its last 50, far more than can happen between two polls."""
        if not isinstance(turns, list):
            return
        seen = rec.turns_observed
        for line in turns:
            n = line.get("turn") if isinstance(line, dict) else None
            if not isinstance(n, int) or n <= seen:
                continue
            rec.turns_observed = max(rec.turns_observed, n)
            self.observe_turn(line)

    def observe_turn(self, line: dict[str, Any]) -> None:
        """One turn line (session_info.py ``turn_line``) into the turn histograms: a
        session object's (above), or a WebSocket session's, which signaling runs itself
        (realtime_ws.py, live_ws.py: no transceiver reports it)."""
        for name, seconds in turn_spans(line).items():
            self.turn_hist[name].observe(seconds)

    def reconcile(self, k: int, objs: Iterable[dict[str, Any]], *, asked_at: float) -> None:
        """Transceiver ``k`` listed ``objs`` for a poll sent at trio time ``asked_at``."""
        now = self.clock()
        seen = set()
        for obj in objs:
            sid = obj.get("id")
            rec = self.sessions.get(sid) if isinstance(sid, str) else None
            if rec is None:
                rec = self.adopt(obj, k)
            if rec is not None:
                self.observe(rec, obj)
                seen.add(rec.id)
        # A live record its transceiver no longer lists (and which existed before we
        # asked) was purged there: it has ended, whatever the reason was.
        for rec in self.sessions.values():
            if (
                rec.transceiver == k
                and not rec.ended
                and rec.id not in seen
                and rec.created_mono < asked_at
            ):
                rec.ended_at, rec.end_reason = now, "gone"

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

    def views(self) -> list[dict[str, Any]]:
        """Every record's session object, oldest first (``GET /v1/sessions``)."""
        return [r.view() for r in sorted(self.sessions.values(), key=lambda r: r.created_at)]
