"""The upstream bridge: ``--agent realtime+wss://host/v1/realtime?model=…`` (issue 17, item 3).

The browser speaks OpenAI's Realtime **WebRTC** surface to the appliance (Opus over RTP, JSON
events on the ``oai-events`` data channel); the upstream — OpenAI, LocalAI, any
speech-to-speech server that speaks the Realtime **WebSocket** protocol (GA event names) —
gets one WebSocket per call from here::

    browser ──RTP/Opus 48k──► transceiver ──frames()──► bridge ──input_audio_buffer.append──►
            ◄──RTP/Opus 48k── (pacer)    ◄──send()──         ◄──response.output_audio.delta──
    browser ══oai-events═══════════════════════════► bridge ═══ every other event ═══► upstream
            ◄═════════════ every other event ════════       ◄═══════════════════════════

What the bridge does, and why (the WebRTC surface differs from the WebSocket one only in who
carries the audio and who knows what was played):

* **audio up**: every 20 ms frame is resampled 48 kHz → 24 kHz (:mod:`appliance.audio.resample`,
  the filter :mod:`appliance.agents.ws` uses) and sent at once as ``input_audio_buffer.append`` with
  base64 ``audio/pcm`` (the GA format: 16-bit little-endian mono at 24 kHz). Nothing is
  batched: the upstream's VAD sees audio as soon as the transceiver decoded it.
* **audio down**: ``response.output_audio.delta`` is decoded, resampled 24 → 48 kHz and played
  through :meth:`AgentContext.send`; it is *not* forwarded (a WebRTC client gets audio as
  RTP). The bridge emits the WebRTC-only ``output_audio_buffer.started`` when a response's
  audio begins playing and ``output_audio_buffer.stopped`` when all of it has been played
  (the upstream, speaking WebSocket, knows neither).
* **barge-in**: ``output_audio_buffer.clear`` from the browser, or the upstream's
  ``input_audio_buffer.speech_started`` while audio plays (server VAD with
  ``interrupt_response``), drops the queued audio at once (:meth:`AgentContext.interrupt`),
  sends ``conversation.item.truncate`` upstream at the position actually played (what only
  the bridge knows; the GA guide asks WebSocket clients to do exactly this), a
  ``response.cancel`` if the response was still being generated and not cancelled already,
  and ``output_audio_buffer.cleared`` to the browser.
* **events**: everything else passes through verbatim both ways, ids included (item,
  response and event ids are the upstream's; the bridge's own events get ``event_…`` ids).
  A ``session.update`` from the browser is forwarded with its audio formats pinned to
  ``audio/pcm`` 24 kHz (the browser's own leg is Opus, whatever it asks for). The call's
  session config (``ctx.params["realtime"]["session"]``, from ``/v1/realtime/calls``) goes
  up as the first ``session.update``; the browser's first event is ``session.created``
  carrying the session as configured, as OpenAI's WebRTC answers.
* **the channel**: pre-negotiated with ``ctx.params["realtime"]["dcid"]`` (opened here, no
  DCEP round trip) or opened by the browser with DCEP and the label ``oai-events``. Upstream
  events that arrive before it is open wait in a bounded queue (oldest dropped first).
* **ending**: the upstream unreachable, rejecting the handshake or closing the socket sends
  the browser an ``error`` event (``type: server_error``, ``code: upstream_unreachable`` /
  ``upstream_disconnected``) and ends the call (``upstream: …``); the call ending closes the
  WebSocket with 1000.

The key (``Authorization: Bearer …``) comes from the environment of the appliance process:
``$APPLIANCE_REALTIME_KEY``, or a file named by ``$APPLIANCE_REALTIME_KEY_FILE``; a spec may
pick another variable with ``key_env=APPLIANCE_REALTIME_KEY_<NAME>`` (only that prefix, so a
spec cannot read arbitrary secrets of the process). No key: no header (local servers). The
key is never logged or put in an event; URLs are logged without their query.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import ssl
from collections import deque
from contextlib import aclosing
from typing import Any
from urllib.parse import urlsplit

import trio
from trio_websocket import (
    ConnectionClosed,
    HandshakeError,
    WebSocketConnection,
    wrap_client_stream,
)

from ..agents.channels import ChannelError, ChannelMessage, ChannelOpened
from ..agents.context import FRAME_BYTES, SAMPLE_RATE, AgentContext, SessionEnded
from ..agents.registry import AgentFn
from ..audio.resample import Resampler
from ..logs import loggable_url
from .bridge_state import (
    KEY_ENV,
    KEY_FILE_ENV,
    PCM_FORMAT,
    SCHEMES,
    UPSTREAM_RATE,
    Playout,
    Upstream,
    _Segment,
    error_event,
    event_id,
    parse_browser,
    pin_formats,
)

__all__ = ["KEY_ENV", "KEY_FILE_ENV", "LABEL", "PCM_FORMAT", "SCHEMES", "UPSTREAM_RATE",
           "Playout", "RealtimeBridge", "Upstream", "bridge", "error_event",
           "parse_browser", "pin_formats"]

log = logging.getLogger("appliance.realtime.bridge")

LABEL = "oai-events"
CONNECT_TIMEOUT = 10.0  # TCP + TLS + WebSocket handshake + session.created
CLOSE_TIMEOUT = 1.0
MAX_MESSAGE = 16 << 20  # an append may carry up to 15 MiB (GA reference)
MAX_PENDING_EVENTS = 1024  # upstream events waiting for the browser's channel
MAX_PENDING_AUDIO_S = 120.0  # decoded audio ahead of the 2 s playout queue; then TCP pushes back


# -- the bridge ------------------------------------------------------------------------------


class UpstreamFailed(Exception):
    """The upstream cannot be reached or went away; ``code`` names which, for the error event."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class RealtimeBridge:
    """One call's bridge. ``await RealtimeBridge(upstream).run(ctx)`` is the agent function."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.channel_id: int | None = None
        self.end_reason: str | None = None
        self._outbox: deque[str] = deque()
        self._outbox_lot = trio.lowlevel.ParkingLot()
        self._inbox: deque[str | bytes] = deque()  # browser messages, not yet handled
        self._inbox_lot = trio.lowlevel.ParkingLot()
        self.events_dropped = 0
        self.playout = Playout()
        self._pending: deque[tuple[_Segment, bytes]] = deque()  # decoded, not yet queued
        self._pending_samples = 0
        self._player_lot = trio.lowlevel.ParkingLot()
        self._poke = trio.Event()  # new audio or an audio-done mark: re-check playout state
        self._cut: set[str] = set()  # items whose later deltas are dropped (barge-in)
        self._audio_done: set[str] = set()  # responses whose audio the upstream has finished
        self._playing: str | None = None  # response id between started and stopped/cleared
        self._active: str | None = None  # response being generated (created .. done)
        self._cancel_sent: str | None = None
        self._in_flight: _Segment | None = None  # the chunk the player is queueing
        self._stream: trio.SocketStream | trio.SSLStream[trio.SocketStream] | None = None
        self._interrupt_response = True  # server VAD's interrupt_response, as last configured
        self._rs_down = Resampler(UPSTREAM_RATE, SAMPLE_RATE)
        self._connected = False  # the WebSocket handshake completed

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self, ctx: AgentContext) -> None:
        rt = ctx.params.get("realtime") if isinstance(ctx.params, dict) else None
        rt = rt if isinstance(rt, dict) else {}
        given = rt.get("session")
        session: dict[str, Any] = given if isinstance(given, dict) else {}
        dcid = rt.get("dcid")
        async with trio.open_nursery() as nursery:
            if isinstance(dcid, int) and not isinstance(dcid, bool):
                # OpenAI's ?dcid= mode: the browser created the channel with negotiated:true
                # and this id; we open the same stream id, no DCEP (RFC 8832 §6 not used).
                try:
                    self.channel_id = ctx.open_channel(LABEL, negotiated_id=dcid).id
                except ChannelError as exc:
                    log.warning("session %s: cannot open %s id %s: %s", ctx.session_id,
                                LABEL, dcid, exc)
            nursery.start_soon(self._to_browser, ctx)
            nursery.start_soon(self._channel, ctx)
            failure = await self._call(ctx, session)
            if failure is not None and not ctx.ended:
                self.end_reason = f"upstream: {failure}"
                log.warning("session %s: realtime upstream %s: %s", ctx.session_id,
                            loggable_url(self.upstream.url), failure)
                self._emit(error_event("server_error", failure.code, f"upstream: {failure}"))
                await self._flushed(ctx)
                await ctx.send_event({"type": "session.end", "reason": self.end_reason})
            nursery.cancel_scope.cancel()

    async def _call(self, ctx: AgentContext, session: dict[str, Any]) -> UpstreamFailed | None:
        """The upstream leg, until the call or the upstream ends; why the upstream did."""
        failed: list[UpstreamFailed] = []
        try:
            await self._upstream(ctx, session)
        except* UpstreamFailed as group:
            failed += _leaves(group)
        except* HandshakeError as group:
            # A refusal with a body is raised by trio-websocket's reader task, in `call`.
            exc = group.exceptions[0]
            status = getattr(exc, "status_code", None)
            failed.append(UpstreamFailed("upstream_unreachable",
                                         f"handshake refused ({status or type(exc).__name__})"))
        except* (trio.BrokenResourceError, ssl.SSLError, OSError) as group:
            # The transport broke: a TLS handshake that failed (wss:// to a plain server, an
            # untrusted certificate) surfaces only when the WebSocket handshake is written.
            broken = group.exceptions[0]
            cause = broken.__cause__ or broken
            failed.append(UpstreamFailed(
                "upstream_disconnected" if self._connected else "upstream_unreachable",
                f"transport failed ({type(cause).__name__}: {str(cause)[:120]})"))
        return failed[0] if failed else None

    async def _upstream(self, ctx: AgentContext, session: dict[str, Any]) -> None:
        try:
            async with trio.open_nursery() as call:
                ws = await self._connect(call)
                try:
                    await self._session(ctx, ws, session)
                finally:
                    await self._close(ctx, ws)
                    call.cancel_scope.cancel()  # trio-websocket's reader task
        finally:
            if self._stream is not None:
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(self._stream)

    async def _connect(self, nursery: trio.Nursery) -> WebSocketConnection:
        """TCP (+ TLS for wss) opened here, so the stream is ours to close whatever happens
        (trio-websocket leaks it when the handshake is refused), then the WebSocket."""
        key = self.upstream.key()
        headers = [(b"Authorization", b"Bearer " + key.encode())] if key else []
        parts = urlsplit(self.upstream.url)
        tls = parts.scheme == "wss"
        host = parts.hostname or ""
        port = parts.port or (443 if tls else 80)
        resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                if tls:
                    tls_stream = await trio.open_ssl_over_tcp_stream(
                        host, port, ssl_context=ssl.create_default_context(),
                        https_compatible=True)
                    self._stream = tls_stream
                    # Now, not lazily: trio-websocket's reader would swallow a TLS failure
                    # and leave the WebSocket handshake waiting until the timeout.
                    await tls_stream.do_handshake()
                else:
                    self._stream = await trio.open_tcp_stream(host, port)
                ws = await wrap_client_stream(
                    nursery, self._stream, parts.netloc.rpartition("@")[2], resource,
                    extra_headers=headers, message_queue_size=64, max_message_size=MAX_MESSAGE)
                self._connected = True
                return ws
        except trio.TooSlowError:
            raise UpstreamFailed("upstream_unreachable", "connect timed out") from None
        except HandshakeError as exc:
            status = getattr(exc, "status_code", None)
            raise UpstreamFailed("upstream_unreachable",
                                 f"handshake refused ({status or type(exc).__name__})") from None
        except OSError as exc:
            raise UpstreamFailed("upstream_unreachable", exc.strerror or str(exc)) from None
        except trio.BrokenResourceError as exc:
            cause = exc.__cause__ or exc
            raise UpstreamFailed("upstream_unreachable", f"TLS failed ({type(cause).__name__}: "
                                 f"{str(cause)[:120]})") from None

    async def _close(self, ctx: AgentContext, ws: WebSocketConnection) -> None:
        if ws.closed is None:
            with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
                try:
                    with trio.move_on_after(0.05):  # its reply frame is nobody's business
                        await ws.aclose(1000, (ctx.end_reason or "call ended")[:120])
                except ConnectionClosed:
                    pass

    async def _session(self, ctx: AgentContext, ws: WebSocketConnection,
                       session: dict[str, Any]) -> None:
        """Set the session up, then run the legs until either side ends."""
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                created = await self._recv(ws)
            if created.get("type") != "session.created":
                raise UpstreamFailed("upstream_disconnected",
                                     f"expected session.created, got {created.get('type')!r}")
            update_id = event_id()
            await self._send(ws, {"type": "session.update", "event_id": update_id,
                                  "session": pin_formats(session)})
            with trio.fail_after(CONNECT_TIMEOUT):
                while True:
                    event = await self._recv(ws)
                    kind = event.get("type")
                    if kind == "session.updated":
                        created = {**created, "session": event.get("session")}
                        break
                    err = event.get("error")
                    if kind == "error" and isinstance(err, dict) and \
                            err.get("event_id") == update_id:
                        self._emit(event)  # the browser learns its config was refused
                        break
                    await self._from_upstream(ctx, ws, event)
        except trio.TooSlowError:
            raise UpstreamFailed("upstream_unreachable", "no session.created/updated") from None
        self._note_session(created.get("session"))
        self._emit(created)
        async with trio.open_nursery() as legs:
            legs.start_soon(self._uplink, ctx, ws, legs.cancel_scope)
            legs.start_soon(self._from_browser, ctx, ws)
            legs.start_soon(self._player, ctx)
            legs.start_soon(self._watch_playout, ctx)
            try:
                while True:
                    await self._from_upstream(ctx, ws, await self._recv(ws))
                    await self._backpressure()
            finally:
                legs.cancel_scope.cancel()

    async def _recv(self, ws: WebSocketConnection) -> dict[str, Any]:
        while True:
            try:
                msg = await ws.get_message()
            except ConnectionClosed as exc:
                reason = exc.reason
                code = reason.code if reason is not None else 1006
                text = (reason.reason if reason is not None else None) or ""
                raise UpstreamFailed("upstream_disconnected",
                                     f"closed {code}" + (f" {text}" if text else "")) from None
            if isinstance(msg, str):
                try:
                    event = json.loads(msg)
                except ValueError:
                    event = None
                if isinstance(event, dict) and isinstance(event.get("type"), str):
                    return event
            log.debug("realtime upstream sent a non-event message; ignored")

    async def _send(self, ws: WebSocketConnection, event: dict[str, Any]) -> None:
        try:
            await ws.send_message(json.dumps(event, separators=(",", ":")))
        except ConnectionClosed:
            pass  # the downlink's get_message reports why

    # -- audio up --------------------------------------------------------------------------------

    async def _uplink(self, ctx: AgentContext, ws: WebSocketConnection,
                      legs: trio.CancelScope) -> None:
        rs = Resampler(SAMPLE_RATE, UPSTREAM_RATE)
        async with aclosing(ctx.frames()) as frames:
            async for frame in frames:
                pcm = rs.process(frame.pcm)
                if not pcm:
                    continue
                await self._send(ws, {"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(pcm).decode()})
        legs.cancel()  # the call is over

    # -- events from the browser ------------------------------------------------------------

    async def _channel(self, ctx: AgentContext) -> None:
        """The whole call long: find ``oai-events`` and queue what the browser sends on it
        (the upstream may not be connected yet)."""
        async with aclosing(ctx.channel_events()) as events:
            async for ev in events:
                if isinstance(ev, ChannelOpened) and ev.channel.label == LABEL:
                    if self.channel_id is None:
                        self.channel_id = ev.channel.id
                        self._outbox_lot.unpark_all()
                elif isinstance(ev, ChannelMessage) and ev.channel_id == self.channel_id:
                    if len(self._inbox) >= MAX_PENDING_EVENTS:
                        self._inbox.popleft()
                        self.events_dropped += 1
                    self._inbox.append(ev.data)
                    self._inbox_lot.unpark_all()

    async def _from_browser(self, ctx: AgentContext, ws: WebSocketConnection) -> None:
        while True:
            while not self._inbox:
                await self._inbox_lot.park()
            event = parse_browser(self._inbox.popleft())
            if isinstance(event, str):
                self._emit(error_event("invalid_request_error", "invalid_event", event))
                continue
            kind = event["type"]
            if kind == "output_audio_buffer.clear":
                await self._barge_in(ctx, ws, cancel=True)
                continue
            if kind == "session.update" and isinstance(event.get("session"), dict):
                event = {**event, "session": pin_formats(event["session"])}
            elif kind == "response.cancel":
                self._cancel_sent = self._active
            await self._send(ws, event)

    # -- events and audio from the upstream ------------------------------------------------------

    async def _from_upstream(self, ctx: AgentContext, ws: WebSocketConnection,
                             event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "response.output_audio.delta":
            self._audio_delta(event)
            return
        if kind == "response.created":
            resp = event.get("response")
            self._active = resp.get("id") if isinstance(resp, dict) else None
        elif kind == "response.output_audio.done":
            self._mark_done(str(event.get("response_id")))
        elif kind == "response.done":
            resp = event.get("response")
            rid = resp.get("id") if isinstance(resp, dict) else None
            self._mark_done(str(rid))
            if rid == self._active:
                self._active = None
        elif kind in ("session.updated", "session.created"):
            self._note_session(event.get("session"))
        elif kind == "input_audio_buffer.speech_started" and self._interrupt_response:
            # Server VAD heard the caller: a WebSocket client must stop playback and
            # truncate (the server cannot know what was played); OpenAI's WebRTC surface
            # does it server-side. The upstream cancels the response itself.
            self._emit(event)
            await self._barge_in(ctx, ws, cancel=False)
            return
        self._emit(event)

    def _note_session(self, session: Any) -> None:
        if not isinstance(session, dict):
            return
        audio = session.get("audio")
        inp = audio.get("input") if isinstance(audio, dict) else None
        td = inp.get("turn_detection") if isinstance(inp, dict) else None
        if isinstance(td, dict) and isinstance(td.get("interrupt_response"), bool):
            self._interrupt_response = td["interrupt_response"]

    def _audio_delta(self, event: dict[str, Any]) -> None:
        item_id, rid = str(event.get("item_id")), str(event.get("response_id"))
        if item_id in self._cut:
            return  # generated before the upstream heard our truncate
        try:
            pcm = base64.b64decode(str(event.get("delta", "")), validate=True)
        except (binascii.Error, ValueError):
            log.debug("realtime upstream sent an audio delta that is not base64; dropped")
            return
        pcm = self._rs_down.process(pcm[: len(pcm) & ~1])
        if not pcm:
            return
        ci = event.get("content_index")
        seg = _Segment(rid, item_id, ci if isinstance(ci, int) else 0)
        for i in range(0, len(pcm), FRAME_BYTES):
            chunk = pcm[i : i + FRAME_BYTES]
            self._pending.append((seg, chunk))
            self._pending_samples += len(chunk) // 2
        self._player_lot.unpark_all()

    async def _backpressure(self) -> None:
        """Stop reading the upstream while more than MAX_PENDING_AUDIO_S waits to be played."""
        while self._pending_samples > MAX_PENDING_AUDIO_S * SAMPLE_RATE:
            await self._player_lot.park()

    def _mark_done(self, response_id: str) -> None:
        self._audio_done.add(response_id)
        self._wake()

    def _wake(self) -> None:
        self._poke.set()

    async def _player(self, ctx: AgentContext) -> None:
        """Decoded audio -> the playout queue, one 20 ms chunk at a time (so ``playout``
        counts exactly what was queued, even when ``send`` waits for room)."""
        try:
            while True:
                while not self._pending:
                    await self._player_lot.park()
                seg, chunk = self._pending.popleft()
                self._in_flight = seg
                self._pending_samples -= len(chunk) // 2
                self._player_lot.unpark_all()  # the reader may be waiting for room
                if self._playing != seg.response_id:
                    if self._playing is not None:
                        self._stopped(self._playing)
                    self._playing = seg.response_id
                    self._emit({"type": "output_audio_buffer.started", "event_id": event_id(),
                                "response_id": seg.response_id})
                await ctx.send(chunk)
                self._in_flight = None
                if seg.item_id in self._cut:
                    continue  # cut while we waited for room: interrupt() dropped it
                self.playout.add(seg.response_id, seg.item_id, seg.content_index,
                                 len(chunk) // 2)
                self._wake()
        except SessionEnded:
            return

    async def _watch_playout(self, ctx: AgentContext) -> None:
        """``output_audio_buffer.stopped`` once a finished response has been played out."""
        while True:
            self._poke = trio.Event()  # before waiting: a poke meanwhile is not lost
            await ctx.drained()
            rid = self._playing
            if rid is not None and rid in self._audio_done and self._in_flight is None and \
                    not any(s.response_id == rid for s, _ in self._pending):
                self._stopped(rid)
                self._playing = None
                if not self._pending:
                    self.playout.clear()  # all played: positions restart at the next one
            await self._poke.wait()

    def _stopped(self, rid: str) -> None:
        self._emit({"type": "output_audio_buffer.stopped", "event_id": event_id(),
                    "response_id": rid})

    def _interrupt(self, ctx: AgentContext) -> tuple[_Segment, int] | None:
        """Drop all queued audio; returns what was playing and how far (ms) it got."""
        if self._playing is None:
            return None
        at = self.playout.playing(round(ctx.queued_seconds * SAMPLE_RATE))
        rid = self._playing
        ctx.interrupt()
        for seg, _ in self._pending:
            self._cut.add(seg.item_id)
        if at is not None:
            self._cut.add(at[0].item_id)
        if self._in_flight is not None:
            self._cut.add(self._in_flight.item_id)
        self._pending.clear()
        self._pending_samples = 0
        self._player_lot.unpark_all()
        self.playout.clear()
        self._rs_down = Resampler(UPSTREAM_RATE, SAMPLE_RATE)  # its buffered tail too
        self._playing = None
        self._emit({"type": "output_audio_buffer.cleared", "event_id": event_id(),
                    "response_id": rid})
        return at

    async def _barge_in(self, ctx: AgentContext, ws: WebSocketConnection, *,
                        cancel: bool) -> None:
        active = self._active
        at = self._interrupt(ctx)
        if cancel and active is not None and self._cancel_sent != active:
            # OpenAI's clear "stops generating audio": a response still running is
            # cancelled (unless the browser did it already, as the SDKs do first).
            self._cancel_sent = active
            await self._send(ws, {"type": "response.cancel", "event_id": event_id()})
        if at is not None:
            seg, ms = at
            await self._send(ws, {"type": "conversation.item.truncate", "event_id": event_id(),
                                  "item_id": seg.item_id, "content_index": seg.content_index,
                                  "audio_end_ms": max(0, ms)})

    # -- to the browser --------------------------------------------------------------------------

    def _emit(self, event: dict[str, Any]) -> None:
        if len(self._outbox) >= MAX_PENDING_EVENTS:
            self._outbox.popleft()
            self.events_dropped += 1
        self._outbox.append(json.dumps(event, separators=(",", ":")))
        self._outbox_lot.unpark_all()

    async def _to_browser(self, ctx: AgentContext) -> None:
        while True:
            while not self._outbox or self.channel_id is None:
                await self._outbox_lot.park()
            text = self._outbox[0]
            try:
                await ctx.send_message(self.channel_id, text)
            except ChannelError as exc:
                if self.channel_id not in ctx.channels:  # closed by the browser: keep waiting
                    self.channel_id = None
                    continue
                log.debug("session %s: event not sent: %s", ctx.session_id, exc)
            self._outbox.popleft()
            self._outbox_lot.unpark_all()

    async def _flushed(self, ctx: AgentContext) -> None:
        """Wait (bounded) until every queued event has been handed to the channel."""
        with trio.move_on_after(CONNECT_TIMEOUT):
            while self._outbox and not ctx.ended:
                await self._outbox_lot.park()


def _leaves(group: BaseExceptionGroup[UpstreamFailed]) -> list[UpstreamFailed]:
    """The UpstreamFailed exceptions of a (nested) group: each nursery level wraps again."""
    out: list[UpstreamFailed] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out += _leaves(exc)
        elif isinstance(exc, UpstreamFailed):
            out.append(exc)
    return out


def bridge(spec: str) -> AgentFn:
    """The scheme factory (registered for :data:`SCHEMES` by appliance/realtime/plugin.py):
    parses (and checks) the spec once, one bridge per call."""
    upstream = Upstream.parse(spec)

    async def run(ctx: AgentContext) -> None:
        await RealtimeBridge(upstream).run(ctx)

    return run
