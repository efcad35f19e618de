"""appliance.children.Supervisor, the one child supervisor (``appliance up`` and
``appliance relay --workers M``), in the relay's settings: a worker that never gets ready is
restarted for ever (as the relay always did), while ``up``'s default gives up after three."""

from __future__ import annotations

import os
import select
import signal
import sys
from pathlib import Path

import pytest
import trio

from appliance.children import ChildSpec, StartupError, Supervisor

EXIT_3 = [sys.executable, "-c", "import sys; sys.exit(3)"]
READY_THEN_EXIT = [sys.executable, "-c",
                   "print('relay listening on 127.0.0.1:1 internal 127.0.0.1:2', flush=True)"]


async def test_never_giving_up_keeps_restarting(nursery: trio.Nursery) -> None:
    spec = ChildSpec("relay", "0", EXIT_3, "")
    sup = Supervisor([spec], backoff_initial=0.01, backoff_max=0.02, startup_failures=None,
                     ready_timeout=None)
    nursery.start_soon(sup.supervise, spec)
    st = sup.status[spec.name]
    with trio.fail_after(20):
        await sup.wait_until(lambda: st.restarts >= 4)
    assert st.last_exit == 3 and st.ready_line is None


async def test_default_gives_up_on_a_child_that_cannot_start() -> None:
    spec = ChildSpec("relay", "0", EXIT_3, "")
    sup = Supervisor([spec], backoff_initial=0.01, backoff_max=0.02)
    with pytest.raises(StartupError, match="3 times in a row"), trio.fail_after(20):
        await sup.supervise(spec)


async def test_ready_fields_and_argv_read_at_each_start(nursery: trio.Nursery) -> None:
    """The relay rewrites a spec's argv once its first worker reported the port it bound;
    the next start (a restart) runs the new argv."""
    spec = ChildSpec("relay", "0", READY_THEN_EXIT, "")
    sup = Supervisor([spec], backoff_initial=0.01, backoff_max=0.02, startup_failures=None)
    nursery.start_soon(sup.supervise, spec)
    st = sup.status[spec.name]
    with trio.fail_after(20):
        await sup.wait_until(lambda: st.ready_line is not None)
    assert st.ready_fields == {"listen": "127.0.0.1:1", "internal": "127.0.0.1:2"}
    spec.argv = EXIT_3
    with trio.fail_after(20):
        await sup.wait_until(lambda: st.last_exit == 3)


# A child whose standby is a fork template (the relay's protocol: appliance.children
# serve_fork_template): with --standby it says it is warm and forks a worker per "go".
STANDBY_CHILD = [sys.executable, "-c", """
import os, sys, time
from appliance.children import serve_fork_template
def worker():
    print(f"relay listening on 127.0.0.1:1 internal 127.0.0.1:{os.getpid()}", flush=True)
    time.sleep(600)
    return 0
if "--standby" in sys.argv:
    sys.exit(serve_fork_template(worker, "relay standby warm"))
worker()
"""]


async def _ready_pid(sup: Supervisor, name: str, not_pid: int | None = None) -> int:
    st = sup.status[name]
    with trio.fail_after(30):
        await sup.wait_until(lambda: st.state == "ready" and st.pid not in (None, not_pid))
    assert st.pid is not None
    return st.pid


async def _warm_template(sup: Supervisor, name: str, not_pid: int | None = None) -> int:
    with trio.fail_after(30):
        await sup.wait_until(lambda: (sb := sup._standby.get(name)) is not None and sb.warm
                             and sb.proc.pid != not_pid and sb.proc.poll() is None)
    return sup._standby[name].proc.pid


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


async def test_a_dead_child_is_replaced_by_a_fork_of_its_warm_standby(
        nursery: trio.Nursery) -> None:
    """Issues 20 and 32: a relay worker that dies is replaced at once, with no backoff, by a
    fork of its standby (imports done); the standby stays, warm for the next one, and the
    forked worker's exit status reaches the supervisor through it."""
    spec = ChildSpec("relay", "0", STANDBY_CHILD, "", standby=True)
    sup = Supervisor([spec], backoff_initial=5.0, standby_delay=0.0)
    nursery.start_soon(sup.supervise, spec)
    first = await _ready_pid(sup, spec.name)
    template = await _warm_template(sup, spec.name)
    os.kill(first, signal.SIGKILL)
    second = await _ready_pid(sup, spec.name, first)
    assert _ppid(second) == template  # a fork, not an interpreter start
    st = sup.status[spec.name]
    # "At once" is what the supervisor slept, recorded, not a wall-clock bound: no backoff.
    assert st.delays == [0.0] and st.restarts == 1
    assert st.ready_fields["internal"] == f"127.0.0.1:{second}"
    assert sup._standby[spec.name].proc.pid == template  # still there, still warm
    os.kill(second, signal.SIGKILL)  # a forked life's death: seen, and its status reported
    third = await _ready_pid(sup, spec.name, second)
    assert _ppid(third) == template
    assert st.last_exit == -signal.SIGKILL and st.delays == [0.0, 0.0]


async def test_kills_back_to_back_each_find_a_warm_standby(nursery: trio.Nursery) -> None:
    """Bug (issue 32, relay failover): a standby, once consumed, was replaced by a new
    process importing for 1-7 s on a loaded host, so kills faster than that (a spare
    standby only moved the limit to two) told a standby still importing to go, or started
    a fresh process: every call waited out the rest of its start-up (1.5 s). The template
    forks each life: any number of kills back to back are each a fork."""
    spec = ChildSpec("relay", "0", STANDBY_CHILD, "", standby=True)
    sup = Supervisor([spec], backoff_initial=5.0, standby_delay=0.0)
    nursery.start_soon(sup.supervise, spec)
    pid = await _ready_pid(sup, spec.name)
    template = await _warm_template(sup, spec.name)
    for _ in range(4):  # each the moment the previous one is ready
        os.kill(pid, signal.SIGKILL)
        pid = await _ready_pid(sup, spec.name, pid)
        assert _ppid(pid) == template
    st = sup.status[spec.name]
    assert st.delays == [0.0] * 4 and st.restarts == 4  # never the 5 s backoff


# As STANDBY_CHILD, but a life holds back its ready line while the file $HOLD exists.
HOLDING_CHILD = [sys.executable, "-c", """
import os, sys, time
from appliance.children import serve_fork_template
def worker():
    while os.path.exists(os.environ["HOLD"]):
        time.sleep(0.01)
    print(f"relay listening on 127.0.0.1:1 internal 127.0.0.1:{os.getpid()}", flush=True)
    time.sleep(600)
    return 0
if "--standby" in sys.argv:
    sys.exit(serve_fork_template(worker, "relay standby warm"))
worker()
"""]


async def test_a_successor_killed_before_its_ready_line_is_forked_again_at_once(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """Bug (issue 32, bench/relay_failover.py with Redis): a second kill 0.3 s after the
    first hit a successor that had not printed its ready line yet; as a life that "never
    got ready" it waited out the backoff (0.5 s in ``up``): every call lost 540 ms. A
    forked life killed by a signal before it was ready is a takeover cut short: the next
    one is forked at once. (A life that *exits* before it is ready still gets the backoff.)"""
    hold = tmp_path / "hold"
    spec = ChildSpec("relay", "0", HOLDING_CHILD, "", standby=True)
    sup = Supervisor([spec], backoff_initial=5.0, standby_delay=0.0,
                     env={"HOLD": str(hold)})
    nursery.start_soon(sup.supervise, spec)
    st = sup.status[spec.name]
    first = await _ready_pid(sup, spec.name)
    template = await _warm_template(sup, spec.name)
    hold.touch()
    os.kill(first, signal.SIGKILL)
    with trio.fail_after(30):  # the successor runs but holds its ready line back
        await sup.wait_until(lambda: st.pid not in (None, first) and st.state == "starting")
    second = st.pid
    assert second is not None and _ppid(second) == template
    os.kill(second, signal.SIGKILL)
    with trio.fail_after(30):
        await sup.wait_until(lambda: st.pid not in (None, first, second))
    assert st.delays == [0.0, 0.0]  # not the 5 s backoff
    hold.unlink()
    third = await _ready_pid(sup, spec.name, second)
    assert _ppid(third) == template and st.last_exit == -signal.SIGKILL


async def test_a_dead_standby_is_replaced_and_a_kill_meanwhile_starts_afresh(
        nursery: trio.Nursery) -> None:
    """The template itself dies: the next kill finds none warm and starts a fresh process
    (no wait for one still importing); a new template is started and forks the next."""
    spec = ChildSpec("relay", "0", STANDBY_CHILD, "", standby=True)
    sup = Supervisor([spec], backoff_initial=5.0, standby_delay=0.0)
    nursery.start_soon(sup.supervise, spec)
    first = await _ready_pid(sup, spec.name)
    template = await _warm_template(sup, spec.name)
    os.kill(template, signal.SIGKILL)
    with trio.fail_after(30):  # the supervisor saw it go (its stdout closed)
        await sup.wait_until(lambda: sup._standby.get(spec.name) is None
                             or sup._standby[spec.name].proc.pid != template)
    newer = await _warm_template(sup, spec.name, template)
    os.kill(first, signal.SIGKILL)
    second = await _ready_pid(sup, spec.name, first)
    assert _ppid(second) == newer


async def test_cancelling_the_supervisor_stops_the_standby_and_its_forks() -> None:
    """Structured concurrency with the new process kind: cancelling ``supervise`` stops
    the forked worker (not our child: signalled and watched through its pidfd) and the
    template, and returns only once both have exited."""
    spec = ChildSpec("relay", "0", STANDBY_CHILD, "", standby=True)
    sup = Supervisor([spec], backoff_initial=5.0, standby_delay=0.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sup.supervise, spec)
        first = await _ready_pid(sup, spec.name)
        await _warm_template(sup, spec.name)
        template_child = sup._standby[spec.name]
        os.kill(first, signal.SIGKILL)
        forked = await _ready_pid(sup, spec.name, first)
        pidfd = os.pidfd_open(forked)
        nursery.cancel_scope.cancel()
    try:
        assert _exited(pidfd)  # SIGTERM reached it and its exit was waited for
    finally:
        os.close(pidfd)
    assert template_child is not None and template_child.proc.returncode is not None
    assert sup.status[spec.name].state == "stopped"


async def test_replace_is_make_before_break(nursery: trio.Nursery) -> None:
    """SIGHUP's rolling restart: a fresh successor (not the standby: it runs the old code)
    is ready before its predecessor is stopped; a successor that cannot start leaves the
    predecessor running."""
    spec = ChildSpec("relay", "0", STANDBY_CHILD, "", standby=True)
    sup = Supervisor([spec], standby_delay=0.0)
    nursery.start_soon(sup.supervise, spec)
    first = await _ready_pid(sup, spec.name)
    with trio.fail_after(30):
        await sup.wait_until(lambda: spec.name in sup._standby)
    standby = sup._standby[spec.name].proc.pid
    assert await sup.replace(spec.name)
    st = sup.status[spec.name]
    assert st.pid not in (first, standby) and st.state == "ready"
    assert sup.status[spec.name].delays == []  # never down: no backoff, no restart wait
    second = st.pid
    spec.argv = EXIT_3
    assert not await sup.replace(spec.name)
    assert sup.status[spec.name].pid == second and sup.status[spec.name].state == "ready"
