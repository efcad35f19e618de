"""``--live-agent`` on ``appliance up`` and ``appliance signaling``: the agent of
``GET /v1/live/sessions`` reaches signaling's config (default: the offline assistant); a bad
explicit spec fails the command at start (exit 2, one line), as a bad ``--realtime-agent``
does. The default is not loaded at start: a box without the speech extra still starts."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from appliance.config import resolve
from appliance.signaling import cli as signaling_cli
from appliance.supervisor import DEFAULTS, add_arguments, build_up_config

REPO = Path(__file__).resolve().parents[2]


def up_args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--state-dir", str(tmp_path / "s"), *argv])
    resolve(args, {}, "up", DEFAULTS)
    return args


def test_up_default_and_explicit(tmp_path: Path) -> None:
    assert build_up_config(up_args(tmp_path)).live_agent == "assistant"
    cfg = build_up_config(up_args(tmp_path, "--live-agent", "realtime"))
    assert cfg.live_agent == "realtime"


def test_up_takes_it_from_the_config_file(tmp_path: Path) -> None:
    args = up_args(tmp_path)
    args.live_agent = None
    resolve(args, {"up": {"live_agent": "realtime"}}, "up", DEFAULTS)
    assert build_up_config(args).live_agent == "realtime"


def test_signaling_flag(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    signaling_cli.add_arguments(p)
    for argv, want in (([], "assistant"), (["--live-agent", "realtime"], "realtime")):
        args = p.parse_args(["--public-address", "192.0.2.1", "--webui-dir", str(tmp_path),
                             *argv])
        resolve(args, {}, "signaling", signaling_cli.DEFAULTS)
        cfg, _ = signaling_cli.build_config(args)
        assert cfg.live_agent == want


def test_a_bad_live_agent_fails_up_at_start(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "appliance", "up", "--live-agent", "echo", "--state-dir",
         str(tmp_path / "state"), "--http", "127.0.0.1:0", "--udp", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("appliance up: ") and "cannot answer a Realtime WebSocket" in line


def test_help_names_it() -> None:
    r = subprocess.run([sys.executable, "-m", "appliance", "up", "--help"],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "--live-agent SPEC" in r.stdout and "/v1/live/sessions" in r.stdout
