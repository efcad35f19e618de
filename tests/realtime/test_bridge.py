"""The upstream Realtime bridge (appliance/realtime/bridge.py) in process: a real AgentHost
and ChannelHub (the transceiver's seam, with the in-memory port of tests/agents), the bridge
over a real loopback WebSocket to the schema-checking server of rt_server.py."""

from __future__ import annotations

import base64
import json
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import numpy as np
import pytest
import trio
from agents.test_channels import MemoryPort
from hypothesis import given, settings
from hypothesis import strategies as st
from realtime.rt_server import Upstream, serving

from appliance.agents import (
    FRAME_BYTES,
    AgentContext,
    AgentError,
    AgentHost,
    AgentIdentity,
    ChannelInfo,
    ChannelMessage,
    ChannelOpened,
    Frame,
    resolve,
)
from appliance.audio.resample import Resampler
from appliance.realtime import bridge as bridge_mod
from appliance.realtime.bridge import LABEL, Playout
from appliance.realtime.bridge import Upstream as Spec


class EventPort(MemoryPort):
    """The in-memory port, waking the test whenever the bridge sends an event."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = trio.Event()

    def send(self, channel_id: int, data: str | bytes) -> None:
        super().send(channel_id, data)
        self.changed.set()
        self.changed = trio.Event()


KEY = "sk-test-" + "s3cr3t" * 6
RATE = 48_000


def sine(freq: float, n: int, rate: int = RATE, amp: float = 10_000) -> bytes:
    t = np.arange(n) / rate
    return (np.sin(2 * np.pi * freq * t) * amp).astype("<i2").tobytes()


def level_db(pcm: bytes, freq: float, rate: int) -> float:
    """The level of ``freq`` in ``pcm`` relative to a 10,000-amplitude sine, in dB: the
    least-squares amplitude of a sinusoid at ``freq`` after the filter's start. (It was the
    peak of a Hann-windowed FFT, which reads up to 1.4 dB low when ``freq`` falls between
    two bins: 300 Hz in exactly 46,000 samples did once the resampler stopped holding back
    a tail, with the filter itself flat to 0.05 dB there.)"""
    x = np.frombuffer(pcm, "<i2").astype(np.float64)[2000:]
    t = (np.arange(len(x)) + 2000) / rate
    basis = np.stack([np.sin(2 * np.pi * freq * t), np.cos(2 * np.pi * freq * t)], axis=1)
    coef, *_ = np.linalg.lstsq(basis, x, rcond=None)
    return float(20 * np.log10(max(float(np.hypot(*coef)), 1e-4) / 10_000))


def dominant(pcm: bytes, rate: int) -> float:
    x = np.frombuffer(pcm, "<i2").astype(np.float64)
    return float(np.argmax(np.abs(np.fft.rfft(x * np.hanning(len(x))))) * rate / len(x))


# -- resampling: the frequency response of both directions -----------------------------------


@pytest.mark.parametrize("freq", [300, 1000, 4000, 8000, 10_000])
def test_down_48k_to_24k_passband_is_flat(freq: int) -> None:
    out = Resampler(RATE, 24_000).process(sine(freq, RATE))
    assert abs(len(out) // 2 - 24_000) < 64
    assert level_db(out, freq, 24_000) == pytest.approx(0, abs=1.0)


@pytest.mark.parametrize("freq", [14_000, 16_000, 20_000])
def test_down_48k_to_24k_rejects_what_would_alias(freq: int) -> None:
    """Above the new Nyquist (12 kHz) a tone must vanish, not fold to 24k - f."""
    out = Resampler(RATE, 24_000).process(sine(freq, RATE))
    assert level_db(out, 24_000 - freq, 24_000) < -60


@pytest.mark.parametrize("freq", [300, 1000, 4000, 8000, 10_000])
def test_up_24k_to_48k_passband_flat_and_no_image(freq: int) -> None:
    out = Resampler(24_000, RATE).process(sine(freq, 24_000, 24_000))
    assert level_db(out, freq, RATE) == pytest.approx(0, abs=1.0)
    assert level_db(out, 24_000 - freq, RATE) < -50  # the mirror image of zero-stuffing


# -- the spec ------------------------------------------------------------------------------------


def test_spec_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    up = Spec.parse("realtime+wss://api.example.com/v1/realtime?model=gpt-realtime")
    assert up.url == "wss://api.example.com/v1/realtime?model=gpt-realtime"
    assert up.key_env == "APPLIANCE_REALTIME_KEY" and not up.explicit
    monkeypatch.setenv("APPLIANCE_REALTIME_KEY_LOCAL", " k1 \n")
    up = Spec.parse("realtime+ws://127.0.0.1:8080/v1/realtime?key_env="
                    "APPLIANCE_REALTIME_KEY_LOCAL&model=x")
    assert up.url == "ws://127.0.0.1:8080/v1/realtime?model=x" and up.key() == "k1"
    with pytest.raises(AgentError, match="must name a variable starting with"):
        Spec.parse("realtime+ws://h/v1/realtime?key_env=HOME")
    with pytest.raises(AgentError, match="is not set"):
        Spec.parse("realtime+ws://h/v1/realtime?key_env=APPLIANCE_REALTIME_KEY_NOPE")
    with pytest.raises(AgentError, match="expected realtime"):
        Spec.parse("realtime+wss:///nohost")
    assert resolve("realtime+ws://127.0.0.1:1/v1/realtime").name.startswith("realtime+ws")


def test_key_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("APPLIANCE_REALTIME_KEY", raising=False)
    assert Spec.parse("realtime+ws://h/x").key() is None  # a local server: no header
    (tmp_path / "key").write_text(KEY + "\n")
    monkeypatch.setenv("APPLIANCE_REALTIME_KEY_FILE", str(tmp_path / "key"))
    assert Spec.parse("realtime+ws://h/x").key() == KEY


def test_playout_positions() -> None:
    p = Playout()
    p.add("r1", "i1", 0, 48_000)  # 1 s of i1
    p.add("r1", "i1", 0, 24_000)
    p.add("r2", "i2", 0, 48_000)
    seg, ms = p.playing(unsent=p.handed - 48_000 - 4_800) or (None, 0)
    assert seg is not None and (seg.item_id, ms) == ("i1", 1100)
    seg, ms = p.playing(unsent=48_000 - 480) or (None, 0)
    assert seg is not None and (seg.item_id, ms) == ("i2", 10)
    seg, ms = p.playing(unsent=0) or (None, 0)  # all played: the last item, whole
    assert seg is not None and (seg.item_id, ms) == ("i2", 1000)
    assert Playout().playing(unsent=0) is None


# -- a call, in process --------------------------------------------------------------------------


class Browser:
    """The session seam plus the browser's end of ``oai-events`` (the in-memory port)."""

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        self.host = AgentHost(on_event=self._on_event)
        self.port = EventPort()
        self.tick = trio.Event()  # set by the pacer for every frame it takes
        self.host.channels.port = self.port
        self.ctx = AgentContext(self.host, AgentIdentity("rt", "s1", params=params or {}))
        self.agent_events: list[dict[str, Any]] = []
        self.ended = trio.Event()
        self.played: list[bytes] = []
        self.n = 0
        self.channel = ChannelInfo(0, LABEL)

    def _on_event(self, event: dict[str, Any]) -> None:
        self.agent_events.append(event)
        if event["type"] == "session.end":
            self.host.close(f"agent: {event['reason']}")
            self.ended.set()

    def open(self) -> None:
        self.host.channels.push(ChannelOpened(self.channel))

    def send(self, event: dict[str, Any] | str) -> None:
        text = event if isinstance(event, str) else json.dumps(event)
        self.host.channels.push(ChannelMessage(self.channel.id, LABEL, text))

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(d) for _, d in self.port.sent]

    def kinds(self) -> list[str]:
        return [e["type"] for e in self.events()]

    async def until(self, kind: str, count: int = 1) -> dict[str, Any]:
        while self.kinds().count(kind) < count:
            await self.port.changed.wait()
        return [e for e in self.events() if e["type"] == kind][count - 1]

    async def talk(self, seconds: float, freq: float = 440.0, amp: float = 10_000) -> None:
        """Mic frames at real time (the pacing of a microphone, not test synchronisation)."""
        pcm = sine(freq, int(seconds * RATE), amp=amp)
        for i in range(0, len(pcm), FRAME_BYTES):
            self.host.push_frame(Frame(pcm[i : i + FRAME_BYTES].ljust(FRAME_BYTES, b"\0"),
                                       self.n * 0.02, trio.current_time(), amp > 0))
            self.n += 1
            await trio.sleep(0.02)

    async def pacer(self) -> None:
        """The transceiver's pacer: one 20 ms frame out per 20 ms."""
        while not self.host.closed:
            frame = self.host.pop_output_frame()
            if frame is not None:
                self.played.append(frame)
                self.tick.set()
                self.tick = trio.Event()
            await trio.sleep(0.02)


@asynccontextmanager
async def call(up: Upstream | None = None, *, params: dict[str, Any] | None = None,
               query: str = "", open_channel: bool = True
               ) -> AsyncIterator[tuple[Browser, Upstream, Any]]:
    async with serving(up) as (server, port):
        b = Browser(params)
        agent = resolve(f"realtime+ws://127.0.0.1:{port}/v1/realtime?model=x{query}")
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(agent.run, b.ctx)
                nursery.start_soon(b.pacer)
                if open_channel:
                    b.open()
                yield b, server, nursery
                if not b.host.closed:
                    b.host.push_event({"type": "session.ended", "reason": "test over"})
                    b.host.close("test over")
                nursery.cancel_scope.cancel()


async def test_a_turn_audio_both_ways_and_events_through(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("APPLIANCE_REALTIME_KEY", KEY)
    params = {"realtime": {"session": {"instructions": "be brief"}, "dcid": None}}
    async with call(params=params) as (b, up, _):
        created = await b.until("session.created")
        await b.talk(0.6)
        await b.talk(0.5, amp=0)  # silence: the server's VAD ends the turn
        await b.until("output_audio_buffer.stopped")
        # Pass-through of the browser's own events, ids kept, formats pinned.
        b.send({"type": "conversation.item.create", "event_id": "evt_b1", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "hello"}]}})
        b.send({"type": "session.update", "event_id": "evt_b2", "session": {
            "type": "realtime", "instructions": "x",
            "audio": {"output": {"format": {"type": "audio/pcmu"}, "voice": "marin"}}}})
        b.send("not json")
        b.send({"type": "no.such.event", "event_id": "evt_b3"})
        await b.until("error", 2)
        await up.wait_for(lambda: "no.such.event" in up.kinds())
    # The upstream: the key in the handshake, our session config, appends of the mic audio.
    assert up.headers[0]["authorization"] == f"Bearer {KEY}"
    assert up.violations == ["unknown client event 'no.such.event'"]
    assert up.sessions[0]["instructions"] == "be brief"
    assert up.sessions[0]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24_000}
    assert up.sessions[1]["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24_000}
    assert up.sessions[1]["audio"]["output"]["voice"] == "marin"
    received = dict((e.get("event_id"), e) for _, e in up.received)
    assert received["evt_b1"]["item"]["content"][0]["text"] == "hello"
    appended = bytes(up.appended)
    assert len(appended) >= 0.95 * 1.1 * 24_000 * 2  # all of the mic audio, at 24 kHz
    assert dominant(appended[: int(0.6 * 48_000)], 24_000) == pytest.approx(440, abs=25)
    # The browser: session.created first (with the configured session), the turn's events
    # with the upstream's ids, WebRTC-only playout events, never an audio delta.
    kinds = b.kinds()
    assert kinds[0] == "session.created" and created["session"]["instructions"] == "be brief"
    for k in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
              "input_audio_buffer.committed", "response.created",
              "response.output_audio_transcript.done", "response.output_audio.done",
              "response.done", "output_audio_buffer.started", "output_audio_buffer.stopped"):
        assert k in kinds, k
    assert "response.output_audio.delta" not in kinds
    assert kinds.index("output_audio_buffer.started") < kinds.index("output_audio_buffer.stopped")
    rid = next(e for e in b.events() if e["type"] == "response.created")["response"]["id"]
    assert next(e for e in b.events() if e["type"] == "output_audio_buffer.started")[
        "response_id"] == rid
    errors = [e for e in b.events() if e["type"] == "error"]
    assert errors[0]["error"]["code"] == "invalid_event"  # "not json", answered here
    assert errors[1]["error"]["event_id"] == "evt_b3"  # the upstream's answer, passed on
    # The reply's audio was played: a second of 1 kHz, resampled to 48 kHz.
    played = b"".join(b.played)
    loud = [f for f in b.played if np.abs(np.frombuffer(f, "<i2")).max() > 3000]
    assert 45 <= len(loud) <= 52, len(loud)
    assert dominant(b"".join(loud), RATE) == pytest.approx(1000, abs=50)
    assert KEY not in caplog.text and KEY not in json.dumps(b.events()) and played


async def test_pre_negotiated_channel_from_params() -> None:
    params = {"realtime": {"session": {}, "dcid": 4, "call_id": "rtc_x"}}
    async with call(params=params, open_channel=False) as (b, up, _):
        b.channel = ChannelInfo(4, LABEL, negotiated=True)
        await b.until("session.created")
        b.send({"type": "response.create", "event_id": "evt_r"})
        await b.until("response.done")
    assert {cid for cid, _ in b.port.sent} == {4}  # opened by the bridge, id 4, no DCEP
    assert "evt_r" in [e.get("event_id") for _, e in up.received]
    assert up.violations == []


async def test_clear_from_the_browser_truncates_at_what_was_played() -> None:
    async with call(Upstream(reply_seconds=4.0)) as (b, up, _):
        await b.until("session.created")
        b.send({"type": "response.create"})
        await b.until("output_audio_buffer.started")
        while len(b.played) < 30:  # ~600 ms of the reply played
            await b.tick.wait()
        n_played = len(b.played)
        b.send({"type": "output_audio_buffer.clear", "event_id": "evt_c"})
        cleared = await b.until("output_audio_buffer.cleared")
        await up.wait_for(lambda: "conversation.item.truncate" in up.kinds())
        await b.until("conversation.item.truncated")
        assert b.host.queued_samples == 0  # dropped at once
    truncate = next(e for _, e in up.received if e["type"] == "conversation.item.truncate")
    # The position played: what the pacer took (minus the frame it had just taken).
    assert truncate["audio_end_ms"] == pytest.approx(n_played * 20, abs=60)
    assert truncate["item_id"] in up.sent_audio_ms and truncate["content_index"] == 0
    assert cleared["response_id"].startswith("resp_")
    assert "output_audio_buffer.clear" not in up.kinds()  # WebRTC-only: handled here
    assert up.violations == []
    assert "output_audio_buffer.stopped" not in b.kinds()  # cleared, not stopped


async def test_speech_during_playback_interrupts_and_truncates() -> None:
    """Server VAD with interrupt_response: the caller talking over the reply stops it here
    (a WebSocket upstream cannot know what was played) and truncates it upstream."""
    async with call(Upstream(reply_seconds=5.0)) as (b, up, _):
        await b.until("session.created")
        b.send({"type": "response.create"})
        await b.until("output_audio_buffer.started")
        while len(b.played) < 15:  # 300 ms of the reply heard, then the caller talks
            await b.tick.wait()
        heard = len(b.played)
        await b.talk(0.3)
        await b.until("output_audio_buffer.cleared")
        await up.wait_for(lambda: "conversation.item.truncate" in up.kinds())
    truncate = next(e for _, e in up.received if e["type"] == "conversation.item.truncate")
    assert truncate["audio_end_ms"] == pytest.approx(heard * 20, abs=80)
    assert up.violations == []


async def test_upstream_disconnect_is_an_error_event_and_ends_the_call() -> None:
    async with call() as (b, up, _):
        await b.until("session.created")
        await up.disconnect(1011, "model crashed")
        with trio.fail_after(5):
            await b.ended.wait()
    err = next(e for e in b.events() if e["type"] == "error")
    assert err["error"]["type"] == "server_error"
    assert err["error"]["code"] == "upstream_disconnected"
    end = b.agent_events[-1]
    assert end == {"type": "session.end", "reason": "upstream: closed 1011 model crashed"}


async def test_unreachable_upstream_waits_for_the_channel_then_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("APPLIANCE_REALTIME_KEY", KEY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here
    b = Browser()
    agent = resolve(f"realtime+ws://127.0.0.1:{port}/v1/realtime?model=x")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.run, b.ctx)
            # The browser's DCEP open comes after the failure: wait for the bridge to log it.
            while "realtime upstream" not in caplog.text:  # noqa: ASYNC110
                await trio.sleep(0.01)  # a poll interval: the loop checks the log
            b.open()
            await b.ended.wait()
    assert b.kinds() == ["error"]
    assert b.events()[0]["error"]["code"] == "upstream_unreachable"
    assert b.agent_events[-1]["reason"].startswith("upstream: ")
    assert KEY not in caplog.text
    assert "realtime+ws" not in caplog.text or "?" not in caplog.text.split("127.0.0.1")[1][:30]


def test_bridge_module_stays_small() -> None:
    assert bridge_mod.__file__ is not None
    with open(bridge_mod.__file__) as f:
        assert sum(1 for _ in f) <= 700


async def test_audio_delta_that_is_not_base64_is_dropped_not_fatal() -> None:
    """A broken delta from the upstream costs that delta only."""
    b = Browser()
    br = bridge_mod.RealtimeBridge(Spec.parse("realtime+ws://127.0.0.1:1/x"))
    br._audio_delta({"type": "response.output_audio.delta", "delta": "%%%", "item_id": "i",
                     "response_id": "r", "content_index": 0})
    br._audio_delta({"type": "response.output_audio.delta",
                     "delta": base64.b64encode(b"\0" * 4800).decode(), "item_id": "i",
                     "response_id": "r", "content_index": 0})
    assert br._pending_samples > 0 and not b.host.closed


# -- untrusted input: whatever either peer sends, the bridge answers or drops, never raises ------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)


@given(st.text() | st.binary())
def test_browser_messages_parse_or_explain(data: str | bytes) -> None:
    out = bridge_mod.parse_browser(data)
    assert isinstance(out, str) or isinstance(out.get("type"), str)


@given(st.dictionaries(st.text(), json_values, max_size=6))
@settings(max_examples=100)
def test_any_session_gets_pinned_formats(session: dict[str, Any]) -> None:
    out = bridge_mod.pin_formats(session)
    assert out["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24_000}
    assert out["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24_000}


@given(st.dictionaries(st.sampled_from(["delta", "item_id", "response_id", "content_index",
                                        "session", "audio", "x"]), json_values, max_size=5))
@settings(max_examples=100)
def test_upstream_fields_of_any_shape(fields: dict[str, Any]) -> None:
    async def one() -> None:
        br = bridge_mod.RealtimeBridge(Spec.parse("realtime+ws://127.0.0.1:1/x"))
        br._audio_delta({"type": "response.output_audio.delta", **fields})
        br._note_session(fields.get("session"))
        br._note_session(fields)

    trio.run(one)


async def test_clear_while_generating_cancels_then_truncates() -> None:
    """A response still being generated (upstream at real time) is cancelled by the clear,
    and truncated where the caller was; a later delta of it is not played."""
    async with call(Upstream(reply_seconds=4.0, pace=0.1)) as (b, up, _):
        await b.until("session.created")
        b.send({"type": "response.create"})
        await b.until("output_audio_buffer.started")
        while len(b.played) < 20:
            await b.tick.wait()
        b.send({"type": "output_audio_buffer.clear"})
        await up.wait_for(lambda: "conversation.item.truncate" in up.kinds())
        done = await b.until("response.done")
        before = len(b.played)
        await b.talk(0.2, amp=0)  # 200 ms more of the pacer: nothing of the reply plays
    assert done["response"]["status"] == "cancelled"
    kinds = up.kinds()
    assert kinds.index("response.cancel") < kinds.index("conversation.item.truncate")
    truncate = next(e for _, e in up.received if e["type"] == "conversation.item.truncate")
    assert 250 <= truncate["audio_end_ms"] <= 600
    assert all(not np.frombuffer(f, "<i2").any() for f in b.played[before + 1:])
    assert up.violations == []


async def test_refused_handshake_is_an_error_event() -> None:
    async with call(Upstream(reject_status=401)) as (b, _, _n):
        with trio.fail_after(5):
            await b.ended.wait()
    err = b.events()[0]["error"]
    assert (err["type"], err["code"]) == ("server_error", "upstream_unreachable")
    assert "401" in err["message"]


async def test_refused_session_update_still_gives_session_created() -> None:
    async with call(Upstream(refuse_update=True), params={"realtime": {"session": {
            "instructions": "x"}}}) as (b, _, _n):
        await b.until("session.created")
    assert b.kinds()[:2] == ["error", "session.created"]
    assert b.events()[0]["error"]["code"] == "unsupported"


async def test_tls_to_a_plain_server_fails_cleanly() -> None:
    """wss:// to a server that answers in plain text: the TLS handshake breaks at once (not
    at the connect timeout), the caller is told why, nothing leaks."""

    async def plain(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, plain, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        b = Browser()
        agent = resolve(f"realtime+wss://127.0.0.1:{port}/v1/realtime?model=x")
        b.open()
        with trio.fail_after(5):
            await agent.run(b.ctx)
        nursery.cancel_scope.cancel()
    err = b.events()[0]["error"]
    assert err["code"] == "upstream_unreachable", err
    assert "TLS failed (SSLError" in err["message"], err
    assert b.agent_events[-1]["type"] == "session.end"
