"""``appliance relay`` flags, config file, and M worker processes (real subprocesses)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from relay.support import RTP, SECRET, check, open_client, open_transceiver, ufrag

from appliance.config import load_config, resolve
from appliance.control import ControlError, control_request
from appliance.relay import cli


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "routing.secret"
    path.write_bytes(SECRET + b"\n")
    return path


def test_flags_and_config_file(tmp_path: Path, secret_file: Path) -> None:
    conf = tmp_path / "appliance.toml"
    conf.write_text(
        f'secret_file = "{secret_file}"\ncluster = 3\n'
        '[relay]\nlisten = "127.0.0.1:5000"\n'
        'transceivers = { 0 = "127.0.0.1:4000", 1 = "127.0.0.1:4001" }\n'
        'next_hops = { 7 = "10.0.0.7:3479" }\nflow_timeout = 12\n'
    )
    args = _parse(["--config", str(conf), "--max-flows", "9", "--listen", "[::1]:5001"])
    resolve(args, load_config(args.config), "relay", cli.DEFAULTS)
    config = cli.build_config(args)
    assert config.listen == (("::1", 5001),)  # the flag wins over the file
    assert config.transceivers == {0: ("127.0.0.1", 4000), 1: ("127.0.0.1", 4001)}
    assert config.next_hops == {7: ("10.0.0.7", 3479)}
    assert config.cluster == 3 and config.flow_timeout == 12.0 and config.max_flows == 9
    assert config.internal == ("127.0.0.1", 0)
    assert config.secrets == (SECRET,)

    args = _parse(["--secret-file", str(secret_file), "--transceiver", "0=127.0.0.1:4000",
                   "--transceiver", "5=localhost:4005", "--next-hop", "2=127.0.0.2:3000"])
    resolve(args, {}, "relay", cli.DEFAULTS)
    config = cli.build_config(args)
    assert config.transceivers == {0: ("127.0.0.1", 4000), 5: ("localhost", 4005)}
    assert config.next_hops == {2: ("127.0.0.2", 3000)}
    assert config.listen == (("0.0.0.0", 3478),)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--secret-file is required"),
        (["--secret-file", "/nonexistent/secret"], "cannot read secret file"),
        (["--transceiver", "zero=127.0.0.1:1"], "--transceiver id 'zero'"),
        (["--transceiver", "127.0.0.1:1"], "expected ID=HOST:PORT"),
        (["--next-hop", "1=nohost"], "--next-hop 1"),
        (["--flow-timeout", "0"], "--flow-timeout must be > 0"),
    ],
)
def test_usage_errors(
    argv: list[str], message: str, secret_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if argv and argv[0] != "--secret-file":
        argv = ["--secret-file", str(secret_file), *argv]
    assert cli.run(_parse(argv)) == 2
    assert message in capsys.readouterr().err


async def _ready_line(stdout: trio.abc.ReceiveStream) -> str:
    buf = b""
    with trio.fail_after(20):
        while b"\n" not in buf:
            chunk = await stdout.receive_some(4096)
            assert chunk, "relay exited before it was ready"
            buf += chunk
    return buf.split(b"\n", 1)[0].decode()


async def _stats(path: str) -> dict[str, Any]:
    return await control_request(path, {"op": "stats"})


@pytest.mark.usefixtures("close_sockets")
async def test_two_worker_processes(
    nursery: trio.Nursery, secret_file: Path, tmp_path: Path, io: str
) -> None:
    t = await open_transceiver(nursery)
    control = str(tmp_path / "relay.sock")
    argv = [sys.executable, "-m", "appliance.relay.cli", "--listen", "127.0.0.1:0",
            "--workers", "2", "--transceiver", f"0={t.address[0]}:{t.address[1]}",
            "--secret-file", str(secret_file), "--control", control, "--log-level", "warning",
            "--io", io]
    proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await _ready_line(proc.stdout)
        assert line.startswith("relay listening on 127.0.0.1:")
        public_text, internal_text = line[len("relay listening on "):].split(" internal ")
        public = ("127.0.0.1", int(public_text.rsplit(":", 1)[1]))
        assert len(internal_text.split(",")) == 2

        # Enough clients that both workers get some (SO_REUSEPORT hashes the 4-tuple).
        clients = [await open_client(public) for _ in range(24)]
        for c in clients:
            await c.send(check(ufrag()))
            await c.recv()
        for c in clients:
            await c.send(RTP)
            assert await c.recv() == (RTP, public)
        stats = await _stats(control)
        assert stats["ok"] and stats["flows"] == 24
        assert stats["io"] == io and all(w["io"] == io for w in stats["workers"])
        assert stats["counters"]["flows_created"] == 24
        workers = stats["workers"]
        assert sorted(w["worker"] for w in workers) == [0, 1]
        assert all(w["flows"] > 0 for w in workers)
        internals = {r.src for r in t.got}
        assert len(internals) == 2  # each worker has its own internal socket

        # A worker that dies is restarted (with backoff) on the same public port.
        old_pid = next(w["pid"] for w in workers if w["worker"] == 1)
        os.kill(old_pid, signal.SIGKILL)

        async def restarted() -> bool:
            try:
                s = await _stats(control)
            except ControlError:  # pragma: no cover - the supervisor itself answers
                return False
            w1 = next(w for w in s["workers"] if w.get("worker") == 1)
            return bool(w1.get("ok")) and w1.get("pid") != old_pid

        with trio.fail_after(15):
            while not await restarted():  # noqa: ASYNC110 - polls another process
                await trio.sleep(0.05)
        # New flows work through whichever worker the kernel picks.
        more = [await open_client(public) for _ in range(8)]
        for c in more:
            await c.send(check(ufrag()))
            await c.recv()

        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            await proc.wait()
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if proc.stdout is not None:
            await proc.stdout.aclose()


@pytest.mark.parametrize("kind", ["udp", "tcp"])
def test_a_port_in_use_is_one_line_naming_it(
    kind: str, secret_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bind that fails inside the worker's nursery is reported as one line with the
    address (the kernel's error names none), exit 1, no traceback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        if kind == "tcp":
            busy.listen(1)
        port = busy.getsockname()[1]
        if kind == "udp":
            argv = ["--listen", f"127.0.0.1:{port}"]
        else:  # UDP on a free port, TCP on the busy one
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind(("127.0.0.1", 0))
                free = s.getsockname()[1]
            argv = ["--listen", f"127.0.0.1:{free}", "--tcp", f"127.0.0.1:{port}"]
        # --nice 0: in-process, the worker would raise this test process's priority
        argv = ["--secret-file", str(secret_file), "--transceiver", "0=127.0.0.1:9",
                "--nice", "0", *argv]
        assert cli.run(_parse(argv)) == 1
    err = capsys.readouterr().err
    what = "cannot bind UDP" if kind == "udp" else "cannot listen on TCP"
    assert f"appliance relay: {what} 127.0.0.1:{port}" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
