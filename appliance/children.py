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
  ``stop_grace`` seconds, then reaped — nothing is orphaned;
* a spec with ``standby`` (relay workers) also has a *fork template*: the same command with
  ``--standby``, started once the child is ready, which does its imports, says it is warm
  and then forks a new life on each ``go`` (:func:`serve_fork_template`) — milliseconds,
  where a fresh interpreter takes 1-7 s on a loaded host — and stays warm for the next one.
  Its stdin is a ``SOCK_SEQPACKET`` control socket: ``go`` carries the new life's stdout
  pipe, the answer a pidfd of it. A forked life is the template's child, not ours: it is
  watched, signalled and waited for through that pidfd (:class:`_ForkedProcess`), its exit
  status reported by the template, and stopped like any other life when the nursery is
  cancelled. The template runs no trio loop (it would not survive a fork); each forked
  life starts its own. A role may give the template more to serve on its selector
  (:class:`TemplateSource`: the relay's keeper of TCP connections, relay/keeper.py); the
  fork closes every descriptor of theirs before the worker runs.

An optional *observer* (signaling's state, for ``up``) is told when a child starts, becomes
ready and exits, so a dead transceiver's sessions are reported ended at once.
"""

from __future__ import annotations

import array
import logging
import os
import re
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import traceback
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
    #: keep a warm standby (``argv + --standby``) that forks the next life at once when the
    #: child dies (relay workers, issues 20 and 32: a fork template, serve_fork_template)
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
#: says it is warm, then serves as a *fork template* (:func:`serve_fork_template`): each
#: ``go`` on its control socket (its stdin) forks one ready worker, in milliseconds, and the
#: template stays warm for the next one (issue 32: kills back to back drained standbys that
#: each had to import for 1-7 s on a loaded host). It binds nothing itself.
STANDBY_FLAG = "--standby"

#: A fork template's messages (one per SOCK_SEQPACKET datagram): the supervisor sends
#: ``go`` with the write end of the new worker's stdout pipe (SCM_RIGHTS); the template
#: answers ``pid N`` with a pidfd of the worker, and ``exit N RC`` once it has reaped it.
_GO = b"go"


class TemplateSource(Protocol):
    """Something a fork template serves beside its control socket, on its selector (no trio
    there): the relay's keeper of TCP connections (relay/keeper.py)."""

    def register(self, sel: selectors.BaseSelector) -> None:
        """Register its descriptors on ``sel``, each key's ``data`` a callable taking the
        ready events mask; it may register and unregister more from those callables."""
        ...

    def close_in_fork(self) -> None:
        """In a fork, before the worker runs: close every descriptor it holds (the worker
        must not keep the template's copies open)."""
        ...


def serve_fork_template(run: Callable[[], int], warm_line: str,
                        sources: Sequence[TemplateSource] = ()) -> int:
    """The template side, called by a standby once its imports are done and before any
    trio loop has started (a process that ran trio must not fork: its loop, threads and
    wake-up fds would be half copied). Forks ``run`` (the worker: it starts its own trio
    loop, binds with ``SO_REUSEPORT`` as any worker does) for each ``go``; reaps the
    workers and reports their exit; serves ``sources`` (:class:`TemplateSource`) on the
    same selector; returns 0 at EOF (the supervisor stopped wanting it).
    Workers outlive their template: the supervisor watches and stops them by pidfd."""
    try:
        ctl = socket.socket(fileno=0)
    except OSError:
        print("a fork template needs a socket on stdin", file=sys.stderr)
        return 2
    if ctl.type != socket.SOCK_SEQPACKET:
        print("a fork template needs a SOCK_SEQPACKET socket on stdin", file=sys.stderr)
        return 2
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ)
    for source in sources:
        source.register(sel)
    live: dict[int, int] = {}  # pidfd -> pid of a worker not yet reaped
    print(warm_line, flush=True)
    while True:
        for key, mask in sel.select():
            if key.data is not None:  # a source's
                key.data(mask)
            elif key.fileobj is ctl:
                try:
                    msg, fds, _, _ = socket.recv_fds(ctl, 64, 1)
                except OSError:
                    msg, fds = b"", []
                if not msg:  # EOF: the supervisor closed it (stopping, or a stale argv)
                    for fd in fds:
                        os.close(fd)
                    return 0
                if msg != _GO or len(fds) != 1:
                    for fd in fds:
                        os.close(fd)
                    continue
                out = fds[0]
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _forked_worker(run, out, ctl, sel, live, sources)  # never returns
                os.close(out)
                pidfd = os.pidfd_open(pid)
                live[pidfd] = pid
                sel.register(pidfd, selectors.EVENT_READ)
                try:
                    socket.send_fds(ctl, [b"pid %d" % pid], [pidfd])
                except OSError:
                    pass  # the supervisor went away; EOF comes next
            else:
                pidfd = key.fd
                pid = live.pop(pidfd)
                sel.unregister(pidfd)
                _, status = os.waitpid(pid, 0)
                os.close(pidfd)
                try:
                    ctl.send(b"exit %d %d" % (pid, os.waitstatus_to_exitcode(status)))
                except OSError:
                    pass


def _forked_worker(run: Callable[[], int], out: int, ctl: socket.socket,
                   sel: selectors.BaseSelector, live: dict[int, int],
                   sources: Sequence[TemplateSource] = ()) -> None:
    """In the fork: a process of its own (own session, stdout the supervisor's new pipe,
    nothing of the template's control channel nor of its sources), then the worker; never
    returns."""
    code = 1
    try:
        os.setsid()  # its own process group, as a child the supervisor started would be
        sel.close()
        for source in sources:
            source.close_in_fork()
        ctl.close()  # fd 0
        for fd in live:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        if null != 0:
            os.dup2(null, 0)
            os.close(null)
        os.dup2(out, 1)
        os.close(out)
        code = run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a worker's crash is reported, not propagated
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class _ForkedProcess:
    """A worker forked by a template: not our child (the template reaps it), watched
    through its pidfd; what :class:`_Child` and :meth:`Supervisor._stop` use of a
    ``trio.Process``."""

    def __init__(self, pid: int, pidfd: int, stdout: trio.lowlevel.FdStream) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.stdout = stdout
        self.stdin: None = None
        self.returncode: int | None = None
        self.exited = trio.Event()  # the pidfd said so
        self.status = trio.Event()  # the template said how (``exit N RC``)

    def poll(self) -> int | None:
        return self.returncode

    async def watch(self, status_within: float) -> None:
        """Wait for the exit (pidfd readable), then for the template's report of the exit
        status; -1 if it never comes (the template died meanwhile). Shielded: whoever
        stops the worker (:meth:`Supervisor._stop`, always, a life's ``finally``) waits
        for its real exit, so a cancelled supervisor returns only once it is gone."""
        with trio.CancelScope(shield=True):
            try:
                await trio.lowlevel.wait_readable(self.pidfd)
                with trio.move_on_after(status_within):
                    await self.status.wait()
            finally:
                if self.returncode is None:
                    self.returncode = -1
                self.exited.set()
                os.close(self.pidfd)

    async def wait(self) -> int:
        await self.exited.wait()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.exited.is_set():
            return
        try:
            signal.pidfd_send_signal(self.pidfd, sig)
        except ProcessLookupError:
            pass


class _Template:
    """The supervisor's end of a fork template's control socket."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.lock = trio.Lock()  # one ``go`` at a time: replies come in order
        self.replies_send, self.replies = trio.open_memory_channel[tuple[int, int]](1)
        self.forked: dict[int, _ForkedProcess] = {}
        self.early_exits: dict[int, int] = {}  # exit reports that beat their ``pid`` reader


class _Child:
    """One process of a spec: a life, a standby (fork template) or a successor."""

    __slots__ = ("argv", "eof", "fields", "line", "proc", "ready", "template", "warm")

    def __init__(self, proc: trio.Process | _ForkedProcess, argv: list[str],
                 template: _Template | None = None) -> None:
        self.proc = proc
        self.argv = argv  # the spec's argv it was started for (without --standby)
        self.ready = trio.Event()
        self.eof = trio.Event()  # its stdout closed: it exited (or is about to)
        self.line: str | None = None
        self.fields: dict[str, str] = {}
        self.warm = False  # a standby that said its imports are done
        self.template = template  # a standby's control socket


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
        fork_timeout: float = 5.0,
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
        #: how long a fork template may take to answer ``go`` before a fresh process is
        #: started instead (it never does unless it is wedged: a dead one is EOF at once)
        self.fork_timeout = fork_timeout
        self._changed = trio.Event()
        self._nurseries: dict[str, trio.Nursery] = {}
        self._current: dict[str, _Child] = {}
        self._standby: dict[str, _Child] = {}  # the fork template of each spec
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
        try:
            return await self._lives_loop(spec, status, nursery)
        finally:
            # A life started but cancelled before its _one_life (which stops it) ran.
            child = self._current.get(spec.name)
            if child is not None and child.proc.returncode is None:
                with trio.move_on_after(self.stop_grace + 2, shield=True):
                    await self._stop(child.proc, spec)

    async def _lives_loop(self, spec: ChildSpec, status: ChildStatus,
                          nursery: trio.Nursery) -> StartupError:
        backoff = self.backoff_initial
        failures_before_ready = 0
        ever_ready = False
        killed_unready = 0  # forked lives in a row killed before their ready line
        child = await self._start(spec, nursery)
        self._current[spec.name] = child
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
            # A forked life killed by a signal before its ready line (issue 32: a second
            # kill 0.3 s after the first, on a loaded host, hit a successor still
            # binding; the 0.5 s backoff then cost every call 540 ms) is a takeover cut
            # short, not a child that cannot start (those exit with a status, and get
            # the backoff); a few in a row at most, so a crash at start cannot spin.
            cut_short = (not was_ready and ever_ready and rc < 0 and killed_unready < 3
                         and isinstance(child.proc, _ForkedProcess))
            killed_unready = killed_unready + 1 if cut_short else 0
            warm = self._warm_standby(spec) if was_ready or cut_short else None
            if warm is not None:
                # Fast failover (issue 20): the standby, imports done, forks the next life
                # at once (issue 32: and stays warm for the one after); the backoff is for
                # children that cannot start, which never get here (was_ready).
                log.warning("%s exited with status %s; its standby forks the next", spec.name, rc)
                status.delays.append(0.0)
                status.restarts += 1
                child = await self._start(spec, nursery)
                self._current[spec.name] = child
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
            self._current[spec.name] = child

    # -- one process ---------------------------------------------------------------------

    async def _open(self, spec: ChildSpec, nursery: trio.Nursery, standby: bool) -> _Child:
        argv = [*spec.argv, STANDBY_FLAG] if standby else list(spec.argv)
        ours: socket.socket | None = None
        theirs: socket.socket | None = None
        if standby:  # its stdin: the fork template's control socket
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = await trio.lowlevel.open_process(
                argv,
                stdin=subprocess.DEVNULL if theirs is None else theirs.fileno(),
                stdout=subprocess.PIPE,
                env=self.env,
                start_new_session=True,  # own process group: we signal the group, never the terminal's
            )
        except BaseException:
            if ours is not None:
                ours.close()
            raise
        finally:
            if theirs is not None:
                theirs.close()
        template = None if ours is None else _Template(trio.socket.from_stdlib_socket(ours))
        child = _Child(proc, list(spec.argv), template)
        nursery.start_soon(self._read_stdout, child, spec)
        if template is not None:
            nursery.start_soon(self._read_template, template)
        return child

    async def _read_template(self, tpl: _Template) -> None:
        """A template's messages: the pid (and pidfd) of each worker it forked, in the
        order asked, and each one's exit status once reaped."""
        try:
            await self._template_messages(tpl)
        finally:
            tpl.sock.close()
            tpl.replies_send.close()
            for forked in tpl.forked.values():  # no status will come: do not wait for it
                forked.status.set()
            tpl.forked.clear()

    async def _template_messages(self, tpl: _Template) -> None:
        """Until EOF: each ``pid N`` (+ pidfd) to the ``go`` waiting for it, each
        ``exit N RC`` to its forked process."""
        while True:
            try:
                msg, anc, _flags, _addr = await tpl.sock.recvmsg(
                    64, socket.CMSG_SPACE(array.array("i", [0]).itemsize))
            except OSError:
                msg, anc = b"", []
            fds = array.array("i")
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
            if not msg:
                for fd in fds:
                    os.close(fd)
                return  # it exited: waiters of a reply see the channel closed
            words = msg.split()
            if words[:1] == [b"pid"] and len(words) == 2 and len(fds) == 1:
                try:
                    tpl.replies_send.send_nowait((int(words[1]), fds[0]))
                except trio.WouldBlock:  # nobody asked: a protocol slip; do not leak
                    os.close(fds[0])
                continue
            for fd in fds:
                os.close(fd)
            if words[:1] == [b"exit"] and len(words) == 3:
                pid, rc = int(words[1]), int(words[2])
                forked = tpl.forked.pop(pid, None)
                if forked is None:  # before its go's task took the pid: it looks here
                    tpl.early_exits[pid] = rc
                else:
                    forked.returncode = rc
                    forked.status.set()

    async def _fork(self, sb: _Child, spec: ChildSpec, nursery: trio.Nursery) -> _Child | None:
        """Ask the template ``sb`` for a new life of ``spec``; None if it cannot."""
        tpl = sb.template
        if tpl is None:
            return None
        async with tpl.lock:
            r, w = os.pipe()
            try:
                try:
                    await tpl.sock.sendmsg(
                        [_GO], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [w]))])
                finally:
                    os.close(w)
                # Shielded: a fork asked for is received (and so stopped by its life's
                # finally), never left running unknown to us by a cancellation.
                with trio.move_on_after(self.fork_timeout, shield=True):
                    pid, pidfd = await tpl.replies.receive()
                    stdout = trio.lowlevel.FdStream(r)
                    r = -1
                    proc = _ForkedProcess(pid, pidfd, stdout)
                    if pid in tpl.early_exits:
                        proc.returncode = tpl.early_exits.pop(pid)
                        proc.status.set()
                    else:
                        tpl.forked[pid] = proc
                    nursery.start_soon(proc.watch, self.stop_grace)
                    child = _Child(proc, list(spec.argv))
                    nursery.start_soon(self._read_stdout, child, spec)
                    return child
                log.error("%s: standby pid %d did not fork within %.1f s", spec.name,
                          sb.proc.pid, self.fork_timeout)
                return None
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                    trio.EndOfChannel):
                return None  # it died just now
            finally:
                if r >= 0:
                    os.close(r)

    @staticmethod
    def _usable(sb: _Child | None, spec: ChildSpec) -> bool:
        """``sb`` can take over (alive, started with today's argv)."""
        return (sb is not None and sb.proc.poll() is None and sb.argv == spec.argv
                and not sb.eof.is_set())

    def _warm_standby(self, spec: ChildSpec) -> _Child | None:
        """The fork template to take over, if it is warm (imports done). One still
        importing is not waited for (issue 32: 1-7 s on a loaded host, every call's gap):
        a fresh process is no later, and the template is then still there for the next."""
        sb = self._standby.get(spec.name)
        return sb if sb is not None and sb.warm and self._usable(sb, spec) else None

    async def _start(self, spec: ChildSpec, nursery: trio.Nursery,
                     use_standby: bool = True) -> _Child:
        """The next life of ``spec``: forked by its warm template, or a fresh process."""
        sb = self._warm_standby(spec) if use_standby else None
        if sb is not None:
            child = await self._fork(sb, spec, nursery)
            if child is not None:
                log.info("%s: standby pid %d forked pid %d", spec.name, sb.proc.pid,
                         child.proc.pid)
                return child
        child = await self._open(spec, nursery, standby=False)
        log.info("started %s (pid %d)", spec.name, child.proc.pid)
        return child

    async def _keep_standby(self, spec: ChildSpec, nursery: trio.Nursery) -> None:
        """Keep the fork template of ``spec`` warm: started (``--standby``: imports done,
        nothing bound) once the current life is ready, so that its start-up never competes
        with the child's; it stays across takeovers (each is a fork); replaced when it
        exits or when the argv changes, stopped during a rolling restart."""
        name = spec.name
        status = self.status[name]

        def needed() -> bool:
            if status.state != "ready" or name in self._rolling:
                return False
            return not self._usable(self._standby.get(name), spec)

        try:
            while True:
                await self.wait_until(needed)
                # Not at once: its imports take a core for a second or more, which must
                # not compete with the child that just took over (and its re-learning).
                await trio.sleep(self.standby_delay)
                if not needed():
                    continue
                stale = self._standby.pop(name, None)
                if stale is not None:
                    with trio.move_on_after(self.stop_grace + 2, shield=True):
                        await self._stop(stale.proc, spec)
                sb = await self._open(spec, nursery, standby=True)
                self._standby[name] = sb
                log.info("%s: standby started (pid %d)", name, sb.proc.pid)
                self._notify(spec)
                await self.wait_until(partial(self._standby_gone, name, sb))
                if sb.eof.is_set() and self._standby.get(name) is sb and not sb.warm:
                    # It exited before it was warm (a bad flag, a crash at import): do
                    # not spin.
                    log.warning("%s: standby exited before it was warm", name)
                    await trio.sleep(self.backoff_max)
        finally:
            left = self._standby.pop(name, None)
            if left is not None:
                with trio.move_on_after(self.stop_grace + 2, shield=True):
                    await self._stop(left.proc, spec)

    def _standby_gone(self, name: str, sb: _Child) -> bool:
        return self._standby.get(name) is not sb or sb.eof.is_set()

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

    async def _ready_deadline(self, proc: trio.Process | _ForkedProcess, spec: ChildSpec, ready: trio.Event) -> None:
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
            stale = self._standby.pop(name, None)
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

    async def _stop(self, proc: trio.Process | _ForkedProcess, spec: ChildSpec) -> None:
        """SIGTERM the child's process group, SIGKILL after the grace period, reap (a
        forked worker: signalled through its pidfd too, and its exit waited for)."""
        if proc.returncode is None:
            _signal(proc, signal.SIGTERM)
            with trio.move_on_after(self.stop_grace):
                await proc.wait()
            if proc.returncode is None:
                log.warning("%s ignored SIGTERM for %.1f s; killing it", spec.name, self.stop_grace)
                _signal(proc, signal.SIGKILL)
                await proc.wait()
        elif not isinstance(proc, _ForkedProcess):
            # The leader is gone; take anything it left behind in its group with it.
            _killpg(proc.pid, signal.SIGKILL)


def _signal(proc: trio.Process | _ForkedProcess, sig: int) -> None:
    if isinstance(proc, _ForkedProcess):
        # Exact, even before it made its own group (setsid); never by pid: its template
        # reaps it, so once it has exited the number may be someone else's. (A relay
        # worker starts no processes of its own.)
        proc.send_signal(sig)
    else:
        _killpg(proc.pid, sig)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
