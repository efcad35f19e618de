"""Suite-wide test settings.

Hypothesis profiles: ``ci`` (default, what ``make test`` runs) keeps the suite well inside
its time budget and is derandomized: every run draws the same examples, so the gate's verdict
is a function of the code, not of the run (a random draw once failed CI on a commit that had
not touched the parser it found a bug in). Exploring for new findings is ``deep``
(HYPOTHESIS_PROFILE=deep, random, many more examples), which ``make fuzz`` runs beside the
atheris targets; a finding gets a fix and a regression test, and then the gate keeps it.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# The suite builds roles in-process (a Transceiver, a signaling app, an agent context), so it
# is a composition root like the roles' entry points: it loads the plugins they load.
from appliance import plugins  # noqa: F401  (registers realtime/ and speech/)

settings.register_profile(
    "ci", max_examples=300, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "deep", max_examples=20_000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Every appliance and transceiver process a test starts counts only its own CPU as its load
# (`--headroom own`, docs/operations.md "What the headroom counts"), unless the test says
# `--headroom core`: a test of a call, a browser or a SIP peer is not a test of admission,
# and on a machine busy with other work (the suite's own Chromium, another job, `make
# test-stress`'s hog) the default mode refuses its calls 503 overloaded because *the
# machine* is busy. The tests of admission on a shared core (reliability/test_hog_midrun.py,
# the sans-IO ones in transceiver/ and signaling/) ask for `core` themselves.
os.environ.setdefault("APPLIANCE_HEADROOM", "own")
# The transceivers a test starts load no agent in the background (`--preload`, issue 38
# item 8b): a preload is ~1 s of CPU, times hundreds of appliances. Tests of the preload
# itself say `--preload` (tests/transceiver/test_warm.py).
os.environ.setdefault("APPLIANCE_PRELOAD", "none")
# The processes a test starts keep the priority they were started with (`--nice 0`,
# appliance/priority.py): at the product's default (-11) an appliance a test starts in one
# xdist worker outranks the other worker's in-process calls and their clients (stress 32:
# the parrot example counted 9 of 12 frames in its barge-in window under the hog). The
# priority itself is tested in tests/test_priority.py, the benches run at the default.
os.environ.setdefault("APPLIANCE_NICE", "0")

REPO = Path(__file__).resolve().parent.parent
# Captured protocol bytes, kept in the repo so a clean clone tests alone.
VECTORS = REPO / "tests" / "vectors"


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The versions of the independent peers this run tests against (tests/peers.py), so a
    red run on another machine says what it ran against."""
    from peers import peer_versions

    return [f"peer {name}: {version}" for name, version in peer_versions().items()]


# Issue 33 item 4: with `-n 2 --dist loadgroup` (pytest-xdist; `make test`'s default, see
# the Makefile) these directories, which start whole appliances, Chromium, SIP peers or
# netns hosts and assert time-dependent properties against a baseline measured in the same
# test, all run in one worker, one at a time, so two of them never compete for the two cores;
# the other worker takes the unit tests. Without xdist the mark does nothing.
#
# Issue 41 item 5: that lane had grown to 1149 s of a 1564 s suite (a clean-clone stress
# run's JUnit times), so pytest took 19 min while the other worker idled after 7. What runs
# in it now is what needs it: Chromium, netns hosts (fixed 10.201/16 addresses), worker
# kills and gap or loss bounds, floods, benches, latency and load. Functional tests that
# start an appliance, SIPp or an in-process relay and wait on outcomes with generous
# deadlines (their ports are picked below the ephemeral range, tests/ports.py) run in the
# other lane, beside the unit tests: SHARED_FILES below, and the directories left out here.
SERIAL_DIRS = frozenset({"browser", "interop", "e2e", "reliability", "multihost", "security",
                         "sip", "bench", "loadgen"})
# Files in those directories that share the other lane (functional, no netns, no Chromium,
# no timing bound).
SHARED_FILES = frozenset({
    "e2e/test_up_http.py", "e2e/test_recording_up.py", "e2e/test_live_sdk_sweep.py",
    "e2e/test_shared_port.py", "e2e/test_live_aiortc.py", "e2e/test_aiortc_relay.py",
    "e2e/test_live_aiortc_responses.py", "e2e/test_datachannels_aiortc.py",
    "interop/test_turn_signaled.py", "interop/test_sipp.py",
    "security/test_redaction.py",
    "sip/test_phone_report_metrics.py", "sip/test_sipp_calls.py", "sip/test_live_sip.py",
    "sip/test_sip_sideband.py", "sip/test_outbound_sipp.py", "sip/test_outbound_unit.py",
    "sip/test_sip_shell.py", "sip/test_call_states.py",
})
# Files elsewhere that time real sockets or load a core: the serial lane, too.
SERIAL_FILES = frozenset({
    "test_makefile.py",
    "transceiver/test_latency.py", "transceiver/test_opus_complexity.py",
    "transceiver/test_outside_load.py", "transceiver/test_headroom.py",
    "transceiver/test_drain.py", "relay/test_coalesce.py",
})


def _serial(parts: tuple[str, ...]) -> bool:
    """Whether the test file at ``parts`` (relative to tests/) belongs to the serial worker."""
    path = "/".join(parts)
    if path in SHARED_FILES:
        return False
    return (len(parts) > 1 and parts[0] in SERIAL_DIRS) or path in SERIAL_FILES


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_dir = Path(__file__).resolve().parent
    gone = sorted(f for f in SERIAL_FILES | SHARED_FILES if not (tests_dir / f).exists())
    if gone:  # a renamed heavy test must not drift into the other lane unnoticed
        raise pytest.UsageError(f"tests/conftest.py SERIAL_FILES or SHARED_FILES names "
                                f"missing files: {gone}")
    for item in items:  # the mark says so (-m xdist_group); the scheduler below acts on it
        if _serial(item.path.resolve().relative_to(tests_dir).parts):
            item.add_marker(pytest.mark.xdist_group("serial"))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``, with the serial group decided here, from each test's path.

    xdist's own loadgroup reads the ``xdist_group`` mark on the workers and appends
    ``@serial`` to the node id by assigning ``item._nodeid``; pytest 9.2 keeps the id
    elsewhere (``Node._id``), so with pytest 9.2 and xdist 3.8 no id got the suffix, the
    group was silently ignored, and the heavy tests ran on both workers at once (two
    ``appliance up`` competing for the cores, picking ports at the same moment: a clean-clone
    ``make test-stress`` failed on a relay port two ups shared through SO_REUSEPORT). The
    same rule as the mark, on the node id the controller sees, holds with any pytest."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SerialGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            parts = tuple(path.split("/"))
            if parts[:1] == ("tests",):
                parts = parts[1:]
            return "serial" if _serial(parts) else nodeid

    return SerialGroup(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """Browser records (tests/browser/artifacts.py) start empty for each test."""
    artifacts = sys.modules.get("browser.artifacts")
    if artifacts is not None:
        artifacts.reset_all()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that had Chromium running leaves each page's console and getStats()
    under .ci/artifacts/ (tests/browser/artifacts.py), so a red CI run can be read later."""
    outcome = yield
    report = outcome.get_result()
    artifacts = sys.modules.get("browser.artifacts")
    if artifacts is not None and report.when == "call" and report.failed:
        where = artifacts.dump_all(item.nodeid)
        if where is not None:
            report.sections.append(("browser artifacts", f"saved under {where}"))


@pytest.fixture
def vectors() -> Path:
    """Directory of captured protocol bytes (see tests/vectors/README.md)."""
    return VECTORS


@pytest.fixture
def relay_sock() -> Iterator[socket.socket]:
    """A non-blocking UDP socket on 127.0.0.1 for a test that plays the relay in front of a
    transceiver (PROXY v2 header + client datagram)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        yield s
