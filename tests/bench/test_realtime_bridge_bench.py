"""Smoke test of bench/realtime_bridge_bench.py: it measures both legs of the bridge and the
plain-WebSocket baseline (no bound on the figures: the box is shared and noisy)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import trio


def test_bench_measures_both_legs_and_the_baseline() -> None:
    path = Path(__file__).resolve().parents[2] / "bench" / "realtime_bridge_bench.py"
    spec = importlib.util.spec_from_file_location("realtime_bridge_bench", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["realtime_bridge_bench"] = mod
    spec.loader.exec_module(mod)
    out = trio.run(mod.bench, 10)
    assert {k: len(v) for k, v in out.items()} == {"up": 10, "down": 10, "up_base": 10,
                                                   "down_base": 10}
    assert all(x > 0 for v in out.values() for x in v)
