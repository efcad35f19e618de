"""ReceptionStats, SenderStats and NTP/RTT arithmetic (RFC 3550 §6.4.1, A.1, A.3, A.8)."""

from __future__ import annotations

import random

import pytest

from appliance.proto.rtp import (
    ReceptionStats,
    RtcpReceiverReport,
    SenderStats,
    compact_ntp,
    ntp_from_unix,
    parse_rtcp_untrusted,
    rtt_from_compact,
    rtt_from_report_block,
    unix_from_ntp,
)


def test_rfc3550_rtt_example() -> None:
    """RFC 3550 §6.4.1 figure 2: A=0xb710:8000, LSR=0xb705:2000, DLSR=0x0005:4000."""
    assert rtt_from_compact(0xB7108000, 0xB7052000, 0x00054000) == 6.125


def test_rtt_edge_cases() -> None:
    assert rtt_from_compact(5, 0, 0) is None  # no SR seen
    assert rtt_from_compact(100, 101, 0) == 0.0  # rounding noise
    assert rtt_from_compact(100, 100 + 65536 * 10, 0) is None  # 10 s in the future
    assert rtt_from_compact(0x00000010, 0xFFFF0000, 0) == pytest.approx((0x10 + 0x10000) / 65536)


def test_ntp_helpers() -> None:
    msw, lsw = ntp_from_unix(0.5)
    assert (msw, lsw) == (2_208_988_800, 1 << 31)
    assert unix_from_ntp(msw, lsw) == 0.5
    assert compact_ntp(0x1234ABCD, 0x56780000) == 0xABCD5678
    # Round trip through an SR-style exchange: SR sent at t, echoed after 0.25 s of
    # holding, received back at t + 0.3 s -> RTT 0.05 s.
    t = 1_700_000_000.123
    lsr = compact_ntp(*ntp_from_unix(t))
    rtt = rtt_from_report_block(t + 0.3, lsr, int(0.25 * 65536))
    assert rtt == pytest.approx(0.05, abs=1e-4)


def test_in_order_no_loss() -> None:
    s = ReceptionStats(ssrc=9)
    for i in range(100):
        assert s.update(1000 + i, 960 * i, i * 0.02)
    block = s.report_block(now=2.0)
    assert (block.ssrc, block.fraction_lost, block.cumulative_lost) == (9, 0, 0)
    assert block.highest_sequence == 1099 and block.jitter == 0
    assert block.lsr == 0 and block.dlsr == 0


def test_sequence_wraparound_and_loss() -> None:
    s = ReceptionStats(ssrc=1)
    seqs = [(65530 + i) & 0xFFFF for i in range(20)]
    lost = {seqs[3], seqs[10]}
    for i, seq in enumerate(seqs):
        if seq not in lost:
            s.update(seq, 960 * i, i * 0.02)
    assert s.extended_highest_seq == 65536 + 13 and s.cycles == 65536
    block = s.report_block(now=1.0)
    assert block.cumulative_lost == 2
    assert block.fraction_lost == (2 << 8) // 20
    # Next interval without loss: fraction resets, cumulative stays.
    for i in range(20, 30):
        s.update((65530 + i) & 0xFFFF, 960 * i, i * 0.02)
    block = s.report_block(now=2.0)
    assert (block.fraction_lost, block.cumulative_lost) == (0, 2)


def test_reorder_and_duplicates() -> None:
    s = ReceptionStats(ssrc=1)
    for seq in [1, 2, 4, 3, 5, 5, 6]:
        s.update(seq, seq * 960, seq * 0.02)
    assert s.extended_highest_seq == 6
    assert s.cumulative_lost == -1  # a duplicate: RFC 3550 lets it go negative
    assert s.report_block(1.0).cumulative_lost == -1


def test_big_jump_needs_confirmation() -> None:
    """A.1: a jump beyond MAX_DROPOUT is a stray unless the next packet follows it."""
    s = ReceptionStats(ssrc=1)
    for seq in range(10):
        s.update(seq, 0, 0.0)
    assert not s.update(30000, 0, 0.0)
    assert s.extended_highest_seq == 9
    assert s.update(30001, 0, 0.0)  # confirmed: the sender restarted, stats re-based
    assert s.extended_highest_seq == 30001 and s.expected == 1 and s.received == 1


def test_jitter_matches_a8_reference() -> None:
    """A synthetic arrival series against a direct transcription of RFC 3550 A.8."""
    rng = random.Random(7)
    rate = 48000
    s = ReceptionStats(ssrc=1, clock_rate=rate)
    jitter = 0.0
    prev_transit: float | None = None
    ts0 = 0xFFFF0000  # the RTP timestamp wraps during the run
    for i in range(500):
        ts = (ts0 + 960 * i) & 0xFFFFFFFF
        arrival = 100.0 + i * 0.02 + rng.uniform(0, 0.015)
        s.update(i, ts, arrival)
        transit = arrival * rate - (ts0 + 960 * i)  # unwrapped, as A.8 assumes
        if prev_transit is not None:
            jitter += (abs(transit - prev_transit) - jitter) / 16
        prev_transit = transit
    assert s.jitter == pytest.approx(jitter, rel=1e-9)
    # Uniform 0-15 ms delay noise gives a few ms of jitter, never a 2^32 spike.
    assert 0.002 < s.jitter_seconds < 0.01
    assert s.report_block(200.0).jitter == int(jitter)


def test_constant_delay_means_zero_jitter() -> None:
    s = ReceptionStats(ssrc=1, clock_rate=8000)
    for i in range(50):
        s.update(i, 160 * i, 5.0 + i * 0.02)
    assert s.jitter == pytest.approx(0.0, abs=1e-6)


def test_lsr_dlsr_in_report() -> None:
    s = ReceptionStats(ssrc=1)
    s.update(0, 0, 0.0)
    s.on_sender_report(0x0001B705, 0x20000000, arrival=10.0)
    block = s.report_block(now=15.25)
    assert block.lsr == 0xB7052000 and block.dlsr == 0x00054000
    rr = RtcpReceiverReport(2, (block,))
    assert parse_rtcp_untrusted(bytes(rr)) == [rr]


def test_sender_stats_sr() -> None:
    st = SenderStats(ssrc=77, clock_rate=48000)
    for i in range(50):
        st.on_packet(payload_size=80, rtp_timestamp=960 * i, now=10.0 + i * 0.02)
    sr = st.sender_report(now=10.0 + 49 * 0.02 + 0.01, now_unix=1_700_000_000.0)
    assert (sr.packet_count, sr.octet_count) == (50, 4000)
    assert sr.rtp_timestamp == 960 * 49 + 480
    assert (sr.ntp_msw, sr.ntp_lsw) == ntp_from_unix(1_700_000_000.0)
    assert parse_rtcp_untrusted(bytes(sr)) == [sr]
    assert SenderStats(ssrc=1).rtp_timestamp_at(5.0) == 0
