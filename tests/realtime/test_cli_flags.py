"""``--realtime-agent`` on ``appliance up`` and ``appliance signaling``: the agent of
``/v1/realtime/calls`` reaches signaling's config; a bad explicit spec fails ``up`` at start
(exit 2, one line), as a bad ``--agent`` does."""

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
    assert build_up_config(up_args(tmp_path)).realtime_agent == "realtime"
    cfg = build_up_config(up_args(tmp_path, "--realtime-agent", "echo"))
    assert cfg.realtime_agent == "echo"


def test_signaling_flag(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    signaling_cli.add_arguments(p)
    for argv, want in (([], "realtime"), (["--realtime-agent", "examples/x.py:agent"], "examples/x.py:agent")):
        args = p.parse_args(["--public-address", "192.0.2.1", "--webui-dir", str(tmp_path), *argv])
        resolve(args, {}, "signaling", signaling_cli.DEFAULTS)
        cfg, _ = signaling_cli.build_config(args)
        assert cfg.realtime_agent == want


def test_a_bad_realtime_agent_fails_up_at_start(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "appliance", "up", "--realtime-agent", "nosuch", "--state-dir",
         str(tmp_path / "state"), "--http", "127.0.0.1:0", "--udp", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("appliance up: ") and "unknown agent 'nosuch'" in line
