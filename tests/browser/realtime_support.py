"""What the OpenAI-Realtime client tests share (tests/browser/test_realtime_*.py):

* :func:`appliance_up` — a real ``appliance up`` on ephemeral ports with extra flags
  (``--realtime-agent``), its log kept in ``test-artifacts/``;
* :class:`PageServer` — the client pages and the bundled ``@openai/agents-realtime`` served
  from **another origin** than the appliance (another port), so every request the clients
  make is a real cross-origin one and CORS is exercised as on a customer's site;
* :func:`agents_realtime_bundle` — tests/browser/realtime_client/build.sh (npm ci + esbuild,
  cached; it does nothing when the bundle is newer than the lockfile);
* :func:`speech_wav` — the fake microphone's input: a tone burst then silence, looped by
  Chromium, so a server VAD sees a turn start *and* end.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser.helpers import ARTIFACTS, REPO

BUNDLE_DIR = Path(__file__).with_name("realtime_client")
BUNDLE = BUNDLE_DIR / "dist" / "agents-realtime.js"
PAGES = Path(__file__).with_name("realtime_pages")
READY_TIMEOUT = 45.0


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@contextlib.contextmanager
def appliance_up(tmp_path: Path, *extra: str, name: str = "realtime") -> Iterator[str]:
    """``appliance up`` with ``extra`` flags; yields its base URL once /readyz is 200."""
    http_port = free_port(socket.SOCK_STREAM)
    udp_port = free_port(socket.SOCK_DGRAM)
    base = f"http://127.0.0.1:{http_port}"
    log_path = tmp_path / f"appliance-up-{name}.log"
    cmd = [sys.executable, "-m", "appliance", "up", "--http", f"127.0.0.1:{http_port}",
           "--udp", f"127.0.0.1:{udp_port}", "--state-dir", str(tmp_path / f"state-{name}"),
           "--transceivers", "1", *extra]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while not (base in log_path.read_text() and http_status(base + "/readyz") == 200):
            if proc.poll() is not None:
                pytest.fail(f"`{' '.join(cmd[2:])}` exited with {proc.returncode}:\n"
                            f"{log_path.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"`appliance up` not ready in {READY_TIMEOUT:.0f} s:\n"
                            f"{log_path.read_text()[-4000:]}")
            time.sleep(0.1)  # a poll interval: readiness is checked, not assumed
        yield base
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / f"e2e-appliance-up-{name}.log").write_text(log_path.read_text())


@functools.cache
def agents_realtime_bundle() -> Path:
    """The bundled official SDK (built once per machine, then cached on disk)."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not installed: `make sysdeps` installs them")
    r = subprocess.run(["sh", str(BUNDLE_DIR / "build.sh")], capture_output=True, text=True,
                       timeout=600, check=False)
    if r.returncode != 0 or not BUNDLE.is_file():
        pytest.fail(f"bundling @openai/agents-realtime failed ({r.returncode}):\n"
                    f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return BUNDLE


def sdk_version() -> str:
    import json

    pkg = BUNDLE_DIR / "node_modules" / "@openai" / "agents-realtime" / "package.json"
    return str(json.loads(pkg.read_text())["version"])


class PageServer:
    """Static files on 127.0.0.1:<ephemeral>: the pages and the SDK bundle."""

    def __init__(self) -> None:
        files = {p.name: p for p in PAGES.iterdir() if p.is_file()}
        files["agents-realtime.js"] = agents_realtime_bundle()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                path = files.get(self.path.lstrip("/").split("?")[0])
                if path is None:
                    self.send_error(404)
                    return
                body = path.read_bytes()
                kind = "text/html" if path.suffix == ".html" else "text/javascript"
                self.send_response(200)
                self.send_header("Content-Type", f"{kind}; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> PageServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def speech_wav(path: Path, *, speech: float = 1.2, silence: float = 2.8, rate: int = 48000) -> Path:
    """A 440 Hz burst at -6 dBFS (with 10 ms ramps, no clicks) then silence; Chromium's fake
    capture device loops the file, so the microphone "speaks" every speech+silence s."""
    n_on, n_off = int(speech * rate), int(silence * rate)
    ramp = int(0.01 * rate)
    amp = 0.5 * 32767
    samples = []
    for i in range(n_on):
        env = min(1.0, i / ramp, (n_on - 1 - i) / ramp)
        samples.append(int(amp * env * math.sin(2 * math.pi * 440.0 * i / rate)))
    samples.extend([0] * n_off)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(struct.pack(f"<{len(samples)}h", *samples))
    return path
