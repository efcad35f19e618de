"""GPT-Live's client delegation loop (issue 42 item 3) driven by the official SDK over the
WebSocket, as KugelAudio's and the Vercel AI SDK's clients use it: an agent that delegates
(tests/live/delegating_agent.py, picked with ``X-Agent``) hears a turn and calls its
``delegate`` tool; the SDK reads a typed ``session.delegation.created``, the automatic
acknowledgement is spoken, and the application's result comes back with
``conn.session.commentary.append(delegation_id=…)`` and is spoken. Every frame is checked
against the SDK's ``ServerEvent`` types (Recorder)."""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import pytest
import trio
from live.test_sdk import FRAME, TIMEOUT, Recorder, client, first_of, start_server

from appliance.live.connection import ACKNOWLEDGEMENT

openai = pytest.importorskip("openai")
AGENT = "realtime:live.delegating_agent:Delegating"


def tone24(seconds: float) -> bytes:
    t = np.arange(int(24_000 * seconds)) / 24_000
    return (np.sin(2 * math.pi * 440 * t) * 8000).astype("<i2").tobytes()


def delegation_loop(url: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with client(url).live.connect(extra_headers={"X-Agent": AGENT}) as conn:
        rec = Recorder(conn)
        conn.session.start(session={"model": "gpt-live-1",
                                    "delegation": {"type": "client"}}, event_id="s1")
        assert rec.next().type == "session.started"
        pcm = bytes(9600) + tone24(1.0) + bytes(72_000)  # 0.2 s, a 1 s "turn", 1.5 s
        for i in range(0, len(pcm), FRAME):
            conn.session.input_audio.append(audio=base64.b64encode(pcm[i : i + FRAME]).decode())
        created = first_of(rec, "session.delegation.created")
        out["created"] = created
        said = []
        while ACKNOWLEDGEMENT not in "".join(said):
            said.append(first_of(rec, "session.output_transcript.delta").delta)
        out["before_result"] = "".join(said)
        conn.session.commentary.append(content="It shipped on Monday.",
                                       delegation_id=created.delegation.id, event_id="c1")
        out["appended"] = first_of(rec, "session.commentary.appended")
        out["result"] = first_of(rec, "session.output_transcript.delta").delta
        conn.session.close()
        out["closed"] = first_of(rec, "session.closed")
    return out


async def test_the_sdk_drives_a_client_delegation(nursery: trio.Nursery) -> None:
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):
        out = await trio.to_thread.run_sync(delegation_loop, url)
    created = out["created"]
    assert created.delegation.target == "client" and created.delegation.type == "delegation"
    assert created.delegation.id.startswith("item_")
    assert 1000 <= created.offset_ms <= 2700  # after the turn, on the input timeline
    assert out["before_result"] == f"Let me find out. {ACKNOWLEDGEMENT}"
    assert out["appended"].client_event_id == "c1"
    assert out["result"] == " It shipped on Monday."
    assert out["closed"].reason == "close_requested"
