"""Every example in examples/ driven through a live transceiver (in-process, real UDP, the
test playing relay and WebRTC client as in tests/transceiver) by a client that listens to
what comes back."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from transceiver.support import Client, decode_all, dominant_hz, sine

from appliance.control import control_request
from appliance.transceiver.opus import FRAME_BYTES, OpusEncoder
from appliance.transceiver.server import (
    TransceiverAddresses,
    TransceiverConfig,
    serve_transceiver,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SECRETS = (b"routing-secret-for-tests-0123456",)
CANDIDATES = [["198.51.100.1", 3478]]
SILENCE = bytes(FRAME_BYTES)


@asynccontextmanager
async def call(agent: str, sock: socket.socket, tmp: Path) -> AsyncIterator[Caller]:
    config = TransceiverConfig(id=1, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp / "t.sock"), agent=agent)
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)
        client = Client(sock, addrs.udp)
        resp = await control_request(addrs.control or "", {
            "op": "create", "session_id": "s1", "offer": client.offer(),
            "candidates": CANDIDATES})
        assert resp["ok"], resp
        client.start(resp["answer"], trio.current_time())
        with trio.fail_after(5):
            while client.srtp is None:
                await client.pump(trio.current_time())
                await trio.sleep(0.005)
        yield Caller(client, addrs)
        nursery.cancel_scope.cancel()


class Caller:
    """Talks at real time (one RTP packet per 20 ms) and records what comes back."""

    def __init__(self, client: Client, addrs: TransceiverAddresses) -> None:
        self.client = client
        self.addrs = addrs
        self.enc = OpusEncoder()
        self.t0 = trio.current_time()

    def now(self) -> float:
        return trio.current_time() - self.t0

    async def talk(self, frames: list[bytes],
                   until: Callable[[], bool] = lambda: False) -> None:
        start = trio.current_time()
        for i, pcm in enumerate(frames):
            await self.client.send_audio(pcm, self.enc)
            await self.client.pump(trio.current_time())
            if until():
                return
            await trio.sleep_until(start + (i + 1) * 0.02)

    async def silence(self, seconds: float, until: Callable[[], bool] = lambda: False) -> None:
        await self.talk([SILENCE] * round(seconds / 0.02), until)

    def arrivals(self, after: float = 0.0, before: float = float("inf")) -> list[Any]:
        return [p for t, p in self.client.received_rtp
                if after <= t - self.t0 < before]

    async def session(self) -> dict[str, Any]:
        resp = await control_request(self.addrs.control or "",
                                     {"op": "get", "session_id": "s1"})
        return dict(resp["session"])


def spec(name: str) -> str:
    return f"{EXAMPLES / name}"


def test_echo_is_at_most_20_lines() -> None:
    assert len((EXAMPLES / "echo.py").read_text().splitlines()) <= 20


async def test_echo(relay_sock: socket.socket, tmp_path: Path) -> None:
    async with call(spec("echo.py:echo"), relay_sock, tmp_path) as c:
        await c.talk(sine(440, 50))
        # Until the echo of the tone is back (on a busy box it trails the last frame sent
        # by more than a frame time); 3 s is a hang guard.
        await c.silence(3, until=lambda: len(c.arrivals()) >= 45)
        packets = c.arrivals()
        assert len(packets) >= 45
        assert dominant_hz(decode_all(packets[5:45])) == pytest.approx(440, abs=5)
        assert (await c.session())["agent"].endswith("echo.py:echo")


async def test_tone_answers_while_you_speak(relay_sock: socket.socket, tmp_path: Path) -> None:
    async with call(spec("tone.py:tone"), relay_sock, tmp_path) as c:
        await c.silence(0.2)
        assert not c.arrivals()  # silence gets no answer
        await c.talk(sine(300, 50))  # 1 s of "speech"
        assert c.arrivals()  # the tone answers while you speak ...
        # ... and goes on to the end of the speech (on a busy box it trails the last frame
        # sent; 3 s is a hang guard), then over the VAD's 200 ms hangover, and stops: the
        # caller's silence goes on well past that, and the count of answers is bounded by
        # the frames the VAD called speech, not by a window on this (possibly busy) clock.
        await c.silence(3, until=lambda: len(c.arrivals()) >= 45)
        await c.silence(0.6)
        answers = c.arrivals()
        assert dominant_hz(decode_all(answers[5:25])) == pytest.approx(660, abs=5)
        # At most 50 frames of speech + the 10-frame hangover (61 on a quiet box: the VAD
        # calls one more frame as the tone's onset) + a few concealed late packets. At
        # least half the speech: on a starved loop (stress 22: the hog beside this
        # in-process call) the caller's frames arrive in bursts, the agent queues tone
        # faster than it plays, and its interrupt when speech ends drops the rest (40).
        assert 25 <= len(answers) <= 50 + 10 + 5, len(answers)


async def test_parrot_turn_taking_and_barge_in(
    relay_sock: socket.socket, tmp_path: Path
) -> None:
    async with call(spec("parrot.py:Parrot"), relay_sock, tmp_path) as c:
        # Turn 1: 0.8 s of 440 Hz, then silence until the parrot answers.
        await c.talk(sine(440, 40))
        stopped = c.now()
        await c.silence(3, until=lambda: bool(c.arrivals()))
        first = c.client.received_rtp[0][0] - c.t0
        # 200 ms VAD hangover + 600 ms of silence; nothing was played while we talked.
        assert 0.75 <= first - stopped <= 1.2, first - stopped
        # Barge in 0.3 s into the playback with 880 Hz: the playback stops.
        await c.silence(0.3)
        barge = c.now()
        await c.talk(sine(880, 30))
        played = c.arrivals(first, barge + 0.1)
        assert 12 <= len(played) <= 25  # ~0.3 s of the 0.8 s + preroll, then cut
        assert dominant_hz(decode_all(played[2:])) == pytest.approx(440, abs=5)
        assert not c.arrivals(barge + 0.1, c.now())
        # Turn 2: after the silence we hear the new utterance, 880 Hz.
        second_from = c.now()
        await c.silence(3, until=lambda: len(c.arrivals(second_from)) >= 25)
        answer = c.arrivals(second_from)
        assert len(answer) >= 25
        assert dominant_hz(decode_all(answer[2:25])) == pytest.approx(880, abs=5)


async def test_ws_agent_echoes_at_16k_and_its_death_ends_the_call(
    relay_sock: socket.socket, tmp_path: Path, ws_agent: tuple[str, subprocess.Popen[str]]
) -> None:
    url, proc = ws_agent
    async with call(url, relay_sock, tmp_path) as c:
        await c.silence(0.1)
        await c.talk(sine(440, 50))
        await c.silence(3, until=lambda: len(c.arrivals()) >= 40)  # (as in test_echo)
        packets = c.arrivals()
        assert len(packets) >= 40
        pcm = decode_all(packets[5:40])
        assert dominant_hz(pcm) == pytest.approx(440, abs=5)
        # Through 16 kHz and back: nothing above 8 kHz survives (a real low-pass).
        spectrum = np.abs(np.fft.rfft(np.frombuffer(pcm, "<i2").astype(float)))
        hz = np.fft.rfftfreq(len(pcm) // 2, 1 / 48_000)
        assert spectrum[hz > 8500].max() < spectrum.max() * 0.01
        s = await c.session()
        assert s["state"] == "connected" and s["agent"] == url
        proc.kill()  # the agent process dies: no close frame, just a dropped TCP connection
        with trio.fail_after(3):
            while (s := await c.session())["state"] != "ended":
                await c.silence(0.04)
        assert s["end_reason"].startswith("agent: disconnected: 1006"), s["end_reason"]


def test_cli_loads_examples_by_path_and_rejects_typos(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("a" * 32 + "\n")
    base = [sys.executable, "-m", "appliance", "transceiver", "--secret-file", str(secret),
            "--listen", "127.0.0.1:0"]
    r = subprocess.run([*base, "--agent", spec("tone.py:nope")], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "has no 'nope'" in r.stderr
    with subprocess.Popen([*base, "--agent", spec("parrot.py:Parrot")],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as p:
        try:
            assert p.stdout is not None
            assert p.stdout.readline().startswith("transceiver 0 listening on 127.0.0.1:")
        finally:
            p.terminate()
            p.wait(10)
