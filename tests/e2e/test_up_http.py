"""Issue 5 item 5 and issue 9 item 2, end to end through ONE `appliance up` (two transceivers):
every call is set up over HTTP (``POST /v1/sessions``) and all of its media goes through the
relay on the public UDP port — nothing here talks to a transceiver directly.

1. aiortc (an independent stack: full ICE, OpenSSL DTLS, libsrtp) sends a 440 Hz tone and
   hears it back; ``GET /v1/sessions/{id}`` then shows RTCP-derived stats, packets both
   ways, the whole setup timeline and aiortc's address.
2. our ClientPeer offering exactly one SRTP profile, for each profile the transceiver
   offers (and SHA1_32, which it does not, is refused with a DTLS handshake failure).
3. ICE restart mid-call: PATCH with a trickle-ice-sdpfrag carrying new credentials
   (RFC 9725 §4.4.1, If-Match with the session's ETag); the client restarts its ICE agent
   and media keeps flowing.
4. DELETE ends the call: the API says ended/deleted and the client gets close_notify.
5. Sessions land on both transceivers and each gets its own echo (different tones).
6. ``kill -9`` of one transceiver: only its calls end ("transceiver lost"), the other's keep
   flowing, the supervisor restarts it and a new call succeeds within 2 s of the restart.

Async tests run under trio (pytest-trio); the aiortc test runs asyncio in a fresh thread so a
loop left on the main thread by another module cannot interfere.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import os
import re
import secrets
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import av
import numpy as np
import pytest
import trio
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCSessionDescription,
)
from e2e.procs import Proc, free_tcp_port, free_udp_port

import appliance.client.call as call_module
from appliance.client.call import Call, CallFailed, open_call
from appliance.client.http import Response, request
from appliance.proto.ice.client import ClientState
from appliance.proto.sdp import parse_sdpfrag_untrusted
from appliance.proto.srtp import DEFAULT_SRTP_PROFILES, SrtpProfile
from appliance.transceiver.opus import OpusDecoder, OpusEncoder

pytestmark = [pytest.mark.interop, pytest.mark.slow]

RATE = 48_000
SDPFRAG = "application/trickle-ice-sdpfrag"
REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


# -- the appliance under test ------------------------------------------------------------------


@dataclass
class Appliance:
    base: str
    udp: int
    state_dir: Path
    proc: Proc


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    tmp = tmp_path_factory.mktemp("up")
    http, udp = free_tcp_port(), free_udp_port()
    state = tmp / "state"
    proc = Proc(["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
                 "--public-address", "127.0.0.1", "--state-dir", str(state),
                 "--transceivers", "2"], "appliance ready", timeout=60)
    app = Appliance(f"http://127.0.0.1:{http}", udp, state, proc)
    children: list[int] = []
    try:
        children = [p["pid"] for p in health(app.base) if p["role"] != "signaling" and p["pid"]]
        yield app
        children += [p["pid"] for p in health(app.base)
                     if p["role"] != "signaling" and p["pid"]]
    finally:
        rc = proc.stop()
        artifacts = REPO / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / "e2e-up-http.log").write_text("".join(proc.stdout + proc.stderr))
    assert rc == 0, "".join(proc.stderr)[-3000:]
    # SIGTERM to `up` stops every child with it: no orphans (issue 5 item 4).
    alive = [pid for pid in children if Path(f"/proc/{pid}").exists()
             and str(state) in _cmdline(pid)]
    assert not alive, f"children left running after up stopped: {alive}"


def health(base: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The ``health`` event of ``GET /v1/events``: each process with its pid, state, restarts."""
    with urllib.request.urlopen(base + "/v1/events", timeout=timeout) as resp:
        buf = b""
        while (m := re.search(rb"event: health\ndata: (.*?)\n\n", buf)) is None:
            chunk = resp.read1(65536)
            if not chunk:
                raise AssertionError(f"event stream ended before a health event: {buf!r}")
            buf += chunk
    processes: list[dict[str, Any]] = json.loads(m.group(1))["processes"]
    return processes


def transceiver_view(processes: list[dict[str, Any]], k: int) -> dict[str, Any]:
    return next(p for p in processes if p["role"] == "transceiver" and p["id"] == str(k))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


# -- small helpers -------------------------------------------------------------------------------


async def until(probe: Callable[[], Awaitable[T | None]], within: float, what: str) -> T:
    """Poll an observable condition (in another process or task) until it holds."""
    last: T | None = None
    with trio.move_on_after(within):
        while True:
            last = await probe()
            if last:
                return last
            await trio.sleep(0.05)
    raise AssertionError(f"timed out after {within} s waiting for {what} (last: {last!r})")


async def get_json(url: str) -> dict[str, Any]:
    resp = await request("GET", url)
    assert resp.status == 200, (resp.status, resp.body[:300])
    obj: dict[str, Any] = json.loads(resp.body)
    return obj


async def get_session(call: Call) -> dict[str, Any]:
    return await get_json(call.session_url)


def spy_posts(monkeypatch: pytest.MonkeyPatch) -> list[Response]:
    """Record the responses to open_call's POSTs (it keeps neither ETag nor headers)."""
    posted: list[Response] = []
    real_request = call_module.request

    async def spy(method: str, url: str, **kwargs: Any) -> Response:
        resp = await real_request(method, url, **kwargs)
        if method == "POST":
            posted.append(resp)
        return resp

    monkeypatch.setattr(call_module, "request", spy)
    return posted


def tone(freq: float, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * 32767 * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def opus_tone(freq: float) -> list[bytes]:
    """One second of a tone (an integer number of cycles, so it loops seamlessly), as Opus."""
    enc = OpusEncoder()
    pcm = tone(freq)
    return [enc.encode(pcm[i : i + 960].tobytes()) for i in range(0, len(pcm), 960)]


def dominant_hz(pcm: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    return float(np.argmax(spectrum) * RATE / len(pcm))


def decode_tail(payloads: list[bytes], frames: int = 25) -> np.ndarray:
    """Decode a stream of Opus payloads in order; the last ``frames`` frames as float PCM."""
    dec = OpusDecoder()
    pcm = [np.frombuffer(dec.decode(p), dtype=np.int16) for p in payloads]
    return np.concatenate(pcm[-frames:]).astype(np.float64)


def assert_tone(payloads: list[bytes], freq: float) -> None:
    pcm = decode_tail(payloads)
    assert np.sqrt(np.mean(pcm ** 2)) > 500, "the echo is silent"
    assert abs(dominant_hz(pcm) - freq) < 15, f"echo at {dominant_hz(pcm):.0f} Hz, sent {freq}"


class Talker:
    """Sends a tone on a call at real time (50 packets/s) and records what comes back."""

    def __init__(self, call: Call, freq: float) -> None:
        self.call = call
        self.freq = freq
        self.frames = opus_tone(freq)
        self.rx: list[tuple[float, bytes]] = []

    @property
    def received(self) -> int:
        return len(self.rx)

    def payloads(self, since: int = 0) -> list[bytes]:
        return [p for _, p in self.rx[since:]]

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._receive)
            await self._send()
            nursery.cancel_scope.cancel()

    async def _send(self) -> None:
        ts, i = secrets.randbits(32), 0
        next_at = trio.current_time()
        while not self.call.peer.closed:
            self.call.send_rtp(self.frames[i % len(self.frames)], ts, marker=i == 0)
            i, ts = i + 1, (ts + 960) & 0xFFFFFFFF
            next_at += 0.02
            await trio.sleep_until(next_at)  # real-time pacing of a media source

    async def _receive(self) -> None:
        while True:
            ev = await self.call.receive()
            self.rx.append((ev.at, ev.packet.payload))

    async def wait_for(self, n: int, within: float = 5.0) -> None:
        async def enough() -> bool:
            return self.received >= n
        await until(enough, within, f"{n} echoed packets at {self.freq} Hz")


@dataclass
class Calls:
    """Open calls, each with a talker; on exit each talker stops, then its call hangs up
    (DELETE). One exit stack keeps every cancel scope properly nested."""

    stack: contextlib.AsyncExitStack
    talkers: list[Talker] = field(default_factory=list)

    async def open(self, base: str, freq: float, **kwargs: Any) -> Talker:
        call = await self.stack.enter_async_context(open_call(base, **kwargs))
        nursery = await self.stack.enter_async_context(trio.open_nursery())
        self.stack.callback(nursery.cancel_scope.cancel)
        talker = Talker(call, freq)
        self.talkers.append(talker)
        nursery.start_soon(talker.run)
        return talker


@contextlib.asynccontextmanager
async def calls() -> AsyncIterator[Calls]:
    async with contextlib.AsyncExitStack() as stack:
        yield Calls(stack)


# -- 1. aiortc through POST /v1/sessions ----------------------------------------------------------


class ToneTrack(MediaStreamTrack):
    """A 440 Hz sine at real time, 20 ms frames, mono s16."""

    kind = "audio"

    def __init__(self, freq: float = 440.0) -> None:
        super().__init__()
        self.pcm = tone(freq)
        self.pts = 0
        self.start: float | None = None

    async def recv(self) -> av.AudioFrame:
        loop = asyncio.get_running_loop()
        if self.start is None:
            self.start = loop.time()
        delay = self.start + self.pts / RATE - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)  # real-time pacing of a media source, not test sync
        i = self.pts % len(self.pcm)
        frame = av.AudioFrame.from_ndarray(self.pcm[i : i + 960].reshape(1, -1), format="s16",
                                           layout="mono")
        frame.sample_rate = RATE
        frame.pts = self.pts
        frame.time_base = fractions.Fraction(1, RATE)
        self.pts += 960
        return frame


def http_json(method: str, url: str, body: bytes | None = None,
              content_type: str | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    if content_type:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def in_fresh_thread(fn: Callable[[], T], timeout: float = 90.0) -> T:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # re-raised in the test's thread
            out["error"] = exc

    thread = threading.Thread(target=target, name="aiortc-asyncio")
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the aiortc call did not finish"
    if "error" in out:
        raise out["error"]
    value: T = out["value"]
    return value


async def aiortc_call(app: Appliance) -> dict[str, Any]:
    # No STUN servers: host candidates only, and no dependence on the internet.
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTrack(ToneTrack(440.0))
    loop = asyncio.get_running_loop()
    got_track: asyncio.Future[MediaStreamTrack] = loop.create_future()
    pc.on("track", got_track.set_result)
    try:
        await pc.setLocalDescription(await pc.createOffer())
        offer = pc.localDescription.sdp
        status, headers, body = await asyncio.to_thread(
            http_json, "POST", app.base + "/v1/sessions", offer.encode(), "application/sdp")
        assert status == 201, (status, body[:500])
        answer = body.decode()
        assert f"127.0.0.1 {app.udp} typ host" in answer
        location = headers["location"]
        await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        track = await asyncio.wait_for(got_track, 10)
        received: list[np.ndarray] = []

        async def drain() -> None:
            while True:
                frame = await track.recv()
                channels = len(frame.layout.channels)  # packed s16: keep the first channel
                received.append(frame.to_ndarray().reshape(-1)[::channels])

        drainer = asyncio.ensure_future(drain())
        try:
            # At least three seconds of call and two of echo; then wait for RTCP to give the
            # server its RTT.
            start = loop.time()
            while loop.time() < start + 3.0 or len(received) < 100:
                await asyncio.sleep(0.1)
                assert not drainer.done(), drainer
                assert loop.time() < start + 10.0, f"{len(received)} echo frames in 10 s"
            pcm = np.concatenate(received).astype(np.float64)
            url = app.base + location
            deadline = loop.time() + 20.0
            while True:
                _, _, raw = await asyncio.to_thread(http_json, "GET", url)
                session = json.loads(raw)
                if all(session[k] is not None for k in ("rtt_ms", "jitter_ms", "loss")):
                    break
                assert loop.time() < deadline, f"no RTCP stats within 20 s: {session}"
                await asyncio.sleep(0.2)
        finally:
            drainer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await drainer
        deleted, _, _ = await asyncio.to_thread(http_json, "DELETE", url)
        return {"pcm": pcm, "session": session, "offer": offer, "deleted": deleted}
    finally:
        await pc.close()


def test_aiortc_call_through_http_and_relay(appliance: Appliance) -> None:
    result = in_fresh_thread(lambda: asyncio.run(aiortc_call(appliance)))
    tail = result["pcm"][-RATE:]  # the last second: well past setup
    assert np.sqrt(np.mean(tail ** 2)) > 500, "echo is silent"
    assert abs(dominant_hz(tail) - 440) < 15, dominant_hz(tail)
    s = result["session"]
    assert s["state"] == "connected" and s["agent"] == "echo"
    # RTCP-derived stats (RR report blocks for RTT; our reception stats for jitter/loss).
    assert 0 <= s["rtt_ms"] < 1000 and s["jitter_ms"] >= 0 and 0 <= s["loss"] <= 1, s
    assert s["packets_in"] > 100 and s["packets_out"] > 100
    assert s["bytes_in"] > 0 and s["bytes_out"] > 0
    # The level meters (transceiver/stages/level.py): the tone in, its echo out.
    levels = s["media"]["levels"]
    assert levels["in"]["frames"] > 100 and levels["out"]["frames"] > 100, levels
    assert -50 < levels["in"]["rms_dbfs"] < 0 and -50 < levels["out"]["rms_dbfs"] < 0, levels
    tl = s["timeline"]
    steps = ["offer_received", "answer_sent", "first_stun", "ice_nominated", "dtls_done",
             "first_rtp_in", "first_rtp_out"]
    assert all(tl[k] is not None for k in steps), tl
    assert tl["offer_received"] <= tl["answer_sent"] <= tl["first_stun"] <= tl["dtls_done"]
    assert tl["first_stun"] <= tl["ice_nominated"]
    assert tl["dtls_done"] <= tl["first_rtp_in"] <= tl["first_rtp_out"], tl
    # The client address is one of aiortc's own host candidates, seen through the relay.
    ours = {f"{m[0]}:{m[1]}" for m in re.findall(
        r"a=candidate:\S+ 1 udp \d+ (\S+) (\d+) typ host", result["offer"])}
    assert s["client_address"] in ours, (s["client_address"], ours)
    assert s["relay_flow"]["public"] == f"127.0.0.1:{appliance.udp}"
    assert result["deleted"] == 200
    # The setup timeline went into the Prometheus histogram.
    _, _, raw = http_json("GET", appliance.base + "/metrics")
    count = re.search(r'^appliance_session_setup_seconds_count\{step="first_rtp_out"\} (\S+)$',
                      raw.decode(), re.M)
    assert count and float(count.group(1)) >= 1, raw.decode()[-2000:]


# -- 2. each SRTP profile --------------------------------------------------------------------------


@pytest.mark.parametrize("profile", DEFAULT_SRTP_PROFILES, ids=lambda p: p.name)
async def test_each_srtp_profile(appliance: Appliance, profile: SrtpProfile) -> None:
    async with calls() as c:
        talker = await c.open(appliance.base, 440.0, srtp_profiles=(profile,))
        await talker.wait_for(15)
        assert talker.call.peer.srtp is not None
        assert talker.call.peer.srtp.profile is profile
        assert talker.call.peer.srtp_errors == 0
        s = await get_session(talker.call)
        assert s["state"] == "connected"
        assert s["srtp_profile"].removeprefix("SRTP_") == profile.name, s["srtp_profile"]
        assert s["packets_in"] > 0 and s["packets_out"] > 0
        # Our client's own timeline: POST → answer → connected → first echoed packet.
        tl = talker.call.timeline
        assert tl.answer is not None and tl.connected is not None and tl.first_rtp_in is not None
        assert 0 < tl.answer <= tl.connected <= tl.first_rtp_in


@pytest.mark.parametrize("audio", [False, True], ids=["data-only", "audio+data"])
async def test_our_client_data_channel_through_up(appliance: Appliance, audio: bool) -> None:
    """Our client's sctp slot (the transceiver's SCTP core in the DTLS client role) through
    signaling, the relay and the transceiver: the echo agent answers on the channel; a
    data-only call (only an m=application section) shows no codec and no SRTP."""
    async with open_call(appliance.base, audio=audio, datachannel=True) as call:
        cid = call.open_channel("chat")
        with trio.fail_after(10):
            await call.channel_open(cid)
            sent: list[str | bytes] = ["", "hi", b"\x00\x01", bytes(200_000)]
            for m in sent:
                await call.send_message(cid, m)
            got = [(await call.receive_message()).data for _ in sent]
        assert got == sent
        s = await get_session(call)
        assert s["state"] == "connected" and s["datachannels"]["sctp"] == "connected"
        assert (s["codec"] is None) is (not audio)
        assert (s["srtp_profile"] is None) is (not audio)
        assert s["datachannels"]["messages_in"] == len(sent)


@pytest.mark.parametrize(("offered", "negotiated"), [
    ({"1.2", "1.3"}, "1.3"), ({"1.2"}, "1.2"), ({"1.3"}, "1.3")])
async def test_our_client_negotiates_dtls13_with_up(appliance: Appliance, offered: set[str],
                                                     negotiated: str) -> None:
    """Our client offering DTLS 1.3 (RFC 9147) gets it from `up`'s default --dtls-versions;
    offering 1.2 only, it gets 1.2 (the RFC 8446 §4.1.3 sentinel is checked by its engine)."""
    async with calls() as c:
        talker = await c.open(appliance.base, 440.0, dtls_versions=frozenset(offered))
        await talker.wait_for(15)
        dtls = talker.call.peer.dtls
        assert dtls is not None and dtls.version == negotiated
        assert talker.call.peer.srtp_errors == 0



async def test_unsupported_srtp_profile_is_refused(appliance: Appliance,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The transceiver offers the profiles of DESIGN.md (GCM and SHA1_80) only: a client that
    insists on SRTP_AES128_CM_HMAC_SHA1_32 gets a DTLS handshake_failure, not a call."""
    posted = spy_posts(monkeypatch)
    with pytest.raises(CallFailed, match=r"DTLS closed: 40\b"):  # alert 40: handshake_failure
        async with open_call(appliance.base,
                             srtp_profiles=(SrtpProfile.AES128_CM_HMAC_SHA1_32,)):
            raise AssertionError("connected with an unsupported SRTP profile")
    s = await get_json(appliance.base + (posted[0].header("location") or ""))
    assert s["state"] == "ended" and s.get("srtp_profile") is None, s


async def test_failed_setup_is_hung_up(appliance: Appliance,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: open_call DELETEd its session only after a successful setup, so a call
    that failed after the 201 (here: a connect timeout) stayed on its transceiver until the
    30 s setup reaper took it."""
    posted = spy_posts(monkeypatch)
    with pytest.raises(CallFailed, match="no ICE/DTLS connection"):
        async with open_call(appliance.base, connect_timeout=0):
            raise AssertionError("connected in no time at all")
    s = await get_json(appliance.base + (posted[0].header("location") or ""))
    assert s["state"] == "ended" and s["end_reason"] == "deleted", s


# -- 3. ICE restart mid-call ------------------------------------------------------------------------


async def test_ice_restart_mid_call(appliance: Appliance, monkeypatch: pytest.MonkeyPatch) -> None:
    posted = spy_posts(monkeypatch)  # to read the 201's ETag
    async with calls() as c:
        talker = await c.open(appliance.base, 440.0)
        call, peer = talker.call, talker.call.peer
        etag = posted[0].header("etag")
        assert etag and posted[0].header("accept-patch") == SDPFRAG
        assert call.etag == etag
        await talker.wait_for(25)
        before = await get_session(call)
        old_ufrag = re.search(r"a=ice-ufrag:(\S+)", call.answer)
        old_pwd = re.search(r"a=ice-pwd:(\S+)", call.answer)
        assert old_ufrag and old_pwd

        ufrag, pwd = secrets.token_hex(4), secrets.token_hex(12)
        frag = (f"a=ice-ufrag:{ufrag}\r\na=ice-pwd:{pwd}\r\n"
                "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n").encode()

        async def patch(if_match: str) -> Response:
            return await request("PATCH", call.session_url, body=frag,
                                 headers={"Content-Type": SDPFRAG, "If-Match": if_match})

        resp = await patch(etag)
        assert resp.status == 200, (resp.status, resp.body)
        assert (resp.header("content-type") or "").startswith(SDPFRAG)
        new_etag = resp.header("etag")
        assert new_etag and new_etag != etag  # new ICE credentials, new entity-tag
        answer = parse_sdpfrag_untrusted(resp.body)
        assert answer.ice_ufrag and answer.ice_pwd
        assert answer.ice_ufrag != old_ufrag.group(1) and answer.ice_pwd != old_pwd.group(1)
        assert f"127.0.0.1 {appliance.udp} typ host" in resp.body.decode()
        # The old entity-tag is stale now (RFC 9725 §4.3.1): 412, with the current one.
        stale = await patch(etag)
        assert stale.status == 412 and stale.header("etag") == new_etag, stale

        # The client restarts ICE on the same pair with the new credentials both ways.
        ice = peer.ice
        assert ice is not None
        ok_before, mark = ice.responses_ok, talker.received
        now = trio.current_time()
        ice.restart(ufrag, pwd, answer.ice_ufrag, answer.ice_pwd, now)
        peer.local_ufrag, peer.local_pwd = ufrag, pwd
        peer.handle_timeout(now)  # moves the new nominating check to the peer's queue
        call._flush()

        async def renominated() -> bool:
            return ice.state is ClientState.NOMINATED and ice.responses_ok > ok_before
        await until(renominated, 5.0, "nomination with the new credentials")
        assert ice.remote_ufrag == answer.ice_ufrag
        # Media kept flowing: another second of echo, still the tone.
        await talker.wait_for(mark + 50)
        assert_tone(talker.payloads(mark), 440.0)
        after = await get_session(call)
        assert after["state"] == "connected" and after["end_reason"] is None
        assert after["client_address"] == before["client_address"]
        assert after["packets_in"] > before["packets_in"] + 40
        assert not peer.closed and call.failure is None


# -- 4. DELETE ---------------------------------------------------------------------------------------


async def test_delete_ends_the_call(appliance: Appliance) -> None:
    async with calls() as c:
        talker = await c.open(appliance.base, 440.0)
        call = talker.call
        await talker.wait_for(10)
        resp = await request("DELETE", call.session_url)
        assert resp.status == 200, resp
        s = await get_session(call)
        assert s["state"] == "ended" and s["end_reason"] == "deleted" and s["ended_at"], s

        async def closed() -> str | None:
            return call.failure
        reason = await until(closed, 5.0, "the client to see the call end")
        assert reason.startswith("DTLS closed"), reason  # close_notify from the transceiver
        assert call.peer.closed
        # The session is gone for good: another DELETE or a PATCH is a 404.
        again = await request("DELETE", call.session_url)
        assert again.status == 404 and b"session-ended" in again.body, again
        patch = await request("PATCH", call.session_url, body=b"a=ice-ufrag:abcd\r\n"
                              b"a=ice-pwd:abcdefghijklmnopqrstuvwx\r\n",
                              headers={"Content-Type": SDPFRAG})
        assert patch.status == 404, patch


# -- 5. both transceivers -------------------------------------------------------------------------


async def calls_on_both(c: Calls, base: str, freqs: list[float]) -> dict[int, list[Talker]]:
    """Open calls until both transceivers carry at least one (signaling balances by load)."""
    by_k: dict[int, list[Talker]] = {}
    for freq in freqs:
        talker = await c.open(base, freq)
        k = (await get_session(talker.call))["transceiver"]
        by_k.setdefault(k, []).append(talker)
        if len(by_k) == 2:
            return by_k
    raise AssertionError(f"{len(freqs)} calls all landed on transceiver(s) {sorted(by_k)}")


async def test_sessions_on_both_transceivers_get_their_own_echo(appliance: Appliance) -> None:
    async with calls() as c:
        by_k = await calls_on_both(c, appliance.base, [440.0, 660.0, 550.0, 770.0])
        assert sorted(by_k) == [0, 1]
        for talker in c.talkers:
            await talker.wait_for(50)
        for k, talkers in by_k.items():
            for talker in talkers:
                assert_tone(talker.payloads(), talker.freq)  # its own tone, nobody else's
                s = await get_session(talker.call)
                assert s["transceiver"] == k and s["state"] == "connected"
                assert s["relay_flow"]["public"] == f"127.0.0.1:{appliance.udp}"


# -- 6. kill -9 one transceiver -----------------------------------------------------------------------


async def test_killed_transceiver_ends_only_its_calls_and_restarts(appliance: Appliance) -> None:
    async with calls() as c:
        # What a call's set-up and first echo take on this machine now: the yardstick for
        # the call after the restart (below).
        t0 = trio.current_time()
        first = await c.open(appliance.base, 330.0)
        await first.wait_for(1)
        setup = trio.current_time() - t0
        by_k = await calls_on_both(c, appliance.base, [440.0, 660.0, 550.0, 770.0])
        victim, survivor = 1, 0
        for talker in c.talkers:
            await talker.wait_for(10)
        procs = await trio.to_thread.run_sync(health, appliance.base)
        view = transceiver_view(procs, victim)
        pid, restarts = view["pid"], view["restarts"]
        assert view["state"] == "ready" and isinstance(pid, int), view
        cmd = _cmdline(pid)  # never kill anything but our own child
        assert f"transceiver --id {victim} " in cmd and str(appliance.state_dir) in cmd, cmd
        marks = {id(t): t.received for t in by_k[survivor]}
        os.kill(pid, signal.SIGKILL)

        # The victim's calls end, with the reason, in the API.
        for talker in by_k[victim]:
            async def lost(t: Talker = talker) -> dict[str, Any] | None:
                s = await get_session(t.call)
                return s if s["state"] == "ended" else None
            s = await until(lost, 5.0, "the killed transceiver's call to end")
            assert s["end_reason"] == "transceiver lost" and s["transceiver"] == victim, s
        # The other transceiver's calls are untouched: another second of their own echo.
        for talker in by_k[survivor]:
            await talker.wait_for(marks[id(talker)] + 50)
            assert_tone(talker.payloads(marks[id(talker)]), talker.freq)
            s = await get_session(talker.call)
            assert s["state"] == "connected" and s["transceiver"] == survivor, s

        # The supervisor restarts it (a new pid, ready again).
        async def restarted() -> dict[str, Any] | None:
            v = transceiver_view(await trio.to_thread.run_sync(health, appliance.base), victim)
            return v if v["state"] == "ready" and v["pid"] not in (None, pid) else None
        view = await until(restarted, 15.0, f"transceiver {victim} to be restarted")
        ready_at = trio.current_time()
        assert view["restarts"] == restarts + 1 and view["up"], view
        metrics = (await request("GET", appliance.base + "/metrics")).body.decode()
        line = f'appliance_process_restarts_total{{role="transceiver",id="{victim}"}} {restarts + 1}'
        assert line in metrics.splitlines(), metrics
        lost_total = re.search(r"^appliance_sessions_lost_total (\d+)", metrics, re.M)
        assert lost_total and int(lost_total.group(1)) >= len(by_k[victim]), metrics

        # A new call succeeds within 2 s of the restart (or, on a machine where a call's
        # set-up alone is slower than that, within 3x the set-up measured above), on the
        # restarted transceiver (the least loaded one now).
        bound = max(2.0, 3 * setup)
        fresh = await c.open(appliance.base, 880.0, connect_timeout=bound)
        await fresh.wait_for(1, within=bound)
        assert trio.current_time() - ready_at <= bound, (setup, bound)
        s = await get_session(fresh.call)
        assert s["transceiver"] == victim and s["state"] == "connected", s
        await fresh.wait_for(50)
        assert_tone(fresh.payloads(), 880.0)
