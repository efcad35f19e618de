"""``appliance signaling`` flags, the default media address, the self-signed certificate."""

from __future__ import annotations

import argparse
import ipaddress
import socket
import stat
from pathlib import Path

import pytest
from cryptography import x509

from appliance.config import resolve
from appliance.signaling.cli import DEFAULTS, add_arguments, build_config
from appliance.signaling.server import (
    check_public_address,
    default_public_addresses,
    default_route_address,
    ensure_api_token,
)
from appliance.signaling.state import SignalingConfig
from appliance.signaling.tls import ensure_self_signed


def parse(argv: list[str], config: dict[str, object] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv)
    resolve(args, config or {}, "signaling", DEFAULTS)
    return args


def test_flags_build_the_config(tmp_path: Path) -> None:
    cfg, fp = build_config(parse([
        "--http", "0.0.0.0:8443", "--transceiver-control", "0=/run/t0.sock",
        "--transceiver-control", "1=10.0.0.2:7001", "--relay-control", "/run/r0.sock",
        "--public-address", "198.51.100.1", "--public-address", "[2001:db8::1]",
        "--udp-port", "3479", "--api-token", "tok",
    ]))
    assert cfg.http == ("0.0.0.0", 8443)
    assert dict(cfg.transceivers) == {0: "/run/t0.sock", 1: "10.0.0.2:7001"}
    assert dict(cfg.relays) == {"0": "/run/r0.sock"}
    assert cfg.public_addresses == ["198.51.100.1", "2001:db8::1"]
    assert cfg.udp_port == 3479
    assert cfg.api_token == "tok"
    assert cfg.requires_auth()
    assert fp is None


def test_config_file_tables_are_accepted(tmp_path: Path) -> None:
    toml = {"signaling": {"transceiver_control": {"0": "/a.sock", "3": "/b.sock"},
                          "relay_control": ["w1=/r1.sock"], "public_address": ["192.0.2.1"]}}
    cfg, _ = build_config(parse([], toml))
    assert dict(cfg.transceivers) == {0: "/a.sock", 3: "/b.sock"}
    assert dict(cfg.relays) == {"w1": "/r1.sock"}
    assert cfg.http == ("127.0.0.1", 8080) and not cfg.requires_auth()


@pytest.mark.parametrize("argv", [
    ["--transceiver-control", "/no-key.sock"],
    ["--transceiver-control", "x=/a.sock"],
    ["--public-address", "example.com"],
    ["--public-address", "0.0.0.0"],
    ["--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"],
    ["--tls-cert", "/nonexistent.pem"],
    ["--udp-port", "0"],
])
def test_bad_flags_are_value_errors(argv: list[str]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each message is checked by hand in run()
        build_config(parse(argv))


def test_generated_api_token_only_off_loopback() -> None:
    assert ensure_api_token(SignalingConfig(http=("127.0.0.1", 1))) is None
    public = SignalingConfig(http=("0.0.0.0", 1))
    token = ensure_api_token(public)
    assert token and public.api_token == token and len(token) >= 32
    assert ensure_api_token(SignalingConfig(http=("0.0.0.0", 1), api_token="x")) is None


def test_default_media_address_is_a_real_address() -> None:
    addr = default_route_address(socket.AF_INET)
    assert addr is None or not ipaddress.ip_address(addr).is_unspecified
    (default,) = default_public_addresses()
    assert check_public_address(default) == default


def test_self_signed_certificate_is_made_once_and_kept_private(tmp_path: Path) -> None:
    cert, key, fp = ensure_self_signed(tmp_path, ["192.0.2.10", "media.example"])
    assert stat.S_IMODE(Path(key).stat().st_mode) == 0o600
    parsed = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    san = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("192.0.2.10") in san.get_values_for_type(x509.IPAddress)
    assert "media.example" in san.get_values_for_type(x509.DNSName)
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    # Reused while it covers the same names: a browser exception keeps working.
    assert ensure_self_signed(tmp_path, ["192.0.2.10"])[2] == fp
    # A new name needs a new certificate.
    assert ensure_self_signed(tmp_path, ["192.0.2.99"])[2] != fp


def test_tls_self_signed_flag(tmp_path: Path) -> None:
    cfg, fp = build_config(parse(["--tls", "self-signed", "--state-dir", str(tmp_path)]))
    assert cfg.tls_cert and cfg.tls_key and fp
    assert Path(cfg.tls_cert).parent == tmp_path
