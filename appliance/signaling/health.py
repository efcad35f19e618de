"""Process health: the control peers (transceivers, relay workers), whether each is up,
what it last reported, and readiness.

Endpoints are believed up until proven otherwise: under ``appliance up`` the supervisor flips
them (:meth:`ProcessHealth.process_down` / :meth:`ProcessHealth.process_up`) as children die
and come back; run alone (``managed=False``), :meth:`ProcessHealth.refresh` does it after
:data:`LOST_AFTER` consecutive failed polls. A transceiver going down is reported to the
``on_transceiver_lost`` callback (the registry ends its sessions).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from ..control import ControlClient, ControlError

# The name these log lines had before health left state.py (log filters key on it).
log = logging.getLogger("appliance.signaling.state")

POLL_TIMEOUT = 1.0  # a stats/list poll that takes longer counts as a failure
LOST_AFTER = 3  # consecutive failed polls before a standalone signaling gives up on a peer


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu(pid: int) -> tuple[float, frozenset[int]] | None:
    """CPU seconds a process (all its threads) has used, from ``/proc/PID/stat``, and its
    affinity; None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        fields = raw[raw.rindex(b")") + 2:].split()  # after "pid (comm) ": state is [0]
        cpu_s = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
        return cpu_s, frozenset(os.sched_getaffinity(pid))
    except (OSError, ValueError, IndexError):
        return None


class StatsObserver(Protocol):
    """Who learns from the transceivers' ``stats`` answers (admission.py)."""

    def asked(self, k: int) -> int: ...
    def report(self, k: int, stats: dict[str, Any], mark: int) -> None: ...
    def forget(self, k: int) -> None: ...
    def sampled(self, now: float, procs: Mapping[str, tuple[float, frozenset[int]]],
                cpus: Mapping[int, frozenset[int]]) -> None: ...


@dataclass
class Endpoint:
    """One control peer (a transceiver or a relay worker) and what we last heard from it."""

    role: str
    key: str
    address: str
    client: ControlClient
    up: bool = True
    failures: int = 0
    last_ok: float | None = None  # trio time
    last_error: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    process: dict[str, Any] = field(default_factory=dict)  # pid/restarts from the supervisor

    def view(self, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": self.role,
            "id": self.key,
            "control": self.address,
            "up": self.up,
            "answering": self.failures == 0 and self.last_ok is not None,
            "last_ok_age_s": None if self.last_ok is None else round(now - self.last_ok, 3),
            "error": self.last_error,
            "counters": self.stats.get("counters", {}),
        }
        if "sessions_by_state" in self.stats:
            out["sessions_by_state"] = self.stats["sessions_by_state"]
        if "flows" in self.stats:
            out["flows"] = self.stats["flows"]
        if isinstance(self.stats.get("load"), dict):  # headroom (issue 23)
            out["load"] = self.stats["load"]
        out.update(self.process)
        return out


class ProcessHealth:
    def __init__(
        self,
        transceivers: Mapping[int, str],
        relays: Mapping[str, str],
        *,
        control_timeout: float,
        managed: bool,
        clock: Callable[[], float],
        on_transceiver_lost: Callable[[int], object],
    ) -> None:
        self.transceivers: dict[int, Endpoint] = {
            int(k): Endpoint("transceiver", str(k), a, ControlClient(a, timeout=control_timeout))
            for k, a in sorted(transceivers.items())
        }
        self.relays: dict[str, Endpoint] = {
            str(k): Endpoint("relay", str(k), a, ControlClient(a, timeout=control_timeout))
            for k, a in sorted(relays.items())
        }
        self.managed = managed  # True under the supervisor: it, not polling, decides who is lost
        self.clock = clock
        self.started_at = clock()
        self.supervisor_info: dict[str, Any] = {}
        self._lost = on_transceiver_lost
        self.observer: StatsObserver | None = None  # set by SignalingState (admission)

    def endpoints(self) -> list[Endpoint]:
        return [*self.transceivers.values(), *self.relays.values()]

    def up_transceivers(self) -> list[int]:
        return [k for k, ep in self.transceivers.items() if ep.up]

    def _endpoint(self, role: str, key: str) -> Endpoint | None:
        return self.transceivers.get(int(key)) if role == "transceiver" else self.relays.get(key)

    # -- what the supervisor tells us -----------------------------------------------------

    def process_info(self, role: str, key: str, **info: Any) -> None:
        """The supervisor reports pid, restarts, state of the child behind an endpoint."""
        ep = self._endpoint(role, key)
        if ep is not None:
            ep.process.update(info)

    def process_up(self, role: str, key: str) -> None:
        ep = self._endpoint(role, key)
        if ep is not None:
            ep.up = True
            ep.failures = 0
            ep.last_error = None
            if role == "transceiver" and self.observer is not None:
                self.observer.forget(int(key))

    async def process_down(self, role: str, key: str, reason: str = "process exited") -> None:
        """A child is gone: stop routing to it and, for a transceiver, end its sessions."""
        ep = self._endpoint(role, key)
        if ep is None:
            return
        ep.up = False
        ep.last_error = reason
        ep.stats = {}
        await ep.client.aclose()  # the next request reconnects to the new process
        if role == "transceiver":
            if self.observer is not None:
                self.observer.forget(int(key))
            self._lost(int(key))

    # -- what polling finds out -----------------------------------------------------------

    async def refresh(self) -> None:
        """Poll every endpoint's ``stats`` once (bounded by :data:`POLL_TIMEOUT`)."""

        async def one(ep: Endpoint) -> None:
            ok = False
            mark = self._asked(ep)
            with trio.move_on_after(POLL_TIMEOUT):
                try:
                    resp = await ep.client.request({"op": "stats"})
                    ok = bool(resp.get("ok"))
                    if ok:
                        ep.stats = {k: v for k, v in resp.items() if k != "ok"}
                        self._answered(ep, mark)
                    else:
                        ep.last_error = str(resp.get("detail"))
                except ControlError as exc:
                    ep.last_error = str(exc)
            if ok:
                if not ep.up and not self.managed:
                    log.info("%s %s answers again", ep.role, ep.key)
                    ep.up = True
                ep.failures, ep.last_ok, ep.last_error = 0, trio.current_time(), None
                return
            if ep.last_error is None:
                ep.last_error = f"no answer within {POLL_TIMEOUT:.1f} s"
            ep.failures += 1
            if not self.managed and ep.up and ep.failures >= LOST_AFTER:
                log.warning("%s %s stopped answering: %s", ep.role, ep.key, ep.last_error)
                ep.up = False
                if ep.role == "transceiver":
                    self._lost(int(ep.key))

        async with trio.open_nursery() as nursery:
            for ep in self.endpoints():
                nursery.start_soon(one, ep)
        if self.managed and self.observer is not None:
            self.observer.sampled(trio.current_time(), *self.colocated())

    def colocated(self) -> tuple[dict[str, tuple[float, frozenset[int]]],
                                 dict[int, frozenset[int]]]:
        """Under the supervisor, what admission needs to count our other processes' CPU
        as a per-call cost (admission.py, :class:`~.admission.Neighbours`): CPU seconds and
        affinity of this process (signaling and the supervisor) and of each relay worker,
        keyed by role and pid; and each transceiver's affinity. The pids are the
        supervisor's, so only processes of this appliance on this host are counted."""
        times = os.times()
        procs = {f"signaling {os.getpid()}": (times.user + times.system,
                                              frozenset(os.sched_getaffinity(0)))}
        for ep in self.relays.values():
            pid = ep.process.get("pid")
            sample = process_cpu(pid) if isinstance(pid, int) and ep.up else None
            if sample is not None:
                procs[f"relay {ep.key} {pid}"] = sample
        cpus: dict[int, frozenset[int]] = {}
        for k, ep in self.transceivers.items():
            pid = ep.process.get("pid")
            if isinstance(pid, int) and ep.up:
                try:
                    cpus[k] = frozenset(os.sched_getaffinity(pid))
                except OSError:
                    pass  # gone between the supervisor's word and now
        return procs, cpus

    async def ready(self) -> tuple[bool, dict[str, Any]]:
        """Ready when at least one transceiver and one relay worker answer ``stats`` now."""
        answering: dict[str, list[str]] = {"transceiver": [], "relay": []}

        async def one(ep: Endpoint) -> None:
            mark = self._asked(ep)
            with trio.move_on_after(POLL_TIMEOUT):
                try:
                    resp = await ep.client.request({"op": "stats"})
                except ControlError:
                    return
                if resp.get("ok"):
                    answering[ep.role].append(ep.key)
                    ep.stats = {k: v for k, v in resp.items() if k != "ok"}
                    self._answered(ep, mark)

        async with trio.open_nursery() as nursery:
            for ep in self.endpoints():
                if ep.up:
                    nursery.start_soon(one, ep)
        ok = bool(answering["transceiver"]) and bool(answering["relay"])
        return ok, {"transceivers": sorted(answering["transceiver"]), "relays": sorted(answering["relay"])}

    def _asked(self, ep: Endpoint) -> int:
        if ep.role != "transceiver" or self.observer is None:
            return 0
        return self.observer.asked(int(ep.key))

    def _answered(self, ep: Endpoint, mark: int) -> None:
        if ep.role == "transceiver" and self.observer is not None:
            self.observer.report(int(ep.key), ep.stats, mark)

    def health_view(self) -> list[dict[str, Any]]:
        now = trio.current_time()
        me: dict[str, Any] = {
            "role": "signaling",
            "id": "0",
            "up": True,
            "answering": True,
            "pid": os.getpid(),
            "uptime_s": round(self.clock() - self.started_at, 3),
        }
        me.update(self.supervisor_info)
        return [me, *(ep.view(now) for ep in self.endpoints())]

    async def aclose(self) -> None:
        for ep in self.endpoints():
            await ep.client.aclose()
