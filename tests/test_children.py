"""appliance.children.Supervisor, the one child supervisor (``appliance up`` and
``appliance relay --workers M``), in the relay's settings: a worker that never gets ready is
restarted for ever (as the relay always did), while ``up``'s default gives up after three."""

from __future__ import annotations

import os
import signal
import sys

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


# A child that serves as a standby: with --standby it says it is warm and waits for "go".
STANDBY_CHILD = [sys.executable, "-c", """
import os, sys, time
if "--standby" in sys.argv:
    print("relay standby warm", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(0)
print(f"relay listening on 127.0.0.1:1 internal 127.0.0.1:{os.getpid()}", flush=True)
time.sleep(600)
"""]


async def _ready_pid(sup: Supervisor, name: str, not_pid: int | None = None) -> int:
    st = sup.status[name]
    with trio.fail_after(30):
        await sup.wait_until(lambda: st.state == "ready" and st.pid not in (None, not_pid))
    assert st.pid is not None
    return st.pid


async def test_a_dead_child_is_replaced_by_its_warm_standby_at_once(nursery: trio.Nursery) -> None:
    """Issue 20: a relay worker that dies is replaced by its standby (already started and
    imported), with no backoff; then a new standby is started."""
    spec = ChildSpec("relay", "0", STANDBY_CHILD, "", standby=True)
    sup = Supervisor([spec], backoff_initial=5.0, standby_delay=0.0)
    nursery.start_soon(sup.supervise, spec)
    first = await _ready_pid(sup, spec.name)
    with trio.fail_after(30):
        await sup.wait_until(lambda: (sb := sup._standby.get(spec.name)) is not None and sb.warm)
    standby = sup._standby[spec.name].proc.pid
    os.kill(first, signal.SIGKILL)
    assert await _ready_pid(sup, spec.name, first) == standby
    st = sup.status[spec.name]
    # "At once" is what the supervisor slept, recorded, not a wall-clock bound: no backoff.
    assert st.delays == [0.0] and st.restarts == 1
    assert st.ready_fields["internal"] == f"127.0.0.1:{standby}"
    with trio.fail_after(30):  # and a fresh standby is kept again
        await sup.wait_until(lambda: (sb := sup._standby.get(spec.name)) is not None
                             and sb.proc.pid != standby)


async def test_kills_back_to_back_each_find_a_warm_standby(nursery: trio.Nursery) -> None:
    """Bug (issue 32, relay failover): one standby per worker, started a second after a
    takeover and importing for 1-4 s on a loaded host, so a second kill in that time told
    a standby still importing to go (or started a fresh process): every call waited out the
    rest of its start-up (~300 ms and more, not one flow late but the whole takeover). A
    spare standby, warm before it is needed, takes the second kill."""
    spec = ChildSpec("relay", "0", STANDBY_CHILD, "", standby=True)
    sup = Supervisor([spec], backoff_initial=5.0, standby_delay=0.0)
    nursery.start_soon(sup.supervise, spec)
    first = await _ready_pid(sup, spec.name)

    def both_warm() -> bool:
        a, b = sup._standby.get(spec.name), sup._spare.get(spec.name)
        return a is not None and a.warm and b is not None and b.warm

    with trio.fail_after(30):
        await sup.wait_until(both_warm)
    standby, spare = sup._standby[spec.name].proc.pid, sup._spare[spec.name].proc.pid
    os.kill(first, signal.SIGKILL)
    second = await _ready_pid(sup, spec.name, first)
    assert second == standby
    assert sup._standby[spec.name].proc.pid == spare  # the spare moved up at once
    os.kill(second, signal.SIGKILL)  # back to back: no standby could have imported since
    assert await _ready_pid(sup, spec.name, second) == spare
    st = sup.status[spec.name]
    assert st.delays == [0.0, 0.0] and st.restarts == 2  # never the 5 s backoff


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
