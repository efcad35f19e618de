"""One builder of a relay worker's argv (appliance/relay/argv.py), for both parents: the
M-worker relay and ``appliance up``. What it writes parses back to the same worker config."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest
from relay.support import SECRET

from appliance.config import resolve
from appliance.relay import cli
from appliance.relay.argv import relay_argv
from appliance.relay.server import RelayConfig
from appliance.supervisor import DEFAULTS as UP_DEFAULTS
from appliance.supervisor import add_arguments as add_up_arguments
from appliance.supervisor import build_up_config, child_specs


def _parse(argv: list[str]) -> tuple[argparse.Namespace, RelayConfig]:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(argv)
    resolve(args, {}, "relay", cli.DEFAULTS)
    return args, cli.build_config(args)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "routing.secret"
    path.write_bytes(SECRET + b"\n")
    return path


def _same_but_worker(a: RelayConfig, b: RelayConfig) -> dict[str, Any]:
    """Fields that differ, other than those that name the worker."""
    skip = {"worker", "relay_id", "control", "listen"}
    return {f.name: (getattr(a, f.name), getattr(b, f.name))
            for f in dataclasses.fields(RelayConfig)
            if f.name not in skip and getattr(a, f.name) != getattr(b, f.name)}


@pytest.mark.parametrize("flags", [
    [],
    ["--cluster", "3", "--internal", "127.0.0.1:5000", "--flow-timeout", "12.5",
     "--max-flows", "77", "--new-flow-rate", "3.25", "--next-hop", "1=10.0.0.2:3479",
     "--transceiver", "0=127.0.0.1:4000", "--transceiver", "5=[::1]:4005",
     "--redis", "redis://127.0.0.1:1/0", "--io", "python", "--coalesce-us", "7.5"],
    ["--transceiver-pattern", "t-{id}.svc:4000", "--transceivers", "4",
     "--resolve-interval", "0.5", "--io", "mmsg", "--coalesce-us", "0"],
])
def test_worker_argv_round_trips_the_parent_config(secret_file: Path, flags: list[str]) -> None:
    args, parent = _parse(["--secret-file", str(secret_file), "--workers", "2",
                           "--listen", "127.0.0.1:0", "--pin", *flags])
    argv = cli._child_argv(args, parent, 1, [("127.0.0.1", 40000)], "/tmp/w1.sock")
    assert argv[1:3] == ["-m", "appliance.relay.cli"]
    child_args, child = _parse(argv[3:])
    assert _same_but_worker(parent, child) == {}
    assert child.worker == 1 and child.control == "/tmp/w1.sock"
    assert child.listen == (("127.0.0.1", 40000),)  # the port the first worker bound
    assert child_args.workers == 1 and child_args.pin


def test_up_builds_its_relay_workers_with_the_same_builder(tmp_path: Path,
                                                           secret_file: Path) -> None:
    parser = argparse.ArgumentParser()
    add_up_arguments(parser)
    args = parser.parse_args(["--state-dir", str(tmp_path / "state"), "--udp", "0.0.0.0:3478",
                              "--relay-workers", "2", "--redis", "redis://127.0.0.1:1/0"])
    resolve(args, {}, "up", UP_DEFAULTS)
    cfg = build_up_config(args)
    transceivers, relays = child_specs(cfg, secret_file, tmp_path)
    assert len(relays) == 2
    # The relay's own module (issue 20: a quarter of the full CLI's start-up time).
    command = [sys.executable, "-m", "appliance.relay.cli"]
    for spec in relays:
        assert spec.standby  # a warm standby per worker
        assert spec.argv[: len(command)] == command
        _, config = _parse(spec.argv[len(command) :])
        assert config.listen == (("0.0.0.0", 3478),) and config.tcp == config.listen
        assert config.control == spec.control and config.redis_url == cfg.redis
        assert sorted(config.transceivers) == list(range(len(transceivers)))
    assert relays[0].argv == relay_argv(
        command, listen=[cfg.udp], secret_file=str(secret_file),
        control=relays[0].control, redis=cfg.redis, log_level=cfg.log_level,
        log_format=cfg.log_format, tcp=[cfg.udp],  # ICE-TCP on the UDP port by default
        transceivers={int(t.key): ("127.0.0.1", int(t.argv[t.argv.index("--listen") + 1]
                                                    .rsplit(":", 1)[1]))
                      for t in transceivers})


def test_only_given_settings_are_written() -> None:
    argv = relay_argv(["relay"], listen=[("::", 3478)], secret_file="s", workers=None)
    assert argv == ["relay", "--listen", "[::]:3478", "--secret-file", "s"]
