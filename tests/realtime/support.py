"""A RealtimeConnection on a fake clock, with a fake output queue that plays at real time."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from realtime.shapes import check_event

from appliance.realtime.agent import id_source
from appliance.realtime.interface import Delta
from appliance.realtime.machine import Action, RealtimeConnection

FRAME = 1920  # 20 ms at 48 kHz PCM16


def tone(ms: int, hz: float = 300.0, amp: float = 0.3) -> bytes:
    n = 48 * ms
    t = np.arange(n) / 48_000
    return bytes((amp * 32767 * np.sin(2 * np.pi * hz * t)).astype("<i2").tobytes())


class Harness:
    """Drives the machine as the shell does, with a fake clock and a fake output queue."""

    def __init__(self, **kw: Any) -> None:
        self.now = 0.0
        self.queue_until = 0.0  # the fake output queue plays until this time
        self.m = RealtimeConnection(session_id="sess_test", ids=id_source("t"),
                                    queued_seconds=self.queued, **kw)
        self.events: list[dict[str, Any]] = []
        self.actions: list[Action] = []

    def queued(self) -> float:
        return max(0.0, self.queue_until - self.now)

    def drain(self) -> list[dict[str, Any]]:
        new = []
        while (e := self.m.poll_event()) is not None:
            json.dumps(e)  # every event is JSON
            check_event(e)  # ... of its GA shape
            new.append(e)
        while (a := self.m.poll_action()) is not None:
            self.actions.append(a)
            if type(a).__name__ == "ClearAudio":
                self.queue_until = self.now  # ctx.interrupt(): dropped at once
        self.events += new
        return new

    def send(self, **event: Any) -> list[dict[str, Any]]:
        self.m.handle_message(json.dumps(event))
        return self.drain()

    def frames(self, pcm: bytes, speech: bool) -> list[dict[str, Any]]:
        new: list[dict[str, Any]] = []
        for i in range(0, len(pcm), FRAME):
            self.now += 0.02
            self.m.handle_frame(pcm[i : i + FRAME].ljust(FRAME, b"\0"), speech)
            new += self.drain()
        return new

    def silence(self, ms: int) -> list[dict[str, Any]]:
        return self.frames(bytes(96 * ms), False)

    def delta(self, rid: str, d: Delta) -> bool:
        ok = self.m.handle_delta(rid, d)
        if ok:
            pcm = getattr(d, "pcm", b"")
            self.queue_until = max(self.queue_until, self.now) + len(pcm) / 96_000
        self.drain()
        return ok

    def types(self, events: list[dict[str, Any]] | None = None) -> list[str]:
        return [e["type"] for e in (self.events if events is None else events)]
