"""The agent side of the WebSocket agent protocol, in asyncio, for the framework adapters.

docs/agent-protocol.md: the transceiver connects once per call, sends ``session.start``
and waits (5 s) for ``session.accept``; then binary frames are PCM16 at the accepted
rate and text frames JSON events. :class:`AgentSocket` is one such connection: the
handshake, serialised sends, and the data channels the agent has been told about.
:func:`serve_bots` / :func:`run` serve one coroutine per connection. Uses ``websockets``
(asyncio), which both adapters' frameworks run on.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

log = logging.getLogger("appliance.integrations")

PROTOCOL = "appliance.agent.v1"
SAMPLE_RATES = (48_000, 24_000, 16_000)
MAX_MESSAGE = 1 << 20  # docs/agent-protocol.md: messages are at most 1 MiB
MAX_PENDING_MESSAGES = 64  # outbound messages held while no channel is open


class AgentSocket:
    """One call's WebSocket (one transceiver connection), shared by an adapter's input and
    output sides."""

    def __init__(self, websocket: ServerConnection, *, wire_sample_rate: int | None = None,
                 default_channel: str | None = None, start_timeout: float = 5.0) -> None:
        self.ws = websocket
        self.wire_sample_rate = wire_sample_rate
        self.default_channel = default_channel
        self.start_timeout = start_timeout
        self.start: dict[str, Any] | None = None
        self.rate = 0  # the accepted wire rate; 0 until session.accept is sent
        self.channels: dict[int, dict[str, Any]] = {}
        self.end_reason: str | None = None
        self.closed = False
        self._accept_lock = asyncio.Lock()
        self._send_lock = asyncio.Lock()
        self._pending: deque[tuple[str | int | None, Any]] = deque()

    async def accept(self, preferred: int) -> None:
        """Read ``session.start`` and answer ``session.accept`` (once, whoever asks first)."""
        async with self._accept_lock:
            if self.rate:
                return
            async with asyncio.timeout(self.start_timeout):
                first = await self.ws.recv()
            start = json_object(first) if isinstance(first, str) else None
            if start is None or start.get("type") != "session.start":
                raise ConnectionError(f"expected session.start, got {first!r:.80}")
            if start.get("protocol") != PROTOCOL:
                log.warning("unknown agent protocol %r", start.get("protocol"))
            offered = [r for r in start.get("sample_rates", [48_000]) if isinstance(r, int)]
            rate = self.wire_sample_rate or (preferred if preferred in offered
                                                    else 48_000)
            if rate not in offered:
                raise ConnectionError(f"the transceiver does not offer {rate} Hz: {offered}")
            self.start = start
            await self.send_json({"type": "session.accept", "sample_rate": rate})
            self.rate = rate

    async def send_json(self, event: dict[str, Any]) -> None:
        await self.send(json.dumps(event))

    async def send(self, data: str | bytes) -> None:
        if self.closed:
            return
        async with self._send_lock:
            try:
                await self.ws.send(data)
            except ConnectionClosed:
                self.closed = True

    async def close(self, reason: str) -> None:
        self.closed = True
        async with self._send_lock:
            await self.ws.close(1000, reason[:120])

    # -- data channels -----------------------------------------------------------------------

    def pick_channel(self, wanted: str | int | None) -> str | int | None:
        if wanted is None:
            wanted = self.default_channel
        if wanted is None:
            return min(self.channels) if self.channels else None
        if isinstance(wanted, int):
            return wanted if wanted in self.channels else None
        return wanted if any(c.get("label") == wanted for c in self.channels.values()) else None

    async def send_message(self, message: Any, channel: str | int | None) -> None:
        target = self.pick_channel(channel)
        if target is None:
            if len(self._pending) >= MAX_PENDING_MESSAGES:
                self._pending.popleft()
                log.warning("no data channel open: dropped the oldest held message")
            self._pending.append((channel, message))
            return
        event: dict[str, Any] = {"type": "channel.send", "channel": target}
        if isinstance(message, bytes | bytearray | memoryview):
            event["binary"] = base64.b64encode(bytes(message)).decode()
        elif isinstance(message, str):
            event["text"] = message
        else:
            event["text"] = json.dumps(message)
        await self.send_json(event)

    async def flush_pending(self) -> None:
        held, self._pending = self._pending, deque()
        for channel, message in held:
            await self.send_message(message, channel)


Bot = Callable[[ServerConnection], Awaitable[None]]


async def serve_bots(bot: Bot, host: str = "127.0.0.1", port: int = 8765, *,
                     ready: Callable[[str], None] | None = None) -> None:
    """Serve ``bot`` to transceivers: one call per connection, until cancelled.

    ``ready`` gets the ``ws://`` URL to give ``appliance up --agent`` once listening."""

    async def handler(websocket: ServerConnection) -> None:
        try:
            await bot(websocket)
        finally:
            await websocket.close()

    async with serve(handler, host, port, max_size=MAX_MESSAGE) as server:
        bound = next(iter(server.sockets)).getsockname()
        if ready is not None:
            ready(f"ws://{bound[0]}:{bound[1]}/")
        await server.serve_forever()


def run(bot: Bot, host: str = "127.0.0.1", port: int = 8765, *,
        ready: Callable[[str], None] | None = None) -> None:
    """:func:`serve_bots` in a fresh asyncio loop; returns on Ctrl-C."""
    try:
        asyncio.run(serve_bots(bot, host, port, ready=ready))
    except KeyboardInterrupt:
        pass


def json_object(text: str) -> dict[str, Any] | None:
    try:
        event = json.loads(text)
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("type"), str) else None


def close_reason(ws: ServerConnection) -> str:
    code = ws.close_code
    return "closed" if code in (1000, 1001) else f"disconnected: {code}"
