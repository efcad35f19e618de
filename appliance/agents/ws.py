"""The external-agent bridge: ``--agent ws://host:port/path`` (and ``wss://``).

For every session the transceiver opens one WebSocket to the agent and speaks the protocol
in docs/agent-protocol.md: JSON text frames for events, binary frames for mono PCM16 little
endian at the sample rate the agent chose in ``session.accept`` (48000, 24000 or 16000;
other rates are resampled here by appliance/audio/resample.py's windowed-sinc filter, never by
dropping samples).

Flow control: inbound frames go out as fast as the socket takes them; if the agent reads
too slowly the transceiver drops the oldest unsent frames (``input.dropped``), never
queues without bound. Outbound audio goes into the session's bounded output queue (2 s);
while it is full the bridge stops reading the socket, so TCP pushes back on the agent.

Data channels (RFC 8831) travel as JSON text frames, since binary frames are audio:
``channel.opened`` / ``channel.message`` / ``channel.closed`` to the agent, and
``channel.send`` / ``channel.open`` / ``channel.close`` from it; binary messages are
base64 in a ``binary`` field, text ones a ``text`` field. A channel operation that fails
(no such channel, too large) answers ``channel.error`` and leaves the call alone.

The call ends with a reason (``agent: …``) when the agent is unreachable
(``unreachable: …``), does not accept in time (``timeout: …``), breaks the protocol
(``protocol-error: …``), closes the socket (``closed[: its reason]``, after its queued
audio has played), drops it (``disconnected: CODE``) or hangs up (its ``reason``).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from contextlib import aclosing
from typing import Any

import trio
from trio_websocket import (
    ConnectionClosed,
    HandshakeError,
    WebSocketConnection,
    connect_websocket_url,
)

from ..audio.resample import Resampler
from ..logs import loggable_url
from .channels import ChannelClosed, ChannelError, ChannelEvent, ChannelMessage, ChannelOpened
from .context import FRAME_SAMPLES, SAMPLE_RATE, AgentContext, AgentFn, SessionEnded

log = logging.getLogger("appliance.agents.ws")

PROTOCOL = "appliance.agent.v1"
SAMPLE_RATES = (48_000, 24_000, 16_000)
CONNECT_TIMEOUT = 5.0  # TCP + TLS + WebSocket handshake
ACCEPT_TIMEOUT = 5.0  # session.start → session.accept
CLOSE_TIMEOUT = 1.0  # the goodbye (session.ended + close frame) when the call ends
CLOSE_REPLY_WAIT = 0.05  # then the TCP connection is closed regardless
MAX_MESSAGE = 1 << 20  # bytes per WebSocket message, either direction


class ProtocolError(Exception):
    """The agent sent something the protocol does not allow."""


class _Framer:
    """Cuts a byte stream into fixed-size frames."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._buf = bytearray()

    def push(self, data: bytes) -> list[bytes]:
        self._buf += data
        n = len(self._buf) // self.size
        out = [bytes(self._buf[i * self.size : (i + 1) * self.size]) for i in range(n)]
        del self._buf[: n * self.size]
        return out


def _pick_rate(value: Any) -> int:
    if value is None:
        return SAMPLE_RATE
    if not isinstance(value, int) or isinstance(value, bool) or value not in SAMPLE_RATES:
        raise ProtocolError(f"sample_rate must be one of {list(SAMPLE_RATES)}, got {value!r}")
    return value


class WsBridge:
    """One session's bridge. ``await WsBridge(url).run(ctx)`` is the agent function."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sample_rate = SAMPLE_RATE
        self.end_reason: str | None = None
        self._reported = 0.0  # the last "played" told to the agent (output.idle/.cleared)
        self._scope = trio.CancelScope()

    async def run(self, ctx: AgentContext) -> None:
        try:
            async with trio.open_nursery() as nursery:
                ws = await self._connect(nursery)
                if ws is None:
                    return
                try:
                    await self._session(ctx, ws)
                finally:
                    await self._goodbye(ctx, ws)
                    nursery.cancel_scope.cancel()  # stops trio-websocket's reader task
                    await _close_transport(ws)
        finally:
            if self.end_reason is not None and not ctx.ended:
                await self._hang_up(ctx)

    async def _connect(self, nursery: trio.Nursery) -> WebSocketConnection | None:
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                return await connect_websocket_url(
                    nursery, self.url, message_queue_size=1, max_message_size=MAX_MESSAGE)
        except trio.TooSlowError:
            self.end_reason = "unreachable: connect timed out"
        except HandshakeError as exc:
            self.end_reason = f"unreachable: {type(exc).__name__}"
        except OSError as exc:
            self.end_reason = f"unreachable: {exc.strerror or exc}"
        log.warning("agent %s: %s", loggable_url(self.url), self.end_reason)
        return None

    async def _hang_up(self, ctx: AgentContext) -> None:
        if not ctx.ended:
            await ctx.send_event({"type": "session.end", "reason": self.end_reason})

    async def _session(self, ctx: AgentContext, ws: WebSocketConnection) -> None:
        ident = ctx.identity
        await ws.send_message(json.dumps({
            "type": "session.start", "protocol": PROTOCOL, "session_id": ident.session_id,
            "agent": ident.name, "sample_rates": list(SAMPLE_RATES), "encoding": "pcm16le",
            "channels": 1, "frame_ms": 20, "info": ident.info,
        }))
        try:
            with trio.fail_after(ACCEPT_TIMEOUT):
                while True:
                    msg = await ws.get_message()
                    if isinstance(msg, str):
                        event = _parse(msg)
                        if event["type"] == "session.accept":
                            break
                        if event["type"] == "session.end":
                            await self._on_event(ctx, event)
                            return
                    raise ProtocolError("expected session.accept first")
        except trio.TooSlowError:
            self.end_reason = "timeout: no session.accept"
            return
        except ProtocolError as exc:
            return await self._protocol_error(ws, exc)
        except ConnectionClosed as exc:
            self.end_reason = _closed_reason(exc)
            return
        try:
            self.sample_rate = _pick_rate(event.get("sample_rate"))
        except ProtocolError as exc:
            return await self._protocol_error(ws, exc)
        async with trio.open_nursery() as nursery:
            self._scope = nursery.cancel_scope
            nursery.start_soon(self._uplink, ctx, ws)
            nursery.start_soon(self._events, ctx, ws)
            nursery.start_soon(self._channel_events, ctx, ws)
            nursery.start_soon(self._playout, ctx, ws)
            await self._downlink(ctx, ws)
            nursery.cancel_scope.cancel()

    async def _protocol_error(self, ws: WebSocketConnection, exc: ProtocolError) -> None:
        self.end_reason = f"protocol-error: {exc}"
        with trio.move_on_after(CLOSE_TIMEOUT) as scope:
            scope.shield = True
            await ws.aclose(1002, str(exc)[:120])

    async def _uplink(self, ctx: AgentContext, ws: WebSocketConnection) -> None:
        """Caller audio → binary frames (20 ms at the agent's rate) + speech events."""
        rs = Resampler(SAMPLE_RATE, self.sample_rate)
        framer = _Framer(FRAME_SAMPLES * self.sample_rate // SAMPLE_RATE * 2)
        speaking = False
        dropped = 0
        with _quietly_closed():
            async with aclosing(ctx.frames()) as frames:
                async for frame in frames:
                    if frame.speech != speaking:
                        speaking = frame.speech
                        kind = "speech.started" if speaking else "speech.stopped"
                        await ws.send_message(json.dumps(
                            {"type": kind, "timestamp": round(frame.timestamp, 3)}))
                    for chunk in framer.push(rs.process(frame.pcm)):
                        await ws.send_message(chunk)
                    if ctx.frames_dropped != dropped:
                        await ws.send_message(json.dumps(
                            {"type": "input.dropped", "frames": ctx.frames_dropped - dropped}))
                        dropped = ctx.frames_dropped
        if ctx.ended:
            self._scope.cancel()  # the call is over: stop reading the agent too

    async def _events(self, ctx: AgentContext, ws: WebSocketConnection) -> None:
        """Transceiver events (session.started, stats, custom) → text frames."""
        with _quietly_closed():
            async with aclosing(ctx.events()) as events:
                async for event in events:
                    if event.get("type") == "session.ended":
                        return  # sent by _goodbye, shielded, once the session is cancelled
                    await ws.send_message(json.dumps(event))

    async def _channel_events(self, ctx: AgentContext, ws: WebSocketConnection) -> None:
        """Data-channel events → text frames (``channel.opened/message/closed``)."""
        with _quietly_closed():
            async with aclosing(ctx.channel_events()) as events:
                async for event in events:
                    await ws.send_message(json.dumps(channel_event_json(event)))

    async def _channel_op(self, ctx: AgentContext, ws: WebSocketConnection,
                          event: dict[str, Any]) -> None:
        """``channel.send`` / ``channel.open`` / ``channel.close`` from the agent."""
        kind = event["type"]
        try:
            if kind == "channel.open":
                label = event.get("label")
                if not isinstance(label, str):
                    raise ProtocolError("channel.open needs a string 'label'")
                info = ctx.open_channel(
                    label,
                    protocol=_opt(event, "protocol", str) or "",
                    ordered=_opt(event, "ordered", bool) is not False,
                    max_retransmits=_opt(event, "max_retransmits", int),
                    max_packet_lifetime_ms=_opt(event, "max_packet_lifetime", int),
                    negotiated_id=_opt(event, "negotiated_id", int),
                )
                await ws.send_message(json.dumps({"type": "channel.opened",
                                                  "channel": info.to_json()}))
                return
            channel = event.get("channel")
            if not isinstance(channel, int | str) or isinstance(channel, bool):
                raise ProtocolError(f"{kind} needs 'channel': an id or a label")
            if kind == "channel.close":
                ctx.close_channel(channel)
            else:
                await ctx.send_message(channel, _message_data(event))
        except ChannelError as exc:
            await ws.send_message(json.dumps({"type": "channel.error",
                                              "channel": event.get("channel",
                                                                   event.get("label")),
                                              "message": str(exc)}))

    async def _playout(self, ctx: AgentContext, ws: WebSocketConnection) -> None:
        """``output.idle`` each time the output queue runs dry after audio: the agent learns
        where playback stands (``played``) instead of modelling it from its own clock."""
        with _quietly_closed():
            while True:
                await ctx.output_queued()
                await ctx.drained()
                if ctx.ended:
                    return
                if ctx.played_seconds <= self._reported:
                    continue  # emptied by an interrupt, and output.cleared said so
                self._reported = ctx.played_seconds
                await ws.send_message(json.dumps(
                    {"type": "output.idle", "played": round(self._reported, 6)}))

    async def _downlink(self, ctx: AgentContext, ws: WebSocketConnection) -> None:
        """Agent messages → audio queue, interrupt, events. Returns when the socket closes."""
        rs = Resampler(self.sample_rate, SAMPLE_RATE)
        while True:
            try:
                msg = await ws.get_message()
            except ConnectionClosed as exc:
                self.end_reason = _closed_reason(exc)
                if self.end_reason.startswith("closed"):
                    await ctx.drained()  # a clean close: let its last words play
                return
            try:
                if isinstance(msg, bytes):
                    if len(msg) % 2:
                        raise ProtocolError("binary frames are PCM16: an even number of bytes")
                    await ctx.send(rs.process(msg))
                else:
                    event = _parse(msg)
                    if event["type"] == "interrupt":
                        dropped = ctx.interrupt()
                        self._reported = ctx.played_seconds
                        rs = Resampler(self.sample_rate, SAMPLE_RATE)  # drop its tail too
                        await ws.send_message(json.dumps({
                            "type": "output.cleared", "played": round(ctx.played_seconds, 6),
                            "dropped": round(dropped, 6)}))
                    elif event["type"] in CHANNEL_OPS:
                        await self._channel_op(ctx, ws, event)
                    elif await self._on_event(ctx, event):
                        return
            except ProtocolError as exc:
                return await self._protocol_error(ws, exc)
            except SessionEnded:
                return

    async def _on_event(self, ctx: AgentContext, event: dict[str, Any]) -> bool:
        """Pass an agent event on; True if it ended the session."""
        if event["type"] == "session.end":
            reason = event.get("reason")
            self.end_reason = reason if isinstance(reason, str) and reason else "hangup"
            if event.get("after_playback"):
                await ctx.drained()
            await ctx.send_event({"type": "session.end", "reason": self.end_reason})
            return True
        await ctx.send_event(event)
        return False

    async def _goodbye(self, ctx: AgentContext, ws: WebSocketConnection) -> None:
        """Tell the agent why the call ended and close the socket (shielded, bounded)."""
        if ws.closed is not None:
            return
        reason = ctx.end_reason or self.end_reason or "agent-done"
        with trio.move_on_after(CLOSE_TIMEOUT) as scope:
            scope.shield = True
            try:
                await ws.send_message(json.dumps({"type": "session.ended", "reason": reason}))
                # aclose() sends the close frame at once, then waits for the agent's reply,
                # which nobody reads once the session is cancelled: do not wait long for it.
                with trio.move_on_after(CLOSE_REPLY_WAIT):
                    await ws.aclose(1000, reason[:120])
            except ConnectionClosed:
                pass


async def _close_transport(ws: WebSocketConnection) -> None:
    """Close the TCP stream. After a close frame from the server a trio-websocket client
    waits for the server's TCP close in its reader task, which we cancel: the socket would
    leak. There is no public handle on the stream, hence the private attribute."""
    stream = getattr(ws, "_stream", None)
    if stream is not None:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(stream)


class _quietly_closed:
    """Context manager: a closed socket ends the task (the downlink reports why)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: type[BaseException] | None, *_: object) -> bool:
        return et is not None and issubclass(et, ConnectionClosed)


def _parse(text: str) -> dict[str, Any]:
    try:
        event = json.loads(text)
    except ValueError:
        raise ProtocolError("text frames must be JSON") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise ProtocolError("events are JSON objects with a string 'type'")
    return event


CHANNEL_OPS = frozenset({"channel.send", "channel.open", "channel.close"})


def channel_event_json(event: ChannelEvent) -> dict[str, Any]:
    """The agent-protocol form of a data-channel event (docs/agent-protocol.md)."""
    if isinstance(event, ChannelOpened):
        return {"type": "channel.opened", "channel": event.channel.to_json()}
    if isinstance(event, ChannelClosed):
        return {"type": "channel.closed", "id": event.channel_id, "label": event.label}
    assert isinstance(event, ChannelMessage)
    out: dict[str, Any] = {"type": "channel.message", "id": event.channel_id,
                           "label": event.label}
    if isinstance(event.data, str):
        out["text"] = event.data
    else:
        out["binary"] = base64.b64encode(event.data).decode()
    return out


def _message_data(event: dict[str, Any]) -> str | bytes:
    text, binary = event.get("text"), event.get("binary")
    if (text is None) == (binary is None):
        raise ProtocolError("channel.send needs exactly one of 'text' or 'binary' (base64)")
    if text is not None:
        if not isinstance(text, str):
            raise ProtocolError("channel.send 'text' must be a string")
        return text
    if not isinstance(binary, str):
        raise ProtocolError("channel.send 'binary' must be a base64 string")
    try:
        return base64.b64decode(binary, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("channel.send 'binary' is not valid base64") from None


def _opt(event: dict[str, Any], key: str, kind: type) -> Any:
    value = event.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f"{event['type']} '{key}' must be {kind.__name__}")
    return value


def _closed_reason(exc: ConnectionClosed) -> str:
    code = exc.reason.code if exc.reason is not None else 1006
    text = (exc.reason.reason if exc.reason is not None else None) or ""
    if code in (1000, 1001):
        return f"closed: {text}" if text else "closed"
    return f"disconnected: {code}" + (f" {text}" if text else "")


def bridge(spec: str) -> AgentFn:
    """The scheme factory (the registry's ``ws`` and ``wss``): one :class:`WsBridge` per
    session."""

    async def run(ctx: AgentContext) -> None:
        await WsBridge(spec).run(ctx)

    return run
