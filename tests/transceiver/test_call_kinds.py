"""Per-call features, written once and run for every call kind (issue 39 item 3): a WebRTC
call (ICE + DTLS-SRTP, the test's client from ``support.py``), an inbound phone call
(``create`` with ``leg: "phone"`` and the trunk's params) and an outbound one (pending,
then a ``patch`` with the answer's leg options). Each runs on a real transceiver and its UDP socket, the test
playing the relay (PROXY v2 headers).

These features were once written twice, in two shells, and the phone copy lacked them:
phone calls were never recorded under ``--record``, phone agents never got the ``stats``
event docs/agent-protocol.md promises, and Opus phone legs never adapted FEC to the loss
the far end reports. One shell (``transceiver/shell.py``) now gives every kind each of
them; a kind that loses one fails here.
"""

from __future__ import annotations

import dataclasses
import io
import socket
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from transceiver.support import AGENT_EVENTS, Client, sine

from appliance import recordings
from appliance.phone_params import PhoneParams
from appliance.proto.proxy import encode_header, parse_transport_untrusted
from appliance.proto.rtp import (
    ReportBlock,
    RtcpPacket,
    RtcpReceiverReport,
    rtp_header,
    rtp_header_fields_untrusted,
    serialize_rtcp,
)
from appliance.transceiver import phone_session as phone_mod
from appliance.transceiver import session as session_mod
from appliance.transceiver.media import PcmPipeline
from appliance.transceiver.opus import OpusEncoder
from appliance.transceiver.server import (
    Transceiver,
    TransceiverAddresses,
    TransceiverConfig,
    serve_transceiver,
)

SECRETS = (b"routing-secret-for-tests-0123456",)
CANDIDATES = [["198.51.100.1", 3478]]
PUBLIC = ("198.51.100.1", 3478)
TRUNK = ("203.0.113.5", 40000)  # the trunk's RTP address, as its SDP and the relay name it
KINDS = ["webrtc", "sip-in", "sip-out"]
EVENTS_AGENT = "transceiver.support:events_agent"
HANG = 20.0  # a hang guard, not a bound


@pytest.fixture
async def tr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[
        tuple[Transceiver, tuple[str, int]]]:
    """A transceiver with ``--record`` and a recordings directory; RTCP every ~0.2 s."""
    monkeypatch.setattr(session_mod, "RTCP_INTERVAL", 0.2)
    monkeypatch.setattr(phone_mod, "RTCP_INTERVAL", 0.2)
    config = TransceiverConfig(id=3, secrets=SECRETS, listen=("127.0.0.1", 0),
                               recordings_dir=str(tmp_path), record=True)
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)
        assert addrs.transceiver is not None
        yield addrs.transceiver, addrs.udp
        nursery.cancel_scope.cancel()


@dataclass
class Caller:
    """The far end of one call of ``kind``, behind a fake relay socket."""

    kind: str
    tr: Transceiver
    udp: tuple[str, int]
    sock: socket.socket
    codec: str = "opus"
    sid: str = "rtc_sip_" + "k" * 24  # a phone call's session id is its call_id
    ssrc: int | None = None  # ours (the transceiver's), once known
    echoed: int = 0
    client: Client | None = None
    _seq: int = 1000
    _enc: OpusEncoder = field(default_factory=OpusEncoder)

    async def op(self, **req: Any) -> dict[str, Any]:
        resp = await self.tr.handle_control(req)
        assert resp.get("ok"), resp
        return resp

    def _phone(self, agent: str) -> dict[str, Any]:
        opus = self.codec == "opus"
        return PhoneParams(
            call_id=self.sid, agent=agent, session={"type": "realtime"},
            codec="opus" if opus else "PCMU", payload_type=111 if opus else 0,
            clock_rate=48000 if opus else 8000, dtmf_payload_type=101,
            direction="sendrecv", remote=TRUNK, rtcp_mux=True, remote_rtcp=None,
            trunk_ip=TRUNK[0]).to_json()

    async def start(self, agent: str = "echo") -> None:
        if self.kind == "webrtc":
            self.client = client = Client(self.sock, self.udp)
            resp = await self.op(op="create", session_id=self.sid, offer=client.offer(),
                                 agent=agent, candidates=CANDIDATES)
            client.start(resp["answer"], trio.current_time())
            with trio.fail_after(HANG):
                while client.srtp is None:
                    await client.pump(trio.current_time())
                    await trio.sleep(0.005)  # a poll interval: the handshake runs over UDP
        elif self.kind == "sip-in":
            resp = await self.op(op="create", leg="phone", session_id=self.sid,
                                 phone=self._phone(agent))
            self.ssrc = resp["ssrc"]
        else:  # sip-out: our offer went out in an INVITE; the answer comes later
            resp = await self.op(op="create", leg="phone", session_id=self.sid, call_id=self.sid,
                                 agent=agent)
            self.ssrc = resp["ssrc"]
            assert self.tr.calls[self.sid].pipeline is None  # nothing runs while pending
            await self.op(op="patch", session_id=self.sid, phone=self._phone(agent),
                          answered=True)  # the far end's answer: its leg options

    # -- media --------------------------------------------------------------------------

    def _send(self, payload: bytes) -> None:
        self.sock.sendto(encode_header(TRUNK, PUBLIC) + payload, self.udp)

    def _receive(self) -> None:
        """What the transceiver sent: count our echo's RTP packets, learn its SSRC."""
        if self.client is not None:
            self.client.received_rtp.clear()
            return
        while True:
            try:
                data, _ = self.sock.recvfrom(65536)
            except BlockingIOError:
                return
            client, _public, off, _ = parse_transport_untrusted(data)
            assert (str(client[0]), int(client[1])) == TRUNK
            payload = data[off:]
            if 192 <= payload[1] <= 223:
                continue  # our RTCP
            _pt, _seq, _ts, ssrc, _m, _off, _end = rtp_header_fields_untrusted(payload)
            assert ssrc == self.ssrc
            self.echoed += 1

    async def talk(self, frames: int, hz: float = 440.0) -> None:
        """``frames`` 20 ms frames of a tone at the real-time rate a caller sends."""
        for i, pcm in enumerate(sine(hz, frames)):
            if self.client is not None:
                await self.client.send_audio(pcm, self._enc)
                await self.client.pump(trio.current_time())
                got = self.client.received_rtp
                if got:
                    self.ssrc = got[0][1].ssrc
                    self.echoed += len(got)
            else:
                if self.codec == "opus":
                    payload, pt, ts = self._enc.encode(pcm), 111, 960 * i
                else:
                    from appliance.audio import g711
                    narrow = np.frombuffer(pcm, "<i2")[::6]
                    payload, pt, ts = g711.encode("pcmu", narrow), 0, 160 * i
                self._send(rtp_header(pt, self._seq & 0xFFFF, ts, 0x5151, i == 0) + payload)
                self._seq += 1
            self._receive()
            await trio.sleep(0.02)  # real-time pacing of a media source, not test sync

    async def send_rtcp(self, packets: list[RtcpPacket]) -> None:
        data = serialize_rtcp(packets)
        if self.client is not None:
            assert self.client.srtp is not None
            await self.client.send_raw(self.client.srtp.protect_rtcp(data))
        else:
            self._send(data)
            await trio.lowlevel.checkpoint()

    async def end(self, reason: str = "bye") -> None:
        await self.op(op="delete", session_id=self.sid, reason=reason)  # any kind


@pytest.fixture(params=KINDS)
def caller(request: pytest.FixtureRequest, tr: tuple[Transceiver, tuple[str, int]],
           relay_sock: socket.socket) -> Caller:
    return Caller(request.param, tr[0], tr[1], relay_sock)


def dominant_hz(samples: np.ndarray) -> float:
    spec = np.abs(np.fft.rfft(samples.astype(float) * np.hanning(len(samples))))
    return float(np.argmax(spec) * 48000 / len(samples))


@pytest.mark.parametrize(("kind", "codec"), [
    (kind, codec) for kind in KINDS for codec in ("opus", "pcmu")
    if not (kind == "webrtc" and codec == "pcmu")  # the WebRTC test client offers Opus only
])
async def test_every_call_kind_is_recorded_as_a_stereo_wav(
        kind: str, codec: str, tr: tuple[Transceiver, tuple[str, int]],
        relay_sock: socket.socket, tmp_path: Path) -> None:
    """``--record``: both directions of any call, the caller left and the agent right, in
    ``{recordings_dir}/{session id}.wav`` (for a phone call its call_id, the id the
    recording route takes). Phone calls were not recorded at all."""
    caller = Caller(kind, tr[0], tr[1], relay_sock)
    caller.codec = codec
    await caller.start()
    await caller.talk(75)
    assert caller.echoed >= 40, "the echo came back"
    view = caller.tr.calls[caller.sid].describe()
    assert view["media"]["recording"]["state"] == "recording"
    await caller.end()
    final, _part, _meta = recordings.paths(tmp_path, caller.sid)
    with trio.fail_after(HANG):
        while not final.exists():  # noqa: ASYNC110 (the recording's task finalises it)
            await trio.sleep(0.02)  # a poll interval: the file appears when it is done
    with wave.open(io.BytesIO(final.read_bytes())) as w:
        assert (w.getnchannels(), w.getframerate(), w.getsampwidth()) == (2, 48000, 2)
        audio = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
    assert len(audio) >= 48000  # about the 1.5 s talked, silence where nothing was
    caller_ch, agent_ch = audio[:, 0], audio[:, 1]
    assert np.abs(caller_ch).max() > 3000 and np.abs(agent_ch).max() > 3000
    assert dominant_hz(caller_ch) == pytest.approx(440, abs=10)
    assert dominant_hz(agent_ch) == pytest.approx(440, abs=10)  # the echo


async def test_every_call_kinds_end_reaches_a_waiting_events_poll(caller: Caller) -> None:
    """Signaling's one long-poll for every call's end (``events``): the poll waiting when
    the call ends answers with an ``ended`` event carrying the kind, the reason and the
    ended session object (the end-of-call facts: counters, transcript), so signaling
    needs no ``list`` or ``get``. WebRTC ends were once found only by polling ``list``."""
    await caller.start()
    await caller.talk(10)
    first = await caller.op(op="events", epoch=None, after=0, wait=0)
    assert caller.sid in first["live"]
    assert not [e for e in first["events"] if e["call_id"] == caller.sid]
    got: list[dict[str, Any]] = []

    async def poll() -> None:
        resp = await caller.op(op="events", epoch=first["epoch"], after=first["next"],
                               wait=HANG)
        got.extend(resp["events"])
        assert caller.sid not in resp["live"]

    with trio.fail_after(HANG):
        async with trio.open_nursery() as n:
            n.start_soon(poll)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # it waits for the end
            await caller.end("bye")
    [ended] = got
    assert ended["type"] == "ended" and ended["call_id"] == caller.sid
    assert ended["kind"] == ("webrtc" if caller.kind == "webrtc" else "phone")
    assert ended["reason"] == "bye" and ended["seq"] == first["next"] + 1
    session = ended["session"]
    assert session["id"] == caller.sid and session["state"] == "ended"
    assert session["end_reason"] == "bye" and session["packets_in"] > 0


async def test_a_patch_or_dtmf_for_the_other_call_kind_is_refused(caller: Caller) -> None:
    """One ``patch`` for every call kind (issue 39 item 1), dispatched on the call's kind: a
    WebRTC call takes an sdpfrag, a phone call its leg options; the other kind's field is
    a 409 naming the call's kind, and the call carries on untouched. ``dtmf`` likewise: a
    WebRTC call has no DTMF leg (409)."""
    await caller.start()
    phone = caller._phone("echo")
    frag = "a=ice-ufrag:abcd\r\na=ice-pwd:" + "p" * 24 + "\r\n"
    if caller.kind == "webrtc":
        wrong = {"phone": phone}
        want = ("not-phone", "is a WebRTC call")
    else:
        wrong = {"sdpfrag": frag}
        want = ("not-webrtc", "is a phone call")
    resp = await caller.tr.handle_control({"op": "patch", "session_id": caller.sid, **wrong})
    assert (resp["ok"], resp["status"], resp["code"]) == (False, 409, want[0]), resp
    assert want[1] in resp["detail"]
    both = await caller.tr.handle_control({"op": "patch", "session_id": caller.sid,
                                           "phone": phone, "sdpfrag": frag})
    assert (both["status"], both["code"]) == (400, "bad-request") and "not both" in both["detail"]
    # DTMF is a call-level op; only a phone call has a leg that carries digits
    dtmf = await caller.tr.handle_control({"op": "dtmf", "session_id": caller.sid,
                                           "digit": "5", "duration_ms": 100})
    if caller.kind == "webrtc":
        assert (dtmf["status"], dtmf["code"]) == (409, "no-dtmf-leg"), dtmf
        assert "no DTMF leg" in dtmf["detail"]
    else:
        assert dtmf == {"ok": True}
    assert caller.tr.calls[caller.sid].state != "ended"
    await caller.end()
    gone = await caller.tr.handle_control({"op": "patch", "session_id": caller.sid, **wrong})
    assert (gone["status"], gone["code"]) == (404, "unknown-session")


async def test_every_call_kinds_agent_gets_stats(caller: Caller) -> None:
    """docs/agent-protocol.md: a ``stats`` event with each RTCP report (every ~5 s; here
    0.2 s), on any leg. Phone agents never got one, and a phone call's session object said
    ``loss`` for the far end's report about our stream where a WebRTC call's says what we
    lost of theirs."""
    AGENT_EVENTS.pop(caller.sid, None)  # (another kind's run)
    await caller.start(agent=EVENTS_AGENT)
    await caller.talk(25)
    with trio.fail_after(HANG):
        while not any(e["type"] == "stats" and e["packets_in"]  # noqa: ASYNC110
                      for e in AGENT_EVENTS.get(caller.sid, ())):
            await caller.talk(1)  # keep the media flowing while the report comes
    stats = [e for e in AGENT_EVENTS[caller.sid] if e["type"] == "stats"]
    assert set(stats[-1]) == {"type", "rtt_ms", "jitter_ms", "loss", "packets_in",
                              "packets_out"}
    # The same figures with the same meaning on every leg: what we received of the far
    # end's stream (nothing lost over loopback), as the session object says too.
    assert stats[-1]["loss"] == 0 and stats[-1]["jitter_ms"] is not None
    view = caller.tr.calls[caller.sid].describe()
    assert view["loss"] == 0 and view["jitter_ms"] is not None
    assert view["packets_in"] >= stats[-1]["packets_in"] > 0
    assert [e["type"] for e in AGENT_EVENTS[caller.sid]][0] == "session.started"
    await caller.end()
    with trio.fail_after(HANG):
        while AGENT_EVENTS[caller.sid][-1]["type"] == "stats":  # noqa: ASYNC110
            await trio.sleep(0.01)  # a poll interval: the agent's task reads the event
    assert AGENT_EVENTS[caller.sid][-1] == {"type": "session.ended", "reason": "bye"}


async def test_every_call_kinds_agent_hears_its_recording_stop(caller: Caller) -> None:
    """docs/agent-protocol.md: a recording that stops early (here the quota: the header and
    five frames) is the agent's ``recording.stopped`` event (a GPT-Live session tells its
    client ``session_storage_failed``), and the call goes on."""
    caller.tr.config = dataclasses.replace(caller.tr.config,
                                           recording_quota=44 + 4 * 960 * 5)
    AGENT_EVENTS.pop(caller.sid, None)  # (another kind's run)
    await caller.start(agent=EVENTS_AGENT)
    with trio.fail_after(HANG):
        while not any(e["type"] == "recording.stopped"  # noqa: ASYNC110
                      for e in AGENT_EVENTS.get(caller.sid, ())):
            await caller.talk(5)  # media keeps coming while the writer fills the quota
    assert [e for e in AGENT_EVENTS[caller.sid] if e["type"] == "recording.stopped"] == [
        {"type": "recording.stopped", "reason": "quota"}]
    echoed = caller.echoed
    await caller.talk(25)
    assert caller.echoed > echoed  # the call went on
    assert caller.tr.calls[caller.sid].describe()["media"]["recording"]["state"] == "stopped"
    await caller.end()


async def test_every_call_kinds_session_object_and_metrics(
        caller: Caller) -> None:
    """The session object (``get``; the dashboard's call detail and the end-of-call report
    read it) carries what the agent reported hearing and saying, each turn's waterfall,
    the level meters of both directions and the PCM stages, on any leg; and the metrics
    count the call whatever its leg (phone calls were left out of ``sessions_by_state``)."""
    await caller.start(agent="transceiver.support:reporting_agent")
    await caller.talk(40)
    view: dict[str, Any] = {}
    with trio.fail_after(HANG):
        while not (view.get("transcript") and view.get("turns")
                   and ((view.get("media") or {}).get("levels") or {}).get("out")):
            await caller.talk(1)  # media flows while the agent's events and the meters land
            view = (await caller.op(op="get", session_id=caller.sid))["session"]
    assert [(t["who"], t["text"]) for t in view["transcript"]] == [
        ("user", "what time is it"), ("agent", "It is noon.")]
    [turn] = view["turns"]
    assert turn["turn"] == 1 and turn["speech_end_ms"] == -300.0
    media = view["media"]
    assert "level-in" in media["in"] and "level-out" in media["out"]
    for way in ("in", "out"):  # the tone, heard and echoed: far above silence
        assert media["levels"][way]["rms_dbfs"] > -40, media["levels"]
    assert media["stage_failures"] == 0
    # Metrics: the transceiver's stats (appliance_sessions{state}, admission's per-call
    # cost) count the call as connected, whatever its leg.
    stats = await caller.op(op="stats")
    assert stats["sessions_by_state"]["connected"] == 1, stats["sessions_by_state"]
    assert stats["phones"] == (caller.kind != "webrtc")
    await caller.end()
    ended = (await caller.op(op="get", session_id=caller.sid))["session"]
    assert ended["state"] == "ended" and ended["transcript"] == view["transcript"]


async def test_every_call_kinds_opus_fec_follows_the_reported_loss(
        caller: Caller, monkeypatch: pytest.MonkeyPatch) -> None:
    """A report block about our stream saying 25 % lost sets the Opus encoder's expected
    loss (more in-band FEC) on any leg; Opus phone legs ignored it."""
    told: list[float] = []
    original = PcmPipeline.set_expected_loss

    def spy(self: PcmPipeline, loss: float) -> None:
        told.append(loss)
        original(self, loss)

    monkeypatch.setattr(PcmPipeline, "set_expected_loss", spy)
    await caller.start()
    await caller.talk(10)
    assert caller.ssrc is not None
    block = ReportBlock(caller.ssrc, 64, 5, 1010, 0, 0, 0)  # 64/256 = 25 % lost
    await caller.send_rtcp([RtcpReceiverReport(0x5151, (block,))])
    with trio.fail_after(HANG):
        while 0.25 not in told:  # noqa: ASYNC110 (the report crosses a real socket)
            await trio.sleep(0.01)  # a poll interval
    await caller.end()


@pytest.mark.parametrize(("offer_pts", "rate"), [("111 0", 48_000), ("0 8", 8_000)])
def test_a_webrtc_calls_rtcp_runs_at_its_codecs_clock(offer_pts: str, rate: int) -> None:
    """The RTCP piece both legs share runs at the negotiated codec's RTP clock. A WebRTC
    call answered with PCMU (an offer without Opus) kept its statistics at Opus's 48 kHz:
    the far end's jitter came out 6x too small, our SR's RTP timestamps 6x too fast."""
    from transceiver.support import CHROME

    from appliance.proto.dtls import Certificate, DtlsConnection, Role
    from appliance.proto.sdp import build_answer, parse_offer_untrusted
    from appliance.transceiver.call import ServerCall

    text = CHROME.read_text().replace(
        "m=audio 9 UDP/TLS/RTP/SAVPF 111 63 9 0 8 13 110 126",
        f"m=audio 9 UDP/TLS/RTP/SAVPF {offer_pts} 126")
    cert = Certificate.generate(1e9)
    answer = build_answer(parse_offer_untrusted(text), ice_ufrag="srvufrag", ice_pwd="p" * 24,
                          fingerprint=cert.fingerprint, candidates=[PUBLIC], ssrc=7,
                          cname="c", session_id=1)
    assert answer.plan is not None and answer.plan.opus.clock_rate == rate
    call = ServerCall(answer=answer, local_ufrag="srvufrag", local_pwd="p" * 24,
                      dtls=DtlsConnection(Role.SERVER, cert, remote_fingerprints=None),
                      ssrc=7, cname="c", now=0.0,
                      wall_offset=1e9, counters={})
    assert call.rtcp.clock_rate == rate and call.rtcp.tx.clock_rate == rate
    # A report block's jitter (timestamp units) in seconds, at that clock: 10 ms.
    block = ReportBlock(7, 0, 0, 1000, rate // 100, 0, 0)
    assert call.rtcp.on_rtcp(1.0, [RtcpReceiverReport(9, (block,))])
    assert call.rtcp.remote_jitter == pytest.approx(0.010)
