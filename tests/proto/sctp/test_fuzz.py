"""Hypothesis fuzzing: every SCTP ``*_untrusted`` parser raises only SctpError (whole input
and byte-at-a-time); ``handle_input`` on a live association never raises at all."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proto.sctp.sctp_pair import NOW, Pair, dc_pair

from appliance.proto.sctp import SctpAssociation, SctpError
from appliance.proto.sctp import chunks as c
from appliance.proto.sctp.cookie import CookieState
from appliance.proto.sctp.datachannel import DataChannelOpen


def only_sctp_error(fn: object, *args: object) -> None:
    try:
        fn(*args)  # type: ignore[operator]
    except SctpError:
        pass


def _session_packets() -> list[bytes]:
    """Real packets of a short session: setup, DCEP, data, PR, reset, shutdown."""
    p = dc_pair()
    captured: list[bytes] = []
    original = p.network.arrivals

    def tap(now: float, pkt: bytes) -> list[float]:
        captured.append(pkt)
        return original(now, pkt)

    p.network.arrivals = tap  # type: ignore[method-assign]
    p.connect()
    cid = p.a.open_channel(p.now, "fuzz", protocol="p", ordered=False, max_retransmits=1)
    p.a.send(p.now, cid, "hello")
    p.run(1)
    p.b.send(p.now, cid, b"x" * 3000)
    p.run(1)
    p.a.close_channel(p.now, cid)
    p.run(2)
    p.a.shutdown(p.now)
    p.run(2)
    return captured


PACKETS = _session_packets()
CHUNK_VALUES = [
    bytes(ch)[4:]
    for pkt in PACKETS
    for ch in c.parse_packet_untrusted(pkt)[1]
]


@pytest.mark.parametrize("ctype", sorted(c.PARSERS))
@given(flags=st.integers(0, 255), value=st.binary(max_size=200))
def test_every_chunk_parser_raises_only_sctp_error(ctype: int, flags: int, value: bytes) -> None:
    only_sctp_error(c.PARSERS[ctype], flags, value)


@pytest.mark.parametrize("ctype", sorted(c.PARSERS))
def test_every_chunk_parser_on_truncated_real_chunks(ctype: int) -> None:
    for value in CHUNK_VALUES:
        for n in range(len(value) + 1):
            only_sctp_error(c.PARSERS[ctype], 0, value[:n])


def test_packet_parser_every_prefix_of_real_packets() -> None:
    for pkt in PACKETS:
        for n in range(len(pkt) + 1):
            only_sctp_error(c.parse_packet_untrusted, pkt[:n])


@given(st.binary(max_size=400))
def test_packet_parser(data: bytes) -> None:
    only_sctp_error(c.parse_packet_untrusted, data)
    c.verify_checksum(data)


@given(st.integers(0, 0xFFFF), st.binary(max_size=64))
def test_reconfig_param_parser(ptype: int, value: bytes) -> None:
    only_sctp_error(c.parse_reconfig_param_untrusted, ptype, value)


@given(st.binary(max_size=100))
def test_params_and_dcep_and_cookie(data: bytes) -> None:
    only_sctp_error(c.parse_params_untrusted, data)
    only_sctp_error(DataChannelOpen.parse_untrusted, data)
    only_sctp_error(CookieState.open_untrusted, data, b"k" * 32, NOW, 60.0)


def test_round_trips() -> None:
    samples: list[c.Chunk] = [
        c.DataChunk(1, 2, 3, 51, b"abc", True, False, True, True),
        c.InitChunk(1, 2, 3, 4, 5, ((c.ParamType.FORWARD_TSN_SUPPORTED, b""),)),
        c.InitAckChunk(1, 2, 3, 4, 5, ((c.ParamType.STATE_COOKIE, b"cookie!"),)),
        c.SackChunk(7, 1000, ((2, 3), (5, 9)), (4, 4)),
        c.HeartbeatChunk(c.serialize_params(((1, b"info"),))),
        c.HeartbeatAckChunk(c.serialize_params(((1, b"info"),))),
        c.AbortChunk(True, ((12, b"bye"),)),
        c.ErrorChunk(((6, b"\x00\x01\x02\x03"),)),
        c.ShutdownChunk(99), c.ShutdownAckChunk(), c.CookieAckChunk(),
        c.ShutdownCompleteChunk(True), c.CookieEchoChunk(b"cookie"),
        c.ForwardTsnChunk(10, ((1, 2), (3, 4))),
        c.ReconfigChunk((c.OutgoingResetRequest(1, 2, 3, (4, 5)),
                         c.ReconfigResponse(9, 1))),
        c.ReconfigChunk((c.IncomingResetRequest(1, (2,)),)),
    ]
    for chunk in samples:
        pkt = c.serialize_packet(5000, 5000, 1234, bytes(chunk))
        assert c.verify_checksum(pkt)
        header, parsed = c.parse_packet_untrusted(pkt)
        assert header == c.CommonHeader(5000, 5000, 1234)
        assert parsed == [chunk], chunk


def test_crc32c_vectors() -> None:
    """RFC 3720 B.4 (iSCSI) vectors and the classic check value; C and Python agree."""
    from appliance.proto.sctp.crc32c import crc32c, crc32c_python

    assert crc32c_python(b"123456789") == 0xE3069283
    assert crc32c_python(b"\0" * 32) == 0x8A9136AA
    assert crc32c_python(b"\xff" * 32) == 0x62A8AB43
    assert crc32c_python(bytes(range(32))) == 0x46DD794E
    rng = random.Random(1)
    for n in list(range(0, 70)) + [1200, 4096]:
        data = rng.randbytes(n)
        assert crc32c_python(data) == crc32c(data)


# --- handle_input on a live association -----------------------------------------------------


def _live() -> tuple[Pair, SctpAssociation]:
    p = Pair(seed=3)
    p.connect()
    p.a.send(p.now, 0, 51, b"in flight")
    return p, p.b


@st.composite
def hostile_packet(draw: st.DrawFn) -> tuple[bytes, bool]:
    base = bytearray(draw(st.sampled_from(PACKETS)))
    for _ in range(draw(st.integers(0, 6))):
        i = draw(st.integers(0, max(0, len(base) - 1)))
        op = draw(st.integers(0, 3))
        if op == 0 and base:
            base[i] ^= 1 << draw(st.integers(0, 7))
        elif op == 1:
            base[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == 2:
            del base[i : i + draw(st.integers(1, 16))]
        elif base:
            base[i] = draw(st.integers(0, 255))
    # Half the time fix the CRC (and tag) so the mutation reaches the chunk handlers.
    return bytes(base), draw(st.booleans())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile_packet(), min_size=1, max_size=8))
def test_handle_input_never_raises(packets: list[tuple[bytes, bool]]) -> None:
    p, b = _live()
    for raw, fix in packets:
        if fix and len(raw) >= 12:
            raw = c.serialize_packet(5000, 5000, b.my_tag, raw[12:])
        b.handle_input(p.now, raw)
        while b.poll_transmit() is not None:
            pass
        while b.poll_event() is not None:
            pass
        b.handle_timeout(p.now + 1)
    assert b.receiver is None or b.receiver.buffered <= 2 * b.max_receive_buffer
