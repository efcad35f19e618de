"""A real WebRTC answerer for the fake backend: aiortc (a TEST-ONLY dependency) echoing the
browser's audio back, so the demo page's whole media path (connect, first audio, levels,
getStats, ended) can be tested before `appliance up` exists and independently of it.

aiortc is asyncio; it runs on its own event loop in a daemon thread, and the HTTP handler
threads submit work to it with run_coroutine_threadsafe.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaRelay


class EchoPeers:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.relay = MediaRelay()
        self.peers: dict[str, RTCPeerConnection] = {}

    def answer(self, session_id: str, offer: str, timeout: float = 10.0) -> str:
        return asyncio.run_coroutine_threadsafe(self._answer(session_id, offer), self.loop).result(timeout)

    async def _answer(self, session_id: str, offer: str) -> str:
        pc = RTCPeerConnection()
        self.peers[session_id] = pc

        @pc.on("track")
        def on_track(track: Any) -> None:
            if track.kind == "audio":
                pc.addTrack(self.relay.subscribe(track))

        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        return str(pc.localDescription.sdp)

    def close(self, session_id: str, timeout: float = 10.0) -> None:
        pc = self.peers.pop(session_id, None)
        if pc is not None:
            asyncio.run_coroutine_threadsafe(pc.close(), self.loop).result(timeout)

    def shutdown(self) -> None:
        for sid in list(self.peers):
            try:
                self.close(sid)
            except Exception:  # noqa: BLE001 - best effort on teardown
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()
