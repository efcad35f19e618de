"""The media processes' CPU priority (issue 41 item 1; docs/operations.md "CPU priority").

A call's audio is due every 20 ms; a batch job on the same host is not. The kernel's
scheduler does not know that: on a 2-CPU host beside one CPU-bound process
(``bench/capacity.py`` placement c), 120 echo calls at 15/s had a round trip of 68-88 ms
p99 and admission took 81-97 of them; with the appliance's processes at nice -10 the same
run admitted all 120 at 19-29 ms p99 (2026-12-06, docs/performance.md "CPU priority
beside a hog"). Audio servers on Linux do the same: PipeWire and PulseAudio run at nice -11.

So ``appliance up``, ``appliance transceiver`` and ``appliance relay`` (every worker life,
forked ones included) start by raising their own priority to ``--nice`` (default
:data:`MEDIA_NICE`; ``0`` leaves it alone). Two knobs, because either can be the one that
decides:

* the **nice value of every thread** of the process (``setpriority``: on Linux nice is per
  thread, and threads started later inherit it from the one that starts them);
* the **autogroup's nice** (``/proc/self/autogroup``): with ``kernel.sched_autogroup_enabled``
  (the default on most distributions) CPU time is shared first between *sessions*, and a
  thread's nice counts only within its own. Every child of ``up`` runs in a session of its
  own (``children.py``), so without this a neighbour's session weighs as much as each of
  ours whatever our threads' nice. Only a process that leads its session sets it: the
  autogroup is the whole session's, and ``appliance up`` started from a shell shares its
  session with that shell and whatever else runs there (its children lead theirs).

A negative nice needs ``CAP_SYS_NICE`` (root has it) or an ``RLIMIT_NICE`` that allows it
(systemd ``LimitNICE=``, ``/etc/security/limits.conf``). Without it the process says so once
and runs at the priority it has: nothing else depends on it. Under a cgroup controller that
shares CPU between services (systemd slices, Kubernetes pods), the cgroup's weight decides
between them first (``CPUWeight=``, a pod's CPU request); the nice values decide within.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
from collections.abc import Mapping

log = logging.getLogger(__name__)

#: The default ``--nice`` of the media processes (PipeWire's and PulseAudio's level).
MEDIA_NICE = -11
#: A host-wide default under the flag and over the config file (:func:`nice_from_environment`;
#: the test suite's conftest sets 0, so its tests' processes compete as they always did).
NICE_ENV = "APPLIANCE_NICE"
NICE_MIN, NICE_MAX = -20, 19
AUTOGROUP = "/proc/self/autogroup"
TASKS = "/proc/self/task"


def parse_nice(value: object) -> int:
    """A ``--nice`` value (flag or config file): an integer in -20..19."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"--nice must be an integer in {NICE_MIN}..{NICE_MAX}, not {value!r}")
    try:
        nice = int(value)
    except ValueError:
        raise ValueError(f"--nice must be an integer in {NICE_MIN}..{NICE_MAX}, "
                         f"not {value!r}") from None
    if not NICE_MIN <= nice <= NICE_MAX:
        raise ValueError(f"--nice must be in {NICE_MIN}..{NICE_MAX}, not {nice}")
    return nice


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir(TASKS)]
    except (OSError, ValueError):
        return [0]  # no /proc: the calling thread


def set_priority(nice: int) -> str | None:
    """Set every thread of this process, and its autogroup if it leads its session, to
    ``nice``. Returns ``None`` when done (or when ``nice`` is 0: nothing asked), else why
    not, in one line; what could be set stays set. Never raises for a refusal: the caller
    logs it and runs on."""
    if nice == 0:
        return None
    why: list[str] = []
    for tid in _threads():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
        except OSError as exc:
            why.append(_reason("nice", nice, exc))
            break
    if os.getsid(0) != os.getpid():
        return "; ".join(why) or None  # the session's autogroup is not ours to raise
    try:
        with open(AUTOGROUP, "w") as f:
            f.write(f"{nice}\n")
    except FileNotFoundError:
        pass  # a kernel without autogroups: the threads' nice is the whole story
    except OSError as exc:
        why.append(_reason("autogroup nice", nice, exc))
    return "; ".join(why) or None


def _reason(what: str, nice: int, exc: OSError) -> str:
    if exc.errno in (errno.EPERM, errno.EACCES):
        return (f"cannot set the {what} to {nice}: not permitted (needs CAP_SYS_NICE or "
                f"RLIMIT_NICE >= {20 - nice})")
    return f"cannot set the {what} to {nice}: {exc.strerror or exc}"


def raise_priority(nice: int, role: str) -> bool:
    """:func:`set_priority`, logged: a debug line when done, a warning naming what is
    missing when not. True when done."""
    why = set_priority(nice)
    if why is None:
        if nice:
            log.debug("%s runs at nice %d (docs/operations.md \"CPU priority\")", role, nice)
        return True
    log.warning("%s runs at its inherited priority: %s; its calls wait behind other work "
                "on this host (docs/operations.md \"CPU priority\")", role, why)
    return False


def nice_from_environment(args: argparse.Namespace,
                          environ: Mapping[str, str] | None = None) -> None:
    """``APPLIANCE_NICE``: the default of ``--nice`` under the flag and over the config
    file (called before the config is resolved, as the other environment defaults are)."""
    env = os.environ if environ is None else environ
    if getattr(args, "nice", None) is None and env.get(NICE_ENV):
        args.nice = env[NICE_ENV]


def add_nice_flag(parser: argparse.ArgumentParser) -> None:
    """``--nice N`` on a media process's parser (``up``, ``transceiver``, ``relay``); the
    roles' DEFAULTS give :data:`MEDIA_NICE`."""
    parser.add_argument(
        "--nice", default=None, metavar="N",
        help=f"CPU priority of the process (nice, {NICE_MIN}..{NICE_MAX}; default "
             f"{MEDIA_NICE}, the audio servers' level, and 0 leaves it as started): a call's "
             "audio is due every 20 ms, other work on the host is not. A negative value "
             "needs CAP_SYS_NICE or RLIMIT_NICE; without, the process says so and runs on "
             "(docs/operations.md \"CPU priority\")")
