"""Smoke test of bench/live_bench.py: one turn on each surface, both measured (no bound on
the figures: the box is shared and noisy; the ratios are the bench's to print)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import trio

pytest.importorskip("websockets")


def test_the_bench_measures_both_surfaces() -> None:
    path = Path(__file__).resolve().parents[2] / "bench" / "live_bench.py"
    spec = importlib.util.spec_from_file_location("live_bench", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["live_bench"] = mod
    spec.loader.exec_module(mod)
    out = trio.run(mod.bench, 1)
    assert {k: len(v) for k, v in out.items()} == {
        "live_setup": 1, "live_start": 1, "realtime_setup": 1, "live_audio": 1,
        "realtime_audio": 1}
    assert all(x > 0 for v in out.values() for x in v)
    mod.report(out)
