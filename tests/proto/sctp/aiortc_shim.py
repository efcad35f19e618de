"""Run aiortc's independent SCTP (``aiortc.rtcsctptransport.RTCSctpTransport``) against our
sans-IO endpoint in one asyncio loop, with no DTLS in between.

``FakeDtlsTransport`` is the part of ``RTCDtlsTransport`` that ``RTCSctpTransport`` uses
(aiortc 1.16): ``state``, ``_role``, ``_register_data_receiver``,
``_unregister_data_receiver`` and ``async _send_data``. ``OursDriver`` is a tiny asyncio
shell around a :class:`DataChannelEndpoint`: it feeds aiortc's packets in, hands ours to
aiortc's ``_handle_data``, and sleeps until ``poll_timeout()`` or the next packet.
Shared by ``test_aiortc_interop.py`` and ``bench/sctp_core.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from appliance.proto.sctp.datachannel import DataChannelEndpoint


class FakeDtlsTransport:
    def __init__(self, role: str, deliver: Callable[[bytes], None]) -> None:
        self._role = role  # "client" / "server": the DTLS role aiortc reads for parity
        self.state = "connected"
        self._data_receiver: Any = None
        self._deliver = deliver
        self.sent_packets = 0

    def _register_data_receiver(self, receiver: Any) -> None:
        self._data_receiver = receiver

    def _unregister_data_receiver(self, receiver: Any) -> None:
        if self._data_receiver is receiver:
            self._data_receiver = None

    async def _send_data(self, data: bytes) -> None:
        self.sent_packets += 1
        self._deliver(data)


class OursDriver:
    def __init__(self, endpoint: DataChannelEndpoint, changed: asyncio.Event) -> None:
        self.ep = endpoint
        self.inbox: asyncio.Queue[bytes] = asyncio.Queue()
        self.events: list[Any] = []
        self.changed = changed
        self.fake: FakeDtlsTransport | None = None
        self.sent_packets = 0

    def feed(self, data: bytes) -> None:
        self.inbox.put_nowait(data)

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def flush(self) -> None:
        assert self.fake is not None
        while (pkt := self.ep.poll_transmit()) is not None:
            self.sent_packets += 1
            receiver = self.fake._data_receiver
            if receiver is not None:
                await receiver._handle_data(pkt)
        got = False
        while (ev := self.ep.poll_event()) is not None:
            self.events.append(ev)
            got = True
        if got:
            self.changed.set()

    async def run(self) -> None:
        while True:
            await self.flush()
            deadline = self.ep.poll_timeout()
            timeout = None if deadline is None else max(0.0, deadline - self.now())
            try:
                data = await asyncio.wait_for(self.inbox.get(), timeout)
            except TimeoutError:
                self.ep.handle_timeout(self.now())
                continue
            self.ep.handle_input(self.now(), data)
            while not self.inbox.empty():
                self.ep.handle_input(self.now(), self.inbox.get_nowait())

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


async def wait_until(changed: asyncio.Event, predicate: Callable[[], object],
                     limit: float = 20.0) -> None:
    """Wait (event-driven, no polling sleeps) until ``predicate()`` holds."""
    async with asyncio.timeout(limit):
        while not predicate():
            changed.clear()
            await changed.wait()
