"""Smoke test of bench/turn_latency.py (issue 38 item 1): one aiortc call through a real
``appliance up --agent assistant`` says one phrase and the caller times the reply. Only that
a turn was measured is asserted, never its figure: the box is shared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from speech.speech_support import have_espeak

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not have_espeak(), reason="espeak-ng is not installed")]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "turn_latency.py"


def test_turn_latency_bench_measures_a_turn() -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--calls", "1", "--turns", "1",
                          "--warmup", "0", "--baseline", "", "--timeout", "120", "--json"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    [spec] = result["specs"]
    assert spec["spec"] == "assistant"
    row = spec["configs"]["1"]
    assert (row["turns"], row["measured"], row["misses"]) == (1, 1, 0), row
    [turn] = row["turn_list"]
    assert turn["latency_ms"] > 0 and not turn["early"], turn
