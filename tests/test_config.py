from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from appliance.config import ConfigError, format_hostport, load_config, parse_hostport, resolve


def test_resolve_precedence(tmp_path: Path) -> None:
    cfg = tmp_path / "a.toml"
    cfg.write_text('cluster = 4\n[relay]\nlisten = "0.0.0.0:9999"\nmax_flows = 10\n')
    config = load_config(cfg)
    args = argparse.Namespace(listen=None, max_flows=5, cluster=None, workers=None)
    resolve(args, config, "relay", {"workers": 1, "listen": "0.0.0.0:3478"})
    assert args.listen == "0.0.0.0:9999"  # file beats default
    assert args.max_flows == 5  # flag beats file
    assert args.cluster == 4  # shared top-level key
    assert args.workers == 1  # default


def test_bad_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("= nope")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    assert load_config(None) == {}


@pytest.mark.parametrize(
    ("text", "addr"),
    [("1.2.3.4:5", ("1.2.3.4", 5)), ("[::1]:3478", ("::1", 3478)), (":80", ("0.0.0.0", 80)),
     ("8080", ("0.0.0.0", 8080))],
)
def test_hostport(text: str, addr: tuple[str, int]) -> None:
    assert parse_hostport(text) == addr
    assert parse_hostport(format_hostport(addr)) == addr


@pytest.mark.parametrize("text", ["nope", "1.2.3.4:x", "1.2.3.4:70000", "[::1]"])
def test_bad_hostport(text: str) -> None:
    with pytest.raises(ValueError, match="bad|out of range"):
        parse_hostport(text)
