"""Smoke test of bench/ice_tcp.py (issue 18 #7): it runs end to end on tiny settings and
reports both transports' figures (their values are not asserted: the box is shared)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "ice_tcp.py"


def test_ice_tcp_bench_runs() -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--setups", "1", "--calls", "2",
                          "--duration", "0.5", "--json"], capture_output=True, text=True,
                         timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for transport in ("udp", "tcp"):
        r = result[transport]
        assert r["rtt_samples"] > 0 and r["relay_frames"] > 0, r
        assert r["setup_ms_median"] > 0 and r["relay_us_per_frame"] > 0, r
    assert result["tcp_over_udp_cpu_per_frame"] > 0
