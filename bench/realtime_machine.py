"""Per-frame cost of the Realtime event machine (issue 17) against the work every call
already does per frame, measured in the same run.

The baseline is the transceiver's energy VAD (``level_dbfs`` + ``EnergyVad.update``), the
cheapest thing computed for every 20 ms inbound frame of every call. The machine's
``handle_frame`` runs on top of it for ``--agent realtime``: idle (silence, VAD on),
during a turn (speech, buffering), and a whole turn cycle (speech, end of turn, commit,
response created and its events drained).

    .venv/bin/python bench/realtime_machine.py
"""

from __future__ import annotations

import time

import numpy as np

from appliance.agents.vad import EnergyVad
from appliance.realtime.agent import id_source
from appliance.realtime.machine import RealtimeConnection

FRAME = 1920
N = 20_000


def _per_frame(fn: object, frames: list[bytes], flags: list[bool]) -> float:
    start = time.perf_counter()
    for pcm, speech in zip(frames, flags, strict=True):
        fn(pcm, speech)  # type: ignore[operator]
    return (time.perf_counter() - start) / len(frames) * 1e6


def main() -> None:
    rng = np.random.default_rng(1)
    loud = [bytes((rng.normal(0, 6000, 960)).astype("<i2").tobytes()) for _ in range(50)]
    quiet = bytes(FRAME)
    vad = EnergyVad()
    base = _per_frame(lambda pcm, _s: vad.update(pcm), [loud[i % 50] for i in range(N)],
                      [True] * N)

    def machine() -> RealtimeConnection:
        m = RealtimeConnection(session_id="sess_bench", ids=id_source("b"))
        m.handle_open()
        return m

    m = machine()
    idle = _per_frame(m.handle_frame, [quiet] * N, [False] * N)
    m = machine()
    turn = _per_frame(m.handle_frame, [loud[i % 50] for i in range(1500)], [True] * 1500)

    # Cycles: 1 s of speech, 0.6 s of silence (end of turn, commit, response.created...).
    m = machine()
    frames = ([loud[0]] * 50 + [quiet] * 30) * 100
    flags = ([True] * 50 + [False] * 30) * 100

    def step(pcm: bytes, speech: bool) -> None:
        m.handle_frame(pcm, speech)
        while m.poll_event() is not None:
            pass
        while (a := m.poll_action()) is not None:
            rid = getattr(getattr(a, "request", None), "response_id", None)
            if rid is not None:
                m.handle_response_end(rid)

    cycle = _per_frame(step, frames, flags)
    print(f"energy VAD per frame (baseline)     {base:7.2f} µs")
    for name, us in (("machine, idle (silence)", idle), ("machine, in a turn", turn),
                     ("machine, turn cycles + events", cycle)):
        print(f"{name:<36}{us:7.2f} µs   {us / base:5.2f}x the VAD")


if __name__ == "__main__":
    main()
