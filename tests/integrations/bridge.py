"""What the integration tests share: the transceiver's WebSocket bridge driven in-process
(a real ``AgentHost`` + ``WsBridge``) and a framework bot run as its example runs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import trio

from appliance.agents.channels import ChannelInfo
from appliance.agents.context import FRAME_BYTES, AgentContext, AgentHost, AgentIdentity, Frame
from appliance.agents.ws import WsBridge

REPO = Path(__file__).resolve().parents[2]
RATE = 48_000


def sine(freq: float, frames: int) -> list[bytes]:
    t = np.arange(frames * 960) / RATE
    pcm = (np.sin(2 * np.pi * freq * t) * 10_000).astype(np.int16).tobytes()
    return [pcm[i * FRAME_BYTES : (i + 1) * FRAME_BYTES] for i in range(frames)]


SILENCE = bytes(FRAME_BYTES)


def dominant_hz(pcm: bytes) -> float:
    x = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * RATE / len(x))



@contextmanager
def bot_process(script: str) -> Iterator[str]:
    """``python examples/<script> --port 0``; yields its ws:// URL; fails on a traceback."""
    proc = subprocess.Popen([sys.executable, str(REPO / "examples" / script), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on ws://"), line + proc.stderr.read()
        yield line.split()[-1]
        assert proc.poll() is None, "the bot process died"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
        artifacts = REPO / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / f"{Path(script).stem}.log").write_text(err)
    assert "Traceback" not in err, err[-3000:]


@dataclass
class Port:
    """The transceiver's data-channel endpoint, standing in for SCTP in-process."""

    sent: list[tuple[int, str | bytes]] = field(default_factory=list)
    arrived: trio.Event = field(default_factory=trio.Event)

    def send(self, channel_id: int, data: str | bytes) -> None:
        self.sent.append((channel_id, data))
        self.arrived.set()

    def open(self, label: str, *, protocol: str, ordered: bool, max_retransmits: int | None,
             max_packet_lifetime_ms: int | None, negotiated_id: int | None) -> ChannelInfo:
        return ChannelInfo(id=negotiated_id or 3, label=label, protocol=protocol)

    def close(self, channel_id: int) -> None:
        pass

    def buffered_amount(self, channel_id: int) -> int:
        return 0


class ObservedHost(AgentHost):
    """The real host, with events for what the test waits on (no polling)."""

    def __init__(self) -> None:
        super().__init__(on_output=self._output)
        self.output_queued = trio.Event()
        self.interrupted = trio.Event()

    def _output(self) -> None:
        self.output_queued.set()

    def interrupt(self) -> int:
        dropped = super().interrupt()
        self.interrupted.set()
        return dropped


@dataclass
class Bridged:
    host: ObservedHost
    bridge: WsBridge
    port: Port
    media_time: float = 0.0

    def push(self, pcm: bytes, *, speech: bool) -> None:
        self.host.push_frame(Frame(pcm, self.media_time, trio.current_time(), speech))
        self.media_time += 0.02

    async def talk(self, frames: list[bytes], *, speech: bool) -> None:
        start = trio.current_time()
        for i, pcm in enumerate(frames):
            self.push(pcm, speech=speech)
            await trio.sleep_until(start + (i + 1) * 0.02)

    paced: bytearray | None = None  # what the pacer sent, with pace=True

    def take_output(self) -> bytes:
        """What the caller got since the last call: with a pacer, what it sent (one frame
        per 20 ms, as the transceiver does); without, the whole queue at once."""
        if self.paced is not None:
            out = bytes(self.paced)
            self.paced.clear()
            return out
        out = b""
        while (frame := self.host.pop_output_frame()) is not None:
            out += frame
        return out

    async def pace(self) -> None:
        """The transceiver's pacer: one frame off the queue every 20 ms of wall clock."""
        assert self.paced is not None
        start = trio.current_time()
        tick = 0
        while not self.host.closed:
            tick += 1
            await trio.sleep_until(start + tick * 0.02)
            frame = self.host.pop_output_frame()
            if frame is not None:
                self.paced += frame


async def bridged(nursery: trio.Nursery, url: str, *, pace: bool = False) -> Bridged:
    """The bridge running against a host; ``pace`` plays its output in real time, so the
    transceiver's ``output.idle`` / ``output.cleared`` counts are what a call's would be."""
    host = ObservedHost()
    ctx = AgentContext(host, AgentIdentity(name=url, session_id="pipecat-test"))
    b = Bridged(host, WsBridge(url), Port())
    host.channels.port = b.port
    nursery.start_soon(b.bridge.run, ctx)
    if pace:
        b.paced = bytearray()
        nursery.start_soon(b.pace)
    return b


