"""appliance.children.Supervisor, the one child supervisor (``appliance up`` and
``appliance relay --workers M``), in the relay's settings: a worker that never gets ready is
restarted for ever (as the relay always did), while ``up``'s default gives up after three."""

from __future__ import annotations

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
