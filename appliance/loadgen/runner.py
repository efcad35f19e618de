"""The trio shell of the load generator: ramp, one pacer for every session, progress.

Task shape (STYLE.md rule 9: only nursery-owned tasks):

* the **ramp** starts one session task every ``1/rate`` s;
* each **session** task holds :func:`~appliance.client.call.open_call` open (which runs that
  call's socket reader) and waits until the pacer is done with it;
* the single **pacer** wakes every 2 ms on trio's clock (``SUBTICKS`` = 10 slots of the
  20 ms packet time) and, for every live session of that slot, drains the echoed packets that
  the reader queued (each carries its arrival time, so draining late does not blur the
  measurement), then sends that session's next packet. 50 packets/s for N sessions costs
  N sends per 20 ms and no task switches per packet.

Sessions are spread over the slots by when they connected, as real callers are: each
microphone runs on its own clock. An earlier pacer sent every session's packet in one burst
per 20 ms, so the server under test saw N packets at once and the last session's echo waited
behind N-1 others (N × the server's cost per packet: 70 PCM sessions × 245 µs ≈ 17 ms); the
"largest N with p99 ≤ 20 ms" of bench/capacity.py then measured the burst, not the server.

Turn taking (``pattern="turns"``): the signal is ``talk`` seconds of tone then ``listen``
seconds of silence, over and over, as a caller who speaks and then waits for the answer.
Every returned packet is decoded and each turn records when loud audio came back: while the
caller talked, and how long after it stopped (``TurnResult``). An echo answers while you
talk; a turn-taking agent (examples/parrot.py) only once you have stopped.

Conversation (``pattern="conversational"``): the same talk-then-listen stream with the
duty cycle of a conversation against an echo (caller 40 % of ``cycle``, then silence; see
:func:`~appliance.loadgen.media.conversational_frames`), measured like ``continuous``: no
turn bookkeeping (no decode per returned packet), and the echo of the silent part is still
50 packets/s, so loss is counted as for ``continuous``.

**Send times**: a packet's RTT starts when it left (the clock read right after the send),
not at the pacer tick that sent it. With a slot's sessions served one after another, the
last of a slot of 20 left a few ms after the tick on a quiet box, and tens of ms after it
on a box whose every CPU was busy (bench/capacity.py placement c: the load generator
beside a hog, its ticks up to 100 ms late): those ms were the load generator's own wait,
counted as the server's (issue 41 item 1). The arrival side already excludes it (kernel
receive timestamps, :func:`~appliance.client.call.read_ready`). A refusal's latency is timed
the same way: from the POST's last byte leaving to the 503's arrival on the kernel's stamp
(:class:`~appliance.client.http.Response`), not to when this loop got round to reading it.

A session's *first* packet leaves the moment it connects, not on the pacer's next tick: a
browser with an open microphone has a frame ready when DTLS completes, and waiting 0-20 ms
for the tick was pure measurement artefact in POST → first echo. From then on the pacer
keeps the 20 ms cadence: the next packet goes on the first tick at least half a packet
time after the previous one (10-30 ms for the second, one per tick after that).
"""

from __future__ import annotations

import math
import re
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass

import trio

from appliance.client.call import Call, CallFailed, open_call
from appliance.proto.dtls import Certificate

from .media import (
    SAMPLE_RATE,
    Decoder,
    OnsetDetector,
    ToneStream,
    conversational_frames,
    encode_tone,
    read_tag,
)
from .stats import Report, SessionResult, TurnResult, percentile

PTIME = 0.020
SUBTICKS = 10  # pacer slots per packet time: sessions are spread over them
SUB = PTIME / SUBTICKS
TS_STEP = 960  # RTP timestamp units (48 kHz) per 20 ms packet
SETUP_GRACE = 1.0  # s past --connect-timeout before a setup (POST included) is abandoned
_RING = 1024  # send times kept for tag matching: ~20 s of packets, far beyond any RTT
#: A POST answered 503 (client/call.py's CallFailed text), and its problem code if any.
_REFUSED = re.compile(r'POST /v1/sessions → 503\b(?:.*?"code": "([a-z-]+)")?')


@dataclass(frozen=True, slots=True)
class LoadConfig:
    url: str
    sessions: int = 10
    rate: float = 5.0  # new sessions per second
    duration: float = 10.0  # seconds each session sends media, from its connection
    agent: str | None = None
    token: str | None = None
    insecure: bool = False  # skip TLS verification (a --tls self-signed appliance)
    connect_timeout: float = 10.0
    drain: float = 0.5  # after the last packet, how long to wait for the echo's tail
    rtt: str = "auto"  # "auto" (tags if they come back, else onset), "tag" or "onset"
    # RFC 7918 DTLS False Start: media from our Finished on, not the server's (browsers do
    # not do this for DTLS-SRTP, so it is off unless asked for; see appliance/client/peer.py).
    false_start: bool = False
    # "continuous" (the tone with a 100 ms gap every second) or "turns": talk for ``talk``
    # seconds, then stay silent for ``listen`` seconds, for agents that wait for their turn.
    pattern: str = "continuous"
    talk: float = 1.0
    listen: float = 2.5
    # "conversational": seconds per talk-then-listen cycle (the caller talks 40 % of it).
    cycle: float = 2.5


PATTERNS = ("continuous", "turns", "conversational")


class _Live:
    """A connected session as the pacer sees it."""

    __slots__ = ("call", "counter", "detector", "done", "first_at", "first_seq", "last_transit",
                 "loudness", "max_seq", "next_due", "res", "seen", "sent_at", "slot", "start",
                 "stop_at", "talk_end", "ts0", "turn")

    def __init__(self, call: Call, res: SessionResult, now: float, duration: float,
                 onset_sample: int, ts0: int) -> None:
        self.call = call
        self.res = res
        self.start = now
        self.stop_at = now + duration
        self.counter = 0
        self.next_due = now  # when this session's next packet is due (trio time)
        self.slot = 0  # the pacer slot this session is served in (set by the generator)
        self.ts0 = ts0
        self.sent_at = [0.0] * _RING
        self.seen = bytearray()
        self.detector = OnsetDetector(onset_sample)
        self.first_seq: int | None = None
        self.max_seq = 0  # extended (wrap-counted) highest sequence number
        self.last_transit: float | None = None
        self.first_at: float | None = None
        self.done = trio.Event()
        # Turn taking: the turn in progress, when its talking stopped, a decoder for loudness.
        self.turn: TurnResult | None = None
        self.talk_end: float | None = None
        self.loudness: Decoder | None = None


class LoadGenerator:
    def __init__(self, cfg: LoadConfig, stream: ToneStream, certificate: Certificate) -> None:
        self.cfg = cfg
        self.stream = stream
        self.turns = cfg.pattern == "turns"
        self.certificate = certificate
        self.results = [SessionResult(i, turn_taking=cfg.pattern == "turns")
                        for i in range(cfg.sessions)]
        self.live: list[_Live] = []
        # The pacer's slots: each live session is in exactly one, served once per 20 ms.
        self.slots: list[list[_Live]] = [[] for _ in range(SUBTICKS)]
        self._slot = 0  # the slot the pacer served last
        self.started = 0
        self.max_concurrent = 0
        self.pacer_late: list[float] = []
        self._all_started = trio.Event()
        self._finished = 0

    # -- sessions ----------------------------------------------------------------------

    async def _session(self, index: int) -> None:
        res = self.results[index]
        cfg = self.cfg
        # --connect-timeout bounds the whole setup, POST included: open_call's own timeout
        # starts after the answer, so a POST that hung used to hang the run with it. The
        # second of grace lets open_call's more specific "no ICE/DTLS" report win when the
        # answer did come.
        posted = trio.current_time()
        setup = trio.CancelScope(deadline=posted + cfg.connect_timeout + SETUP_GRACE)
        try:
            with setup:
                await self._call(res, setup)
            if setup.cancelled_caught:
                res.failure = (f"no answer and connection within "
                               f"{cfg.connect_timeout + SETUP_GRACE:g} s of the POST")
        except CallFailed as exc:
            res.failure = str(exc)
            refused = _REFUSED.match(res.failure)
            if refused:  # admission (issue 23): how fast the busy signal came, from the
                # POST leaving to the 503 arriving (kernel stamps: not this loop's waits)
                res.refused = (exc.answered_in if exc.answered_in is not None
                               else trio.current_time() - posted)
                res.refused_code = refused.group(1) or "503"
                res.refused_retry_after = exc.retry_after
        except Exception as exc:  # one broken session must not end the run
            res.failure = f"{type(exc).__name__}: {exc}"
        finally:
            self._finished += 1

    async def _call(self, res: SessionResult, setup: trio.CancelScope) -> None:
        cfg = self.cfg
        async with open_call(
            cfg.url, agent=cfg.agent, token=cfg.token, certificate=self.certificate,
            verify_tls=not cfg.insecure, connect_timeout=cfg.connect_timeout,
            false_start=cfg.false_start,
        ) as call:
            setup.deadline = math.inf  # connected: the call runs its course
            res.setup_answer = call.timeline.answer
            res.setup_connected = call.timeline.connected
            live = _Live(call, res, trio.current_time(), cfg.duration,
                         self.stream.onset_sample, call.peer.ssrc & 0xFFFF)
            self.live.append(live)
            # Served from the slot of its connection time on: its second packet goes ~20 ms
            # after the first, and sessions that connect at different times stay spread.
            live.slot = self._slot
            self.slots[live.slot].append(live)
            self.max_concurrent = max(self.max_concurrent, len(self.live))
            if not call.peer.closed:
                self._send(live, live.start)  # the first frame is ready: no wait for the tick
            await live.done.wait()

    async def _ramp(self, nursery: trio.Nursery) -> None:
        t0 = trio.current_time()
        for i in range(self.cfg.sessions):
            nursery.start_soon(self._session, i)
            self.started += 1
            await trio.sleep_until(t0 + (i + 1) / self.cfg.rate)
        self._all_started.set()

    # -- the pacer ---------------------------------------------------------------------

    async def _pacer(self) -> None:
        next_tick = trio.current_time()
        slot = 0
        while not (self._all_started.is_set() and self._finished == self.cfg.sessions
                   and not self.live):
            await trio.sleep_until(next_tick)
            now = trio.current_time()
            self._slot = slot = (slot + 1) % SUBTICKS
            due = self.slots[slot]
            if due:
                self.pacer_late.append(now - next_tick)
            for live in list(due):
                self._receive(live)
                if live.call.peer.closed:
                    self._finish(live, f"call ended by peer: {live.call.failure or 'closed'}")
                elif now < live.stop_at:
                    # Half a packet time of slack: ticks come late by a little, and the
                    # first packet left between two ticks.
                    if now >= live.next_due - PTIME / 2:
                        self._send(live, now)
                elif now >= live.stop_at + self.cfg.drain:
                    self._finish(live, None)
            next_tick += SUB
            if now - next_tick > 5 * PTIME:
                next_tick = now  # far behind: drop the missed ticks rather than burst

    def _send(self, live: _Live, now: float) -> None:
        c = live.counter
        stream = self.stream
        frame = c % stream.cycle
        if self.turns:
            if frame == 0:  # a new turn: the caller starts talking
                self._close_turn(live)
                live.turn = TurnResult()
                live.talk_end = None
            elif frame == stream.tone_frames:  # ... and now stops and listens
                live.talk_end = now
        payload = self.stream.payload(frame, live.res.index, c)
        live.call.send_rtp(payload, (live.ts0 + c * TS_STEP) & 0xFFFFFFFF, marker=c == 0)
        # When it left, not the tick's ``now``: a slot's sessions are served one after
        # another, and a starved load generator is preempted between them (module
        # docstring, "Send times"); ``now`` keeps the cadence.
        sent = trio.current_time()
        live.sent_at[c % _RING] = sent
        # One packet per tick at most: a late pacer drops ticks, it does not burst.
        live.next_due = max(live.next_due + PTIME, now - PTIME / 2)
        live.counter = c + 1
        live.res.sent = c + 1
        gap_at = stream.tone_frames
        if self.cfg.rtt != "tag" and live.res.rtt_method != "tag" and c >= gap_at:
            if frame == gap_at:
                live.detector.arm()
            elif frame == 0:
                live.detector.onset_sent(sent)

    def _receive(self, live: _Live) -> None:
        res = live.res
        index = res.index & 0xFFFF
        while (ev := live.call.receive_nowait()) is not None:
            pkt, at = ev.packet, ev.at
            res.received += 1
            if live.first_at is None:
                live.first_at = at
            res.echo_span = at - live.first_at
            self._sequence(live, pkt.sequence)
            # RFC 3550 §6.4.1 / A.8: jitter from transit-time differences, in seconds.
            transit = at - pkt.timestamp / SAMPLE_RATE
            if live.last_transit is not None:
                d = abs(transit - live.last_transit)
                if d < 1.0:  # a timestamp jump (new talkspurt, wrap) is not jitter
                    res.jitter += (d - res.jitter) / 16
            live.last_transit = transit
            payload = pkt.payload
            if live.turn is not None:
                self._turn_heard(live, live.turn, payload, at)
            found = read_tag(payload) if self.cfg.rtt != "onset" else None
            if found is not None and found[0] == index:
                self._tagged(live, found[1], at)
                continue
            if res.setup_first_echo is None and res.rtt_method != "tag":
                res.setup_first_echo = at - live.call.started_at
            if res.rtt_method != "tag" and self.cfg.rtt != "tag":
                rtt = live.detector.feed(payload, at)
                if rtt is not None:
                    res.rtt_method = "onset"
                    res.rtts.append(rtt)

    def _tagged(self, live: _Live, counter: int, at: float) -> None:
        res = live.res
        if res.rtt_method != "tag":
            # Tags come back: the server passes media through. Onset samples (if any) and
            # the detector are dropped; from here on every packet is a sample.
            res.rtt_method = "tag"
            res.rtts.clear()
            res.setup_first_echo = at - live.call.started_at
        if counter >= live.counter or live.counter - counter > _RING:
            return  # not ours to match (or older than the ring): ignore
        seen = live.seen
        if len(seen) <= counter:
            seen.extend(bytes(counter + 1024 - len(seen)))
        if seen[counter]:
            res.duplicates += 1
            return
        seen[counter] = 1
        res.echoed += 1
        res.rtts.append(at - live.sent_at[counter % _RING])

    @staticmethod
    def _turn_heard(live: _Live, turn: TurnResult, payload: bytes, at: float) -> None:
        if live.loudness is None:
            live.loudness = Decoder()
        if not live.loudness.is_loud(payload):
            return
        if live.talk_end is None or at < live.talk_end:
            turn.loud_while_talking += 1
            return
        turn.loud_while_listening += 1
        after = at - live.talk_end
        if turn.reply_after is None:
            turn.reply_after = after
        turn.reply_end = after

    @staticmethod
    def _close_turn(live: _Live) -> None:
        # Only turns that reached their listening part count (the run may end mid-talk).
        if live.turn is not None and live.talk_end is not None:
            live.res.turns.append(live.turn)
        live.turn = None

    @staticmethod
    def _sequence(live: _Live, seq: int) -> None:
        if live.first_seq is None:
            live.first_seq = live.max_seq = seq
            return
        # Extend to 32 bits around the highest seen so far (RFC 3550 A.1, simplified).
        ext = (live.max_seq & ~0xFFFF) | seq
        if ext < live.max_seq - 0x8000:
            ext += 0x10000
        elif ext > live.max_seq + 0x8000:
            ext -= 0x10000
        live.max_seq = max(live.max_seq, ext)

    def _finish(self, live: _Live, failure: str | None) -> None:
        res = live.res
        self._receive(live)
        self._close_turn(live)
        res.srtp_errors = live.call.peer.srtp_errors
        res.onsets_missed = live.detector.missed
        if live.first_seq is not None:
            expected = live.max_seq - live.first_seq + 1
            res.return_lost = max(0, expected - res.received)
        if failure is None and res.received == 0:
            failure = "connected, but no RTP came back"
        res.failure = failure
        self.live.remove(live)
        self.slots[live.slot].remove(live)
        live.done.set()

    # -- progress ----------------------------------------------------------------------

    def progress_line(self, elapsed: float) -> str:
        failed = sum(1 for r in self.results if r.failure)
        recent = [r for live in self.live for r in live.res.rtts[-50:]]
        p50 = percentile(recent, 50)
        sent = sum(live.res.sent for live in self.live)
        lost = sum(live.res.sent * (live.res.loss or 0.0) for live in self.live)
        loss = f"{100 * lost / sent:5.2f} %" if sent else "   -   "
        return (f"[{elapsed:6.1f} s] started {self.started}/{self.cfg.sessions}  "
                f"live {len(self.live)}  done {self._finished}  failed {failed}  "
                f"rtt p50 {'-' if p50 is None else f'{p50 * 1000:.1f} ms'}  loss {loss}")


async def run_load(
    cfg: LoadConfig,
    *,
    stream: ToneStream | None = None,
    certificate: Certificate | None = None,
    progress: Callable[[str], None] | None = None,
    progress_interval: float = 1.0,
) -> Report:
    """Run the whole load and return the report (sessions that fail are in it, with why)."""
    if cfg.sessions < 1 or cfg.rate <= 0 or cfg.duration <= 0:
        raise ValueError("sessions ≥ 1, rate > 0 and duration > 0 are required")
    if cfg.pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {', '.join(PATTERNS)}, not {cfg.pattern!r}")
    if cfg.pattern == "turns":
        if cfg.talk < PTIME or cfg.listen < PTIME:
            raise ValueError("talk and listen must each be at least one packet (0.02 s)")
        stream = stream or encode_tone(tone_frames=round(cfg.talk / PTIME),
                                       gap_frames=round(cfg.listen / PTIME))
    if cfg.pattern == "conversational":
        tone, gap = conversational_frames(cfg.cycle)
        stream = stream or encode_tone(tone_frames=tone, gap_frames=gap)
    stream = stream or encode_tone()
    # One certificate for every session, as a browser reuses its own; generating one per
    # call would put key generation inside the setup times we measure. Pass ``certificate``
    # to share one across runs too (bench/setup_bench.py does, round after round).
    gen = LoadGenerator(cfg, stream, certificate or Certificate.generate(trio.current_time()))
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        if progress is not None:
            nursery.start_soon(_progress, gen, progress, progress_interval, t0)
        nursery.start_soon(gen._ramp, nursery)
        await gen._pacer()
        nursery.cancel_scope.cancel()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return Report(cfg.url, gen.results, trio.current_time() - t0, cpu, gen.max_concurrent,
                  gen.pacer_late)


async def _progress(gen: LoadGenerator, out: Callable[[str], None], every: float,
                    t0: float) -> None:
    while True:
        await trio.sleep(every)
        out(gen.progress_line(trio.current_time() - t0))


def stderr_progress(tty: bool) -> Callable[[str], None]:
    """A progress sink: rewrite one line on a terminal, one line per update otherwise."""

    def out(line: str) -> None:
        sys.stderr.write(("\r" + line + "\x1b[K") if tty else line + "\n")
        sys.stderr.flush()

    return out
