"""``--opus-complexity``: from the command line, the config file or ``appliance up`` to the
libopus encoder of every PCM session — checked with ``OPUS_GET_COMPLEXITY`` on the real
encoder, not on a Python attribute that could say one thing while libopus does another."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest
import trio
from transceiver.support import Client

from appliance.config import parse_opus_complexity, resolve
from appliance.control import control_request
from appliance.supervisor import DEFAULTS as UP_DEFAULTS
from appliance.supervisor import add_arguments as add_up_arguments
from appliance.supervisor import build_up_config, child_specs
from appliance.transceiver import cli
from appliance.transceiver.opus import DEFAULT_COMPLEXITY, _LibOpusEncoder
from appliance.transceiver.server import TransceiverAddresses, TransceiverConfig, serve_transceiver

SECRETS = (b"routing-secret-for-tests-0123456",)


@pytest.mark.parametrize("complexity", [0, 3, 10])
def test_encoder_is_created_with_the_complexity_asked_for(complexity: int) -> None:
    enc = _LibOpusEncoder(complexity=complexity)
    assert enc.complexity == complexity
    assert enc.encode(bytes(1920))  # and still encodes


def test_default_encoder_complexity_is_the_documented_default() -> None:
    assert _LibOpusEncoder().complexity == DEFAULT_COMPLEXITY


@pytest.mark.parametrize("bad", ["11", "-1", "three", 2.5, True, "", None])
def test_bad_values_are_refused_with_the_option_named(bad: object) -> None:
    with pytest.raises(ValueError, match="--opus-complexity"):
        parse_opus_complexity(bad)


def transceiver_config(argv: list[str], config: dict[str, object]) -> TransceiverConfig:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(argv)
    resolve(args, config, "transceiver", cli.DEFAULTS)
    return cli.build_config(args, SECRETS)


def test_transceiver_flag_overrides_config_file_which_overrides_the_default() -> None:
    assert transceiver_config([], {}).opus_complexity == DEFAULT_COMPLEXITY
    table = {"transceiver": {"opus_complexity": 7}}
    assert transceiver_config([], table).opus_complexity == 7
    assert transceiver_config([], {"opus_complexity": 1}).opus_complexity == 1  # shared key
    assert transceiver_config(["--opus-complexity", "2"], table).opus_complexity == 2
    with pytest.raises(ValueError, match="0..10"):
        transceiver_config(["--opus-complexity", "12"], {})


def test_transceiver_cli_refuses_a_bad_complexity(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "secret"
    secret.write_text("a" * 32 + "\n")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--secret-file", str(secret), "--opus-complexity", "42"])
    assert cli.run(args) == 2
    assert "--opus-complexity must be 0..10, got 42" in capsys.readouterr().err


def up_config(tmp_path: Path, argv: list[str], config: dict[str, object]) -> list[str]:
    """The argv ``appliance up`` gives its first transceiver."""
    parser = argparse.ArgumentParser()
    add_up_arguments(parser)
    args = parser.parse_args(["--state-dir", str(tmp_path / "state"), *argv])
    resolve(args, config, "up", UP_DEFAULTS)
    cfg = build_up_config(args)
    transceivers, _ = child_specs(cfg, tmp_path / "secret", tmp_path)
    return transceivers[0].argv


def test_up_passes_the_complexity_to_every_transceiver(tmp_path: Path) -> None:
    # Not set: the transceivers keep their own default (no flag passed).
    assert "--opus-complexity" not in up_config(tmp_path, [], {})
    argv = up_config(tmp_path, [], {"up": {"opus_complexity": 3}})
    assert argv[argv.index("--opus-complexity") + 1] == "3"
    argv = up_config(tmp_path, ["--opus-complexity", "8"], {"up": {"opus_complexity": 3}})
    assert argv[argv.index("--opus-complexity") + 1] == "8"
    with pytest.raises(ValueError, match="--opus-complexity"):
        up_config(tmp_path, ["--opus-complexity", "x"], {})
    # And what up passes is what the transceiver's own parser takes.
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(argv[argv.index("transceiver") + 1 :])
    resolve(args, {}, "transceiver", cli.DEFAULTS)
    assert cli.build_config(args, SECRETS).opus_complexity == 8


async def test_sessions_of_a_transceiver_encode_at_its_complexity(
    tmp_path: Path, relay_sock: socket.socket
) -> None:
    complexity = 2 if DEFAULT_COMPLEXITY != 2 else 4  # anything but the default
    config = TransceiverConfig(id=3, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp_path / "t.sock"), opus_complexity=complexity)
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)
        assert addrs.control is not None and addrs.transceiver is not None
        client = Client(relay_sock, addrs.udp)
        resp = await control_request(addrs.control, {
            "op": "create", "session_id": "c1", "offer": client.offer(),
            "candidates": [["198.51.100.1", 3478]]})
        assert resp["ok"], resp
        session = addrs.transceiver.calls["c1"]
        assert isinstance(session.encoder, _LibOpusEncoder)
        assert session.encoder.complexity == complexity
        nursery.cancel_scope.cancel()
