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
from functools import partial
from typing import Any, Protocol

import trio

log = logging.getLogger("appliance.supervisor")

READY_PATTERNS = {
    "transceiver": re.compile(r"^transceiver (?P<id>\S+) listening on (?P<listen>\S+) control (?P<control>.+)$"),
    "relay": re.compile(
        r"^relay listening on (?P<listen>\S+) internal (?P<internal>\S+)(?: tcp (?P<tcp>\S+))?"),
}


def exception_leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups: what a failed child reports."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in exception_leaves(sub)]
    return [exc]


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
    #: keep a warm standby (``argv + --standby``) that takes over at once when the child
    #: dies (relay workers, issue 20), and a spare one (Supervisor.spare_standby, issue 32)
    standby: bool = False

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


#: The flag a standby is started with: it does its imports and reads its configuration,
#: then waits for ``go`` on stdin before it binds anything (EOF: it exits).
STANDBY_FLAG = "--standby"


class _Child:
    """One process of a spec: a life, a standby or a successor."""

    __slots__ = ("argv", "eof", "fields", "line", "proc", "ready", "warm")

    def __init__(self, proc: trio.Process, argv: list[str]) -> None:
        self.proc = proc
        self.argv = argv  # the spec's argv it was started for (without --standby)
        self.ready = trio.Event()
        self.eof = trio.Event()  # its stdout closed: it exited (or is about to)
        self.line: str | None = None
        self.fields: dict[str, str] = {}
        self.warm = False  # a standby that said its imports are done


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
        standby_delay: float = 1.0,
        spare_standby: bool = True,
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
        self.standby_delay = standby_delay
        #: a second standby per spec (issue 32): kills back to back, or one during the
        #: first standby's imports (1-4 s on a loaded host), still find a warm one
        self.spare_standby = spare_standby
        self._changed = trio.Event()
        self._nurseries: dict[str, trio.Nursery] = {}
        self._current: dict[str, _Child] = {}
        self._standby: dict[str, _Child] = {}  # the standby that takes over next
        self._spare: dict[str, _Child] = {}  # ... and the one after it (spare_standby)
        self._successor: dict[str, _Child] = {}
        self._rolling: set[str] = set()

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
        failed: StartupError | None = None
        try:
            async with trio.open_nursery() as nursery:
                self._nurseries[spec.name] = nursery
                if spec.standby:
                    nursery.start_soon(self._keep_standby, spec, nursery)
                    if self.spare_standby:
                        nursery.start_soon(self._keep_standby, spec, nursery, True)
                failed = await self._lives(spec, status, nursery)
                nursery.cancel_scope.cancel()
        finally:
            self._nurseries.pop(spec.name, None)
            status.state, status.pid = "stopped", None
            self._notify(spec)
        if failed is not None:
            raise failed  # outside the nursery: callers catch it unwrapped

    async def _lives(self, spec: ChildSpec, status: ChildStatus,
                     nursery: trio.Nursery) -> StartupError:
        """Run, watch and restart the child; returns only to give up on it."""
        backoff = self.backoff_initial
        failures_before_ready = 0
        ever_ready = False
        child = await self._start(spec, nursery)
        while True:
            started = trio.current_time()
            rc, was_ready = await self._one_life(spec, status, child)
            ever_ready |= was_ready
            successor = self._successor.pop(spec.name, None)
            if successor is not None:
                # A rolling restart (replace): the successor is ready and serving already;
                # this was the planned stop of its predecessor.
                status.last_exit, status.restarts = rc, status.restarts + 1
                child = successor
                continue
            status.last_exit, status.state, status.pid = rc, "backoff", None
            warm = self._warm_standby(spec) if was_ready else None
            if warm is not None:
                # Fast failover (issue 20): a standby that has done its imports takes over
                # at once; the backoff is for children that cannot start, which never get
                # here (was_ready).
                log.warning("%s exited with status %s; its standby takes over", spec.name, rc)
                status.delays.append(0.0)
                status.restarts += 1
                child = await self._start(spec, nursery)
                if self.state is not None:
                    await self.state.process_down(spec.role, spec.key, f"exited with status {rc}")
                continue
            if self.state is not None:
                await self.state.process_down(spec.role, spec.key, f"exited with status {rc}")
            if not ever_ready:
                failures_before_ready += 1
                if (self.startup_failures is not None
                        and failures_before_ready >= self.startup_failures):
                    return StartupError(
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
            child = await self._start(spec, nursery)

    # -- one process ---------------------------------------------------------------------

    async def _open(self, spec: ChildSpec, nursery: trio.Nursery, standby: bool) -> _Child:
        argv = [*spec.argv, STANDBY_FLAG] if standby else list(spec.argv)
        proc = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.PIPE if standby else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=self.env,
            start_new_session=True,  # own process group: we signal the group, never the terminal's
        )
        child = _Child(proc, list(spec.argv))
        nursery.start_soon(self._read_stdout, child, spec)
        return child

    @staticmethod
    def _usable(sb: _Child | None, spec: ChildSpec) -> bool:
        """``sb`` can take over (alive, started with today's argv)."""
        return (sb is not None and sb.proc.poll() is None and sb.argv == spec.argv
                and not sb.eof.is_set())

    def _warm_standby(self, spec: ChildSpec) -> _Child | None:
        """The standby to take over: a warm one (imports done) first — the other may still
        be importing, and one told ``go`` then makes the takeover wait for the rest of its
        imports (issue 32: 1-4 s on a loaded host, every call's gap) — else one still
        starting, which is still sooner than a fresh process."""
        usable = [sb for sb in (self._standby.get(spec.name), self._spare.get(spec.name))
                  if sb is not None and self._usable(sb, spec)]
        warm = [sb for sb in usable if sb.warm]
        if warm:
            return warm[0]
        return usable[0] if usable else None

    async def _start(self, spec: ChildSpec, nursery: trio.Nursery,
                     use_standby: bool = True) -> _Child:
        """The next life of ``spec``: its warm standby, told to go, or a fresh process."""
        warm = self._warm_standby(spec) if use_standby else None
        others = [sb for sb in (self._standby.pop(spec.name, None),
                                self._spare.pop(spec.name, None))
                  if sb is not None and sb is not warm]
        if use_standby:
            for sb in others:
                if self._usable(sb, spec) and spec.name not in self._standby:
                    self._standby[spec.name] = sb  # the other one is next in line
        stale = [sb for sb in others if self._standby.get(spec.name) is not sb]
        if warm is not None:
            assert warm.proc.stdin is not None
            try:
                await warm.proc.stdin.send_all(b"go\n")
                await warm.proc.stdin.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                warm = None  # it died just now: start afresh
            else:
                log.info("%s: standby pid %d takes over", spec.name, warm.proc.pid)
                for sb in stale:
                    nursery.start_soon(self._stop_quietly, sb, spec)
                return warm
        for sb in stale:
            with trio.move_on_after(self.stop_grace + 2, shield=True):
                await self._stop(sb.proc, spec)
        child = await self._open(spec, nursery, standby=False)
        log.info("started %s (pid %d)", spec.name, child.proc.pid)
        return child

    async def _stop_quietly(self, sb: _Child, spec: ChildSpec) -> None:
        with trio.move_on_after(self.stop_grace + 2, shield=True):
            await self._stop(sb.proc, spec)

    async def _keep_standby(self, spec: ChildSpec, nursery: trio.Nursery,
                            spare: bool = False) -> None:
        """Keep one standby of ``spec`` warm: started (``--standby``: imports done, nothing
        bound) once the current life is ready, so that its start-up never competes with
        the child's; replaced when consumed or when the argv changes. With ``spare``, the
        second one (:attr:`spare_standby`): started only once the first is warm, so two
        standbys never import at once; when the first takes over, the spare moves up."""
        name = spec.name
        status = self.status[name]
        slot = self._spare if spare else self._standby

        def needed() -> bool:
            if status.state != "ready" or name in self._rolling:
                return False
            if spare:
                first = self._standby.get(name)
                return (first is not None and first.warm and self._usable(first, spec)
                        and not self._usable(slot.get(name), spec))
            return not self._usable(slot.get(name), spec)

        try:
            while True:
                await self.wait_until(needed)
                # Not at once: its imports take a core for a second or more, which must
                # not compete with the child that just took over (and its re-learning).
                await trio.sleep(self.standby_delay)
                if not needed():
                    continue
                if not spare and self._usable(self._spare.get(name), spec):
                    slot[name] = self._spare.pop(name)  # the spare moves up
                    self._notify(spec)
                    continue
                stale = slot.pop(name, None)
                if stale is not None:
                    with trio.move_on_after(self.stop_grace + 2, shield=True):
                        await self._stop(stale.proc, spec)
                sb = await self._open(spec, nursery, standby=True)
                slot[name] = sb
                log.info("%s: %sstandby started (pid %d)", name, "spare " if spare else "",
                         sb.proc.pid)
                self._notify(spec)
                await self.wait_until(partial(self._standby_gone, name, sb, slot))
                if sb.eof.is_set() and slot.get(name) is sb:
                    # It exited on its own (a bad flag, a crash at import): do not spin.
                    log.warning("%s: standby exited before it was needed", name)
                    await trio.sleep(self.backoff_max)
        finally:
            left = slot.pop(name, None)
            if left is not None:
                with trio.move_on_after(self.stop_grace + 2, shield=True):
                    await self._stop(left.proc, spec)

    def _standby_gone(self, name: str, sb: _Child,
                      slot: dict[str, _Child] | None = None) -> bool:
        slot = self._standby if slot is None else slot
        return slot.get(name) is not sb or sb.eof.is_set()

    async def _one_life(self, spec: ChildSpec, status: ChildStatus,
                        child: _Child) -> tuple[int, bool]:
        """Run one life of the child until it exits: (exit status, whether it was ready)."""
        proc = child.proc
        self._current[spec.name] = child
        status.pid, status.state, status.ready_line = proc.pid, "starting", None
        if child.ready.is_set():  # a successor handed over ready (replace)
            self._mark_ready(spec, child)
        self._notify(spec)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._ready_deadline, proc, spec, child.ready)
                rc = await proc.wait()
                nursery.cancel_scope.cancel()
            return rc, child.ready.is_set()
        finally:
            with trio.move_on_after(self.stop_grace + 2, shield=True):
                await self._stop(proc, spec)

    def _mark_ready(self, spec: ChildSpec, child: _Child) -> None:
        status = self.status[spec.name]
        status.ready_line, status.ready_fields = child.line, dict(child.fields)
        status.state = "ready"
        log.info("%s ready (pid %s): %s", spec.name, child.proc.pid, child.line)
        if self.state is not None:
            self.state.process_up(spec.role, spec.key)
        self._notify(spec)

    async def _ready_deadline(self, proc: trio.Process, spec: ChildSpec, ready: trio.Event) -> None:
        if self.ready_timeout is None:
            return  # no deadline: the child may take as long as it needs to start
        with trio.move_on_after(self.ready_timeout):
            await ready.wait()
            return
        log.error("%s not ready after %.0f s; stopping it", spec.name, self.ready_timeout)
        await self._stop(proc, spec)

    async def _read_stdout(self, child: _Child, spec: ChildSpec) -> None:
        proc = child.proc
        assert proc.stdout is not None
        buf = b""
        pattern = READY_PATTERNS[spec.role]
        try:
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
                        if m and not child.ready.is_set():
                            child.line = line
                            child.fields = {k: v for k, v in m.groupdict().items()
                                            if v is not None}  # optional groups
                            child.ready.set()
                            if self._current.get(spec.name) is child:
                                self._mark_ready(spec, child)
                            else:
                                self._notify(spec)  # a successor (replace) is ready
                        elif line == f"{spec.role} standby warm":
                            child.warm = True
                            log.info("%s: standby pid %d warm", spec.name, proc.pid)
                            self._notify(spec)
                        elif line:
                            log.info("%s: %s", spec.name, line)
        finally:
            child.eof.set()
            self._notify(spec)

    # -- rolling restarts (issue 20: SIGHUP) ---------------------------------------------

    async def replace(self, name: str) -> bool:
        """Make-before-break restart of child ``name`` with a *fresh* process (a standby
        runs the code it was started with; a roll is how a new version goes in): start
        it, wait for its ready line, make it current, then stop its predecessor. A
        successor that fails to start is stopped and the predecessor kept; False then."""
        spec, status = self.specs[name], self.status[name]
        nursery = self._nurseries.get(name)
        old = self._current.get(name)
        if nursery is None or old is None or status.state != "ready":
            return False
        self._rolling.add(name)
        try:
            for stale in (self._standby.pop(name, None), self._spare.pop(name, None)):
                if stale is not None:  # it runs the old code
                    with trio.move_on_after(self.stop_grace + 2, shield=True):
                        await self._stop(stale.proc, spec)
            child = await self._open(spec, nursery, standby=False)
            log.info("%s: successor started (pid %d)", name, child.proc.pid)
            try:
                with trio.move_on_after(self.ready_timeout or 120.0):
                    await self.wait_until(lambda: child.ready.is_set() or child.eof.is_set())
            finally:
                if not child.ready.is_set():  # failed, or we were cancelled: no orphan
                    with trio.move_on_after(self.stop_grace + 2, shield=True):
                        await self._stop(child.proc, spec)
            if not child.ready.is_set():
                log.error("%s: successor pid %d did not become ready; keeping pid %d",
                          name, child.proc.pid, old.proc.pid)
                return False
            self._successor[name] = child
            with trio.move_on_after(self.stop_grace + 2, shield=True):
                await self._stop(old.proc, spec)
            await self.wait_until(lambda: self._current.get(name) is child)
            return True
        finally:
            self._rolling.discard(name)
            self._notify(spec)

    async def roll(self, names: Sequence[str]) -> list[bool]:
        """Replace these children one at a time (:meth:`replace`), in order."""
        done = []
        for name in names:
            log.info("rolling restart: %s", name)
            done.append(await self.replace(name))
        return done

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
