"""Turn latency as a caller feels it (issue 38 item 1): an independent WebRTC caller through
``appliance up --agent assistant``, on its own clock.

For each agent spec, one ``appliance up --agent SPEC`` (its own state directory, free ports
on 127.0.0.1, loopback only, ``up``'s default transceiver count) is started as a
subprocess; then, for each ``--calls`` value N, N aiortc callers (an independent stack: its
own ICE, OpenSSL DTLS, libsrtp, libopus) are set up with ``POST /v1/sessions`` and talk at
once, each for ``--turns`` turns:

* the caller's microphone is a MediaStreamTrack that sends 20 ms frames on a real-time grid:
  a phrase's frames exactly (espeak-ng, en-gb 140 wpm, tests/speech/speech_support.py: not
  the assistant's own voice), then digital silence; it notes the caller-clock time
  (``time.perf_counter``) at which it hands aiortc the phrase's **last voiced frame** (peak
  above :data:`VOICED`, the level speech_support.speech_bounds_ms uses);
* every RTP packet the caller receives is decoded by the caller itself (libopus, as it
  arrives: aiortc's jitter buffer would add its 80 ms prefetch, which a browser's adaptive
  one does not) and the **first packet with a voiced level** after the last voiced frame
  sent is the reply's start. The difference is the turn's latency: VAD end-of-turn wait,
  transcription, the responder, TTS, the transceiver's pacer and encoder, both network
  legs (loopback) and the caller's own receive path;
* the next phrase starts only once the reply has been quiet for ``--gap`` s (default 0.8:
  the reply's end plus ~0.5 s, long enough to bridge the pauses between its sentences), so
  turns never overlap and nothing is a barge-in. No voiced reply within ``--timeout`` s is a
  **miss**; voiced audio heard while the caller was still speaking is counted as **early**
  (the turn was cut inside the phrase: a false end of turn).

Reported per spec and call count: turns measured, misses, early, p50 / p90 / p99 / max of
end of speech → first reply audio (ms; p99 of a handful of turns is interpolated, near the
max), the first turn after start-up (a warm-up turn, not counted), the load average; and,
for every spec against the first (the baseline), the ratio of the p50s and p90s in the same
run: the issue wants its figures "as ratios against the current loop in the same run".

**CPU per call** (item 6: capacity is not traded away): the CPU seconds of the ``up``
process tree (every process under it, with the children each has reaped: the espeak-ng of
every sentence) from the first phrase of the connected calls to the end of the last reply,
less the tree's own idle rate (measured for ``--idle`` s before the calls, in the same run),
per second of call time (each call's own, first phrase to last reply, summed); the callers'
talk fraction of that time (their phrases' voiced spans: the phrase + ``--gap`` pacing and
the replies' length set it, reported, not chosen: the built-in responder's long replies
give ~15 %; ``--llm-delay 0 --llm-reply 'Sure, I can help with that.'`` ~40 %); and from it
the calls per core, beside whether item 1's latency bounds held at that call count (p50 ≤
500 and p99 ≤ 800 ms with one call, p50 ≤ 800 ms with more) and the ratio to the baseline.

**Specs.** By default two: the baseline ``assistant?turn=silence&silence_ms=500&speculate=0&stt=whisper`` (today's loop pinned
by its options: Silero VAD, a fixed 500 ms end-of-turn silence, Whisper, the built-in
responder, espeak-ng) and the default ``assistant``. Today they are the same loop, so their
ratio is the run's own noise; once the default changes (issue 38 items 2-3), the baseline
must keep naming the old loop with whatever option pins it. ``--agent SPEC`` (repeatable)
measures other specs (``assistant?vad=energy``, ``assistant?silence_ms=300``; the keys are
in appliance/speech/assistant.py), ``--baseline ''`` drops the baseline.

**An LLM with a delay** (``--llm-delay D``): a local stand-in OpenAI-compatible server
(tests/speech/fake_openai.py, in this process) answers every chat request with a short
reply whose first token streams D s after the response headers; each spec gets
``llm=<its URL>`` (the key goes to ``up`` as ``$APPLIANCE_LLM_KEY``, never in the spec), and
the appliance's own share, latency minus D, is reported beside the latency.

**Voices.** espeak-ng always; with ``--piper-model MODEL.onnx`` and a ``piper`` program on
PATH, every other phrase is spoken by that neural voice instead (piper-tts is GPL-3.0: it
runs as a separate process, never imported). Not exercised here: no piper on this box.

    .venv/bin/python bench/turn_latency.py                       # 1 and 4 calls, 5 turns
    .venv/bin/python bench/turn_latency.py --calls 1 --turns 10 --agent 'assistant?vad=energy'
    .venv/bin/python bench/turn_latency.py --llm-delay 0.3 --json

Figures: docs/performance.md, "Turn latency (issue 38)". The box is shared: only ratios
within one run compare across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fractions
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import trio

ROOT = Path(__file__).resolve().parents[1]
# The tests' helpers and the sibling benches; and this tree's ``appliance`` before an
# installed one (`up` is started with the same PYTHONPATH), so a worktree measures itself.
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench"), str(ROOT)]

from capacity import machine, process_tree  # noqa: E402
from e2e.procs import Proc, free_tcp_port, free_udp_port  # noqa: E402
from e2e.test_up_http import http_json  # noqa: E402
from speech.fake_openai import KEY, FakeOpenAI, fake_openai  # noqa: E402
from speech.speech_support import PHRASES, espeak_pcm48, frames, silence  # noqa: E402

from appliance.audio.resample import resample  # noqa: E402
from appliance.loadgen.media import Decoder  # noqa: E402
from appliance.loadgen.stats import percentile  # noqa: E402
from appliance.speech.audio import read_wav  # noqa: E402

RATE = 48_000
FRAME = 960  # samples per 20 ms frame
VOICED = 300  # peak |sample| of a voiced frame (speech_support.speech_bounds_ms's level)
BASELINE = "assistant?turn=silence&silence_ms=500&speculate=0&stt=whisper"
LLM_REPLY = "Sure, I can help with that. Here is a short answer."


# -- the phrases -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Phrase:
    text: str
    voice: str
    frames: tuple[bytes, ...]  # 20 ms PCM16 frames, espeak's own padding kept
    last_voiced: int  # index of the last frame whose peak is above VOICED
    first_voiced: int = 0  # and of the first: the caller talks from this frame to that one

    @property
    def talk_seconds(self) -> float:
        return (self.last_voiced - self.first_voiced + 1) * FRAME / RATE


def phrase(text: str, voice: str, pcm: bytes) -> Phrase:
    fs = tuple(frames(pcm))
    peaks = [int(np.abs(np.frombuffer(f, "<i2").astype(np.int32)).max()) for f in fs]
    voiced = [i for i, p in enumerate(peaks) if p > VOICED]
    if not voiced:
        raise RuntimeError(f"{voice} said nothing for {text!r}")
    return Phrase(text, voice, fs, voiced[-1], voiced[0])


def piper_pcm48(text: str, model: str) -> bytes:
    """``text`` spoken by the ``piper`` program (a separate process: piper-tts is GPL) with
    ``model``, as 48 kHz mono PCM16. ``-m`` / ``-f`` and the text on stdin are spelt the
    same by piper-tts 1.2 and piper1-gpl."""
    with tempfile.TemporaryDirectory(prefix="piper-") as d:
        out = Path(d) / "phrase.wav"
        subprocess.run(["piper", "-m", model, "-f", str(out)], input=text.encode(),
                       check=True, capture_output=True, timeout=120)
        pcm, sr = read_wav(out.read_bytes())
    return resample(pcm, sr, RATE)


def build_phrases(count: int, piper_model: str | None) -> list[Phrase]:
    texts = [PHRASES[i % len(PHRASES)] for i in range(count)]
    use_piper = piper_model is not None and shutil.which("piper") is not None
    if piper_model is not None and not use_piper:
        print("--piper-model given but no piper program on PATH: espeak-ng only",
              file=sys.stderr)
    out = []
    for i, text in enumerate(texts):
        if use_piper and i % 2 == 1:
            assert piper_model is not None
            out.append(phrase(text, "piper", piper_pcm48(text, piper_model)))
        else:
            out.append(phrase(text, "espeak-ng", espeak_pcm48(text)))
    return out


# -- one caller (asyncio, aiortc) --------------------------------------------------------------


@dataclass
class Turn:
    call: int
    text: str
    voice: str
    latency_ms: float | None  # None: a miss
    early: bool  # voiced audio came back while the caller was still speaking


@dataclass
class Caller:
    """One aiortc call's state, on the caller's clock (``time.perf_counter``)."""

    index: int
    decoder: Decoder = field(default_factory=Decoder)
    speaking: bool = False  # between a phrase's first frame and its last voiced frame
    early: bool = False
    end_of_speech: float | None = None  # armed: the last voiced frame was sent then
    first_reply: float | None = None
    last_voiced_rx: float = 0.0
    replied: asyncio.Event = field(default_factory=asyncio.Event)
    packets: int = 0
    talk_seconds: float = 0.0  # the phrases' voiced spans said so far
    talk_window: float = 0.0  # from its first phrase to the end of its last reply

    def on_rtp(self, payload: bytes, at: float) -> None:
        """Every received RTP packet, as aiortc's receiver gets it (before its jitter
        buffer). Decoded here, in arrival order, so the Opus decoder state is right."""
        self.packets += 1
        mag = self.decoder.decode(payload)
        if mag is None or int(mag.max(initial=0)) <= VOICED:
            return
        self.last_voiced_rx = at
        if self.speaking:
            self.early = True
        elif self.end_of_speech is not None and self.first_reply is None \
                and at > self.end_of_speech:
            self.first_reply = at
            self.replied.set()

    def phrase_started(self) -> None:
        self.speaking, self.early = True, False
        self.end_of_speech, self.first_reply = None, None
        self.replied.clear()

    def last_voiced_sent(self, at: float) -> None:
        self.speaking = False
        self.end_of_speech = at


def make_microphone(caller: Caller) -> Any:
    """The caller's microphone: a MediaStreamTrack on a 20 ms real-time grid, the current
    phrase's frames exactly, silence otherwise."""
    import av
    from aiortc import MediaStreamTrack

    class Microphone(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.pts = 0
            self.t0: float | None = None
            self.phrase: Phrase | None = None
            self.index = 0
            self.done: asyncio.Future[None] | None = None

        def say(self, p: Phrase) -> asyncio.Future[None]:
            """Queue ``p``; the future is done when its last frame has been sent."""
            assert self.phrase is None, "one phrase at a time"
            self.phrase, self.index = p, 0
            self.done = asyncio.get_running_loop().create_future()
            return self.done

        async def recv(self) -> av.AudioFrame:
            loop = asyncio.get_running_loop()
            if self.t0 is None:
                self.t0 = loop.time()
            delay = self.t0 + self.pts / RATE - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # real-time pacing of a media source
            p = self.phrase
            if p is None:
                pcm = silence(FRAME / RATE)
            else:
                pcm = p.frames[self.index]
                if self.index == 0:
                    caller.phrase_started()
                if self.index == p.last_voiced:
                    caller.last_voiced_sent(time.perf_counter())
                self.index += 1
                if self.index == len(p.frames):
                    self.phrase = None
                    assert self.done is not None
                    self.done.set_result(None)
            samples = np.frombuffer(pcm, "<i2").reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
            frame.sample_rate, frame.pts = RATE, self.pts
            frame.time_base = fractions.Fraction(1, RATE)
            self.pts += FRAME
            return frame

    return Microphone()


async def wait_quiet(caller: Caller, gap: float, within: float = 120.0) -> None:
    """Until no voiced audio has come back for ``gap`` s (the reply is over)."""
    deadline = time.perf_counter() + within
    while (quiet := time.perf_counter() - caller.last_voiced_rx) < gap:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"call {caller.index}: the reply did not stop in {within} s")
        await asyncio.sleep(gap - quiet)  # a reply's end is a silence: nothing to wake on


async def converse(caller: Caller, mic: Any, phrases: list[Phrase], *, start: int, turns: int,
                   gap: float, reply_within: float) -> list[Turn]:
    out = []
    t0 = time.perf_counter()
    for k in range(turns):
        p = phrases[(start + k) % len(phrases)]
        await wait_quiet(caller, gap)
        await mic.say(p)
        caller.talk_seconds += p.talk_seconds
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(reply_within):
                await caller.replied.wait()
        latency = None
        if caller.first_reply is not None and caller.end_of_speech is not None:
            latency = round(1000 * (caller.first_reply - caller.end_of_speech), 1)
        out.append(Turn(caller.index, p.text, p.voice, latency, caller.early))
        caller.end_of_speech = None  # disarmed until the next phrase
    await wait_quiet(caller, gap)
    caller.talk_window += time.perf_counter() - t0
    return out


# -- CPU per call (issue 38 item 6) ------------------------------------------------------------


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and every process under it (``appliance up``: the supervisor,
    relay, signaling, transceivers, Piper workers), from /proc/PID/stat: utime + stime, and
    cutime + cstime, the children each has reaped (the espeak-ng process every sentence runs
    in). A process's CPU so moves to its parent when it is reaped, and is counted once
    either way; one that is gone between the listing and the read counts 0."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime (14-17)
    return total / os.sysconf("SC_CLK_TCK")


@dataclass
class Window:
    """The ``up`` tree's CPU while calls talk: from the first phrase of N connected calls to
    the last reply's end (set-up and teardown are left out)."""

    cpu_s: float = 0.0
    seconds: float = 0.0  # wall time
    calls: int = 0
    talk_s: float = 0.0  # the callers' voiced spans, summed over the calls
    #: Each call's own time, summed: from its first phrase to its last reply's end (a call
    #: that is done waits for the slowest one; that wait is not call time).
    call_seconds: float = 0.0

    def __iadd__(self, other: Window) -> Window:
        self.cpu_s += other.cpu_s
        self.seconds += other.seconds
        self.calls = max(self.calls, other.calls)
        self.talk_s += other.talk_s
        self.call_seconds += other.call_seconds
        return self


#: Issue 38 item 1: the p50 (and, for one call, the p99) bounds, ms.
BOUNDS = {"p50_ms": (500, 800), "p99_ms": (800, None)}  # (one call, more calls at once)


def within_bounds(n: int, row: dict[str, Any]) -> bool:
    for key, (one, more) in BOUNDS.items():
        bound = one if n == 1 else more
        if bound is not None and (row.get(key) is None or row[key] > bound):
            return False
    return row["misses"] == 0


def cpu_row(w: Window, idle_per_s: float | None, n: int, row: dict[str, Any]
            ) -> dict[str, Any]:
    """CPU per call per second of call time, gross and above the tree's idle rate (measured
    before the calls, in the same run), and the calls per core that rate gives."""
    if not w.call_seconds:
        return {}
    per = w.cpu_s / w.call_seconds
    out: dict[str, Any] = {"cpu_s": round(w.cpu_s, 2), "window_s": round(w.seconds, 1),
                           "calls": w.calls, "talk_fraction": round(w.talk_s / w.call_seconds, 3),
                           "per_call_s": round(per, 4)}
    if idle_per_s is not None:
        above = max(0.0, (w.cpu_s - idle_per_s * w.seconds) / w.call_seconds)
        out["above_idle_per_call_s"] = round(above, 4)
        out["calls_per_core"] = round(1 / above, 1) if above else None
    out["within_bounds"] = within_bounds(n, row)
    return out


async def run_calls(base: str, n: int, phrases: list[Phrase], *, turns: int, gap: float,
                    reply_within: float, offset: int = 0, pid: int | None = None
                    ) -> tuple[list[Turn], Window]:
    """N aiortc calls at once, each ``turns`` turns, call i from phrase ``offset + 3 i``;
    with ``pid`` (``up``), its tree's CPU over the turns (:class:`Window`)."""
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
    from aiortc.rtcrtpreceiver import RTCRtpReceiver

    callers: dict[int, Caller] = {}  # id(RTCRtpReceiver) -> its call
    real = RTCRtpReceiver._handle_rtp_packet

    async def spy(receiver: Any, packet: Any, arrival_time_ms: int) -> None:
        caller = callers.get(id(receiver))
        if caller is not None:
            caller.on_rtp(packet.payload, time.perf_counter())
        await real(receiver, packet, arrival_time_ms)

    async def drain(track: Any) -> None:  # aiortc's own decoded frames: not what we time
        with contextlib.suppress(Exception):
            while True:
                await track.recv()

    pcs: list[Any] = []
    locations: list[str] = []
    drains: list[asyncio.Task[None]] = []
    RTCRtpReceiver._handle_rtp_packet = spy  # type: ignore[method-assign]
    try:
        mics = []
        for i in range(n):
            caller = Caller(i)
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            pcs.append(pc)
            mic = make_microphone(caller)
            mics.append((caller, mic))
            pc.addTrack(mic)
            pc.on("track", lambda track: drains.append(asyncio.ensure_future(drain(track))))
            await pc.setLocalDescription(await pc.createOffer())
            status, headers, body = await asyncio.to_thread(
                http_json, "POST", base + "/v1/sessions", pc.localDescription.sdp.encode(),
                "application/sdp")
            if status != 201:
                raise RuntimeError(f"POST /v1/sessions: {status} {body[:300]!r}")
            locations.append(headers["location"])
            await pc.setRemoteDescription(RTCSessionDescription(body.decode(), "answer"))
            for receiver in pc.getReceivers():
                callers[id(receiver)] = caller
        async with asyncio.timeout(60):
            while not all(pc.connectionState == "connected" for pc in pcs):
                if any(pc.connectionState in ("failed", "closed") for pc in pcs):
                    raise RuntimeError("an aiortc call failed to connect")
                await asyncio.sleep(0.05)  # aiortc's state, polled: a bench, not a test
        await asyncio.sleep(0.5)  # media flowing both ways before the first phrase
        cpu0, t0 = (tree_cpu_seconds(pid) if pid else 0.0), time.perf_counter()
        results = await asyncio.gather(*(
            converse(caller, mic, phrases, start=offset + 3 * caller.index, turns=turns, gap=gap,
                     reply_within=reply_within) for caller, mic in mics))
        window = Window((tree_cpu_seconds(pid) - cpu0) if pid else 0.0,
                        time.perf_counter() - t0, n,
                        sum(c.talk_seconds for c, _ in mics),
                        sum(c.talk_window for c, _ in mics))
        if turns and not any(c.packets for c in callers.values()):
            # (a call without turns may end before any RTP comes back)
            raise RuntimeError("no RTP came back on any call")
        return [t for r in results for t in r], window
    finally:
        RTCRtpReceiver._handle_rtp_packet = real  # type: ignore[method-assign]
        for task in drains:
            task.cancel()
        for location in locations:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(http_json, "DELETE", base + location)
        for pc in pcs:
            await pc.close()


# -- the stand-in LLM --------------------------------------------------------------------------


@asynccontextmanager
async def stand_in_llm(delay: float | None, reply: str = LLM_REPLY
                       ) -> AsyncIterator[FakeOpenAI | None]:
    """tests/speech/fake_openai.py's server, its chat stream's first token ``delay`` s after
    the response headers (a model's time to first token), with a two-sentence reply."""
    if delay is None:
        yield None
        return
    async with fake_openai() as api:
        chat = api._chat

        async def delayed_chat(send: Any, receive: Any, req: dict[str, Any]) -> None:
            if not api.replies:
                api.replies.append(reply)
            bodies = 0

            async def delayed(msg: dict[str, Any]) -> None:
                nonlocal bodies
                if msg["type"] == "http.response.body":
                    bodies += 1
                    if bodies == 2:  # the first is the role-only delta, the second has text
                        await trio.sleep(delay)
                await send(msg)

            await chat(delayed, receive, req)

        api._chat = delayed_chat  # type: ignore[method-assign]
        yield api


def with_llm(spec: str, base_url: str) -> str:
    return f"{spec}{'&' if '?' in spec else '?'}llm={quote(base_url, safe=':/')}"


# -- one spec: its own `appliance up` ----------------------------------------------------------


def start_up(spec: str, state: Path, env: dict[str, str]) -> tuple[Proc, str]:
    http, udp = free_tcp_port(), free_udp_port()
    argv = ["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
            "--public-address", "127.0.0.1", "--state-dir", str(state), "--agent", spec]
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    # 300 s: `up --agent assistant` loads Silero and Whisper in every transceiver, and a
    # shared box at load 15 took 66 s to start a bare `up` (bench/capacity.py).
    return Proc(argv, "appliance ready", timeout=300,
                env={"PYTHONPATH": pythonpath, **env}), f"http://127.0.0.1:{http}"


def summary(turns: list[Turn], delay: float | None) -> dict[str, Any]:
    lat = [t.latency_ms for t in turns if t.latency_ms is not None]

    def stats(xs: list[float]) -> dict[str, float | None]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 1)

        return {"p50_ms": r(percentile(xs, 50)), "p90_ms": r(percentile(xs, 90)),
                "p99_ms": r(percentile(xs, 99)), "max_ms": r(max(xs) if xs else None)}

    out: dict[str, Any] = {"turns": len(turns), "measured": len(lat),
                           "misses": len(turns) - len(lat),
                           "early": sum(t.early for t in turns), **stats(lat)}
    if delay is not None:
        out["appliance_share"] = stats([x - 1000 * delay for x in lat])
    return out


@dataclass
class Up:
    spec: str
    proc: Proc
    base: str
    state: Path
    start_s: float


async def start_ups(specs: list[str], env: dict[str, str], llm: str | None) -> list[Up]:
    """One ``up`` per spec, started one after another; with ``llm``, each spec gets
    ``llm=URL`` added (reported under the spec as given: the URL's port changes per run)."""
    ups: list[Up] = []
    try:
        for label in specs:
            spec = label if llm is None else with_llm(label, llm)
            state = Path(tempfile.mkdtemp(prefix="turns-"))
            t0 = time.monotonic()
            print(f"== {spec}: starting appliance up", file=sys.stderr, flush=True)
            try:
                proc, base = await trio.to_thread.run_sync(start_up, spec, state, env)
            except BaseException:
                shutil.rmtree(state, ignore_errors=True)
                raise
            ups.append(Up(label, proc, base, state, round(time.monotonic() - t0, 1)))
    except BaseException:
        await stop_ups(ups)
        raise
    return ups


async def stop_ups(ups: list[Up]) -> None:
    for up in ups:
        rc = await trio.to_thread.run_sync(up.proc.stop)
        shutil.rmtree(up.state, ignore_errors=True)
        if rc not in (0, -15):
            print(f"   {up.spec}: appliance up exited {rc}: {''.join(up.proc.stderr)[-2000:]}",
                  file=sys.stderr)


def split(total: int, parts: int) -> list[int]:
    """``total`` turns over ``parts`` rounds, as evenly as can be (5 over 2: 3, 2)."""
    return [total // parts + (i < total % parts) for i in range(parts)]


async def measure(ups: list[Up], args: argparse.Namespace,
                  phrases: list[Phrase]) -> list[dict[str, Any]]:
    """Every spec at every call count, the turns split into ``--rounds`` rounds whose spec
    order alternates (A B, B A, ...): a box whose load drifts during the run then weighs on
    every spec alike, not on whichever ran last."""
    def calls(up: Up, n: int, turns: int, offset: int
              ) -> Callable[[], tuple[list[Turn], Window]]:
        return lambda: asyncio.run(run_calls(up.base, n, phrases, turns=turns, gap=args.gap,
                                             reply_within=args.timeout, offset=offset,
                                             pid=up.proc.proc.pid))

    out: list[dict[str, Any]] = [{"spec": up.spec, "start_s": up.start_s, "configs": {}}
                                 for up in ups]
    if args.warmup:
        for up, res in zip(ups, out, strict=True):
            warm, _ = await trio.to_thread.run_sync(calls(up, 1, args.warmup, 0))
            res["first_turn_ms"] = warm[0].latency_ms
    idle: list[float | None] = [None for _ in ups]
    if args.idle:
        # Each tree's own CPU with no call (its transceivers' timers, metrics, the relay),
        # taken off the calls' CPU below: what a call adds is what capacity is made of.
        for i, up in enumerate(ups):
            cpu0 = tree_cpu_seconds(up.proc.proc.pid)
            await trio.sleep(args.idle)  # the measuring window, nothing to wait for
            idle[i] = (tree_cpu_seconds(up.proc.proc.pid) - cpu0) / args.idle
            out[i]["idle_cpu_per_s"] = round(idle[i] or 0.0, 4)
    for n in args.calls:
        turns: list[list[Turn]] = [[] for _ in ups]
        windows = [Window() for _ in ups]
        loads: list[list[float]] = [[] for _ in ups]
        for r, per_call in enumerate(split(args.turns, args.rounds)):
            if not per_call:
                continue  # fewer turns than rounds
            order = list(range(len(ups)))
            for i in order if r % 2 == 0 else order[::-1]:
                loads[i].append(round(os.getloadavg()[0], 1))
                # Each round starts further on in the phrase list: no phrase said twice.
                got, window = await trio.to_thread.run_sync(
                    calls(ups[i], n, per_call, sum(split(args.turns, args.rounds)[:r])))
                turns[i] += got
                windows[i] += window
                loads[i].append(round(os.getloadavg()[0], 1))
        for i, res in enumerate(out):
            row = summary(turns[i], args.llm_delay)
            row["load"] = [min(loads[i]), max(loads[i])]
            row["cpu"] = cpu_row(windows[i], idle[i], n, row)
            row["turn_list"] = [t.__dict__ for t in turns[i]]
            res["configs"][str(n)] = row
            brief = {k: v for k, v in row.items() if k != "turn_list"}
            print(f"   {ups[i].spec}, {n} call(s): {json.dumps(brief)}", file=sys.stderr,
                  flush=True)
    return out


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each spec's p50, p90 and CPU per call over the first spec's (the baseline), per call
    count."""
    if len(results) < 2:
        return []
    base = results[0]
    out = []
    for r in results[1:]:
        for n, row in r["configs"].items():
            ref = base["configs"].get(n)
            if not ref:
                continue
            entry: dict[str, Any] = {"spec": r["spec"], "baseline": base["spec"], "calls": int(n)}
            for key in ("p50_ms", "p90_ms"):
                a, b = row.get(key), ref.get(key)
                entry[key.replace("_ms", "")] = round(a / b, 3) if a and b else None
            key = "above_idle_per_call_s" if "above_idle_per_call_s" in row["cpu"] \
                else "per_call_s"
            a, b = row["cpu"].get(key), ref["cpu"].get(key)
            entry["cpu_per_call"] = round(a / b, 3) if a and b else None
            out.append(entry)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    n_phrases = max(8, args.turns + 3 * max(args.calls))
    phrases = await trio.to_thread.run_sync(build_phrases, n_phrases, args.piper_model)
    specs = ([args.baseline] if args.baseline else []) + args.agent
    async with stand_in_llm(args.llm_delay, args.llm_reply) as api:
        env = {} if api is None else {"APPLIANCE_LLM_KEY": KEY, "APPLIANCE_LLM_URL": ""}
        ups = await start_ups(specs, env, None if api is None else api.base_url)
        try:
            results = await measure(ups, args, phrases)
        finally:
            await stop_ups(ups)
    return {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "voices": sorted({p.voice for p in phrases}), "gap_s": args.gap,
            "llm_delay_s": args.llm_delay, "turns_per_call": args.turns, "specs": results,
            "ratios": ratios(results)}


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def print_report(result: dict[str, Any]) -> None:
    llm = result["llm_delay_s"]
    print(f"{result['machine']}; {result['date']}; voices {', '.join(result['voices'])}"
          + ("" if llm is None else f"; every spec with llm= a stand-in LLM, first token "
                                    f"after {llm} s"))
    print("end of the caller's speech -> first reply audio heard (ms, caller's clock)")
    share = result["llm_delay_s"] is not None
    head = f"{'spec':42} {'calls':>5} {'turns':>5} {'miss':>4} {'early':>5} " \
           f"{'p50':>6} {'p90':>6} {'p99':>6} {'max':>6}  load"
    print(head + ("   share p50/p90/max (minus the LLM delay)" if share else ""))
    for r in result["specs"]:
        for n, row in r["configs"].items():
            line = (f"{r['spec'][:42]:42} {n:>5} {row['measured']:>5} {row['misses']:>4} "
                    f"{row['early']:>5} {_f(row['p50_ms']):>6} {_f(row['p90_ms']):>6} "
                    f"{_f(row['p99_ms']):>6} {_f(row['max_ms']):>6}  "
                    f"{row['load'][0]}-{row['load'][1]}")
            if share:
                s = row["appliance_share"]
                line += f"   {_f(s['p50_ms'])} / {_f(s['p90_ms'])} / {_f(s['max_ms'])}"
            print(line)
        print(f"{'':42} (up ready in {r['start_s']} s; first turn after start "
              f"{_f(r.get('first_turn_ms'))} ms, not counted)")
    print("CPU of the `up` process tree per call, per second of call time (the calls' turns "
          "only), above its idle rate; calls per core at that rate; item 1's bounds")
    print(f"{'spec':42} {'calls':>5} {'talk':>5} {'CPU s':>7} {'per s':>7} {'>idle':>7} "
          f"{'per core':>8}  bounds")
    for r in result["specs"]:
        for n, row in r["configs"].items():
            c = row["cpu"]
            if not c:
                continue
            above = c.get("above_idle_per_call_s")
            print(f"{r['spec'][:42]:42} {n:>5} {c['talk_fraction']:>5.0%} {c['cpu_s']:>7.1f} "
                  f"{c['per_call_s']:>7.3f} {'-' if above is None else f'{above:.3f}':>7} "
                  f"{_f(c.get('calls_per_core')):>8}  {'met' if c['within_bounds'] else 'missed'}")
        if r.get("idle_cpu_per_s") is not None:
            print(f"{'':42} (idle: {r['idle_cpu_per_s']:.3f} CPU s per s)")
    for q in result["ratios"]:
        print(f"{q['spec']} / {q['baseline']}, {q['calls']} call(s): "
              f"p50 x{q['p50']}, p90 x{q['p90']}, CPU per call x{q['cpu_per_call']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agent", action="append", metavar="SPEC",
                   help="agent spec to measure (repeatable; default: assistant)")
    p.add_argument("--baseline", default=BASELINE, metavar="SPEC",
                   help=f"measured first, the others' ratios are against it (default "
                        f"{BASELINE!r}: today's loop; '' for none)")
    p.add_argument("--calls", default="1,4",
                   help="call counts, comma-separated: N calls talking at once (default 1,4)")
    p.add_argument("--turns", type=int, default=5, help="turns per call (default 5)")
    p.add_argument("--rounds", type=int, default=2,
                   help="split each call count's turns into R rounds, the specs' order "
                        "alternating (default 2: A B, then B A)")
    p.add_argument("--warmup", type=int, default=1,
                   help="turns of one call after start-up, not counted (default 1)")
    p.add_argument("--idle", type=float, default=5.0,
                   help="s of each `up` with no call, its idle CPU taken off the calls' "
                        "(default 5; 0: gross CPU only)")
    p.add_argument("--gap", type=float, default=0.8,
                   help="s of quiet after a reply before the next phrase (default 0.8)")
    p.add_argument("--timeout", type=float, default=15.0,
                   help="s without a reply that make a turn a miss (default 15)")
    p.add_argument("--llm-delay", type=float, default=None, metavar="D",
                   help="answer with a stand-in OpenAI-compatible LLM whose first token "
                        "streams after D s; report latency minus D too")
    p.add_argument("--llm-reply", default=LLM_REPLY, metavar="TEXT",
                   help="what the stand-in LLM answers (with --llm-delay; a shorter reply "
                        "raises the callers' talk fraction)")
    p.add_argument("--piper-model", metavar="ONNX",
                   help="speak every other phrase with this Piper voice (needs `piper`)")
    p.add_argument("--json", action="store_true", help="print the JSON only")
    args = p.parse_args(argv)
    args.agent = args.agent or ["assistant"]
    args.calls = [int(x) for x in args.calls.split(",") if x]
    if shutil.which("espeak-ng") is None:
        print("espeak-ng is not installed (make sysdeps)", file=sys.stderr)
        return 2
    result = trio.run(run, args)
    if not args.json:
        print_report(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
