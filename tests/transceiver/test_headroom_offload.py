"""Speech work is load, not an emergency (issue 41 item 4).

The bug: on a quiet default ``appliance up``, one demo-page call to the assistant (one
Whisper decode per turn, in a ``trio.to_thread`` worker) left its transceiver at Opus
complexity 3 with "calls degraded: admitting up to 50 %" 2 s after the call had ended,
while the other transceiver showed 84 % headroom. The meter read the whole process's CPU
(``time.process_time``) as the media loop's use of its core: a decode filled a window,
``busy`` plus one call's worth (busy per call, one call) crossed the controller's urgent
line, and the first step was taken at once; stepping back up needs five quiet seconds.

Now the loop's own CPU is what ``busy`` is made of, and the worker threads' CPU is charged
to the calls that can have asked for it as a learned per-call cost of their agent kind
(transceiver/offload.py), which signaling's admission adds for each live call and for the
call it places. These tests drive the meter on a fake clock (no tick task): the scenario
of the report, and the same scenario read the old way, which must degrade (so the scenario
is one that finds the bug). The last test runs the real tick task beside a real Whisper
decode in a worker thread and checks where its CPU is counted."""

from __future__ import annotations

import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from transceiver.support import make_offer

from appliance.agents import AgentContext, agent_kind, register
from appliance.agents.registry import _registered
from appliance.control import control_request
from appliance.proto.dtls import Certificate
from appliance.signaling.admission import LIMIT, Admission
from appliance.transceiver.call import CallState
from appliance.transceiver.corestat import parse_proc_stat_untrusted
from appliance.transceiver.headroom import TICK
from appliance.transceiver.offload import HORIZON, MAX_KINDS, MIN_CALL_SECONDS, OffloadCost
from appliance.transceiver.server import (
    Transceiver,
    TransceiverAddresses,
    TransceiverConfig,
    serve_transceiver,
)

SECRETS = (b"routing-secret-for-tests-0123456",)
CERT = Certificate.generate(time.time())
TICKS_PER_S = 100  # /proc/stat's clock ticks
#: A registered agent that runs as a task, as the assistant does (the assistant itself
#: would load its speech models at ``create``; what is counted depends only on the task).
KIND = "inference-test"


# -- the learner, sans-IO --------------------------------------------------------------------


def test_a_burst_is_spread_over_the_call_seconds_it_belongs_to() -> None:
    c = OffloadCost()
    assert c.cost(KIND) == 0.0  # never seen: no offload known
    # One call; its first decode lands in one 0.5 s window: 0.45 s of a worker's CPU.
    assert c.handle_window(0.45, 0.5, {KIND: 1}, unsettled=0)
    # A call of at least MIN_CALL_SECONDS: not 0.9 of a core.
    assert c.cost(KIND) == pytest.approx(0.45 / MIN_CALL_SECONDS)
    # Then 10 s of the call with no decode, then another 0.45 s: the mean is learned.
    for _ in range(20):
        c.handle_window(0.0, 0.5, {KIND: 1}, unsettled=0)
    c.handle_window(0.45, 0.5, {KIND: 1}, unsettled=0)
    assert c.cost(KIND) == pytest.approx(0.9 / MIN_CALL_SECONDS, rel=0.1)
    # A long call converges to its true mean: 0.9 s of CPU every 5 s is 0.18 of a core.
    for _ in range(60):
        for w in range(10):
            c.handle_window(0.45 if w < 2 else 0.0, 0.5, {KIND: 1}, unsettled=0)
    assert c.cost(KIND) == pytest.approx(0.18, rel=0.05)
    assert c.need([KIND, KIND, "echo"]) == pytest.approx(2 * c.cost(KIND))


def test_setup_windows_and_nobodys_offload_teach_nothing() -> None:
    c = OffloadCost()
    assert not c.handle_window(0.4, 0.5, {KIND: 1}, unsettled=1)  # a model loaded at setup
    assert not c.handle_window(0.4, 0.5, {}, unsettled=0)  # a decode after its call ended
    assert not c.handle_window(0.4, 0.5, {KIND: 0}, unsettled=0)
    assert c.costs() == {} and c.samples == 0


def test_mixed_kinds_share_a_window_evenly_and_kinds_are_bounded() -> None:
    c = OffloadCost()
    for _ in range(4 * round(MIN_CALL_SECONDS)):  # both kinds past MIN_CALL_SECONDS
        c.handle_window(0.3, 0.5, {"a": 2, "b": 1}, unsettled=0)
    assert c.cost("a") == pytest.approx(c.cost("b"))  # per call, the same: 0.2 of a core
    assert c.cost("a") == pytest.approx(0.2)
    for i in range(MAX_KINDS + 5):
        c.handle_window(0.1, 0.5, {f"k{i}": 1}, unsettled=0)
    assert len(c.costs()) == MAX_KINDS and "a" not in c.costs()


def test_a_kind_keeps_its_cost_between_its_calls() -> None:
    """The decay runs on the kind's own call-seconds: an hour with no assistant call does
    not make the next one free."""
    c = OffloadCost()
    for _ in range(round(2 * HORIZON)):
        c.handle_window(0.1, 0.5, {KIND: 1}, unsettled=0)
    learned = c.cost(KIND)
    for _ in range(7200):
        c.handle_window(0.0, 0.5, {"echo-like": 3}, unsettled=0)
    assert c.cost(KIND) == learned


def test_agent_kinds() -> None:
    assert agent_kind(None) == agent_kind("") == "echo"
    assert agent_kind("assistant?stt=whisper&voice=x") == "assistant"
    assert agent_kind("ws://user:secret@host/path?token=x") == "ws://"
    assert agent_kind("realtime:gpt-x") == agent_kind("realtime") == "realtime"
    # a family's options may hold a URL: still the family (as resolve() matches it)
    assert agent_kind("assistant?llm=http://127.0.0.1:11434/v1") == "assistant"
    assert agent_kind("pkg.mod:agent") == "pkg.mod:agent"


def test_signaling_reads_offload_costs_bounded_and_per_agent() -> None:
    adm = Admission([0], {0: 0})
    base = {"busy": 0.05, "sessions": 1, "call_cpu": 0.015, "idle_cpu": 0.01,
            "window_calls": 1, "available": 1.0}
    junk = {f"k{i}": 0.01 for i in range(100)}
    adm.report(0, {"load": {**base, "agent_kind": "assistant", "offload_calls": 0.2,
                            "offload_cpu": {"assistant": 0.2, "echo": "x", "big": 99.0,
                                            **junk}}}, adm.asked(0))
    assert adm.offload_cost(0) == adm.offload_cost(0, "assistant?voice=x") == 0.2
    assert adm.offload_cost(0, "echo") == 0.0  # not a number: not a cost
    assert adm.offload_cost(0, "big") == 2.0  # clamped
    assert adm.offload_cost(0, "k99") == 0.0  # beyond the kinds kept
    # now: busy + the live calls' offload; one more assistant call: its loop and offload
    assert adm.projected(0, 1, "assistant") == pytest.approx(0.05 + 0.2 + 0.015 + 0.2)
    assert adm.projected(0, 1, "echo") == pytest.approx(0.05 + 0.2 + 0.015)
    # An older transceiver (no offload fields): as before.
    adm.report(0, {"load": base}, adm.asked(0))
    assert adm.offload_cost(0) == 0.0
    assert adm.projected(0, 1) == pytest.approx(0.05 + 0.015)


# -- one assistant call on a transceiver with room (the report's scenario) --------------------


async def _inference_agent(ctx: AgentContext) -> None:
    async for _ in ctx.frames():
        pass


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Transceiver]:
    """A transceiver at the default complexity whose calls run :data:`KIND` agents."""
    register(KIND, _inference_agent)
    config = TransceiverConfig(id=0, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp_path / "t0.sock"), agent=KIND)
    try:
        async with trio.open_nursery() as nursery:
            addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)
            assert addrs.transceiver is not None
            yield addrs.transceiver
            nursery.cancel_scope.cancel()
    finally:
        _registered.pop(KIND, None)


async def _create(tr: Transceiver, sid: str, agent: str | None = None) -> None:
    assert tr.config.control is not None
    r = await control_request(tr.config.control, {
        "op": "create", "session_id": sid, "candidates": [["198.51.100.1", 3478]],
        "agent": agent,
        "offer": make_offer("Clnt", "clientpasswordclientpass", CERT.fingerprint)})
    assert r["ok"], r


class QuietHost:
    """A quiet two-core host on a fake clock: the transceiver's loop thread on one CPU, its
    worker threads' inference on the other, /proc/stat texts to match. ``old_reading``:
    pass the meter what the tick task passed before issue 41 item 4 (the process's CPU, the
    workers' included, as the loop's), to show the scenario finds the bug."""

    def __init__(self, *, old_reading: bool = False) -> None:
        self.t = 100.0
        self.loop = self.offload = 0.0
        self.busy = [0.0, 0.0]
        self.idle = [0.0, 0.0]
        self.old_reading = old_reading

    def window(self, tr: Transceiver, loop: float, offload: float = 0.0, *,
               sent_per_s: int = 0) -> dict[str, Any]:
        """One meter window with the loop using ``loop`` of a core and the workers
        ``offload`` of the other; what ``stats`` says under ``load`` after."""
        windows = tr.load.meter.windows
        while tr.load.meter.windows == windows:
            self.t += TICK
            self.loop += loop * TICK
            self.offload += offload * TICK
            for cpu, used in enumerate((loop, offload)):
                self.busy[cpu] += used * TICK * TICKS_PER_S
                self.idle[cpu] += (1.0 - used) * TICK * TICKS_PER_S
            tr.counters["datagrams_out"] += round(sent_per_s * TICK)
            stat = parse_proc_stat_untrusted(
                "".join(f"cpu{i} {int(self.busy[i])} 0 0 {int(self.idle[i])} 0 0 0 0 0 0\n"
                        for i in (0, 1))
                + f"procs_running {1 + (offload > 0)}\n") if tr.load.meter.window_due(self.t) else None
            affinity = frozenset({0, 1}) if stat else None
            lag = 0.001  # the loop is on time throughout: nothing a caller hears
            if self.old_reading:
                tr.load.handle_tick(self.t, self.loop + self.offload, lag, stat, affinity)
            else:
                tr.load.handle_tick(self.t, self.loop, lag, stat, affinity, offload=self.offload)
        return tr.load.view()


async def _one_assistant_call(tr: Transceiver, host: QuietHost,
                              each: Callable[[str, dict[str, Any], Admission], None]) -> Admission:
    """Idle, then one call of :data:`KIND` for 30 s with a turn every 5 s (two windows of
    0.9 of a core in a worker: a speculative and a final Whisper decode), then hang-up and
    2 s of quiet. Every report goes to signaling's admission; ``each(phase, load, adm)``."""
    adm = Admission([0], {0: 0})

    def window(phase: str, loop: float, offload: float = 0.0, sent: int = 0) -> None:
        load = host.window(tr, loop, offload, sent_per_s=sent)
        adm.report(0, {"load": load}, adm.asked(0))
        each(phase, load, adm)

    for _ in range(4):
        window("idle", 0.01)
    await _create(tr, "caller")
    window("setup", 0.05)
    tr.calls["caller"].call.state = CallState.CONNECTED
    window("setup", 0.03, sent=50)
    for w in range(60):  # 30 s of the call: 0.5 s windows
        window("call", 0.025, 0.9 if w % 10 in (4, 5) else 0.0, sent=50)
    assert tr.config.control is not None
    await control_request(tr.config.control, {"op": "delete", "session_id": "caller"})
    with trio.fail_after(10):
        while "caller" in tr.calls:  # noqa: ASYNC110 (the session ends in its own task)
            await trio.sleep(0.01)  # a poll interval
    for _ in range(4):  # 2 s after the call has ended
        window("after", 0.01)
    return adm


async def test_one_assistant_call_neither_degrades_nor_caps_a_transceiver_with_room(
        running: Transceiver) -> None:
    tr, host = running, QuietHost()
    seen: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    def each(phase: str, load: dict[str, Any], adm: Admission) -> None:
        view = adm.view(0)
        seen.append((phase, load, view))
        # Never degraded, never capped: the default quality and signaling's own limit.
        assert load["opus_complexity"] == 5 and not load["degraded"], (phase, load)
        assert load["admit_limit"] is None and view["limit"] == LIMIT, (phase, view)
        assert adm.admits(0) and adm.admits(0, "echo") and adm.admits(0, KIND), (phase, view)
        assert not tr.load.overloaded()

    adm = await _one_assistant_call(tr, host, each)
    assert tr.counters["complexity_changes"] == 0
    # The decodes are the assistant call's cost, learned: 0.9 s of CPU per 5 s is 0.18 of
    # a core; over the first 30 s of the kind's history it reads a little under that.
    call = [load for phase, load, _ in seen if phase == "call"]
    learned = call[-1]["offload_cpu"][KIND]
    assert 0.1 < learned <= 0.18
    assert call[-1]["offload_calls"] == pytest.approx(learned, abs=1e-5)
    assert max(load["offload"] for load in call) == pytest.approx(0.9, abs=0.05)
    assert max(load["busy"] for load in call) < 0.1  # the loop's, as it was
    # Signaling counted it as the call's cost while it ran, and counts it for the next
    # call of that kind (not for an echo call).
    assert adm.offload_cost(0, KIND) == pytest.approx(learned, abs=1e-5)
    assert adm.offload_cost(0, "echo") == 0.0
    assert adm.projected(0, 1, KIND) - adm.projected(0, 1, "echo") == pytest.approx(
        learned, abs=1e-4)
    # 2 s after the call ended: the headroom of a transceiver that serves nothing (all of
    # signaling's limit but an idle loop's few per cent).
    after = [view for phase, _, view in seen if phase == "after"]
    assert after[-1]["headroom"] > LIMIT - 0.05 and not after[-1]["degraded"]


async def test_the_same_call_read_as_process_cpu_degrades_it(running: Transceiver) -> None:
    """The scenario above fed as the tick task fed it before the fix (the workers' CPU in
    the loop's): the calls are degraded and signaling capped, as the report saw."""
    tr, host = running, QuietHost(old_reading=True)
    degraded: list[str] = []

    def each(phase: str, load: dict[str, Any], adm: Admission) -> None:
        if load["degraded"] and adm.view(0)["limit"] < LIMIT:
            degraded.append(phase)

    await _one_assistant_call(tr, host, each)
    assert "call" in degraded and "after" in degraded


# -- the tick task beside a real decode in a worker thread ------------------------------------


async def test_a_real_whisper_decode_in_a_worker_is_offload_not_the_loops_cpu(
        running: Transceiver) -> None:
    """The real tick task (``measure_loop``, what the CLI runs) and a real Whisper decode
    in a ``trio.to_thread`` worker while one steady call of :data:`KIND` is in the table:
    the decode's CPU (measured in the worker itself) is reported as offload, not as the
    loop's; the calls are not degraded and admission is not capped. Asserts where CPU was
    counted, not how fast anything ran (a loaded machine only slows the decode)."""
    pytest.importorskip("faster_whisper")
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (make sysdeps)")
    import numpy as np
    from transceiver.speech_audio import espeak

    from appliance.audio.resample import resample
    from appliance.speech.stt import STT_RATE, WhisperStt, whisper_model

    tr = running
    await trio.to_thread.run_sync(whisper_model)  # loaded before any window is measured
    await _create(tr, "caller")
    tr.calls["caller"].call.state = CallState.CONNECTED
    windows: list[tuple[float, float, int, bool, float | None]] = []
    inner = tr.load.handle_tick

    def tick(*args: Any, **kwargs: Any) -> None:  # records each completed window
        before = tr.load.meter.windows
        inner(*args, **kwargs)
        if tr.load.meter.windows != before:
            windows.append((tr.load.meter.report.cpu * tr.load.meter.report.window_s,
                            tr.load.meter.offload_s, tr.load.complexity.complexity,
                            tr.load.complexity.degraded, tr.load.view()["admit_limit"]))

    tr.load.handle_tick = tick  # type: ignore[method-assign]
    engine = WhisperStt()
    speech = np.clip(espeak(0), -32768, 32767).astype("<i2").tobytes()
    pcm = resample(speech, 48_000, STT_RATE)  # a sentence, as the assistant hears a turn

    def decode() -> float:
        # The process's CPU: CTranslate2 computes in threads of its own, not this one.
        t0 = time.process_time()
        engine.transcribe_sync(pcm, None, None)
        engine.transcribe_sync(pcm, None, None)  # a turn: speculative + final decode
        return time.process_time() - t0

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tr.load.measure_loop)
        with trio.fail_after(60):
            while len(windows) < 2:  # noqa: ASYNC110 (windows end in the tick task)
                await trio.sleep(0.01)  # a poll interval
            first = len(windows)
            burst = await trio.to_thread.run_sync(decode)
            last = len(windows)
            while len(windows) < last + 2:  # noqa: ASYNC110 (the decode's last window, one more)
                await trio.sleep(0.01)  # a poll interval
        nursery.cancel_scope.cancel()
    during = windows[first:]
    offload = sum(w[1] for w in during)
    loop = sum(w[0] for w in during)
    assert burst > 0.1  # a real decode ran
    assert offload >= 0.8 * burst, (burst, during)  # counted as the workers'...
    assert loop < 0.5 * burst, (burst, during)  # ...not as the loop's
    assert all(w[2] == 5 and not w[3] and w[4] is None for w in windows), windows
    assert tr.counters["complexity_changes"] == 0
