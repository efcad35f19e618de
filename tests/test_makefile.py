"""The Makefile's two commands as a newcomer meets them: `make up` after `make test` does not
install again (issue 22), and `make sysdeps` agrees with the suite on the oldest Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from peers import CHROMIUM_MIN

REPO = Path(__file__).resolve().parent.parent


def make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-C", str(REPO), "--no-print-directory", *args],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_up_after_make_test_does_not_reinstall(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "pip.log"
    # A venv whose pip only records that it was called: the Makefile's own rules run for real.
    for tool in ("python", "pip"):
        stub = venv / "bin" / tool
        stub.write_text(f"#!/bin/sh\necho {tool} \"$@\" >> {log}\n")
        stub.chmod(0o755)
    r = make("install-test", f"VENV={venv}")
    assert r.returncode == 0, r.stderr
    # The project once (with its test extra); openai-agents goes into a directory of its own
    # (--target: its package `agents` would shadow tests/agents/ in the venv).
    assert log.read_text().count("pip install -q -e") == 1
    assert log.read_text().count("pip install") == 2
    # `make up` = install + run: with the test install done, nothing is left to install.
    r = make("-n", "up", f"VENV={venv}")
    assert r.returncode == 0, r.stderr
    assert "pip" not in r.stdout, r.stdout
    assert r.stdout.strip().endswith("bin/appliance up"), r.stdout


def test_sysdeps_minimum_chromium_is_the_suites() -> None:
    m = re.search(r"^CHROMIUM_MIN\s*:?=\s*(\d+)$", (REPO / "Makefile").read_text(), re.M)
    assert m is not None
    assert int(m.group(1)) == CHROMIUM_MIN
