"""``--headroom own`` against the default ``--headroom core`` (issue 33's lever, issue 32's
meter): an operator's choice of what a transceiver counts as its load.

``core`` counts what the CPUs it may run on have left: a neighbour that fills the core and
makes its frames late reads as load. ``own`` counts its own CPU alone, as before issue 32:
right on a core of its own, and on a host whose other load is not the appliance's to judge
(a busy test machine made appliances under test refuse calls ``503 overloaded`` at "busy
64 %" with two workers of the suite running beside them).

The meter is fed made-up times, CPU seconds, tick lags and ``/proc/stat`` texts (sans-IO),
so nothing depends on this machine; the CLI tests only parse arguments."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from appliance.config import resolve
from appliance.supervisor import DEFAULTS as UP_DEFAULTS
from appliance.supervisor import add_arguments as up_arguments
from appliance.supervisor import build_up_config, child_specs
from appliance.transceiver import cli as transceiver_cli
from appliance.transceiver.corestat import parse_proc_stat_untrusted
from appliance.transceiver.headroom import TICK, LoadMeter
from appliance.transceiver.server import Transceiver, TransceiverConfig

SECRETS = (b"routing-secret-for-tests-0123456",)


def hogged_windows(meter: LoadMeter, windows: int = 4) -> None:
    """``windows`` meter windows on one CPU: the transceiver at 10 % of it sending media,
    four busy loops taking the rest, its 20 ms ticks 45 ms late (past saturation)."""
    t, cpu, busy_ticks, idle_ticks, sent = 0.0, 0.0, 0, 0, 0
    while meter.windows < windows:
        t += TICK
        cpu += 0.1 * TICK
        busy_ticks += 2  # 100 ticks/s: the whole 20 ms used, by us and the hogs
        sent += 6
        stat = parse_proc_stat_untrusted(
            f"cpu0 {busy_ticks} 0 0 {idle_ticks} 0 0 0 0 0 0\nprocs_running 5\n"
        ) if meter.window_due(t) else None
        meter.handle_tick(t, cpu, 0.045, sent=sent, stat=stat,
                          affinity=frozenset({0}) if stat else None)


def test_core_counts_the_neighbours_harm_own_counts_only_its_own_cpu() -> None:
    core, own = LoadMeter(), LoadMeter(own_only=True)
    hogged_windows(core)
    hogged_windows(own)
    assert core.busy == pytest.approx(1.0)  # frames a frame time late: full
    assert own.busy == pytest.approx(0.1)  # its 10 % of a core, whatever the hogs do
    assert own.report.available == pytest.approx(1.0)  # a core of its own
    assert own.report.late == 0.0 and own.report.core_idle is None
    # What was seen is still reported: the tick lag and the frames' lateness.
    assert own.report.lag_mean_ms == pytest.approx(45.0)
    assert own.report.late_p90_ms == pytest.approx(45.0)


def test_on_a_quiet_core_the_two_agree() -> None:
    def quiet(meter: LoadMeter) -> None:
        t = cpu = busy = idle = 0.0
        sent = 0
        while meter.windows < 3:
            t += TICK
            cpu += 0.2 * TICK
            busy += 0.2 * TICK * 100  # /proc/stat's 100 ticks a second: ours, the rest idle
            idle += 0.8 * TICK * 100
            sent += 6
            stat = parse_proc_stat_untrusted(
                f"cpu0 {round(busy)} 0 0 {round(idle)} 0 0 0 0 0 0\nprocs_running 1\n"
            ) if meter.window_due(t) else None
            meter.handle_tick(t, cpu, 0.001, sent=sent, stat=stat,
                              affinity=frozenset({0}) if stat else None)
    core, own = LoadMeter(), LoadMeter(own_only=True)
    quiet(core)
    quiet(own)
    assert core.busy == pytest.approx(own.busy) == pytest.approx(0.2)


def test_a_transceiver_with_headroom_own_admits_on_a_hogged_core() -> None:
    """The transceiver's own refusal (``create`` → 503 overloaded) follows the mode."""
    for mode, overloaded in (("core", True), ("own", False)):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            tr = Transceiver(TransceiverConfig(id=0, secrets=SECRETS, headroom=mode), sock)
            assert tr.load.meter.own_only is (mode == "own")
            hogged_windows(tr.load.meter)
            assert tr.load.overloaded() is overloaded
            assert tr.load.view()["headroom_mode"] == mode
        finally:
            sock.close()


def test_an_unknown_mode_is_refused() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        with pytest.raises(ValueError, match="headroom"):
            Transceiver(TransceiverConfig(id=0, secrets=SECRETS, headroom="cores"), sock)
    finally:
        sock.close()


# -- the flags -------------------------------------------------------------------------------


def transceiver_args(*argv: str, config: dict[str, object] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    transceiver_cli.add_arguments(p)
    args = p.parse_args(list(argv))
    resolve(args, config or {}, "transceiver", transceiver_cli.DEFAULTS)
    return args


def test_transceiver_flag_defaults_to_core_and_takes_own() -> None:
    assert transceiver_cli.build_config(transceiver_args(), SECRETS).headroom == "core"
    cfg = transceiver_cli.build_config(transceiver_args("--headroom", "own"), SECRETS)
    assert cfg.headroom == "own"
    # From the config file's [transceiver] table too, checked the same way.
    args = transceiver_args(config={"transceiver": {"headroom": "own"}})
    assert transceiver_cli.build_config(args, SECRETS).headroom == "own"
    with pytest.raises(ValueError, match="--headroom"):
        transceiver_cli.build_config(
            transceiver_args(config={"transceiver": {"headroom": "all"}}), SECRETS)
    with pytest.raises(SystemExit):
        transceiver_args("--headroom", "all")  # argparse: not one of the choices


def test_up_passes_headroom_to_every_transceiver(tmp_path: Path) -> None:
    def transceiver_argvs(*argv: str) -> list[list[str]]:
        p = argparse.ArgumentParser()
        up_arguments(p)
        args = p.parse_args(["--state-dir", str(tmp_path / "s"), *argv])
        resolve(args, {}, "up", UP_DEFAULTS)
        cfg = build_up_config(args)
        transceivers, _ = child_specs(cfg, tmp_path / "secret", tmp_path)
        return [spec.argv for spec in transceivers]

    default = transceiver_argvs()
    assert default and all("--headroom" not in argv for argv in default)  # theirs: core
    own = transceiver_argvs("--headroom", "own", "--transceivers", "3")
    assert len(own) == 3
    for argv in own:
        assert argv[argv.index("--headroom") + 1] == "own"


def test_the_environment_sets_the_default_under_the_flag_and_over_the_config() -> None:
    """``APPLIANCE_HEADROOM`` (what the suite's conftest sets): a host-wide default."""
    env = {transceiver_cli.HEADROOM_ENV: "own"}

    def resolved(*argv: str, config: dict[str, object] | None = None,
                 environ: dict[str, str] = env) -> str:
        p = argparse.ArgumentParser()
        transceiver_cli.add_arguments(p)
        args = p.parse_args(list(argv))
        transceiver_cli.apply_environment(args, environ)
        resolve(args, config or {}, "transceiver", transceiver_cli.DEFAULTS)
        return transceiver_cli.build_config(args, SECRETS).headroom

    assert resolved() == "own"
    assert resolved("--headroom", "core") == "core"  # the flag wins
    assert resolved(config={"transceiver": {"headroom": "core"}}) == "own"
    assert resolved(environ={}) == "core"
    assert resolved(environ={transceiver_cli.HEADROOM_ENV: ""}) == "core"  # empty: unset
    with pytest.raises(ValueError, match="--headroom"):
        resolved(environ={transceiver_cli.HEADROOM_ENV: "all"})
