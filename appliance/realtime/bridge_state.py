"""The pure parts of the upstream Realtime bridge (:mod:`appliance.realtime.bridge`): the
``realtime+ws(s)://`` spec and where its key comes from, the playout ledger that knows what
was played, and the event helpers. No I/O here except reading the key (env or file)."""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..agents.context import SAMPLE_RATE
from ..agents.loader import AgentError
from ..logs import loggable_url

log = logging.getLogger("appliance.realtime.bridge")

SCHEMES = ("realtime+wss", "realtime+ws")
UPSTREAM_RATE = 24_000  # GA ``audio/pcm``: PCM16 LE mono, rate always 24000
PCM_FORMAT: dict[str, Any] = {"type": "audio/pcm", "rate": UPSTREAM_RATE}
KEY_ENV = "APPLIANCE_REALTIME_KEY"
KEY_FILE_ENV = "APPLIANCE_REALTIME_KEY_FILE"
_SAMPLES_PER_MS = SAMPLE_RATE // 1000


# -- the spec ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Upstream:
    """A parsed ``realtime+ws(s)://`` spec: the WebSocket URL and where its key comes from."""

    url: str  # ws:// or wss://, the spec's query minus our own parameters
    key_env: str = KEY_ENV
    explicit: bool = False  # key_env= was given: the variable must be set

    @classmethod
    def parse(cls, spec: str) -> Upstream:
        parts = urlsplit(spec)
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES or not parts.hostname:
            raise AgentError(f"agent {loggable_url(spec)!r}: expected "
                             "realtime+wss://host[:port]/path?model=…")
        query = parse_qsl(parts.query, keep_blank_values=True)
        key_env, explicit = KEY_ENV, False
        rest = []
        for k, v in query:
            if k == "key_env":
                if not v.startswith(KEY_ENV):
                    raise AgentError(f"agent {loggable_url(spec)!r}: key_env must name a "
                                     f"variable starting with {KEY_ENV}")
                key_env, explicit = v, True
            else:
                rest.append((k, v))
        url = urlunsplit((scheme.removeprefix("realtime+"), parts.netloc, parts.path or "/",
                          urlencode(rest), ""))
        up = cls(url, key_env, explicit)
        if explicit and not os.environ.get(key_env):
            raise AgentError(f"agent {loggable_url(spec)!r}: ${key_env} is not set")
        return up

    def key(self) -> str | None:
        """The bearer key, read per call (so a rotated key file applies to the next call)."""
        value = os.environ.get(self.key_env)
        if value:
            return value.strip()
        if self.explicit:
            return None
        path = os.environ.get(KEY_FILE_ENV)
        if path:
            try:
                return Path(path).read_text().strip() or None
            except OSError as exc:
                log.warning("realtime key file unreadable: %s", exc.strerror)
        return None


# -- what was played (pure bookkeeping) ----------------------------------------------------------


@dataclass(slots=True)
class _Segment:
    response_id: str
    item_id: str
    content_index: int
    samples: int = 0  # 48 kHz samples handed to the playout queue


@dataclass(slots=True)
class Playout:
    """Which response's audio is in the playout queue, and how much of it has been played.

    Only the bridge can answer "where was the user when they interrupted": the upstream sent
    the audio faster than real time, and the transceiver only counts samples. ``handed`` is
    every sample given to :meth:`AgentContext.send`; ``unsent`` (passed in) what is still
    queued; so the played position is ``handed - unsent`` into the segment list."""

    segments: deque[_Segment] = field(default_factory=deque)
    handed: int = 0

    def add(self, response_id: str, item_id: str, content_index: int, samples: int) -> None:
        last = self.segments[-1] if self.segments else None
        if last is None or (last.item_id, last.content_index) != (item_id, content_index):
            last = _Segment(response_id, item_id, content_index)
            self.segments.append(last)
        last.samples += samples
        self.handed += samples

    def playing(self, unsent: int) -> tuple[_Segment, int] | None:
        """The segment now playing and the milliseconds of it played; when all of it has
        been played (an upstream slower than real time), the last one, whole. None: none."""
        played = self.handed - unsent
        start = 0
        for seg in self.segments:
            if played < start + seg.samples:
                return seg, (played - start) // _SAMPLES_PER_MS
            start += seg.samples
        if self.segments:
            last = self.segments[-1]
            return last, last.samples // _SAMPLES_PER_MS
        return None

    def clear(self) -> None:
        self.segments.clear()
        self.handed = 0



# -- events --------------------------------------------------------------------------------------


def event_id() -> str:
    """A fresh id for an event the bridge makes itself (the upstream's keep theirs)."""
    return "event_" + secrets.token_hex(10)


def pin_formats(session: dict[str, Any]) -> dict[str, Any]:
    """``session`` with both audio formats set to ``audio/pcm`` 24 kHz (the upstream leg's)."""
    out = dict(session)
    out.setdefault("type", "realtime")
    audio = dict(out.get("audio") or {}) if isinstance(out.get("audio"), dict | None) else {}
    for way in ("input", "output"):
        leg = audio.get(way)
        leg = dict(leg) if isinstance(leg, dict) else {}
        leg["format"] = dict(PCM_FORMAT)
        audio[way] = leg
    out["audio"] = audio
    return out


def error_event(kind: str, code: str, message: str, about: str | None = None) -> dict[str, Any]:
    """An ``error`` server event (GA shape); ``about`` is the client event's id, if any."""
    return {"type": "error", "event_id": event_id(),
            "error": {"type": kind, "code": code, "message": message, "param": None,
                      "event_id": about}}


def parse_browser(data: str | bytes) -> dict[str, Any] | str:
    """A browser event, or why it is not one (answered with an ``error`` event)."""
    if not isinstance(data, str):
        return "events are JSON text messages, not binary"
    try:
        event = json.loads(data)
    except ValueError:
        return "the message is not JSON"
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return "an event is a JSON object with a string 'type'"
    return event


