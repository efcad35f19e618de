"""``--dtls-versions``: from the command line, the config file or ``appliance up`` to the
DTLS server of every call, checked by handshaking with a real DTLS client through the
transceiver (the version it reports is the one the handshake negotiated, RFC 9147 §5.3)."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest
import trio
from transceiver.support import Client
from transceiver.test_opus_complexity import SECRETS, transceiver_config, up_config

from appliance.config import parse_dtls_versions, resolve
from appliance.control import control_request
from appliance.transceiver import cli
from appliance.transceiver.server import TransceiverAddresses, TransceiverConfig, serve_transceiver

BOTH = frozenset({"1.2", "1.3"})


@pytest.mark.parametrize(("value", "expected"), [
    ("1.2,1.3", BOTH), ("1.3, 1.2", BOTH), ("1.2", {"1.2"}), ("1.3", {"1.3"}),
    (["1.2", "1.3"], BOTH),  # a TOML list
])
def test_values_accepted(value: object, expected: set[str]) -> None:
    assert parse_dtls_versions(value) == expected


@pytest.mark.parametrize("bad", ["", "1.1", "1.2,1.0", "tls1.3", ",", 1.3, ["1.2", 3], None])
def test_bad_values_are_refused_with_the_option_named(bad: object) -> None:
    with pytest.raises(ValueError, match="--dtls-versions"):
        parse_dtls_versions(bad)


def test_default_is_both_and_flag_beats_file_beats_default() -> None:
    assert transceiver_config([], {}).dtls_versions == BOTH
    table = {"transceiver": {"dtls_versions": "1.2"}}
    assert transceiver_config([], table).dtls_versions == {"1.2"}
    assert transceiver_config([], {"dtls_versions": "1.3"}).dtls_versions == {"1.3"}  # shared
    assert transceiver_config(["--dtls-versions", "1.2,1.3"], table).dtls_versions == BOTH


def test_transceiver_cli_refuses_bad_versions(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "secret"
    secret.write_text("a" * 32 + "\n")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--secret-file", str(secret), "--dtls-versions", "1.1"])
    assert cli.run(args) == 2
    assert "--dtls-versions must be a comma list of 1.2 and 1.3, got '1.1'" in \
        capsys.readouterr().err


def test_up_passes_the_versions_to_every_transceiver(tmp_path: Path) -> None:
    assert "--dtls-versions" not in up_config(tmp_path, [], {})  # the transceiver's default
    argv = up_config(tmp_path, [], {"up": {"dtls_versions": ["1.3", "1.2"]}})
    assert argv[argv.index("--dtls-versions") + 1] == "1.2,1.3"
    argv = up_config(tmp_path, ["--dtls-versions", "1.2"], {"up": {"dtls_versions": "1.3"}})
    assert argv[argv.index("--dtls-versions") + 1] == "1.2"
    with pytest.raises(ValueError, match="--dtls-versions"):
        up_config(tmp_path, ["--dtls-versions", "2"], {})
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(argv[argv.index("transceiver") + 1 :])
    resolve(args, {}, "transceiver", cli.DEFAULTS)
    assert cli.build_config(args, SECRETS).dtls_versions == {"1.2"}


@pytest.mark.parametrize(("server", "client", "negotiated"), [
    (BOTH, BOTH, "1.3"),  # the default: 1.3 when both offer it
    (BOTH, frozenset({"1.2"}), "1.2"),  # a 1.2-only client (aiortc, OpenSSL 3.0)
    (frozenset({"1.2"}), BOTH, "1.2"),  # --dtls-versions 1.2
    (frozenset({"1.3"}), BOTH, "1.3"),
], ids=["both-both", "both-12client", "12server-both", "13server-both"])
async def test_calls_negotiate_within_the_setting(
    tmp_path: Path, relay_sock: socket.socket, server: frozenset[str], client: frozenset[str],
    negotiated: str,
) -> None:
    config = TransceiverConfig(id=3, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp_path / "t.sock"), dtls_versions=server)
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)
        assert addrs.control is not None
        peer = Client(relay_sock, addrs.udp, dtls_versions=client)
        resp = await control_request(addrs.control, {
            "op": "create", "session_id": "c1", "offer": peer.offer(),
            "candidates": [["198.51.100.1", 3478]]})
        assert resp["ok"], resp
        peer.start(resp["answer"], trio.current_time())
        with trio.fail_after(10):
            while peer.srtp is None:
                await peer.pump(trio.current_time())
                await trio.sleep(0.005)  # a poll interval: the loop checks the state
        assert peer.dtls is not None and peer.dtls.version == negotiated
        nursery.cancel_scope.cancel()
