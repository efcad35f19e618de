"""``GET /v1/live/sessions`` driven by the official ``openai`` SDK's ``client.live.connect()``
against the signaling server on loopback (the same app ``appliance up`` serves), with only
the base URL changed: the default agent (the offline assistant) hears espeak-ng speech and
answers it, the SDK's helpers get their acks, the negative cases of the GPT-Live research
notes §5.2 get ``error`` events on a socket that stays open, and every frame the server
sends is checked against the SDK's ``ServerEvent`` types (live_shapes.py).

The SDK is a threaded client: each exchange runs in a worker thread
(``trio.to_thread.run_sync``) while the server runs in the test's nursery.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import trio
from sdk_clients import sdk
from speech.speech_support import espeak_pcm48, have_espeak, silence

from appliance.realtime.audio import pcm48k_to_24k
from appliance.signaling import SignalingConfig, SignalingState, serve_signaling
from appliance.signaling.webhooks import CALL_ENDED, CALL_STARTED

openai = pytest.importorskip("openai")
from live.live_shapes import shape_errors  # noqa: E402

API_TOKEN = "test-api-token-0123456789"
TIMEOUT = 120  # a hang guard for a whole exchange (the box is loaded; Whisper loads once)
FRAME = 2400  # 50 ms of 24 kHz PCM16, as the GPT-Live wire client sends it
needs_espeak = pytest.mark.skipif(not have_espeak(), reason="espeak-ng is not installed")


async def start_server(nursery: trio.Nursery, **overrides: Any) -> tuple[str, SignalingState]:
    cfg = SignalingConfig(http=("127.0.0.1", 0), transceivers={}, relays={})
    for k, v in overrides.items():
        setattr(cfg, k, v)
    state = SignalingState(cfg)
    binds = await nursery.start(partial(serve_signaling, cfg, state=state))
    return binds[0], state


def client(url: str, api_key: str = "unused-on-loopback") -> Any:
    """Only the base URL changes: the SDK derives ws://…/v1/live/sessions from it."""
    return sdk(url + "/v1", api_key=api_key)


class Recorder:
    """Reads a connection frame by frame, checking each against the SDK's types."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.events: list[Any] = []

    def next(self) -> Any:
        raw = json.loads(self.conn.recv_bytes())
        assert shape_errors(raw) == [], raw
        event = self.conn.parse_event(json.dumps(raw))
        self.events.append(event)
        return event

    def until(self, done: Callable[[Any], bool]) -> list[Any]:
        got = []
        while True:
            event = self.next()
            got.append(event)
            if done(event):
                return got

    def of(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]


def speak(conn: Any, text: str) -> None:
    pcm = pcm48k_to_24k(silence(0.3) + espeak_pcm48(text) + silence(1.5))
    for i in range(0, len(pcm), FRAME):
        conn.session.input_audio.append(audio=base64.b64encode(pcm[i : i + FRAME]).decode())


def first_of(rec: Recorder, kind: str) -> Any:
    return rec.until(lambda e: e.type == kind)[-1]


# -- the default agent, end to end -------------------------------------------------------------


def conversation(url: str) -> Recorder:
    with client(url).live.connect() as conn:
        rec = Recorder(conn)
        conn.session.start(session={"model": "gpt-live-1", "delegation": {"type": "client"},
                                    "audio": {"format": {"type": "audio/pcm",
                                                         "rate": 24000}}},
                           event_id="s1")
        started = rec.next()
        assert started.type == "session.started" and started.client_event_id == "s1"
        assert started.session.id.startswith("live_") and started.session.status == "active"
        speak(conn, "what time is it")
        first_of(rec, "session.output_transcript.delta")
        conn.session.input_audio.mute(event_id="m")
        assert first_of(rec, "session.input_audio.muted").client_event_id == "m"
        conn.session.input_audio.unmute()
        first_of(rec, "session.input_audio.unmuted")
        conn.send({"type": "session.input_audio.commit"})  # not GPT-Live's: an error
        err = first_of(rec, "error")
        assert err.error.code == "unknown_event" and err.error.param == "type"
        conn.session.instructions.append(content="Keep answers short.", delegation_id=None,
                                         event_id="i1")
        assert first_of(rec, "session.instructions.appended").client_event_id == "i1"
        conn.session.commentary.append(content="The weather in Paris is sunny.",
                                       delegation_id=None, event_id="c1")
        assert first_of(rec, "session.commentary.appended").client_event_id == "c1"
        rec.until(lambda e: e.type == "session.output_transcript.delta" and "Paris" in e.delta)
        conn.session.close(event_id="bye")
        first_of(rec, "session.closed")
        # The server closes with 1000 after session.closed: the SDK's iterator just ends.
        assert list(conn) == []
    return rec


@needs_espeak
async def test_the_sdk_is_heard_and_answered_by_the_default_assistant(
        nursery: trio.Nursery) -> None:
    url, state = await start_server(nursery)
    hooks: list[tuple[str, dict[str, Any]]] = []
    state.webhooks.emit = lambda kind, data: hooks.append((kind, data))
    with trio.fail_after(TIMEOUT):
        rec = await trio.to_thread.run_sync(conversation, url)
    heard = "".join(e.delta for e in rec.of("session.input_transcript.delta"))
    assert "time" in heard.lower()
    spans = [(e.start_ms, e.end_ms) for e in rec.of("session.input_transcript.delta")]
    assert all(0 <= a <= b for a, b in spans)
    said = [e.delta for e in rec.of("session.output_transcript.delta")]
    assert said[0].startswith("It is ")  # the built-in responder tells the time
    assert said[-1] == " The weather in Paris is sunny."  # the commentary, spoken
    starts = [e.start_ms for e in rec.of("session.output_transcript.delta")]
    assert starts == sorted(starts)
    audio = b"".join(base64.b64decode(e.delta) for e in rec.of("session.output_audio.delta"))
    assert len(audio) > 24_000 and len(audio) % 2 == 0  # over 0.5 s of 24 kHz PCM16
    [closed] = rec.of("session.closed")
    assert closed.reason == "close_requested" and closed.client_event_id == "bye"
    assert closed.usage.seconds >= 2 and closed.session.id == rec.events[0].session.id
    assert [k for k, _ in hooks] == [CALL_STARTED, CALL_ENDED]
    ended = hooks[1][1]
    assert ended["call_id"] == closed.session.id and ended["transport"] == "websocket"
    assert ended["agent"] == "assistant" and ended["report"]["end_reason"] == "close_requested"


# -- the negative cases ------------------------------------------------------------------------


def negatives(url: str) -> list[Any]:
    with client(url).live.connect(extra_headers={"X-Agent": "realtime"}) as conn:
        rec = Recorder(conn)
        conn.session.start(session={"model": "gpt-live-1", "voice": "marin"}, event_id="bad")
        err = first_of(rec, "error")
        assert (err.error.code, err.error.param) == ("unknown_parameter", "session.voice")
        assert err.client_event_id == err.error.client_event_id == "bad"
        conn.session.start(session={"model": "gpt-live-1"}, event_id="s1")
        first_of(rec, "session.started")
        conn.session.start(session={"model": "gpt-live-1"}, event_id="s2")
        assert first_of(rec, "error").error.code == "session_already_started"
        conn.session.update(session={"audio": {"output": {"voice": "ash"}}},
                            event_id="u")
        err = first_of(rec, "error")
        assert (err.error.code, err.error.param) == ("immutable_field_update",
                                                     "session.audio")
        conn.response.create(event_id="r")
        err = first_of(rec, "error")
        assert "requires Responses delegation" in err.error.message
        conn.send({"type": "decision.create"})  # the SDK's helper would require the id
        err = first_of(rec, "error")
        assert (err.error.code, err.error.param) == ("missing_required_parameter",
                                                     "event_id")
        conn.decision.create(event_id="d1")
        assert first_of(rec, "error").error.code == "unsupported_event"
        # Every other helper of resources/live/ the appliance does not serve: an error each,
        # naming the command, and the socket stays open.
        conn.decision.item.create(item={"role": "user", "content": "hi"}, event_id="di")
        conn.decision.item.delete(item_id="item_1", event_id="dd")
        conn.response.item.create(item={"type": "function_call_output", "call_id": "c",
                                        "output": "{}"}, event_id="ri")
        conn.session.output_audio.fixture.play(audio=base64.b64encode(bytes(4800)).decode(),
                                               event_id="fx")
        for cid in ("di", "dd", "ri", "fx"):
            err = first_of(rec, "error")
            assert (err.error.code, err.client_event_id) == ("unsupported_event", cid)
        conn.session.thinking.append(content="The user sounds busy.", delegation_id=None,
                                     event_id="t1")
        assert first_of(rec, "session.thinking.appended").client_event_id == "t1"
        conn.session.update(session={"delegation": {"type": "client",
                                                    "acknowledgement_delay_ms": 200}},
                            event_id="ok")
        updated = first_of(rec, "session.updated")  # the socket is still open and serving
        assert updated.client_event_id == "ok"
        conn.session.close()
        first_of(rec, "session.closed")
    return rec.events


async def test_the_negative_cases_get_errors_on_an_open_socket(nursery: trio.Nursery) -> None:
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):
        events = await trio.to_thread.run_sync(negatives, url)
    assert [e.type for e in events].count("error") == 10



def with_handlers(url: str) -> list[str]:
    """The SDK's push API: handlers registered before connecting, dispatch_events() until
    the server closes the socket after session.closed."""
    seen: list[str] = []
    manager = client(url).live.connect(extra_headers={"X-Agent": "realtime"})

    @manager.on("session.started")
    def started(event: Any) -> None:
        seen.append(event.type)
        conn.session.input_audio.mute()

    @manager.on("session.input_audio.muted")
    def muted(event: Any) -> None:
        seen.append(event.type)
        conn.session.close(event_id="bye")

    @manager.on("session.closed")
    def closed(event: Any) -> None:
        seen.append(f"{event.type} {event.reason} {event.client_event_id}")

    manager.send({"type": "session.start", "session": {"model": "gpt-live-1"}})
    with manager as conn:
        conn.dispatch_events()  # returns when the server closes with 1000
    return seen


async def test_the_sdks_event_handlers_and_dispatch(nursery: trio.Nursery) -> None:
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):
        seen = await trio.to_thread.run_sync(with_handlers, url)
    assert seen == ["session.started", "session.input_audio.muted",
                    "session.closed close_requested bye"]


def refused_upgrade(url: str, key: str) -> int:
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as info, client(url, key).live.connect():
        pass
    return int(info.value.response.status_code)


def bearer_session(url: str) -> str:
    with client(url, API_TOKEN).live.connect(extra_headers={"X-Agent": "realtime"}) as conn:
        conn.session.start(session={"model": "gpt-live-1"})
        started = conn.recv()
        conn.session.close()
        assert conn.recv().type == "session.closed"
        return str(started.type)


async def test_the_api_token_is_required_off_loopback(nursery: trio.Nursery) -> None:
    url, _ = await start_server(nursery, api_token=API_TOKEN, auth_required=True)
    with trio.fail_after(TIMEOUT):
        assert await trio.to_thread.run_sync(refused_upgrade, url, "wrong-key") == 401
        assert await trio.to_thread.run_sync(refused_upgrade, url, "ek_x.y") == 401
        assert await trio.to_thread.run_sync(bearer_session, url) == "session.started"


# -- formats, and the socket going away --------------------------------------------------------


def echo_turn(url: str, fmt: dict[str, Any]) -> list[Any]:
    from appliance.realtime.audio import g711_from_48k, pcm48k_to_16k

    speech = silence(0.3) + espeak_pcm48("hello there") + silence(1.5)
    encode = {"audio/pcm": pcm48k_to_16k if fmt.get("rate") == 16000 else pcm48k_to_24k,
              "audio/pcmu": partial(g711_from_48k, alaw=False),
              "audio/pcma": partial(g711_from_48k, alaw=True)}[fmt["type"]]
    data = encode(speech)
    step = len(data) // 40
    with client(url).live.connect(extra_headers={"X-Agent": "realtime"}) as conn:
        rec = Recorder(conn)
        conn.session.start(session={"model": "gpt-live-1", "audio": {"format": fmt}})
        first_of(rec, "session.started")
        for i in range(0, len(data), step):
            conn.session.input_audio.append(audio=base64.b64encode(data[i : i + step]).decode())
        rec.until(lambda e: e.type == "session.output_transcript.delta")  # "(echo, 1.3 s)"
        conn.session.close()
        first_of(rec, "session.closed")
    return rec.events


@needs_espeak
@pytest.mark.parametrize(("fmt", "bytes_per_s"), [
    ({"type": "audio/pcm", "rate": 16000}, 32_000),
    ({"type": "audio/pcmu", "rate": 8000}, 8_000),
])
async def test_the_session_format_both_ways(nursery: trio.Nursery, fmt: dict[str, Any],
                                            bytes_per_s: int) -> None:
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):
        events = await trio.to_thread.run_sync(echo_turn, url, fmt)
    [said] = [e for e in events if e.type == "session.output_transcript.delta"]
    seconds = float(said.delta.split(", ")[1].split(" ")[0])  # the echo says how long
    audio = b"".join(base64.b64decode(e.delta) for e in events
                     if e.type == "session.output_audio.delta")
    # The echo plays the turn back: its audio, in the session's format and rate.
    assert len(audio) == pytest.approx(seconds * bytes_per_s, rel=0.05)


def hang_up(url: str) -> str:
    conn = client(url).live.connect(extra_headers={"X-Agent": "realtime"}).enter()
    conn.session.start(session={"model": "gpt-live-1"})
    started = conn.recv()
    conn.close()  # a close frame, no session.close
    return str(started.session.id)


async def test_a_socket_closed_without_session_close_is_connection_lost(
        nursery: trio.Nursery) -> None:
    url, state = await start_server(nursery)
    hooks: list[tuple[str, dict[str, Any]]] = []
    ended = trio.Event()

    def emit(kind: str, data: dict[str, Any]) -> None:
        hooks.append((kind, data))
        if kind == CALL_ENDED:
            ended.set()

    state.webhooks.emit = emit
    with trio.fail_after(TIMEOUT):
        sid = await trio.to_thread.run_sync(hang_up, url)
        await ended.wait()
    report = hooks[-1][1]
    assert report["call_id"] == sid and report["report"]["end_reason"] == "connection_lost"



def unknown_content(url: str) -> int:
    with pytest.raises(openai.NotFoundError) as missing:
        client(url).live.sessions.download_recording("live_unknown0")
    return int(missing.value.status_code)


async def test_a_wrong_session_id_on_content_is_404(nursery: trio.Nursery) -> None:
    """§5.2's last negative case, the content half: no session is stored yet
    (docs/live.md), so every id's recording is unknown. (The attach half:
    test_sideband.py.)"""
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):
        assert await trio.to_thread.run_sync(unknown_content, url) == 404
