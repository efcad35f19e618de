"""Smoke test of bench/turn_core.py (issue 40 item 7, the in-process part): it runs on tiny
settings and prints every figure (their values are not asserted: the box is shared)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "turn_core.py"


def test_turn_core_bench_runs() -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--packets", "200", "--allocations", "20"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    for label in ("direct", "turn-in", "turn-out own", "Data indication", "allocations/s"):
        assert label in out.stdout, out.stdout
