"""The transceiver shell over a real UDP socket: the test plays the relay (PROXY v2
headers) and a client built from appliance/proto (IceClient, DTLS client, SRTP)."""

from __future__ import annotations

import gc
import socket
import time
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from transceiver.support import PUBLIC, Client, decode_all, dominant_hz, sine

from appliance.control import control_request
from appliance.proto.proxy import encode_header
from appliance.proto.rtp import ReceptionStats, RtcpReceiverReport, RtcpSenderReport, RtpPacket
from appliance.proto.ufrag import UfragCodec
from appliance.transceiver import server as server_mod
from appliance.transceiver import session as session_mod
from appliance.transceiver.opus import OpusEncoder
from appliance.transceiver.server import (
    Transceiver,
    TransceiverAddresses,
    TransceiverConfig,
    serve_transceiver,
)
from appliance.transceiver.session import EndedSession, Session

SECRETS = (b"routing-secret-for-tests-0123456",)
CANDIDATES = [["198.51.100.1", 3478]]


@pytest.fixture(params=[True, False], ids=["sendmmsg", "sendto"])
async def transceiver(tmp_path: Path, request: pytest.FixtureRequest
                      ) -> AsyncIterator[TransceiverAddresses]:
    """Every test here runs with the receive loop's batched sends (the C extension must be
    built: ``pip install -e .``) and with one ``sendto`` per datagram."""
    if request.param:
        assert server_mod._mmsg is not None, "appliance.relay._mmsg is not built"
    config = TransceiverConfig(id=3, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp_path / "t3.sock"), max_sessions=2,
                               batch_sends=request.param)
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)
        yield addrs
        nursery.cancel_scope.cancel()


async def ctl(addrs: TransceiverAddresses, **req: Any) -> dict[str, Any]:
    assert addrs.control is not None
    return await control_request(addrs.control, req)


async def connect(addrs: TransceiverAddresses, sock: socket.socket, sid: str = "s1",
                  agent: str | None = None, **extra: Any) -> Client:
    client = Client(sock, addrs.udp)
    resp = await ctl(addrs, op="create", session_id=sid, offer=client.offer(), agent=agent,
                     candidates=CANDIDATES, **extra)
    assert resp["ok"], resp
    hint = UfragCodec(list(SECRETS)).decode_untrusted(resp["ufrag"])
    assert hint.transceiver == 3
    assert "a=ice-lite" in resp["answer"] and "198.51.100.1 3478" in resp["answer"]
    assert "127.0.0.1" not in resp["answer"]  # our internal address never leaks
    client.start(resp["answer"], trio.current_time())
    with trio.fail_after(5):
        while client.srtp is None:
            await client.pump(trio.current_time())
            await trio.sleep(0.005)
    return client


async def pump_until(client: Client, done: Callable[[], bool]) -> None:
    """Receive and answer until ``done()``; the 10 s is a hang guard, not a bound."""
    with trio.fail_after(10):
        while not done():
            await client.pump(trio.current_time())
            await trio.sleep(0.005)  # a poll interval: the loop checks the condition


async def test_echo_end_to_end(
    transceiver: TransceiverAddresses, relay_sock: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(session_mod, "RTCP_INTERVAL", 0.3)
    client = await connect(transceiver, relay_sock)
    enc = OpusEncoder()
    rx = ReceptionStats(0)
    for pcm in sine(440, 75):
        await client.send_audio(pcm, enc)
        await client.pump(trio.current_time())
        await trio.sleep(0.02)  # real-time pacing of a media source, not test sync
    await pump_until(client, lambda: len(client.received_rtp) >= 65)
    packets = [p for _, p in client.received_rtp]
    assert len(packets) >= 65
    assert len({p.ssrc for p in packets}) == 1
    # The first packet starts a talkspurt. A scheduling stall of > 60 ms on a loaded test
    # machine is a real input gap and may start another (marker + timestamp jump); inside
    # a talkspurt timestamps advance by exactly one frame.
    assert packets[0].marker
    assert sum(p.marker for p in packets) <= 3
    seqs = [p.sequence for p in packets]
    assert all((b - a) & 0xFFFF == 1 for a, b in zip(seqs, seqs[1:], strict=False))
    for a, b in zip(packets, packets[1:], strict=False):
        delta = (b.timestamp - a.timestamp) & 0xFFFFFFFF
        assert delta == 960 if not b.marker else delta >= 960
    assert dominant_hz(decode_all(packets[10:])) == pytest.approx(440, abs=5)

    # RTCP: the transceiver sent SRs; answer one with an RR so it can compute RTT.
    srs = [p for p in client.received_rtcp if isinstance(p, RtcpSenderReport)]
    assert srs and srs[-1].ssrc == packets[0].ssrc and srs[-1].packet_count > 0
    rx = ReceptionStats(packets[0].ssrc)
    for p in packets:
        rx.update(p.sequence, p.timestamp, trio.current_time())
    rx.on_sender_report(srs[-1].ntp_msw, srs[-1].ntp_lsw, trio.current_time())
    await trio.sleep(0.01)  # a delay since the SR, so the report's DLSR is not zero
    assert client.srtp is not None
    from appliance.proto.rtp import serialize_rtcp
    rr = RtcpReceiverReport(0x1234, (rx.report_block(trio.current_time()),))
    await client.send_raw(client.srtp.protect_rtcp(serialize_rtcp([rr])))
    with trio.fail_after(10):  # a hang guard: until the transceiver has read the RR
        while (s := (await ctl(transceiver, op="get", session_id="s1"))["session"]  # noqa: ASYNC110
               )["rtt_ms"] is None:
            await trio.sleep(0.01)  # a poll interval: the loop checks the state

    assert s["state"] == "connected" and s["agent"] == "echo" and s["transceiver"] == 3
    assert s["client_address"] == "203.0.113.7:53211"
    assert s["relay_flow"]["public"] == "198.51.100.1:3478"
    assert s["packets_in"] >= 75 and s["packets_out"] >= 65
    assert s["rtt_ms"] is not None and 0 <= s["rtt_ms"] < 1000
    assert s["jitter_ms"] is not None and s["loss"] == 0
    assert all(v is not None for v in s["timeline"].values()), s["timeline"]
    assert s["srtp_profile"] and s["cipher_suite"]

    stats = await ctl(transceiver, op="stats")
    assert stats["transceiver"] == 3 and stats["sessions_by_state"]["connected"] == 1
    assert stats["counters"]["datagrams_in"] > 75

    assert (await ctl(transceiver, op="delete", session_id="s1", reason="bye"))["ok"]
    ended = (await ctl(transceiver, op="get", session_id="s1"))["session"]
    assert ended["state"] == "ended" and ended["end_reason"] == "bye"
    assert client.dtls is not None
    await pump_until(client, lambda: client.dtls is not None
                     and client.dtls.state.value == "closed")  # close_notify


async def test_echo_latency_is_at_most_one_frame(
    transceiver: TransceiverAddresses, relay_sock: socket.socket,
) -> None:
    """RTP in → echoed RTP out within one frame (20 ms) more than a bare UDP echo takes.

    The margin is derived in the same run: each frame's round trip through the transceiver
    alternates with one through a trivial trio UDP echo polled the same way, so both see
    the same load (the exact zero-delay figure is test_latency.py's, on the fake clock)."""
    client = await connect(transceiver, relay_sock)
    enc = OpusEncoder()
    delays, baseline = [], []
    with trio.socket.socket(type=socket.SOCK_DGRAM) as echo_sock, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        await echo_sock.bind(("127.0.0.1", 0))
        probe.bind(("127.0.0.1", 0))
        probe.setblocking(False)  # polled like the client's socket

        async def bare_echo() -> None:
            while True:
                data, addr = await echo_sock.recvfrom(2048)
                await echo_sock.sendto(data, addr)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(bare_echo)
            for pcm in sine(300, 30):
                sent = trio.current_time()
                probe.sendto(b"ping", echo_sock.getsockname())
                with trio.fail_after(10):  # a hang guard
                    while True:  # polled like the client below
                        await trio.sleep(0.001)
                        try:
                            probe.recv(16)
                            break
                        except BlockingIOError:
                            pass
                baseline.append(trio.current_time() - sent)
                before = len(client.received_rtp)
                sent = trio.current_time()
                await client.send_audio(pcm, enc)
                with trio.move_on_after(1):  # a hang guard: a lost packet is not counted
                    while len(client.received_rtp) == before:
                        await trio.sleep(0.001)
                        await client.pump(trio.current_time())
                if len(client.received_rtp) > before:
                    delays.append(client.received_rtp[-1][0] - sent)
                await trio.sleep(0.02 - (trio.current_time() - sent) % 0.02)  # pacing
            nursery.cancel_scope.cancel()
    assert len(delays) >= 25
    delays.sort()
    baseline.sort()
    assert delays[len(delays) // 2] < baseline[len(baseline) // 2] + 0.020, (delays, baseline)


async def test_control_errors(transceiver: TransceiverAddresses) -> None:
    bad_sdp = await ctl(transceiver, op="create", session_id="x", offer="v=0\r\nnonsense",
                        candidates=CANDIDATES)
    assert not bad_sdp["ok"] and bad_sdp["status"] in (400, 422) and bad_sdp["code"]
    client = Client(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), transceiver.udp)
    client.sock.close()
    offer = client.offer()
    r = await ctl(transceiver, op="create", session_id="x", offer=offer, agent="nope",
                  candidates=CANDIDATES)
    assert (r["status"], r["code"]) == (400, "unknown-agent")
    r = await ctl(transceiver, op="create", session_id="x", offer=offer, candidates=[])
    assert (r["status"], r["code"]) == (400, "bad-request")
    for op in ("get", "patch", "delete"):
        r = await ctl(transceiver, op=op, session_id="missing", sdpfrag="")
        assert (r["status"], r["code"]) == (404, "unknown-session"), op
    r = await ctl(transceiver, op="frobnicate")
    assert r["status"] == 400
    # Capacity (max_sessions=2), duplicates, then drain.
    for sid in ("a", "b"):
        assert (await ctl(transceiver, op="create", session_id=sid, offer=offer,
                          candidates=CANDIDATES))["ok"]
    r = await ctl(transceiver, op="create", session_id="a", offer=offer, candidates=CANDIDATES)
    assert r["status"] in (409, 503)
    r = await ctl(transceiver, op="create", session_id="c", offer=offer, candidates=CANDIDATES)
    assert (r["status"], r["code"]) == (503, "full")
    listed = await ctl(transceiver, op="list")
    assert {s["id"] for s in listed["sessions"]} == {"a", "b"}
    assert all(s["state"] == "new" for s in listed["sessions"])
    assert (await ctl(transceiver, op="delete", session_id="a"))["ok"]
    assert (await ctl(transceiver, op="drain"))["ok"]
    r = await ctl(transceiver, op="create", session_id="d", offer=offer, candidates=CANDIDATES)
    assert (r["status"], r["code"]) == (503, "draining")


async def test_session_without_ice_is_reaped(
    transceiver: TransceiverAddresses, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_mod, "SETUP_TIMEOUT", 0.2)
    client = Client(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), transceiver.udp)
    client.sock.close()
    r = await ctl(transceiver, op="create", session_id="idle", offer=client.offer(),
                  candidates=CANDIDATES)
    assert r["ok"]
    with trio.fail_after(10):  # a hang guard: until the 0.2 s setup timeout has fired
        while (s := (await ctl(transceiver, op="get", session_id="idle"))["session"]  # noqa: ASYNC110
               )["state"] != "ended":
            await trio.sleep(0.02)  # a poll interval: the loop checks the state
    assert (s["state"], s["end_reason"]) == ("ended", "ice-timeout")
    assert (await ctl(transceiver, op="stats"))["sessions_by_state"]["new"] == 0


async def test_ice_restart_keeps_the_call(
    transceiver: TransceiverAddresses, relay_sock: socket.socket
) -> None:
    client = await connect(transceiver, relay_sock)
    frag = ("a=ice-ufrag:New1\r\na=ice-pwd:newclientpasswordnewcli\r\n"
            "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n")
    r = await ctl(transceiver, op="patch", session_id="s1", sdpfrag=frag)
    assert r["ok"] and "a=ice-ufrag:" in r["sdpfrag"], r
    new_ufrag = r["sdpfrag"].split("a=ice-ufrag:")[1].split("\r\n")[0]
    new_pwd = r["sdpfrag"].split("a=ice-pwd:")[1].split("\r\n")[0]
    assert client.ice is not None
    client.ice.restart("New1", "newclientpasswordnewcli", new_ufrag, new_pwd,
                       trio.current_time())
    await client.flush()
    enc = OpusEncoder()
    for pcm in sine(440, 10):
        await client.send_audio(pcm, enc)
        await trio.sleep(0.02)  # real-time pacing of a media source, not test sync
        await client.pump(trio.current_time())
    await pump_until(client, lambda: client.ice is not None
                     and client.ice.state.value == "nominated" and len(client.received_rtp) >= 5)
    assert client.ice.state.value == "nominated"
    assert len(client.received_rtp) >= 5
    s = (await ctl(transceiver, op="get", session_id="s1"))["session"]
    assert s["state"] == "connected"
    # Plain trickle (same credentials) answers an empty fragment.
    r = await ctl(transceiver, op="patch", session_id="s1",
                  sdpfrag="a=ice-ufrag:New1\r\na=ice-pwd:newclientpasswordnewcli\r\n")
    assert r == {"ok": True, "sdpfrag": ""}


async def test_garbage_is_dropped_and_counted(
    transceiver: TransceiverAddresses, relay_sock: socket.socket
) -> None:
    relay_sock.sendto(b"not a proxy header", transceiver.udp)
    client = Client(relay_sock, transceiver.udp)
    await client.send_raw(b"\x80" + bytes(30))  # RTP from an unknown flow
    with trio.fail_after(10):  # a hang guard: until both datagrams have been read
        while ((counters := (await ctl(transceiver, op="stats"))["counters"])  # noqa: ASYNC110
               ["drop_proxy"] + counters["drop_unknown_flow"] < 2):
            await trio.sleep(0.01)  # a poll interval: the loop checks the state
    assert counters["drop_proxy"] == 1 and counters["drop_unknown_flow"] == 1


async def test_passthrough_echoes_rtp_without_the_codec(
    transceiver: TransceiverAddresses, relay_sock: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """agent=passthrough: each packet comes back with the same payload (no decode/encode)
    under our SSRC, with our sequence/timestamp space continuing across a caller SSRC
    change; RTCP sender reports describe our stream."""
    monkeypatch.setattr(session_mod, "RTCP_INTERVAL", 0.2)
    client = await connect(transceiver, relay_sock, agent="passthrough")
    assert client.srtp is not None
    payloads = [bytes([0xF8]) + i.to_bytes(2, "big") + b"opaque" for i in range(40)]

    async def send(i: int, ssrc: int, seq: int, ts: int) -> None:
        assert client.srtp is not None
        pkt = RtpPacket(111, seq & 0xFFFF, ts & 0xFFFFFFFF, ssrc, payloads[i], marker=i == 0)
        await client.send_raw(client.srtp.protect(bytes(pkt)))

    for i in range(20):  # the caller's stream wraps its sequence number
        await send(i, 0x1234, 65530 + i, 4_294_960_000 + 960 * i)
        await trio.sleep(0.01)  # pacing of a media source, not test sync
        await client.pump(trio.current_time())
    await send(20, 0x1234, 65530 + 22, 4_294_960_000 + 960 * 22)  # a gap (2 lost) ...
    await send(21, 0x1234, 65530 + 21, 4_294_960_000 + 960 * 21)  # ... and one reordered
    for i in range(22, 40):  # the caller restarts its stream: new SSRC, seq, timestamp
        await send(i, 0x5678, 100 + i, 7 + 960 * i)
        await trio.sleep(0.01)
        await client.pump(trio.current_time())
    def all_back_and_reported() -> bool:  # all 40 echoed, and an SR that counts them
        return len(client.received_rtp) >= 40 and any(
            isinstance(p, RtcpSenderReport) and p.packet_count == 40
            for p in client.received_rtcp)

    await pump_until(client, all_back_and_reported)
    got = [p for _, p in client.received_rtp]
    assert [p.payload for p in got] == payloads  # byte-identical, in arrival order
    assert len({p.ssrc for p in got}) == 1 and got[0].ssrc not in (0x1234, 0x5678)
    assert all(p.payload_type == 111 and not p.extension for p in got)
    seqs = [p.sequence for p in got]
    ts = [p.timestamp for p in got]
    base_seq, base_ts = seqs[0], ts[0]
    for i in range(20):  # the first stream's seq/ts map by a constant offset
        assert seqs[i] == (base_seq + i) & 0xFFFF
        assert ts[i] == (base_ts + 960 * i) & 0xFFFFFFFF
    assert (seqs[20], seqs[21]) == ((base_seq + 22) & 0xFFFF, (base_seq + 21) & 0xFFFF)
    assert ts[20] == (base_ts + 960 * 22) & 0xFFFFFFFF
    # After the SSRC change our stream continues: next seq, timestamp moved on, marker set.
    assert seqs[22] == (seqs[20] + 1) & 0xFFFF and got[22].marker
    assert 960 <= (ts[22] - ts[20]) & 0xFFFFFFFF <= 960 * 50
    for i in range(23, 40):
        assert seqs[i] == (seqs[i - 1] + 1) & 0xFFFF
        assert (ts[i] - ts[i - 1]) & 0xFFFFFFFF == 960 and not got[i].marker
    srs = [p for p in client.received_rtcp if isinstance(p, RtcpSenderReport)]
    assert srs and srs[-1].ssrc == got[0].ssrc and srs[-1].packet_count == 40
    s = (await ctl(transceiver, op="get", session_id="s1"))["session"]
    assert s["agent"] == "passthrough" and s["packets_in"] == 40 and s["packets_out"] == 40


async def test_held_call_state_stays_bounded_and_ended_sessions_are_small(
    transceiver: TransceiverAddresses, relay_sock: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Soak regressions (docs/reliability.md): (a) a held call must not accumulate per RTCP
    report (nobody reads a passthrough session's agent events: the stats event posted at
    each report piled up); (b) an ended session is kept as its describe() only, not as the
    Session with its codec, DTLS and queues."""
    monkeypatch.setattr(session_mod, "RTCP_INTERVAL", 0.02)
    tr = transceiver.transceiver
    assert tr is not None
    refs: list[weakref.ref[Session]] = []
    for sid, agent in (("s1", "passthrough"), ("s2", "echo")):
        client = await connect(transceiver, relay_sock, sid=sid, agent=agent)
        session = tr.calls[sid]
        refs.append(weakref.ref(session))
        assert (session.decoder is None) == (agent == "passthrough")
        client.received_rtcp.clear()
        def enough(c: Client = client, s: Session = session) -> bool:
            return s.host.events_coalesced >= 20 and sum(
                isinstance(p, RtcpSenderReport | RtcpReceiverReport)
                for p in c.received_rtcp) >= 20

        # RTCP reports 0.01-0.03 s apart: until 20 have been sent and coalesced.
        await pump_until(client, enough)
        assert sum(isinstance(p, RtcpSenderReport | RtcpReceiverReport)
                   for p in client.received_rtcp) >= 20
        assert session.host.events_coalesced >= 20
        assert len(session.host._events_in) <= 2  # session.started + the latest stats
        assert (await ctl(transceiver, op="delete", session_id=sid, reason="bye"))["ok"]
        del session, enough  # enough() holds the session too
    with trio.move_on_after(10):  # a hang guard: until the session tasks have unwound
        while any(r() is not None for r in refs):
            gc.collect()
            await trio.sleep(0.01)  # a poll interval: the loop checks the state
    gc.collect()
    assert [r() for r in refs] == [None, None]  # nothing keeps an ended Session alive
    assert [type(e) for e in tr.ended] == [EndedSession, EndedSession]
    got = (await ctl(transceiver, op="get", session_id="s2"))["session"]
    assert got["state"] == "ended" and got["end_reason"] == "bye" and got["agent"] == "echo"
    listed = (await ctl(transceiver, op="list"))["sessions"]
    assert [s["id"] for s in listed] == ["s1", "s2"]
    again = await ctl(transceiver, op="delete", session_id="s1", reason="again")
    assert again["ok"] and again["end_reason"] == "bye"


async def test_passthrough_is_a_known_agent() -> None:
    from appliance.agents import PASSTHROUGH, resolve
    assert resolve(PASSTHROUGH).passthrough and not resolve("echo").passthrough


@pytest.mark.parametrize(("flush_after", "yield_after"), [(1.0, 1.0), (0.0, 1.0), (1.0, 0.0)],
                         ids=["one-batch", "flush-each", "yield-each"])
async def test_a_receive_batch_is_answered_in_one_sendmmsg(
    transceiver: TransceiverAddresses, relay_sock: socket.socket,
    monkeypatch: pytest.MonkeyPatch, flush_after: float, yield_after: float,
) -> None:
    """Datagrams that arrive together are handled in one drain of the socket; what the
    sessions send meanwhile leaves together at its end (one ``send_batch`` call with the
    sendmmsg path), in order and counted — unless the drain takes longer than
    ``FLUSH_AFTER``: then what is queued goes out before the next datagram is handled; or
    longer than ``YIELD_AFTER``: then the drain ends (flushing) and the others run first.
    (Both bounds are set here: a loaded CI box once took > 2 ms for the 30 datagrams.)"""
    monkeypatch.setattr(server_mod, "FLUSH_AFTER", flush_after)
    monkeypatch.setattr(server_mod, "YIELD_AFTER", yield_after)
    client = await connect(transceiver, relay_sock, agent="passthrough")
    assert client.srtp is not None and transceiver.transceiver is not None
    tr = transceiver.transceiver
    batches: list[int] = []
    if tr._send_batch is not None:
        real = tr._send_batch

        def recording(fd: int, buf: bytes, msgs: list[Any]) -> tuple[int, int, int]:
            batches.append(len(msgs))
            return real(fd, buf, msgs)

        tr._send_batch = recording
    before = (await ctl(transceiver, op="stats"))["counters"]["datagrams_out"]
    payloads = [bytes([0xF8]) + i.to_bytes(2, "big") + b"burst" for i in range(30)]
    for i, payload in enumerate(payloads):  # no checkpoint: all 30 wait in the socket
        pkt = RtpPacket(111, 100 + i, 960 * i, 0x1234, payload, marker=i == 0)
        relay_sock.sendto(encode_header(client.client_addr, PUBLIC) + client.srtp.protect(bytes(pkt)),
                        transceiver.udp)
    with trio.fail_after(5):
        while len(client.received_rtp) < 30:
            await trio.sleep(0.005)
            await client.pump(trio.current_time())
    assert [p.payload for _, p in client.received_rtp] == payloads
    if tr._send_batch is not None:
        assert batches == ([30] if flush_after and yield_after else [1] * 30)
    after = (await ctl(transceiver, op="stats"))["counters"]
    assert after["datagrams_out"] - before >= 30 and after["drop_send"] == 0


@pytest.mark.parametrize("batch", [True, False], ids=["sendmmsg", "sendto"])
def test_a_datagram_that_cannot_be_sent_is_dropped_and_counted_alone(batch: bool) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        peer.bind(("127.0.0.1", 0))
        peer.settimeout(2)
        tr = Transceiver(TransceiverConfig(id=1, secrets=SECRETS, batch_sends=batch), sock)
        assert (tr._send_batch is not None) == batch
        dest = peer.getsockname()
        tr._queued = []
        tr.send(b"first", dest)
        tr.send(b"unroutable", ("::1", 9))  # an IPv6 address on an IPv4 socket
        tr.send(b"third", dest)
        assert tr.counters["datagrams_out"] == 0  # queued, not sent yet
        tr._flush()
        assert tr._queued is None
        assert [peer.recv(100), peer.recv(100)] == [b"first", b"third"]
        assert tr.counters["datagrams_out"] == 2 and tr.counters["drop_send"] == 1
        assert tr.counters["bytes_out"] == len(b"first") + len(b"third")


async def test_a_full_socket_yields_to_other_tasks_within_a_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a bulk data-channel transfer keeps the socket full, and the receive loop
    only yielded after 256 datagrams (~10-20 ms of SCTP), so the pacer sent every call's
    audio late and the echo dropped frames (bench/datachannel.py: 10 of 50 packets/s came
    back during a 10 MB transfer). It now yields after YIELD_AFTER, however full."""
    handled: list[int] = []
    all_handled = trio.Event()

    def slow_dispatch(self: Transceiver, now: float, data: memoryview, relay: Any) -> None:
        end = time.perf_counter() + 0.001  # ~1 ms of work per datagram
        while time.perf_counter() < end:
            pass
        handled.append(1)
        if len(handled) == 100:
            all_handled.set()

    monkeypatch.setattr(Transceiver, "dispatch", slow_dispatch)
    config = TransceiverConfig(id=3, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp_path / "t3.sock"))
    seen: list[int] = []  # how many datagrams were handled each time the other task ran
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)

        async def other() -> None:
            while True:
                seen.append(len(handled))
                await trio.lowlevel.checkpoint()

        nursery.start_soon(other)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _ in range(100):  # all queued before the loop reads one
                s.sendto(b"x" * 100, addrs.udp)
        with trio.fail_after(10):
            await all_handled.wait()
        nursery.cancel_scope.cancel()
    counts = sorted(set(seen))
    gaps = [b - a for a, b in zip(counts, counts[1:], strict=False)]
    # YIELD_AFTER is 2 ms: a few 1 ms datagrams between two turns of the other task, not 100.
    assert server_mod.YIELD_AFTER <= 0.002
    assert gaps and max(gaps) <= 5, counts
