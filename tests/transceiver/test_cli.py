"""``appliance transceiver`` as a process: ready line, control socket, clean SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import trio

from appliance.control import control_request

RUN = ("import argparse, sys; from appliance.transceiver import cli; p = argparse.ArgumentParser();"
       " cli.add_arguments(p); sys.exit(cli.run(p.parse_args(sys.argv[1:])))")


async def test_process_prints_ready_line_and_stops_on_sigterm(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("a" * 32 + "\n")
    ctl = tmp_path / "t7.sock"
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-c", RUN, "--id", "7", "--listen", "127.0.0.1:0",
         "--control", str(ctl), "--secret-file", str(secret)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        with trio.fail_after(20):
            line = b""
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                assert chunk, "process exited before it was ready"
                line += chunk
        text = line.decode()
        assert text.startswith("transceiver 7 listening on 127.0.0.1:")
        assert text.rstrip().endswith(f"control {ctl}")
        stats = await control_request(str(ctl), {"op": "stats"})
        assert stats["ok"] and stats["transceiver"] == 7
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(5):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                await stream.aclose()


def test_missing_secret_file_is_a_usage_error(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", RUN, "--id", "1"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "--secret-file is required" in r.stderr
    r = subprocess.run([sys.executable, "-c", RUN, "--secret-file", str(tmp_path / "none")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_a_port_in_use_is_one_line_naming_it(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("0" * 64 + "\n")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-c", RUN, "--secret-file", str(secret),
                            "--listen", f"127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"appliance transceiver: cannot bind UDP 127.0.0.1:{port}: " in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
