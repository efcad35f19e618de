"""Helpers for the security tests and ``bench/soak.py``: a real ``python -m appliance up`` as
a process (its whole process tree's log in one file), plain HTTP over raw sockets, and
/proc sampling of the tree."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from e2e.procs import free_udp_port
from ports import BOTH
from ports import free_port as _free_port

REPO = Path(__file__).resolve().parents[2]


def free_port(kind: int, host: str = "127.0.0.1") -> int:
    """Free for ``kind`` and for the other kind too (tests/ports.py says why)."""
    return _free_port(BOTH, host)


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@dataclass
class Up:
    """``python -m appliance up`` on loopback; stdout+stderr of the supervisor and of every
    child (children inherit its stderr) go to ``log``."""

    proc: subprocess.Popen[bytes]
    base: str
    udp: tuple[str, int]
    state_dir: Path
    log: Path
    argv: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, tmp: Path, *extra: str, ready_timeout: float = 40.0) -> Up:
        http_port = free_port(socket.SOCK_STREAM)
        udp_port = free_udp_port()
        state = tmp / "state"
        log = tmp / "appliance-up.log"
        argv = [sys.executable, "-m", "appliance", "up",
                "--http", f"127.0.0.1:{http_port}", "--udp", f"127.0.0.1:{udp_port}",
                "--public-address", "127.0.0.1", "--state-dir", str(state), *extra]
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                    start_new_session=True)
        up = cls(proc, f"http://127.0.0.1:{http_port}", ("127.0.0.1", udp_port), state, log, argv)
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"appliance up exited {proc.returncode}:\n{up.text()[-4000:]}")
            if "appliance ready:" in up.text() and http_status(up.base + "/readyz") == 200:
                return up
            if time.monotonic() > deadline:
                up.stop()
                raise RuntimeError(f"appliance up not ready in {ready_timeout} s:\n{up.text()[-4000:]}")
            time.sleep(0.1)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def pids(self) -> dict[str, int]:
        """The supervisor (which also runs signaling) and its live children, by role."""
        out = {"up": self.proc.pid}
        for pid in children(self.proc.pid):
            cmd = cmdline(pid)
            if not any(a == "appliance" or a.startswith("appliance.") for a in cmd):
                continue
            role = "?"
            if "--standby" in cmd:
                # A relay worker's warm standby (issue 20), idle until needed; since issue
                # 32 a fork template: the relay workers are its children.
                for worker in children(pid):
                    out["relay" if "relay" not in out else f"relay{worker}"] = worker
                continue
            if "transceiver" in cmd:
                role = f"transceiver{cmd[cmd.index('--id') + 1] if '--id' in cmd else pid}"
            elif "relay" in cmd or "appliance.relay.cli" in cmd:  # up runs the module
                role = f"relay{pid}" if any(k.startswith("relay") for k in out) else "relay"
            out[role] = pid
        return out

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        return self.proc.returncode


# -- /proc ----------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in _listdir(f"/proc/{pid}/task"):
        try:
            out += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return out


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def proc_sample(pid: int) -> dict[str, int] | None:
    """RSS (KiB), open fds and threads of one process; None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            fields[key] = int(value.split()[0])
    return {"rss_kib": fields.get("VmRSS", 0), "fds": fds, "threads": fields.get("Threads", 0)}


# -- raw HTTP ---------------------------------------------------------------------------------


def raw_request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                *, host: str = "127.0.0.1:80") -> bytes:
    hdrs = {"Host": host, "Connection": "close", "Content-Length": str(len(body)), **(headers or {})}
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
    return head.encode("latin-1") + b"\r\n" + body
