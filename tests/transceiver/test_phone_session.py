"""A phone call's media on a transceiver (transceiver/phone_session.py), through its real
UDP socket and control ops: a fake relay (a loopback socket sending PROXY v2 datagrams, and
the vouch query a relay worker sends) stands in for the relay, the trunk's RTP is built
here. The echo agent must send the caller's tone back (FFT), RFC 4733 digits must reach the
agent and the ``events`` long-poll, and ``delete`` (the one op for every call kind) / the
media timeout end it.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import trio

from appliance.audio import g711
from appliance.phone_params import PhoneParams
from appliance.proto.proxy import encode_header, parse_transport_untrusted
from appliance.proto.proxy.vouch import Kind, Vouch, VouchError, derive_key, encode, parse_untrusted
from appliance.proto.rtp import rtp_header, rtp_header_fields_untrusted
from appliance.transceiver import rtp_leg
from appliance.transceiver.server import (
    Transceiver,
    TransceiverAddresses,
    TransceiverConfig,
    serve_transceiver,
)

SECRET = b"phone-session-test-secret-0123456789"
TRUNK = ("127.0.0.1", 0)  # the port is the trunk socket's
PUBLIC = ("127.0.0.1", 3478)  # the relay's public address named in the PROXY headers
TIMEOUT = 30.0


@dataclass
class Rig:
    tr: Transceiver
    udp: tuple[str, int]
    relay: trio.socket.SocketType  # our fake relay worker's internal socket
    trunk: tuple[str, int]

    async def op(self, **req: Any) -> dict[str, Any]:
        return await self.tr.handle_control(req)

    async def send_rtp(self, payload: bytes, src: tuple[str, int] | None = None) -> None:
        await self.relay.sendto(encode_header(src or self.trunk, PUBLIC) + payload, self.udp)

    async def stream(self, packets: list[bytes]) -> None:
        """At the real-time rate a trunk sends (the echo keeps at most ~60 ms queued, so a
        burst would mostly be dropped by design)."""
        for pkt in packets:
            await self.send_rtp(pkt)
            await trio.sleep(0.02)  # pacing the source, not synchronisation

    async def recv(self) -> tuple[tuple[str, int], tuple[str, int], bytes]:
        """One datagram the transceiver sent the relay: (client, public, payload)."""
        while True:
            data, _ = await self.relay.recvfrom(65536)
            try:
                client, public, off, _ = parse_transport_untrusted(data)
            except Exception:
                continue  # a vouch answer (LOCAL): read by the test that asked
            return (str(client[0]), int(client[1])), (str(public[0]), int(public[1])), data[off:]


@pytest.fixture
async def rig(nursery: trio.Nursery) -> AsyncIterator[Rig]:
    cfg = TransceiverConfig(id=3, secrets=(SECRET,), listen=("127.0.0.1", 0), agent="echo")
    addrs: TransceiverAddresses = await nursery.start(serve_transceiver, cfg)
    assert addrs.transceiver is not None
    relay = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await relay.bind(("127.0.0.1", 0))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # a port for the trunk
        s.bind(("127.0.0.1", 0))
        trunk = ("127.0.0.1", int(s.getsockname()[1]))
    with relay:
        yield Rig(addrs.transceiver, addrs.udp, relay, trunk)


def params(rig: Rig, **over: Any) -> dict[str, Any]:
    p = PhoneParams(call_id="rtc_sip_" + "a" * 24, agent="echo", session={"type": "realtime"},
                    codec="PCMU", payload_type=0, clock_rate=8000, dtmf_payload_type=101,
                    direction="sendrecv", remote=rig.trunk, rtcp_mux=True, remote_rtcp=None,
                    trunk_ip=rig.trunk[0])
    return {**p.to_json(), **over}


def tone_packets(n: int, freq: float = 1000.0, ssrc: int = 0x5151) -> list[bytes]:
    t = np.arange(n * 160) / 8000
    pcm = (8000 * np.sin(2 * math.pi * freq * t)).astype(np.int16)
    enc = g711.G711Encoder("pcmu")
    out = []
    for i in range(n):
        frame48 = np.repeat(pcm[i * 160:(i + 1) * 160], 6).astype("<i2").tobytes()
        payload = enc.encode(frame48)
        out.append(rtp_header(0, 1000 + i, 160 * i, ssrc, i == 0) + payload)
    return out


def peak_hz(ulaw: bytes) -> float:
    dec = g711.G711Decoder("pcmu")
    pcm = np.frombuffer(b"".join(dec.decode(ulaw[i:i + 160]) for i in range(0, len(ulaw), 160)),
                        dtype="<i2").astype(float)
    spec = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    return float(np.argmax(spec) * 48000 / len(pcm))


async def test_the_echo_agent_answers_a_tone_over_plain_rtp(rig: Rig) -> None:
    sid = "rtc_sip_" + "a" * 24
    resp = await rig.op(op="create", leg="phone", session_id=sid, phone=params(rig))
    assert resp["ok"], resp
    got: list[bytes] = []
    packets = tone_packets(50)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as n:
            n.start_soon(rig.stream, packets)
            while len(got) < 40:
                client, public, payload = await rig.recv()
                assert client == rig.trunk and public == PUBLIC  # back via the relay
                pt, _seq, _ts, ssrc, _m, off, end = rtp_header_fields_untrusted(payload)
                if pt == 0:
                    assert ssrc == resp["ssrc"]
                    got.append(payload[off:end])
    assert abs(peak_hz(b"".join(got[5:])) - 1000) < 30  # the tone came back
    view = (await rig.op(op="get", session_id=sid))["session"]  # the one get, any kind
    assert view["phone"]["latched"] == f"{rig.trunk[0]}:{rig.trunk[1]}"
    assert view["codec"] == "PCMU/8000" and view["packets_in"] >= 40
    # a stray source gets nothing and cannot take the call over
    await rig.send_rtp(packets[0], src=("127.0.0.1", rig.trunk[1] + 1))
    ended = await rig.op(op="delete", session_id=sid, reason="bye")
    assert ended["ok"] and ended["end_reason"] == "bye" and ended["ended_at"] > 0, ended
    # ended, it is kept like a WebRTC call: get, list and a second delete answer for it
    kept = (await rig.op(op="get", session_id=sid))["session"]
    assert (kept["kind"], kept["state"], kept["end_reason"]) == ("phone", "ended", "bye")
    assert kept["phone"]["latched"] == view["phone"]["latched"]
    again = await rig.op(op="delete", session_id=sid, reason="later")
    assert (again["end_reason"], again["ended_at"]) == ("bye", kept["ended_at"])
    listed = (await rig.op(op="list"))["sessions"]
    assert [(s["kind"], s["state"]) for s in listed if s["id"] == sid] == [("phone", "ended")]
    ev = await rig.op(op="events", after=0, wait=0, epoch=rig.tr.epoch)
    assert [e["type"] for e in ev["events"]] == ["ended"] and ev["live"] == []
    assert ev["events"][0]["call_id"] == sid and ev["events"][0]["reason"] == "bye"


async def test_rfc4733_digits_reach_the_agent_and_signaling(rig: Rig) -> None:
    sid = "rtc_sip_" + "b" * 24
    assert (await rig.op(op="create", leg="phone", session_id=sid, phone=params(rig)))["ok"]
    phone = rig.tr.calls[sid]
    # ctx.params as a WebRTC Realtime call's: the accept's session config under "realtime"
    assert phone.ctx.params["realtime"] == {"session": {"type": "realtime"}, "dcid": None,
                                            "call_id": phone.call_id}
    assert phone.ctx.identity.info["transport"] == "sip"
    polled: list[dict[str, Any]] = []

    async def poll() -> None:  # signaling's long-poll, waiting before the digit is sent
        resp = await rig.op(op="events", after=0, wait=TIMEOUT, epoch=rig.tr.epoch)
        polled.extend(resp["events"])

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as n:
            n.start_soon(poll)
            await trio.testing.wait_all_tasks_blocked()
            for pkt in tone_packets(3):
                await rig.send_rtp(pkt)
            ts, ssrc = 480, 0x5151
            for i, (dur, end) in enumerate([(160, False), (320, False), (800, True),
                                            (800, True), (800, True)]):
                payload = bytes([7, (0x80 if end else 0) | 10, dur >> 8, dur & 0xFF])
                await rig.send_rtp(rtp_header(101, 1003 + i, ts, ssrc, i == 0) + payload)
        events = []
        async with aclosing(phone.ctx.events()) as stream:
            async for ev in stream:
                events.append(ev)
                if ev["type"] == "dtmf":
                    break
    assert events[0]["type"] == "session.started" and events[0]["transport"] == "sip"
    assert events[-1] == {"type": "dtmf", "digit": "7", "duration_ms": 100, "source": "rfc4733"}
    assert polled and polled[0]["type"] == "dtmf" and polled[0]["digit"] == "7"
    # SIP INFO digits come from signaling and reach the agent the same way
    assert (await rig.op(op="dtmf", session_id=sid, digit="#", duration_ms=250))["ok"]
    async with aclosing(phone.ctx.events()) as stream:
        async for ev in stream:
            assert ev == {"type": "dtmf", "digit": "#", "duration_ms": 250, "source": "sip-info"}
            break


async def test_the_relay_vouch_is_answered_for_the_call_sources_only(rig: Rig) -> None:
    sid = "rtc_sip_" + "c" * 24
    assert (await rig.op(op="create", leg="phone", session_id=sid, phone=params(rig)))["ok"]
    key = derive_key(SECRET)

    async def ask(client: tuple[str, int]) -> bool:
        nonce = os.urandom(8)
        q = encode(Vouch(Kind.QUERY, client, PUBLIC, 3, nonce), key)
        await rig.relay.sendto(q, rig.udp)
        with trio.move_on_after(1.0):  # silence is the "no" (bounded: a no never comes)
            while True:
                data, _ = await rig.relay.recvfrom(65536)
                try:
                    msg = parse_untrusted(data, [key])
                except VouchError:
                    continue  # the echo's RTP
                if msg.kind is Kind.VOUCH and msg.nonce == nonce:
                    return True
        return False

    with trio.fail_after(TIMEOUT):
        assert await ask(rig.trunk)  # the signalled address
        assert await ask((rig.trunk[0], 40000))  # the SIP source's IP, another port (NAT)
        assert not await ask(("127.0.0.2", rig.trunk[1]))  # anyone else: silence
        for pkt in tone_packets(3):  # latch to the signalled address
            await rig.send_rtp(pkt)
        await rig.recv()
        assert not await ask((rig.trunk[0], 40000))  # latched: that port no longer


async def test_a_pending_call_starts_media_when_answered(rig: Rig) -> None:
    sid = "rtc_sip_" + "d" * 24
    resp = await rig.op(op="create", leg="phone", session_id=sid, call_id=sid, agent="echo",
                        session={})
    assert resp["ok"], resp
    assert rig.tr.calls[sid].state == "new"
    await rig.send_rtp(tone_packets(1)[0])  # nothing to take it yet: dropped
    bad = await rig.op(op="patch", session_id="nope", phone=params(rig))
    assert bad["status"] == 404
    assert (await rig.op(op="patch", session_id=sid, phone=params(rig), answered=True))["ok"]
    twice = await rig.op(op="patch", session_id=sid, phone=params(rig), answered=True)
    assert twice["status"] == 400  # answered only once: it is no longer pending
    notbool = await rig.op(op="patch", session_id=sid, phone=params(rig), answered="yes")
    assert (notbool["status"], notbool["code"]) == (400, "bad-request")
    noparams = await rig.op(op="patch", session_id=sid)
    assert (noparams["status"], noparams["code"]) == (400, "bad-params")
    with trio.fail_after(TIMEOUT):
        for pkt in tone_packets(5):
            await rig.send_rtp(pkt)
        _, _, payload = await rig.recv()
    assert rtp_header_fields_untrusted(payload)[0] == 0
    # a re-INVITE to hold: direction only, same leg; we stop sending
    leg = rig.tr.calls[sid].leg
    held = await rig.op(op="patch", session_id=sid, phone=params(rig, direction="recvonly"))
    assert held["ok"] and rig.tr.calls[sid].leg is leg and leg is not None
    assert not leg.can_send()
    # RFC 2543 hold (c=0.0.0.0) is a direction change too: the leg and its latch stay
    old_hold = await rig.op(op="patch", session_id=sid, phone=params(
        rig, direction="inactive", remote=["0.0.0.0", rig.trunk[1]]))
    assert old_hold["ok"] and rig.tr.calls[sid].leg is leg and leg.latched == rig.trunk
    unhold = await rig.op(op="patch", session_id=sid, phone=params(rig))
    assert unhold["ok"] and rig.tr.calls[sid].leg is leg and leg.can_send()


async def test_bad_params_are_refused_clearly(rig: Rig) -> None:
    for body, code in [({"phone": {"codec": "G729"}}, "bad-params"),
                       ({"phone": params(rig), "session_id": ""}, "bad-request"),
                       ({"phone": params(rig, agent="nope-agent")}, "unknown-agent"),
                       ({"phone": params(rig, agent="passthrough")}, "bad-params"),
                       ({"phone": params(rig), "leg": "pigeon"}, "bad-leg")]:
        req = {"op": "create", "leg": "phone", "session_id": "x", **body}
        resp = await rig.tr.handle_control(req)
        assert not resp["ok"] and resp["code"] == code, (body, resp)
    assert (await rig.op(op="phone.nope"))["code"] == "unknown-op"
    # one create for every leg kind: the old phone-only op is gone
    assert (await rig.op(op="phone.create", phone=params(rig)))["code"] == "unknown-op"


async def test_the_old_phone_ops_are_unknown_and_the_generic_ones_answer(rig: Rig) -> None:
    """Issue 39 item 1, one set of control ops: ``phone.end``/``phone.get``/``phone.list``
    and ``phone.answered``/``phone.update`` (now ``patch`` with leg options) and
    ``phone.dtmf`` (now ``dtmf``) are gone (400
    unknown-op like any unknown op); ``delete``/``get``/``list`` answer for a phone call,
    and for an id nobody has, 404."""
    sid = "rtc_sip_" + "g" * 24
    assert (await rig.op(op="create", leg="phone", session_id=sid, phone=params(rig)))["ok"]
    for op in ("phone.end", "phone.get", "phone.list", "phone.answered", "phone.update",
               "phone.dtmf"):
        resp = await rig.op(op=op, session_id=sid, reason="x")
        assert (resp["ok"], resp["status"], resp["code"]) == (False, 400, "unknown-op"), op
        assert op in resp["detail"]
    assert rig.tr.calls[sid].state != "ended"  # none of them did anything
    view = (await rig.op(op="get", session_id=sid))["session"]
    assert view["id"] == sid and view["phone"]["call_id"] == params(rig)["call_id"]
    listed = (await rig.op(op="list"))["sessions"]
    assert [(s["kind"], s["state"]) for s in listed if s["id"] == sid] == [("phone", view["state"])]
    for op in ("get", "delete"):
        assert (await rig.op(op=op, session_id="nope"))["code"] == "unknown-session"
    assert (await rig.op(op="delete", session_id=sid))["end_reason"] == "deleted"


async def test_media_timeout_ends_the_call(nursery: trio.Nursery,
                                           autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()
    cfg = TransceiverConfig(id=1, secrets=(SECRET,), listen=("127.0.0.1", 0))
    addrs: TransceiverAddresses = await nursery.start(serve_transceiver, cfg)
    tr = addrs.transceiver
    assert tr is not None

    p = PhoneParams.from_json_untrusted({
        "call_id": "rtc_sip_" + "e" * 24, "agent": "echo", "session": {}, "codec": "PCMA",
        "payload_type": 8, "clock_rate": 8000, "dtmf_payload_type": None,
        "direction": "sendrecv", "remote": ["127.0.0.1", 9], "rtcp_mux": True,
        "remote_rtcp": None, "trunk_ip": "127.0.0.1"})
    assert (await tr.handle_control({"op": "create", "leg": "phone", "session_id": "t1",
                                     "phone": p.to_json()}))["ok"]
    with trio.fail_after(rtp_leg.MEDIA_TIMEOUT + TIMEOUT):
        resp = await tr.handle_control({"op": "events", "after": 0,
                                        "wait": rtp_leg.MEDIA_TIMEOUT + 5, "epoch": None})
        while not resp["events"]:
            resp = await tr.handle_control({"op": "events", "after": 0, "wait": 5,
                                            "epoch": tr.epoch})
    assert resp["events"][0]["reason"] == "rtp-timeout"
    assert trio.current_time() - start >= rtp_leg.MEDIA_TIMEOUT
