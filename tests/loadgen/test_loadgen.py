"""The load generator against real servers: aiortc (re-encoding echo), a passthrough echo
built from ``appliance.proto``, a server that refuses with 4xx and one that never answers ICE.
Plus the signal and its two RTT methods, offline."""

from __future__ import annotations

import json
import socket

import pytest
import trio
from loadgen.support import serve_http, serve_passthrough, start_aiortc

from appliance.loadgen import LoadConfig, run_load
from appliance.loadgen.cli import main as cli_main
from appliance.loadgen.media import (
    CYCLE,
    FRAME_SAMPLES,
    GAP,
    SAMPLE_RATE,
    Decoder,
    OnsetDetector,
    ToneStream,
    encode_tone,
    read_tag,
)
from appliance.loadgen.stats import SessionResult, percentile
from appliance.proto.dtls import Certificate
from appliance.proto.sdp import build_answer, parse_offer_untrusted


@pytest.fixture(scope="module")
def stream() -> ToneStream:
    return encode_tone()


def test_tag_in_padding_leaves_audio_unchanged(stream: ToneStream) -> None:
    plain, tagged = Decoder(), Decoder()
    for i in range(CYCLE):
        payload = stream.payload(i, 7, 1000 + i)
        assert read_tag(payload) == (7, 1000 + i)
        a, b = plain.decode(stream.plain[i]), tagged.decode(payload)
        assert a is not None and b is not None
        assert (a == b).all()
    assert read_tag(stream.plain[0]) is None


@pytest.mark.parametrize("delay_frames", [0, 3, 12])
def test_onset_detector_measures_the_echo_delay(stream: ToneStream, delay_frames: int) -> None:
    """An echo that returns our own packets ``delay_frames`` late reads as that delay."""
    det = OnsetDetector(stream.onset_sample)
    sent: list[tuple[float, bytes]] = []
    rtts: list[float] = []
    for k in range(3 * CYCLE):
        now = k * 0.02
        if k % CYCLE == CYCLE - GAP:
            det.arm()
        elif k % CYCLE == 0 and k:
            det.onset_sent(now)
        sent.append((now, stream.plain[k % CYCLE]))
        if k >= delay_frames:
            rtt = det.feed(sent[k - delay_frames][1], now)
            if rtt is not None:
                rtts.append(rtt)
    assert len(rtts) == 2
    for rtt in rtts:
        assert rtt == pytest.approx(delay_frames * FRAME_SAMPLES / SAMPLE_RATE, abs=0.002)


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)


async def test_calls_complete_against_aiortc(stream: ToneStream) -> None:
    with start_aiortc() as url:
        report = await run_load(
            LoadConfig(url, sessions=3, rate=10, duration=1.6, connect_timeout=10),
            stream=stream)
    summary = report.summary()
    assert summary["failed"] == 0, summary["failures"]
    for s in report.sessions:
        assert s.received > 40  # echoed audio came back, re-encoded by aiortc
        assert s.setup_connected is not None and s.setup_first_echo is not None
        assert s.rtt_method == "onset" and s.rtts, s
        assert 0.0 < s.rtts[0] < 1.0
    assert summary["rtt_p50_ms"] is not None


async def test_passthrough_echo_is_measured_with_tags(stream: ToneStream) -> None:
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_passthrough)
        report = await run_load(LoadConfig(url, sessions=2, rate=20, duration=1.0),
                                stream=stream)
        nursery.cancel_scope.cancel()
    summary = report.summary()
    assert summary["failed"] == 0, summary["failures"]
    for s in report.sessions:
        assert s.rtt_method == "tag"
        assert s.sent >= 45 and s.echoed == s.sent and s.loss == 0.0
        assert len(s.rtts) == s.sent and max(s.rtts) < 0.5
    assert summary["rtt_method"] == "tag"


async def test_the_round_trip_starts_when_the_packet_left_not_at_the_tick(
        stream: ToneStream, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41 item 1: the pacer serves a slot's sessions one after another, and a starved
    load generator is preempted between them; that wait is its own, not the server's. Every
    send here first blocks the loop for STALL (as a preemption would), so a round trip
    timed from the tick is never under STALL; timed from when the packet left, the
    passthrough echo on loopback comes back well inside it at least once per session."""
    import time

    from appliance.client.call import Call

    stall = 0.02
    send_rtp = Call.send_rtp

    def late_send(self: Call, payload: bytes, timestamp: int, *, marker: bool = False) -> None:
        time.sleep(stall)
        send_rtp(self, payload, timestamp, marker=marker)

    monkeypatch.setattr(Call, "send_rtp", late_send)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_passthrough)
        report = await run_load(LoadConfig(url, sessions=2, rate=20, duration=0.6),
                                stream=stream)
        nursery.cancel_scope.cancel()
    assert report.summary()["failed"] == 0
    for s in report.sessions:
        assert s.rtt_method == "tag" and len(s.rtts) >= 5, s
        assert min(s.rtts) < stall, sorted(s.rtts)[:5]


async def test_turns_against_an_echo_hear_it_while_talking() -> None:
    """pattern="turns": talk 0.4 s then listen 0.6 s. A passthrough echo answers while the
    caller talks, and only its round-trip tail comes back after the caller stops."""
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_passthrough)
        report = await run_load(LoadConfig(url, sessions=1, duration=2.0, pattern="turns",
                                           talk=0.4, listen=0.6, drain=0.2))
        nursery.cancel_scope.cancel()
    [res] = report.sessions
    assert res.failure is None, res.failure
    assert len(res.turns) == 2, res.turns
    for t in res.turns:
        assert t.loud_while_talking >= 15, t  # 20 frames of tone, echoed
        assert t.reply_end is not None and t.reply_end < 0.3, t
    summary = report.summary()
    assert (summary["turns"], summary["turns_overlapped"]) == (2, 2)
    assert res.loss == 0.0  # tags came back: exact loss, as in the continuous pattern


def test_turns_stream_is_talk_then_silence() -> None:
    s = encode_tone(tone_frames=30, gap_frames=90)
    assert (s.cycle, s.tone_frames, s.gap) == (120, 30, 90)
    dec = Decoder()
    loud = [dec.is_loud(p) for p in s.plain]
    assert all(loud[2:30]) and not any(loud[35:])


async def test_bad_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="pattern"):
        await run_load(LoadConfig("http://127.0.0.1:9", pattern="bursts"))
    with pytest.raises(ValueError, match="talk and listen"):
        await run_load(LoadConfig("http://127.0.0.1:9", pattern="turns", listen=0.0))


async def test_false_start_calls_echo_over_real_sockets(stream: ToneStream) -> None:
    """--false-start (RFC 7918, opt-in): media from our Finished on; the server, keyed by
    that Finished, gets every packet (none arrives before its keys) and echoes them all."""
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_passthrough)
        report = await run_load(LoadConfig(url, sessions=2, rate=20, duration=0.5,
                                           false_start=True), stream=stream)
        nursery.cancel_scope.cancel()
    summary = report.summary()
    assert summary["failed"] == 0, summary["failures"]
    for s in report.sessions:
        assert s.rtt_method == "tag" and s.sent >= 20 and s.echoed == s.sent


async def test_4xx_is_a_failure_with_the_status(stream: ToneStream) -> None:
    async def refuse(method: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        return 415, {}, b"unsupported-codec"

    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_http, refuse)
        report = await run_load(LoadConfig(url, sessions=2, rate=20, duration=1.0),
                                stream=stream)
        nursery.cancel_scope.cancel()
    assert [s.failure for s in report.sessions] == [
        "POST /v1/sessions → 415: b'unsupported-codec'"] * 2
    assert report.summary()["failures"] == {"POST /v1/sessions → 415: b'unsupported-codec'": 2}


async def test_503_is_counted_as_refused_with_its_code_and_latency(stream: ToneStream) -> None:
    """Admission (issue 23): the capacity benchmark reports how fast refusals come."""
    body = b'{"type": "urn:appliance:problem:overloaded", "status": 503, "code": "overloaded"}'

    async def full(method: str, path: str, body_in: bytes) -> tuple[int, dict[str, str], bytes]:
        return 503, {"Retry-After": "2"}, body

    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_http, full)
        report = await run_load(LoadConfig(url, sessions=3, rate=30, duration=1.0),
                                stream=stream)
        nursery.cancel_scope.cancel()
    summary = report.summary()
    assert summary["refused"] == 3 and summary["failed"] == 3
    assert summary["refused_codes"] == {"overloaded": 3}
    assert summary["refused_p99_ms"] is not None and summary["refused_p99_ms"] >= 0
    # Each refusal keeps its Retry-After (bench/capacity.py checks every one).
    assert summary["refused_with_retry_after"] == 3
    assert {s.refused_retry_after for s in report.sessions} == {"2"}


async def test_silent_ice_is_a_failure_with_a_timeout(stream: ToneStream) -> None:
    """A valid answer whose candidate never answers a check."""
    hole = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # bound, never read
    hole.bind(("127.0.0.1", 0))
    cert = Certificate.generate(0.0)
    deleted: list[str] = []

    async def answer(method: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if method == "DELETE":  # the client hangs up the session it could not connect
            deleted.append(path)
            return 200, {}, b""
        ans = build_answer(parse_offer_untrusted(body.decode()), ice_ufrag="silentuf",
                           ice_pwd="silentpasswordsilentpass", fingerprint=cert.fingerprint,
                           candidates=[hole.getsockname()], ssrc=1, cname="x", session_id=1)
        return 201, {"Location": "/v1/sessions/x"}, ans.text.encode()

    with hole:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_http, answer)
            report = await run_load(
                LoadConfig(url, sessions=1, rate=10, duration=1.0, connect_timeout=1.0),
                stream=stream)
            nursery.cancel_scope.cancel()
    assert report.sessions[0].failure == "no ICE/DTLS connection within 1.0 s"
    assert deleted == ["/v1/sessions/x"]


async def test_a_hung_post_fails_after_the_connect_timeout(stream: ToneStream) -> None:
    """Regression: --connect-timeout only started after the answer, so a POST that never
    got one hung the whole run."""
    async def hang(method: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_http, hang)
        with trio.fail_after(10):
            report = await run_load(
                LoadConfig(url, sessions=2, rate=20, duration=1.0, connect_timeout=0.5),
                stream=stream)
        nursery.cancel_scope.cancel()
    assert [s.failure for s in report.sessions] == [
        "no answer and connection within 1.5 s of the POST"] * 2


def test_onset_loss_does_not_count_a_stretched_echo() -> None:
    """Every packet came back, spread over a little more time than it was sent in."""
    res = SessionResult(0, sent=414, received=414, rtt_method="onset", echo_span=8.33)
    assert res.loss == 0.0
    res = SessionResult(0, sent=414, received=400, rtt_method="onset", echo_span=8.33)
    assert res.loss == pytest.approx(14 / 414)


def test_cli_reports_unreachable_signaling_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = cli_main(["--url", f"http://127.0.0.1:{port}", "-n", "1", "--duration", "0.1",
                   "--json", "-"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert out["summary"]["failed"] == 1
    assert out["sessions"][0]["failure"].startswith("signaling unreachable")
