"""What the cores have left (issue 32): /proc/stat parsing, the affinity set's idle and
steal, the fair share, the delay signal, and the meter that combines them — on canned
/proc/stat texts and synthetic lateness, so nothing depends on this machine."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.errors import RemoteProtocolError
from appliance.transceiver.corestat import (
    LATE_FLOOR,
    LATE_FULL,
    CoreSample,
    ProcStat,
    ProcStatError,
    available_cores,
    core_busy,
    core_sample,
    decide,
    lateness_busy,
    parse_proc_stat_untrusted,
    percentile,
)
from appliance.transceiver.headroom import LoadMeter, read_core_stat

# A 2-CPU machine, as /proc/stat writes it (user nice system idle iowait irq softirq steal
# guest guest_nice), at two moments 1 s (100 ticks per CPU) apart.
STAT_0 = """cpu  200 0 100 1500 10 0 5 0 0 0
cpu0 100 0 50 750 5 0 3 0 0 0
cpu1 100 0 50 750 5 0 2 0 0 0
intr 123 4 5
ctxt 999
btime 1700000000
processes 4242
procs_running 1
procs_blocked 0
"""


def stat(cpu0: tuple[int, int, int], cpu1: tuple[int, int, int], running: int = 1) -> str:
    """/proc/stat text with cpu0/cpu1 as (busy, idle, steal) ticks on top of STAT_0's."""
    def line(n: int, base: int, t: tuple[int, int, int]) -> str:
        busy, idle, steal = t
        return f"cpu{n} {100 + busy} 0 50 {750 + idle} 5 0 {base} {steal} 0 0"
    return (f"cpu  0 0 0 0 0 0 0 0 0 0\n{line(0, 3, cpu0)}\n{line(1, 2, cpu1)}\n"
            f"ctxt 1000\nprocs_running {running}\nprocs_blocked 0\n")


def test_parse_reads_each_cpu_line_and_procs_running() -> None:
    s = parse_proc_stat_untrusted(STAT_0)
    assert set(s.cpus) == {0, 1}
    assert s.cpus[0].total == 100 + 50 + 750 + 5 + 3
    assert s.cpus[0].idle == 755  # idle + iowait
    assert s.cpus[0].steal == 0
    assert s.procs_running == 1


def test_parse_accepts_old_kernels_short_lines() -> None:
    s = parse_proc_stat_untrusted("cpu0 1 2 3 4\n")  # 2.4-era: four fields
    assert s.cpus[0].total == 10 and s.cpus[0].idle == 4 and s.procs_running is None


@pytest.mark.parametrize("text", [
    "cpu0 1 2 x 4\n", "cpu0 1 2\n", "cpuX 1 2 3 4\n", "cpu0 1 2 3 -4\n",
    "cpu0 " + " ".join(["1"] * 11) + "\n", "procs_running many\n", "cpu1234567 1 2 3 4\n",
])
def test_parse_rejects_what_the_kernel_does_not_write(text: str) -> None:
    with pytest.raises(ProcStatError):
        parse_proc_stat_untrusted(text)


def test_the_error_is_in_the_protocol_error_tree() -> None:
    assert issubclass(ProcStatError, RemoteProtocolError)


@given(st.text(max_size=400))
def test_parse_raises_only_its_error(text: str) -> None:
    try:
        parse_proc_stat_untrusted(text)
    except ProcStatError:
        pass  # anything else fails the test


def test_this_machines_proc_stat_parses() -> None:
    got, cpus = read_core_stat()
    if got is None:
        pytest.skip("no /proc/stat here")
    assert cpus and cpus <= set(got.cpus)


def test_sample_is_the_affinity_sets_share_in_cores() -> None:
    a = parse_proc_stat_untrusted(STAT_0)
    # 1 s later: cpu0 ran 60 ticks, 40 idle; cpu1 ran 100 (a hog), 0 idle.
    b = parse_proc_stat_untrusted(stat((60, 40, 0), (100, 0, 0)))
    both = core_sample(a, b, {0, 1})
    assert both is not None and both.cpus == 2
    assert both.idle == pytest.approx(0.4) and both.used == pytest.approx(1.6)
    only0 = core_sample(a, b, {0})
    assert only0 is not None and only0.idle == pytest.approx(0.4) and only0.cpus == 1
    assert core_sample(a, b, {7}) is None  # a CPU the text does not have
    assert core_sample(a, a, {0, 1}) is None  # no time passed


def test_steal_is_counted_apart_from_idle() -> None:
    a = parse_proc_stat_untrusted(STAT_0)
    b = parse_proc_stat_untrusted(stat((30, 40, 30), (30, 40, 30)))
    s = core_sample(a, b, {0, 1})
    assert s is not None
    assert (s.idle, s.steal) == (pytest.approx(0.8), pytest.approx(0.6))


def test_alone_on_a_core_busy_is_the_own_share() -> None:
    """The transceiver alone: everything it did not use was idle, busy = own (as before)."""
    s = CoreSample(cpus=1, idle=0.7, steal=0.0, used=0.3)
    avail = available_cores(0.3, s, runnable=0)
    assert avail == pytest.approx(1.0)
    assert core_busy(0.3, avail) == pytest.approx(0.3)


def test_sharing_a_saturated_core_reads_full_though_own_share_is_70_percent() -> None:
    """Issue 32's case: the whole appliance on one core, the transceiver at 70 % and relay
    and signaling taking the rest: nothing is left."""
    s = CoreSample(cpus=1, idle=0.0, steal=0.0, used=1.0)
    avail = available_cores(0.7, s, runnable=1)  # one other task runnable
    assert core_busy(0.7, avail) == pytest.approx(1.0)


def test_steal_takes_capacity_away() -> None:
    s = CoreSample(cpus=1, idle=0.3, steal=0.3, used=0.4)
    avail = available_cores(0.4, s, runnable=0)
    assert avail == pytest.approx(0.7)
    assert core_busy(0.4, avail) == pytest.approx(0.4 / 0.7)


def test_an_idle_transceiver_on_a_saturated_host_is_not_busy() -> None:
    """The trap of issue 23: at load 20 on 2 CPUs nothing is idle, but the fair scheduler
    would give us 2/21 of them; using 0.5 % of a core is 5 % of that, not "full"."""
    s = CoreSample(cpus=2, idle=0.0, steal=0.0, used=2.0)
    avail = available_cores(0.005, s, runnable=20)
    assert avail == pytest.approx(2 / 21)
    assert core_busy(0.005, avail) < 0.1


def test_a_hog_on_the_other_cpu_leaves_a_whole_core() -> None:
    s = CoreSample(cpus=2, idle=0.7, steal=0.0, used=1.3)  # hog 1.0, us 0.3
    assert available_cores(0.3, s, runnable=1) == pytest.approx(1.0)


def test_no_proc_stat_means_a_core_of_its_own() -> None:
    assert available_cores(0.4, None) == 1.0


def test_lateness_floor_percentile_and_minimum() -> None:
    assert lateness_busy([LATE_FULL] * 5) == 0.0  # too few samples to tell
    assert lateness_busy([0.003] * 50) == 0.0  # under the floor: scheduling noise
    # 5 of 50 very late (a GC, a handshake): the 90th percentile is still on time.
    assert lateness_busy([0.001] * 45 + [0.05] * 5) == 0.0
    # Every frame 12 ms late: halfway between the floor and full.
    mid = (LATE_FLOOR + LATE_FULL) / 2
    assert lateness_busy([mid] * 50) == pytest.approx(0.5)
    assert lateness_busy([LATE_FULL * 2] * 50) == 1.0
    assert percentile([], 0.9) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0


# -- the meter with /proc/stat and lateness ------------------------------------------------


def run_window(m: LoadMeter, t: float, cpu: float, own: float, text: str, *, lag: float,
               sent: int, sent_more: int, cpus: frozenset[int] = frozenset({0}),
               behind_since: float | None = None) -> float:
    """One 0.5 s window of 25 ticks: ``own`` of a core, every tick ``lag`` late, the
    window's edge with ``text`` as /proc/stat; ``behind_since``: the receive loop has not
    found its socket empty since then; returns the CPU seconds at its end."""
    for i in range(1, 26):
        now = t + i * 0.02
        edge = m.window_due(now)
        m.handle_tick(now, cpu + own * i * 0.02, lag, sent=sent + sent_more * i // 25,
                      stat=parse_proc_stat_untrusted(text) if edge else None,
                      affinity=cpus if edge else None,
                      backlog=0.0 if behind_since is None else now - behind_since)
    return cpu + own * 0.5


def test_meter_alone_on_a_core_busy_is_its_own_share() -> None:
    m = LoadMeter()
    m.handle_tick(0.0, 0.0, 0.0, sent=0, stat=parse_proc_stat_untrusted(STAT_0),
                  affinity=frozenset({0}))
    # cpu0 over 0.5 s: 15 busy, 35 idle ticks; we used 0.3 of it.
    run_window(m, 0.0, 0.0, 0.3, stat((15, 35, 0), (0, 50, 0)), lag=0.001, sent=0,
               sent_more=500)
    assert m.windows == 1
    assert m.busy == pytest.approx(0.3, abs=0.01)
    assert m.report.available == pytest.approx(1.0)
    assert m.report.core_idle == pytest.approx(0.7)
    assert m.report.late == 0.0


def test_meter_on_a_core_shared_with_a_hog_counts_it_as_far_as_frames_are_late() -> None:
    """A CPU hog on our one CPU, fair-shared: we use 30 %, the hog the rest, available is the
    fair half. On time, the hog is no reason to refuse (busy 0.3: the fair scheduler serves
    us when we wake); with our frames 32.5 ms late (three quarters of the way from the floor
    to full) three quarters of the hog's part counts: 0.3 + (0.6 - 0.3) x 0.75."""
    def window(lag: float) -> LoadMeter:
        m = LoadMeter()
        m.handle_tick(0.0, 0.0, 0.0, sent=0, stat=parse_proc_stat_untrusted(STAT_0),
                      affinity=frozenset({0}))
        # procs_running is machine-wide (us, the hog, one task on the other CPU): one
        # other runnable task per CPU of the machine, scaled to our one CPU.
        run_window(m, 0.0, 0.0, 0.3, stat((50, 0, 0), (0, 50, 0), running=3), lag=lag,
                   sent=0, sent_more=500)
        return m

    on_time = window(0.0)
    assert on_time.report.core_available == pytest.approx(0.5)
    assert on_time.busy == pytest.approx(0.3, abs=0.01)
    assert on_time.report.available == pytest.approx(1.0)  # a unit of own CPU costs 1
    late = window(0.0325)
    assert late.report.late == pytest.approx(0.75)
    assert late.busy == pytest.approx(0.525, abs=0.01)
    # what one call's own CPU costs in busy units now: signaling's divisor
    assert late.report.available == pytest.approx(0.3 / 0.525, abs=0.01)
    saturated = window(0.045)
    assert saturated.busy == 1.0


def test_meter_counts_a_receive_backlog_its_on_time_ticks_do_not_show() -> None:
    """Issue 41 item 1: the whole ``appliance up`` on one core, the transceiver using 80 %
    of it and the relay and signaling the rest, nothing idle. Its ticks fire on time (the
    receive loop yields every 2 ms of work), so as far as lateness went the neighbours'
    share was no harm and busy read 0.8 while the calls' datagrams queued in the socket. A
    receive loop that has not found its socket empty for the whole window is behind by
    more than a frame time: the core is full."""
    def window(behind_since: float | None) -> LoadMeter:
        m = LoadMeter()
        m.handle_tick(0.0, 0.0, 0.0, sent=0, stat=parse_proc_stat_untrusted(STAT_0),
                      affinity=frozenset({0}))
        run_window(m, 0.0, 0.0, 0.8, stat((50, 0, 0), (0, 50, 0), running=2), lag=0.002,
                   sent=0, sent_more=1000, behind_since=behind_since)
        return m

    keeping_up = window(None)
    assert keeping_up.report.late == 0.0 and keeping_up.report.backlog_max_ms == 0.0
    assert keeping_up.busy == pytest.approx(0.8, abs=0.01)
    behind = window(-0.1)  # behind since before the window began
    assert behind.report.backlog_max_ms == pytest.approx(600.0)
    assert behind.report.late == 1.0 and behind.busy == 1.0
    # A backlog under the floor (a batch of setups, a burst) is noise a jitter buffer takes.
    brief = LoadMeter()
    brief.handle_tick(0.0, 0.0, 0.0, sent=0)
    for i in range(1, 26):
        brief.handle_tick(i * 0.02, i * 0.02 * 0.5, 0.0, sent=40 * i,
                          backlog=0.004 if i % 2 else 0.0)
    assert brief.report.late == 0.0 and brief.report.backlog_max_ms == pytest.approx(4.0)


def test_steal_counts_whether_or_not_frames_are_late() -> None:
    assert decide(0.35, 0.7, 0.7, 0.0) == pytest.approx(0.5)


def test_meter_idle_transceiver_late_ticks_do_not_count() -> None:
    """Nothing sent in the window: its ticks 30 ms late (a loaded host) say nothing about
    the calls it does not have — the trap found in issue 23."""
    m = LoadMeter()
    m.handle_tick(0.0, 0.0, 0.0, sent=7, stat=parse_proc_stat_untrusted(STAT_0),
                  affinity=frozenset({0, 1}))
    run_window(m, 0.0, 0.0, 0.005, stat((50, 0, 0), (50, 0, 0), running=21), lag=0.030,
               sent=7, sent_more=0, cpus=frozenset({0, 1}))
    assert m.report.late == 0.0 and m.report.late_p90_ms is None
    assert m.busy < 0.1


def test_meter_counts_pacer_lateness() -> None:
    m = LoadMeter()
    m.handle_tick(0.0, 0.0, 0.0, sent=0)
    m.add_lateness([0.050] * 100)  # paced frames 50 ms late, ticks on time
    run_window(m, 0.0, 0.0, 0.1, STAT_0, lag=0.0, sent=0, sent_more=100)
    assert m.report.late == 1.0 and m.busy == 1.0


def test_meter_without_proc_stat_behaves_as_before() -> None:
    m = LoadMeter()
    m.handle_tick(0.0, 0.0, 0.0)
    for i in range(1, 26):
        m.handle_tick(i * 0.02, i * 0.02 * 0.4, 0.0)
    assert m.busy == pytest.approx(0.4)
    assert m.report.available == 1.0 and m.report.core_idle is None


def test_proc_stat_as_parsed_is_frozen() -> None:
    s = parse_proc_stat_untrusted(STAT_0)
    assert isinstance(s, ProcStat)
    with pytest.raises(AttributeError):
        s.procs_running = 3  # type: ignore[misc]
