"""Child processes, supervised from a trio nursery: one implementation for every parent.

``appliance up`` (:mod:`appliance.supervisor`: transceivers and relay workers) and
``appliance relay --workers M`` (:mod:`appliance.relay.cli`: M relay workers sharing a
port) both run their children through :class:`Supervisor` (DESIGN.md "Processes"):

* a child runs in its own process group (``start_new_session``: a terminal's Ctrl-C reaches
  only the parent, which then stops the children in order), stdin closed, stdout read;
* it is *ready* when it prints its role's ready line (:data:`READY_PATTERNS`); the line's
  fields (addresses it bound) are kept in :attr:`ChildStatus.ready_fields`;
* a child that exits is restarted after an exponential backoff (``backoff_initial``
  doubling up to ``backoff_max``, reset once it has stayed up for ``stable_after``); one
  that cannot even start (``startup_failures`` exits in a row before its first ready line)
  raises :class:`StartupError` instead of looping forever on, say, a port in use;
* stopping (the nursery is cancelled): SIGTERM to the child's process group, SIGKILL after
  ``stop_grace`` seconds, then reaped — nothing is orphaned.

An optional *observer* (signaling's state, for ``up``) is told when a child starts, becomes
ready and exits, so a dead transceiver's sessions are reported ended at once.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

log = logging.getLogger("appliance.supervisor")

READY_PATTERNS = {
    "transceiver": re.compile(r"^transceiver (?P<id>\S+) listening on (?P<listen>\S+) control (?P<control>.+)$"),
    "relay": re.compile(
        r"^relay listening on (?P<listen>\S+) internal (?P<internal>\S+)(?: tcp (?P<tcp>\S+))?"),
}


class StartupError(Exception):
    """A child could not be brought up at all (bad flags, port in use, ...)."""


class Observer(Protocol):
    """What the supervisor reports to (signaling's ``SignalingState`` for ``up``)."""

    def process_info(self, role: str, key: str, **info: Any) -> None: ...

    def process_up(self, role: str, key: str) -> None: ...

    async def process_down(self, role: str, key: str, reason: str) -> None: ...


@dataclass
class ChildSpec:
    role: str  # "transceiver" | "relay"
    key: str
    argv: list[str]
    control: str

    @property
    def name(self) -> str:
        return f"{self.role} {self.key}"


@dataclass
class ChildStatus:
    state: str = "starting"  # starting | ready | backoff | stopped
    pid: int | None = None
    restarts: int = 0
    last_exit: int | None = None
    ready_line: str | None = None
    ready_fields: dict[str, str] = field(default_factory=dict)
    delays: list[float] = field(default_factory=list)  # every backoff slept, in order

    def view(self) -> dict[str, Any]:
        return {"pid": self.pid, "state": self.state, "restarts": self.restarts,
                "last_exit": self.last_exit}


class Supervisor:
    """Starts, watches and restarts child processes; reports to an optional observer.

    ``ready_timeout=None`` waits for a ready line forever; ``startup_failures=None``
    restarts a child that was never ready forever (``appliance relay --workers M``).
    """

    def __init__(
        self,
        specs: Sequence[ChildSpec],
        *,
        state: Observer | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        stable_after: float = 30.0,
        ready_timeout: float | None = 30.0,
        stop_grace: float = 2.0,
        startup_failures: int | None = 3,
        env: dict[str, str] | None = None,
    ) -> None:
        self.specs = {s.name: s for s in specs}
        self.status = {s.name: ChildStatus() for s in specs}
        self.state = state
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stable_after = stable_after
        self.ready_timeout = ready_timeout
        self.stop_grace = stop_grace
        self.startup_failures = startup_failures
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._changed = trio.Event()

    # Tests and `up` wait on conditions over the statuses instead of sleeping.
    def _notify(self, spec: ChildSpec) -> None:
        if self.state is not None:
            self.state.process_info(spec.role, spec.key, **self.status[spec.name].view())
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._changed.wait()

    async def run_group(
        self, specs: Sequence[ChildSpec], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """One task group: supervise ``specs`` until cancelled; started once all are ready."""
        async with trio.open_nursery() as nursery:
            for spec in specs:
                nursery.start_soon(self.supervise, spec)
            names = [s.name for s in specs]
            await self.wait_until(lambda: all(self.status[n].ready_line for n in names))
            task_status.started()

    async def supervise(self, spec: ChildSpec) -> None:
        status = self.status[spec.name]
        backoff = self.backoff_initial
        failures_before_ready = 0
        ever_ready = False
        try:
            while True:
                started = trio.current_time()
                rc, was_ready = await self._one_life(spec, status)
                ever_ready |= was_ready
                status.last_exit, status.state, status.pid = rc, "backoff", None
                if self.state is not None:
                    await self.state.process_down(spec.role, spec.key, f"exited with status {rc}")
                if not ever_ready:
                    failures_before_ready += 1
                    if (self.startup_failures is not None
                            and failures_before_ready >= self.startup_failures):
                        raise StartupError(
                            f"{spec.name} exited with status {rc} before it was ready, "
                            f"{failures_before_ready} times in a row; giving up "
                            f"(command: {shlex.join(spec.argv)})"
                        )
                if was_ready and trio.current_time() - started >= self.stable_after:
                    backoff = self.backoff_initial  # it ran fine for a while: a fresh failure
                log.warning("%s exited with status %s; restarting in %.2f s", spec.name, rc, backoff)
                status.delays.append(backoff)
                self._notify(spec)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self.backoff_max)
                status.restarts += 1
        finally:
            status.state, status.pid = "stopped", None
            self._notify(spec)

    async def _one_life(self, spec: ChildSpec, status: ChildStatus) -> tuple[int, bool]:
        """Run the child once: (exit status, whether it became ready)."""
        proc = await trio.lowlevel.open_process(
            spec.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=self.env,
            start_new_session=True,  # own process group: we signal the group, never the terminal's
        )
        status.pid, status.state, status.ready_line = proc.pid, "starting", None
        log.info("started %s (pid %d)", spec.name, proc.pid)
        self._notify(spec)
        ready = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_stdout, proc, spec, status, ready)
                nursery.start_soon(self._ready_deadline, proc, spec, ready)
                rc = await proc.wait()
                nursery.cancel_scope.cancel()
            return rc, ready.is_set()
        finally:
            with trio.move_on_after(self.stop_grace + 2, shield=True):
                await self._stop(proc, spec)

    async def _ready_deadline(self, proc: trio.Process, spec: ChildSpec, ready: trio.Event) -> None:
        if self.ready_timeout is None:
            return  # no deadline: the child may take as long as it needs to start
        with trio.move_on_after(self.ready_timeout):
            await ready.wait()
            return
        log.error("%s not ready after %.0f s; stopping it", spec.name, self.ready_timeout)
        await self._stop(proc, spec)

    async def _read_stdout(
        self, proc: trio.Process, spec: ChildSpec, status: ChildStatus, ready: trio.Event
    ) -> None:
        assert proc.stdout is not None
        buf = b""
        pattern = READY_PATTERNS[spec.role]
        async with proc.stdout:
            while True:
                try:
                    chunk = await proc.stdout.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not chunk:
                    return
                buf += chunk
                *lines, buf = buf.split(b"\n")
                if len(buf) > 65536:  # a child printing without newlines: do not grow forever
                    lines.append(buf)
                    buf = b""
                for raw in lines:
                    line = raw.decode("utf-8", "replace").rstrip("\r")
                    m = pattern.match(line)
                    if m and not ready.is_set():
                        status.ready_line = line
                        status.ready_fields = {k: v for k, v in m.groupdict().items()
                                               if v is not None}  # optional groups
                        status.state = "ready"
                        ready.set()
                        log.info("%s ready (pid %s): %s", spec.name, proc.pid, line)
                        if self.state is not None:
                            self.state.process_up(spec.role, spec.key)
                        self._notify(spec)
                    elif line:
                        log.info("%s: %s", spec.name, line)

    async def _stop(self, proc: trio.Process, spec: ChildSpec) -> None:
        """SIGTERM the child's process group, SIGKILL after the grace period, reap."""
        if proc.returncode is None:
            _killpg(proc.pid, signal.SIGTERM)
            with trio.move_on_after(self.stop_grace):
                await proc.wait()
            if proc.returncode is None:
                log.warning("%s ignored SIGTERM for %.1f s; killing it", spec.name, self.stop_grace)
                _killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        else:
            # The leader is gone; take anything it left behind in its group with it.
            _killpg(proc.pid, signal.SIGKILL)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
