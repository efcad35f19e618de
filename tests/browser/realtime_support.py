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
import shutil
import struct
import subprocess
import threading
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser.helpers import running_appliance_up

BUNDLE_DIR = Path(__file__).with_name("realtime_client")
BUNDLE = BUNDLE_DIR / "dist" / "agents-realtime.js"
PAGES = Path(__file__).with_name("realtime_pages")
READY_TIMEOUT = 45.0


@contextlib.contextmanager
def appliance_up(tmp_path: Path, *extra: str, name: str = "realtime") -> Iterator[str]:
    """``appliance up`` with one transceiver and ``extra`` flags (helpers.running_appliance_up)."""
    with running_appliance_up(tmp_path, "--transceivers", "1", *extra, name=name,
                              ready_timeout=READY_TIMEOUT) as base:
        yield base


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
