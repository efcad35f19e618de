"""The media processes' CPU priority (appliance/priority.py, issue 41 item 1): every thread
and, for a session leader, the autogroup; a refusal said, not raised; ``up`` hands its
``--nice`` to every child, 0 included."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from relay.support import SECRET

from appliance.config import resolve
from appliance.priority import MEDIA_NICE, NICE_ENV, nice_from_environment, parse_nice
from appliance.relay import cli as relay_cli
from appliance.supervisor import DEFAULTS as UP_DEFAULTS
from appliance.supervisor import add_arguments as up_arguments
from appliance.supervisor import build_up_config, child_specs
from appliance.transceiver import cli as transceiver_cli

#: Run in a fresh interpreter (the test's own process keeps its priority): a thread that
#: exists before, set_priority, a thread started after; prints what each and the autogroup
#: ended with. ``DROP``: become nobody first (what an unprivileged service is).
PROBE = r"""
import json, os, sys, threading
from appliance.priority import set_priority
if os.environ.get("DROP") and os.geteuid() == 0:  # after the imports: /root is not theirs
    os.setgid(65534)
    os.setuid(65534)
before = threading.Event(); done = threading.Event(); seen = {}
def early():
    seen["early_tid"] = threading.get_native_id(); before.set(); done.wait()
t = threading.Thread(target=early); t.start(); before.wait()
why = set_priority(int(sys.argv[1]))
def late():
    seen["late"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
u = threading.Thread(target=late); u.start(); u.join()
seen["early"] = os.getpriority(os.PRIO_PROCESS, seen["early_tid"]); done.set(); t.join()
seen["main"] = os.getpriority(os.PRIO_PROCESS, 0)
try:  # empty in init's own session (the root autogroup): "root"
    seen["autogroup"] = (open("/proc/self/autogroup").read().split() or ["root"])[-1]
except OSError:
    seen["autogroup"] = None
print(json.dumps({"why": why, **seen}))
"""

HAVE_AUTOGROUP = Path("/proc/self/autogroup").exists()


def _probe(nice: int, *, session: bool, drop: bool = False) -> dict[str, object]:
    env = {**os.environ, **({"DROP": "1"} if drop else {})}
    out = subprocess.run([sys.executable, "-c", PROBE, str(nice)], capture_output=True,
                         text=True, check=True, env=env, start_new_session=session,
                         timeout=60)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def _own_autogroup_nice() -> str | None:
    """The nice of this process's autogroup; "root" for init's session (a service manager's
    child that never called setsid, as a CI runner may be), whose file reads empty."""
    try:
        return (Path("/proc/self/autogroup").read_text().split() or ["root"])[-1]
    except OSError:
        return None


@pytest.mark.skipif(os.geteuid() != 0, reason="a negative nice needs CAP_SYS_NICE")
def test_every_thread_and_the_leaders_autogroup_get_the_nice() -> None:
    seen = _probe(-3, session=True)
    assert seen["why"] is None
    assert (seen["main"], seen["early"], seen["late"]) == (-3, -3, -3)
    if HAVE_AUTOGROUP:
        assert seen["autogroup"] == "-3"


@pytest.mark.skipif(os.geteuid() != 0, reason="a negative nice needs CAP_SYS_NICE")
def test_a_process_in_someone_elses_session_leaves_the_autogroup_alone() -> None:
    """``appliance up`` from a shell: the autogroup is the shell's session's."""
    ours = _own_autogroup_nice()
    seen = _probe(-4, session=False)
    assert seen["why"] is None
    assert (seen["main"], seen["early"], seen["late"]) == (-4, -4, -4)
    assert seen["autogroup"] == ours
    assert _own_autogroup_nice() == ours


def test_without_the_privilege_it_says_why_and_runs_at_what_it_had() -> None:
    seen = _probe(-5, session=True, drop=True)
    why = str(seen["why"])
    assert "cannot set the nice to -5: not permitted" in why
    assert "CAP_SYS_NICE" in why and "RLIMIT_NICE >= 25" in why
    assert (seen["main"], seen["early"], seen["late"]) == (0, 0, 0)


def test_zero_asks_for_nothing() -> None:
    seen = _probe(0, session=True)
    assert seen["why"] is None
    assert (seen["main"], seen["early"], seen["late"]) == (0, 0, 0)


@pytest.mark.parametrize(("value", "expected"), [(-11, -11), ("-20", -20), ("19", 19), (0, 0)])
def test_nice_values_parse(value: object, expected: int) -> None:
    assert parse_nice(value) == expected


@pytest.mark.parametrize("value", [-21, 20, "high", "1.5", True, 2.0, None])
def test_bad_nice_values_are_refused_by_name(value: object) -> None:
    with pytest.raises(ValueError, match="--nice"):
        parse_nice(value)


def _up(tmp_path: Path, *argv: str) -> tuple[list[list[str]], list[list[str]], int]:
    p = argparse.ArgumentParser()
    up_arguments(p)
    args = p.parse_args(["--state-dir", str(tmp_path / "s"), *argv])
    resolve(args, {}, "up", UP_DEFAULTS)
    cfg = build_up_config(args)
    transceivers, relays = child_specs(cfg, tmp_path / "secret", tmp_path)
    return [s.argv for s in transceivers], [s.argv for s in relays], cfg.nice


def _flag(argv: list[str]) -> str:
    return argv[argv.index("--nice") + 1]


def test_up_hands_its_nice_to_every_child_zero_included(tmp_path: Path) -> None:
    transceivers, relays, nice = _up(tmp_path)
    assert nice == MEDIA_NICE
    assert {_flag(a) for a in transceivers + relays} == {str(MEDIA_NICE)}
    transceivers, relays, nice = _up(tmp_path, "--nice", "0", "--relay-workers", "2")
    assert nice == 0 and len(relays) == 2
    # 0 is passed on: left out, the children's own default (MEDIA_NICE) would apply
    assert {_flag(a) for a in transceivers + relays} == {"0"}


def test_the_children_default_to_the_media_nice(tmp_path: Path) -> None:
    for add, defaults, role in ((transceiver_cli.add_arguments, transceiver_cli.DEFAULTS,
                                 "transceiver"),
                                (relay_cli.add_arguments, relay_cli.DEFAULTS, "relay")):
        p = argparse.ArgumentParser()
        add(p)
        args = p.parse_args([])
        resolve(args, {}, role, defaults)
        assert parse_nice(args.nice) == MEDIA_NICE


def test_a_bad_nice_stops_the_relay_with_its_reason(tmp_path: Path) -> None:
    secret = tmp_path / "routing.secret"
    secret.write_bytes(SECRET + b"\n")
    out = subprocess.run([sys.executable, "-m", "appliance.relay.cli", "--secret-file",
                          str(secret), "--listen", "127.0.0.1:0", "--nice", "-30"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--nice must be in -20..19, not -30" in out.stderr


def test_the_environment_sets_the_default_under_the_flag_and_over_the_config() -> None:
    """``APPLIANCE_NICE`` (what the suite's conftest sets to 0): a host-wide default."""
    env = {NICE_ENV: "0"}

    def resolved(*argv: str, config: dict[str, object] | None = None) -> int:
        p = argparse.ArgumentParser()
        relay_cli.add_arguments(p)
        args = p.parse_args(list(argv))
        nice_from_environment(args, env)
        resolve(args, config or {}, "relay", relay_cli.DEFAULTS)
        return parse_nice(args.nice)

    assert resolved() == 0
    assert resolved("--nice", "-3") == -3  # the flag wins
    assert resolved(config={"relay": {"nice": -7}}) == 0  # over the config file
    env.clear()
    assert resolved(config={"relay": {"nice": -7}}) == -7
    assert resolved() == MEDIA_NICE
