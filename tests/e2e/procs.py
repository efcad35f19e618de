"""Start real `appliance` role processes for end-to-end tests and stop them cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from ports import BOTH, TCP, free_port


def free_udp_port(host: str = "127.0.0.1") -> int:
    """A UDP port whose number is free for TCP too: ``up`` listens for ICE-TCP on its
    ``--udp`` port by default (tests/ports.py says how it is picked)."""
    return free_port(BOTH, host)


def free_tcp_port(host: str = "127.0.0.1") -> int:
    return free_port(TCP, host)


class Proc:
    """A role process; ``ready`` holds its first stdout line matching ``ready_prefix``.

    stderr is collected in a thread so the child never blocks on a full pipe; the test
    joins it at stop()."""

    def __init__(self, args: Sequence[str], ready_prefix: str, *, timeout: float = 30.0,
                 env: dict[str, str] | None = None, prefix: Sequence[str] = ()) -> None:
        self.args = list(args)
        self.proc = subprocess.Popen(  # prefix: e.g. ["ip", "netns", "exec", NAME]
            [*prefix, sys.executable, "-m", "appliance", *args], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={**os.environ, **(env or {})})
        self.stderr: list[str] = []
        self.stdout: list[str] = []
        self._err = threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr))
        self._err.start()
        ready = threading.Event()
        self.ready = ""

        def read_out() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.stdout.append(line)
                if not self.ready and line.startswith(ready_prefix):
                    self.ready = line.strip()
                    ready.set()
            ready.set()

        self._out = threading.Thread(target=read_out)
        self._out.start()
        if not ready.wait(timeout) or not self.ready:
            self.stop()
            raise RuntimeError(f"{args[0]} not ready: {''.join(self.stderr)[-2000:]}")

    @staticmethod
    def _drain(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._out.join(5)
        self._err.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return self.proc.returncode


def write_secret(directory: Path) -> Path:
    p = directory / "routing.secret"
    p.write_text(os.urandom(32).hex() + "\n")
    p.chmod(0o600)
    return p
