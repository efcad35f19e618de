"""Issue 9 item 3, short: ``bench/soak.py`` with 20 calls held for 30 s (plus churn rounds
of short calls) through a real ``appliance up``: zero failed calls, and after warm-up no
process of the appliance grows by more than 20 MiB RSS or 8 fds (idle fds before and after
the load equal within that bound). The full run is in docs/reliability.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"

pytestmark = pytest.mark.slow


async def test_soak_short(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    with trio.fail_after(240):
        proc = await trio.run_process(
            [sys.executable, str(SOAK), "--calls", "20", "--minutes", "0.5", "--warmup", "5",
             "--sample", "2", "--churn-calls", "4", "--churn-seconds", "8",
             "--max-rss-growth-mib", "20", "--max-fd-growth", "8", "--json", str(out)],
            capture_stdout=True, stderr=subprocess.STDOUT, check=False)
    assert out.exists(), proc.stdout.decode()[-4000:]
    report = json.loads(out.read_text())
    assert report["calls"]["main"]["failed"] == 0, report["calls"]
    assert report["calls"]["main"]["completed"] == 20
    assert report["calls"]["churn_failed"] == 0 and report["calls"]["churn_rounds"] >= 1
    growth = report["growth_after_warmup"]
    assert {"up", "relay", "transceiver0", "transceiver1"} <= set(growth)
    for role, g in growth.items():
        assert g["rss_kib"]["growth"] <= 20 * 1024, (role, g)
        assert g["fds"]["growth"] <= 8 and g["idle_fd_delta"] <= 8, (role, g)
    assert report["ok"], report["problems"]
    assert proc.returncode == 0
