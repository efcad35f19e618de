"""The examples' shared fixture: examples/ws_agent.py running as the standalone process a
user starts, with its ``ws://`` URL."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def ws_agent() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "ws_agent.py"), "--port", "0", "--rate", "16000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on ws://"), line + (proc.stderr.read()
                                                             if proc.stderr else "")
        yield line.split()[-1], proc
    finally:
        proc.kill()
        proc.wait()
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
