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
from appliance.priority import MEDIA_NICE
from appliance.relay import cli
from appliance.relay.argv import relay_argv
from appliance.relay.server import RelayConfig
from appliance.relay.tls import TurnTls
from appliance.signaling.tls import ensure_self_signed
from appliance.supervisor import DEFAULTS as UP_DEFAULTS
from appliance.supervisor import add_arguments as add_up_arguments
from appliance.supervisor import build_up_config, child_specs, turn_advert, turn_media


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
    ["--turn", "--turn-realm", "example", "--media-address", "203.0.113.1:0",
     "--turn-relay-ip", "203.0.113.1", "--turn-peer", "10.0.0.0/8", "--turn-peer", "::1",
     "--turn-max-allocations", "50", "--turn-allocations-per-ip", "3",
     "--turn-allocations-per-user", "2", "--turn-max-lifetime", "900"],
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
    for w, spec in enumerate(relays):
        assert spec.standby  # a warm standby per worker
        assert spec.argv[: len(command)] == command
        _, config = _parse(spec.argv[len(command) :])
        assert config.worker == w  # its own TURN allocations' file / keys, its own relay id
        assert config.listen == (("0.0.0.0", 3478),) and config.tcp == config.listen
        assert config.control == spec.control and config.redis_url == cfg.redis
        assert sorted(config.transceivers) == list(range(len(transceivers)))
    assert relays[0].argv == relay_argv(
        command, worker_index=0, listen=[cfg.udp], secret_file=str(secret_file),
        control=relays[0].control, redis=cfg.redis, log_level=cfg.log_level,
        log_format=cfg.log_format, nice=MEDIA_NICE,  # appliance/priority.py
        tcp=[cfg.udp],  # ICE-TCP on the UDP port by default
        # TURN on by default, relaying to the public address (the default route's; off on
        # a host without one of the --udp address's family)
        turn=bool(turn_media(cfg)), media_addresses=turn_media(cfg),
        turn_relay_ips=[a for a, _ in turn_media(cfg)],
        # the relays' private directory, with Redis too: the keeper of each worker's TCP
        # connections is named from it (relay/keeper.py)
        turn_state_dir=str(cfg.state_dir / "relay"),
        transceivers={int(t.key): ("127.0.0.1", int(t.argv[t.argv.index("--listen") + 1]
                                                    .rsplit(":", 1)[1]))
                      for t in transceivers})


def test_turn_secrets_travel_as_a_file_never_on_the_command_line(
        tmp_path: Path, secret_file: Path) -> None:
    turn_file = tmp_path / "turn.secret"
    turn_file.write_bytes(b"# coturn's static-auth-secret\nnot-a-flag-value\n")
    args, parent = _parse(["--secret-file", str(secret_file), "--workers", "2",
                           "--turn", "--turn-secret-file", str(turn_file),
                           "--listen", "127.0.0.1:3478"])
    assert parent.turn is not None and parent.turn.secrets == (b"not-a-flag-value",)
    argv = cli._child_argv(args, parent, 0, [("127.0.0.1", 3478)], "/tmp/w0.sock")
    assert "not-a-flag-value" not in " ".join(argv)
    assert _parse(argv[3:])[1].turn == parent.turn
    # Without a file the secret is derived from the routing secret (signaling can mint).
    _, derived = _parse(["--secret-file", str(secret_file), "--turn", "--listen",
                         "127.0.0.1:3478"])
    assert derived.turn is not None and len(derived.turn.secrets[0]) == 64


@pytest.mark.parametrize(("flags", "message"), [
    (["--turn-realm", "a-realm-of-thirteen"], "realm"),
    (["--turn-peer", "10.0.0.0/33"], "--turn-peer"),
    (["--turn-relay-ip", "example.org"], "--turn-relay-ip"),
    (["--turn-allocations-per-ip", "0"], "quotas"),
])
def test_bad_turn_flags_are_usage_errors(secret_file: Path, flags: list[str],
                                         message: str) -> None:
    with pytest.raises(cli.UsageError, match=message):
        _parse(["--secret-file", str(secret_file), "--listen", "127.0.0.1:3478", "--turn",
                *flags])


def test_up_passes_turn_to_its_relay_workers(tmp_path: Path, secret_file: Path) -> None:
    parser = argparse.ArgumentParser()
    add_up_arguments(parser)
    turn_file = tmp_path / "turn.secret"
    turn_file.write_bytes(b"shared\n")
    args = parser.parse_args(["--state-dir", str(tmp_path / "state"), "--udp", "0.0.0.0:3478",
                              "--public-address", "203.0.113.1",
                              "--public-address", "2001:db8::1", "--turn",
                              "--turn-secret-file", str(turn_file),
                              "--turn-peer", "10.0.0.0/8"])
    resolve(args, {}, "up", UP_DEFAULTS)
    cfg = build_up_config(args)
    _, relays = child_specs(cfg, secret_file, tmp_path)
    _, config = _parse(relays[0].argv[3:])
    assert config.turn is not None
    # The IPv4 wildcard serves the IPv4 public address only: that is TURN's media address.
    assert config.turn.media == (("203.0.113.1", 3478),)
    assert config.turn.relay_ips == ("203.0.113.1",)
    assert config.turn.secrets == (b"shared",)
    assert [str(n) for n in config.turn.peers] == ["10.0.0.0/8"]
    assert "shared" not in " ".join(relays[0].argv)


def test_only_given_settings_are_written() -> None:
    argv = relay_argv(["relay"], listen=[("::", 3478)], secret_file="s", workers=None)
    assert argv == ["relay", "--listen", "[::]:3478", "--secret-file", "s"]
    # TURN off is written: a worker's own default is on wherever it knows its address.
    off = relay_argv(["relay"], listen=[("127.0.0.1", 3478)], secret_file="s", turn=False)
    assert off[-1] == "--no-turn"


def test_turn_is_on_by_default_where_the_media_address_is_known(secret_file: Path) -> None:
    """Issue 40 item 3: TURN is on by default. A relay that knows the address clients reach
    it by (bound to one IP, or told with --media-address) runs it; one on a wildcard without
    that address (a Kubernetes relay behind a load balancer) cannot relay to itself, so it
    stays off there unless asked, and asking is a usage error."""
    base = ["--secret-file", str(secret_file)]
    on = _parse([*base, "--listen", "127.0.0.1:3478"])[1].turn
    assert on is not None and on.secrets == _parse(
        [*base, "--listen", "127.0.0.1:3478", "--turn"])[1].turn.secrets  # type: ignore[union-attr]
    told = _parse([*base, "--listen", "0.0.0.0:3478", "--media-address", "203.0.113.1:3478"])[1]
    assert told.turn is not None and told.turn.media == (("203.0.113.1", 3478),)
    assert _parse([*base, "--listen", "0.0.0.0:3478"])[1].turn is None
    assert _parse([*base, "--listen", "127.0.0.1:3478", "--no-turn"])[1].turn is None
    with pytest.raises(cli.UsageError, match="--media-address"):
        _parse([*base, "--listen", "0.0.0.0:3478", "--turn"])
    # The config file's key: turn = false.
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([*base, "--listen", "127.0.0.1:3478"])
    resolve(args, {"relay": {"turn": False}}, "relay", cli.DEFAULTS)
    assert cli.build_config(args).turn is None


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[str, str]:
    cert, key, _ = ensure_self_signed(tmp_path / "tls", ["127.0.0.1"])
    return cert, key


def test_turn_tls_round_trips_as_file_names(secret_file: Path,
                                            tls_files: tuple[str, str]) -> None:
    cert, key = tls_files
    args, parent = _parse(["--secret-file", str(secret_file), "--workers", "2", "--turn",
                           "--listen", "127.0.0.1:0",
                           "--tcp", "127.0.0.1:0", "--turn-tls-cert", cert, "--turn-tls-key",
                           key, "--turn-tls-name", "TURN.example.com.",
                           "--tcp-https-name", "App.example.com"])
    assert parent.turn_tls == TurnTls(cert, key, ("turn.example.com",), ("app.example.com",))
    argv = cli._child_argv(args, parent, 1, [("127.0.0.1", 40000)], "/tmp/w1.sock")
    assert Path(key).read_text() not in " ".join(argv)  # the key travels as its file name
    assert _parse(argv[3:])[1].turn_tls == parent.turn_tls


@pytest.mark.parametrize(("flags", "message"), [
    (["--turn", "--tcp", "127.0.0.1:0", "--turn-tls-cert", "CERT"], "go together"),
    (["--no-turn", "--tcp", "127.0.0.1:0", "--turn-tls-cert", "CERT", "--turn-tls-key", "KEY"],
     "needs TURN"),
    (["--turn", "--turn-tls-cert", "CERT", "--turn-tls-key", "KEY"], "needs a --tcp"),
    (["--turn", "--tcp", "127.0.0.1:0", "--turn-tls-cert", "KEY", "--turn-tls-key", "KEY"],
     "--turn-tls-cert/--turn-tls-key"),
])
def test_bad_turn_tls_flags_are_usage_errors(secret_file: Path, tls_files: tuple[str, str],
                                             flags: list[str], message: str) -> None:
    cert, key = tls_files
    flags = [cert if f == "CERT" else key if f == "KEY" else f for f in flags]
    with pytest.raises(cli.UsageError, match=message):
        _parse(["--secret-file", str(secret_file), "--listen", "127.0.0.1:3478", *flags])


@pytest.mark.parametrize("shared", [True, False], ids=["https-on-media-port", "tls-only"])
def test_up_gives_turn_tls_where_the_media_port_serves_tls(
        tmp_path: Path, secret_file: Path, shared: bool) -> None:
    parser = argparse.ArgumentParser()
    add_up_arguments(parser)
    args = parser.parse_args(["--state-dir", str(tmp_path / "state"), "--udp", "0.0.0.0:3478",
                              "--tls", "self-signed", "--turn",
                              *(["--https-on-media-port"] if shared else [])])
    resolve(args, {}, "up", UP_DEFAULTS)
    cfg = build_up_config(args)
    if shared:
        cfg.relay_https = ("127.0.0.1", 40443)  # `up` picks it before it builds the relays
    _, relays = child_specs(cfg, secret_file, tmp_path)
    _, config = _parse(relays[0].argv[3:])
    if shared:  # signaling's certificate, for TURN/TLS on the same TCP port
        assert config.turn_tls == TurnTls(str(cfg.tls_cert), str(cfg.tls_key))
    else:
        assert config.turn_tls is None


@pytest.mark.parametrize(("udp", "flags", "relayed"), [
    ("0.0.0.0:443", [], 3478),  # below 1024: the default relayed-media port
    ("0.0.0.0:443", ["--relayed-media-port", "40443"], 40443),
    ("0.0.0.0:3478", [], None),  # Chromium relays to it already
    ("0.0.0.0:3478", ["--relayed-media-port", "40443"], None),
])
def test_up_gives_turn_clients_a_port_they_relay_to(
        tmp_path: Path, secret_file: Path, udp: str, flags: list[str],
        relayed: int | None) -> None:
    """Issue 40 item 2: Chromium relays to no peer port below 1024, so with media on 443 the
    relays also listen on the relayed-media port, TURN counts it as our own media address,
    and signaling answers it as a second, lower-priority candidate."""
    parser = argparse.ArgumentParser()
    add_up_arguments(parser)
    args = parser.parse_args(["--state-dir", str(tmp_path / "state"), "--udp", udp,
                              "--public-address", "203.0.113.1", "--turn", *flags])
    resolve(args, {}, "up", UP_DEFAULTS)
    cfg = build_up_config(args)
    port = int(udp.rsplit(":", 1)[1])
    _, relays = child_specs(cfg, secret_file, tmp_path)
    _, config = _parse(relays[0].argv[3:])
    assert config.turn is not None
    if relayed is None:
        assert config.listen == (("0.0.0.0", port),)
        assert config.turn.media == (("203.0.113.1", port),)
    else:
        assert config.listen == (("0.0.0.0", port), ("0.0.0.0", relayed))
        assert set(config.turn.media) == {("203.0.113.1", port), ("203.0.113.1", relayed)}
        assert config.turn.relay_ips == ("203.0.113.1",)
        assert config.tcp == (("0.0.0.0", port),)  # TCP stays on the one port


@pytest.mark.parametrize("port", ["80", "70000"])
def test_a_relayed_media_port_turn_clients_cannot_use_is_refused(tmp_path: Path,
                                                                 port: str) -> None:
    parser = argparse.ArgumentParser()
    add_up_arguments(parser)
    args = parser.parse_args(["--state-dir", str(tmp_path / "state"), "--udp", "0.0.0.0:443",
                              "--turn", "--relayed-media-port", port])
    resolve(args, {}, "up", UP_DEFAULTS)
    with pytest.raises(ValueError, match="--relayed-media-port must be 1024..65535"):
        build_up_config(args)
def _up(tmp_path: Path, *flags: str, public: str = "203.0.113.1") -> Any:
    parser = argparse.ArgumentParser()
    add_up_arguments(parser)
    args = parser.parse_args(["--state-dir", str(tmp_path / "state"), "--udp", "0.0.0.0:3478",
                              "--public-address", public, *flags])
    resolve(args, {}, "up", UP_DEFAULTS)
    return build_up_config(args)


def test_up_advertises_what_its_relays_listen_on_with_their_secret(
        tmp_path: Path, secret_file: Path) -> None:
    """Issue 40 item 3: signaling's TURN URLs are the ports the relays actually listen on,
    and its secret is the one the relays verify with (derived from the same routing
    secret), so what it mints they accept."""
    cfg = _up(tmp_path)
    advert = turn_advert(cfg, secret_file)
    assert advert is not None
    # TCP only: TURN/UDP on the media address would break Chromium's direct UDP path.
    assert advert.urls == ("turn:203.0.113.1:3478?transport=tcp",)
    _, relays = child_specs(cfg, secret_file, tmp_path)
    relay = _parse(relays[0].argv[3:])[1].turn
    assert relay is not None and advert.secret == relay.secrets[0]
    # A load balancer's TCP port; TLS where the media port serves it; no ICE-TCP: UDP only.
    assert turn_advert(_up(tmp_path, "--public-tcp-port", "443"), secret_file).urls == (  # type: ignore[union-attr]
        "turn:203.0.113.1:443?transport=tcp",)
    tls = _up(tmp_path, "--tls", "self-signed", "--https-on-media-port")
    assert turn_advert(tls, secret_file).urls == (  # type: ignore[union-attr]
        "turn:203.0.113.1:3478?transport=tcp", "turns:203.0.113.1:3478?transport=tcp")
    # Only UDP left: the relays serve it, signaling advertises nothing (unless --turn-url).
    no_tcp = _up(tmp_path, "--no-ice-tcp")
    assert no_tcp.turn and turn_advert(no_tcp, secret_file) is None
    # A proxy in front: its URLs instead; a TURN secret file: its first secret.
    turn_file = tmp_path / "turn.secret"
    turn_file.write_bytes(b"first\nsecond\n")
    proxied = turn_advert(_up(tmp_path, "--turn-url", "turns:turn.example.com:443",
                              "--turn-secret-file", str(turn_file)), secret_file)
    assert proxied is not None and proxied.urls == ("turns:turn.example.com:443",)
    assert proxied.secret == b"first"
    with pytest.raises(ValueError, match="turn: or turns:"):
        _up(tmp_path, "--turn-url", "stun:203.0.113.1")
    with pytest.raises(ValueError, match="--turn-credential-ttl"):
        _up(tmp_path, "--turn-credential-ttl", "5")


def test_up_no_turn_turns_off_the_relays_and_the_advert(tmp_path: Path,
                                                        secret_file: Path) -> None:
    cfg = _up(tmp_path, "--no-turn")
    assert turn_advert(cfg, secret_file) is None
    _, relays = child_specs(cfg, secret_file, tmp_path)
    assert "--no-turn" in relays[0].argv and _parse(relays[0].argv[3:])[1].turn is None
    # Without a public address of the --udp family TURN could not relay to us: off by
    # default, an error when asked for.
    assert not _up(tmp_path, public="2001:db8::1").turn
    with pytest.raises(ValueError, match="public address"):
        _up(tmp_path, "--turn", public="2001:db8::1")
