"""CPU µs per echoed packet through one real PCM-agent session, in process (no sockets).

A real :class:`~appliance.transceiver.session.Session` (ICE-lite, DTLS, SRTP, jitter buffer,
Opus decode, VAD, the built-in ``echo`` agent, Opus encode, packetizer, SRTP) is connected
in memory, then ``--packets`` pre-protected SRTP packets of speech-like Opus are handed to
:meth:`Session.handle_rtp` one per 20 ms of a fake trio clock, exactly as the transceiver's
socket loop would, and every datagram the session sends is counted. Reported: µs of CPU per
packet (``time.process_time``), the whole path and — with ``--stub-codec`` — with the Opus
encoder and decoder replaced by constant-time stand-ins, so only our own Python counts.

``--compare DIR`` runs this same script alternately (``--rounds`` times, in fresh processes)
against the ``appliance`` package in DIR (e.g. a copy of the tree before a change) and the
one here, so a before/after comparison shares one run and one machine load:

    .venv/bin/python bench/pcm_path.py
    .venv/bin/python bench/pcm_path.py --compare /tmp/before --rounds 5

``--phone`` measures a G.711 (PCMU) phone echo call instead: a real phone session
(plain-RTP leg, G.711 8 kHz <-> 48 kHz, the ``echo`` agent) handed plain RTP packets through
its ``handle_input`` on the same fake clock; ``--compare`` then runs both call kinds.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OFFER = HERE.parent / "tests" / "proto" / "sdp" / "data" / "chrome-audio-only.sdp"
CLIENT = ("203.0.113.7", 53211)
PUBLIC = ("198.51.100.1", 3478)
RELAY = ("10.0.0.2", 4000)


def _measure(packets: int, stub: bool, complexity: int | None, media: str | None = None,
             prepare: int = 0) -> float:
    """Run one session in this process; CPU µs per echoed packet. ``prepare`` (at least
    ``packets``) packets are made first, so two runs that differ only in ``packets`` differ
    only in the loop (instruction counts: callgrind the two, subtract, divide)."""
    import numpy as np
    import trio
    import trio.testing

    from appliance.agents import resolve
    from appliance.proto.dtls import Certificate, DtlsConnection, HandshakeComplete, Role
    from appliance.proto.ice import IceClient
    from appliance.proto.mux import Kind, classify
    from appliance.proto.proxy import parse_untrusted
    from appliance.proto.rtp import RtpPacket
    from appliance.proto.sdp import build_answer, parse_offer_untrusted
    from appliance.proto.srtp import SrtpSession
    from appliance.transceiver import session as session_mod
    from appliance.transceiver.opus import FRAME_BYTES, OpusEncoder

    sys.path.insert(0, str(HERE))
    from opus_complexity import speech_like

    import appliance

    print(f"appliance from {Path(appliance.__file__).parent}", file=sys.stderr)
    pcm = speech_like(seconds=4.0).tobytes()  # 200 frames, repeated
    made = max(packets, prepare)
    frames = [pcm[(i % 200) * FRAME_BYTES : (i % 200 + 1) * FRAME_BYTES] for i in range(made)]
    client_enc = OpusEncoder()
    payloads = [client_enc.encode(f) for f in frames]

    if stub:
        class StubDecoder:
            errors = 0

            def decode(self, payload: bytes) -> bytes:
                return frames[0]

            def conceal(self, fec_from: bytes | None = None) -> bytes:
                return frames[0]

        class StubEncoder:
            def encode(self, pcm: bytes) -> bytes:
                return payloads[0]

            def set_expected_loss(self, percent: int) -> None:
                pass

            def set_complexity(self, complexity: int) -> None:
                pass

    cert = Certificate.generate(time.time())
    server_cert = Certificate.generate(time.time())
    text = OFFER.read_text()
    text = re.sub(r"a=ice-ufrag:\S+", "a=ice-ufrag:Clnt", text)
    text = re.sub(r"a=ice-pwd:\S+", "a=ice-pwd:clientpasswordclientpass", text)
    text = re.sub(r"a=fingerprint:[^\r\n]+", f"a=fingerprint:{cert.fingerprint}", text)
    offer = parse_offer_untrusted(text)
    ufrag, pwd = "srvufrag", secrets.token_hex(12)
    answer = build_answer(offer, ice_ufrag=ufrag, ice_pwd=pwd,
                          fingerprint=server_cert.fingerprint, candidates=[PUBLIC],
                          ssrc=0xABCDEF, cname="bench", session_id=1,
                          prefer_active=False)  # the client below is the DTLS client
    ice = IceClient("Clnt", "clientpasswordclientpass", ufrag, pwd, PUBLIC)
    dtls = DtlsConnection(Role.CLIENT, cert, remote_fingerprints=[server_cert.fingerprint])
    state: dict[str, Any] = {"srtp": None, "rtp_out": 0}

    def send(data: bytes, relay: tuple[str, int]) -> None:
        if state["srtp"] is not None:  # connected: count, do not parse (not our cost)
            state["rtp_out"] += 1
            return
        _, _, off = parse_untrusted(data)
        payload = bytes(data[off:])
        now = trio.current_time()
        kind = classify(payload)
        if kind is Kind.STUN:
            ice.handle_datagram(now, payload, PUBLIC)
            if dtls.state.value == "client-idle" and ice.state.value == "nominated":
                dtls.start(now)
        elif kind is Kind.DTLS:
            dtls.handle_datagram(now, payload)
            while (ev := dtls.poll_event()) is not None:
                if isinstance(ev, HandshakeComplete):
                    assert ev.srtp_profile is not None
                    state["srtp"] = SrtpSession.from_exporter(
                        dtls.export_keying_material, ev.srtp_profile, "client")

    class Counters(dict[str, int]):
        def __missing__(self, key: str) -> int:
            return 0

    kwargs: dict[str, Any] = {}
    if complexity is not None:
        kwargs["opus_complexity"] = complexity
    if media is not None:  # the call's PCM stages (a tree from before them ignores this)
        import json
        try:
            from appliance.transceiver.stages import MediaConfig
        except ImportError:
            pass
        else:
            kwargs["media"] = MediaConfig.from_params_untrusted({"media": json.loads(media)})
    result: list[float] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            session = session_mod.Session(
                session_id="bench", transceiver=0, agent=resolve("echo"), answer=answer,
                candidates=[PUBLIC], local_ufrag=ufrag, local_pwd=pwd,
                dtls=DtlsConnection(Role.SERVER, server_cert,
                                    remote_fingerprints=[str(f) for f in answer.transport.fingerprints]),
                ssrc=0xABCDEF, cname="bench", send=send, now=trio.current_time(),
                on_end=lambda s: None, counters=Counters(), **kwargs)
            if stub:
                for name, stand_in in (("decoder", StubDecoder()), ("encoder", StubEncoder())):
                    try:
                        setattr(session, name, stand_in)
                    except AttributeError:  # a tree whose Session had no setter: its field
                        setattr(session, f"_{name}", stand_in)
            await nursery.start(session.run)
            ice.start(trio.current_time())
            source = (CLIENT, PUBLIC, RELAY)
            new_api = hasattr(session, "handle_input")  # one entry point (issue 27)
            for _ in range(50):
                now = trio.current_time()
                while (out := ice.poll_transmit()) is not None:
                    if new_api:
                        session.handle_input(now, out[0], source)
                    else:
                        session.handle_stun(now, out[0], CLIENT, PUBLIC, RELAY)
                while (d := dtls.poll_transmit()) is not None:
                    if new_api:
                        session.handle_input(now, d, source)
                    else:
                        session.handle_dtls(now, d, CLIENT, RELAY)
                if state["srtp"] is not None and session.state == "connected":
                    break
                await trio.sleep(0.001)
                ice.handle_timeout(trio.current_time())
                dtls.handle_timeout(trio.current_time())
            srtp = state["srtp"]
            assert srtp is not None and session.state == "connected"
            wire = [srtp.protect(bytes(RtpPacket(111, (1000 + i) & 0xFFFF, 960 * i, 0x1234, p,
                                                 i == 0)))
                    for i, p in enumerate(payloads)]
            clock = trio.lowlevel.current_clock()
            assert isinstance(clock, trio.testing.MockClock)
            warm = min(100, packets // 4)
            wire = wire[:packets]
            if new_api:
                handle_input = session.handle_input

                def handle(now: float, data: bytes) -> None:
                    handle_input(now, data, source)
            else:
                handle_rtp = session.handle_rtp

                def handle(now: float, data: bytes) -> None:
                    handle_rtp(now, data, CLIENT, RELAY)
            for i, data in enumerate(wire):
                if i == warm:
                    t0, sent0 = time.process_time(), state["rtp_out"]
                clock.jump(0.020)
                handle(trio.current_time(), data)
            cpu = time.process_time() - t0
            sent = state["rtp_out"] - sent0
            assert sent >= 0.98 * (len(wire) - warm), f"only {sent} packets echoed"
            result.append(cpu / (len(wire) - warm) * 1e6)
            nursery.cancel_scope.cancel()

    np.seterr(all="ignore")
    trio.run(main, clock=trio.testing.MockClock(rate=0))
    return result[0]


def _measure_phone(packets: int) -> float:
    """One G.711 phone echo call in this process; CPU µs per echoed packet."""
    import numpy as np
    import trio
    import trio.testing

    from appliance.agents import resolve
    from appliance.audio import g711
    from appliance.phone_params import PhoneParams
    from appliance.proto.rtp import RtpPacket
    from appliance.transceiver.pacer import Pacer

    sys.path.insert(0, str(HERE))
    from opus_complexity import speech_like

    import appliance

    print(f"appliance from {Path(appliance.__file__).parent}", file=sys.stderr)
    speech = speech_like(seconds=4.0)  # 48 kHz int16
    narrow = speech[::6]  # 8 kHz: the bench's input only needs to be speech-like
    frames = [g711.encode("pcmu", narrow[i * 160:(i + 1) * 160]) for i in range(200)]
    wire = [bytes(RtpPacket(0, (1000 + i) & 0xFFFF, 160 * i, 0x1234, frames[i % 200],
                            i == 0)) for i in range(packets)]
    params = PhoneParams(
        call_id="bench", agent="echo", session={}, codec="PCMU", payload_type=0,
        clock_rate=8000, dtmf_payload_type=101, direction="sendrecv", remote=CLIENT,
        rtcp_mux=True, remote_rtcp=None, trunk_ip=CLIENT[0])
    state = {"rtp_out": 0}

    def send(data: bytes, relay: tuple[str, int]) -> None:
        state["rtp_out"] += 1

    class Counters(dict[str, int]):
        def __missing__(self, key: str) -> int:
            return 0

    result: list[float] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            pacer = Pacer()
            nursery.start_soon(pacer.run)
            try:  # one call class (issue 39)
                from appliance.transceiver.phone_session import PhoneSession as Call
            except ImportError:  # pragma: no cover - a later tree
                raise
            session = Call(
                session_id="bench", call_id="bench", transceiver=0, agent=resolve("echo"),
                params=params, send=send, now=trio.current_time(), on_end=lambda s: None,
                on_event=lambda e: None, on_latched=lambda s, a: None, counters=Counters(),
                pacer=pacer, opus_complexity=5)
            await nursery.start(session.run)
            clock = trio.lowlevel.current_clock()
            assert isinstance(clock, trio.testing.MockClock)
            source = (CLIENT, PUBLIC, RELAY)
            handle_input = session.handle_input
            warm = min(100, packets // 4)
            for i, data in enumerate(wire):
                if i == warm:
                    t0, sent0 = time.process_time(), state["rtp_out"]
                clock.jump(0.020)
                handle_input(trio.current_time(), data, source)
            cpu = time.process_time() - t0
            sent = state["rtp_out"] - sent0
            assert sent >= 0.98 * (len(wire) - warm), f"only {sent} packets echoed"
            result.append(cpu / (len(wire) - warm) * 1e6)
            nursery.cancel_scope.cancel()

    np.seterr(all="ignore")
    trio.run(main, clock=trio.testing.MockClock(rate=0))
    return result[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--packets", type=int, default=2000)
    p.add_argument("--stub-codec", action="store_true", help="constant-time codec stand-ins")
    p.add_argument("--complexity", type=int, default=None, help="Opus encoder complexity")
    p.add_argument("--compare", default=None, metavar="DIR",
                   help="alternate with the appliance package in DIR (before/after)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--media", default=None, metavar="JSON",
                   help='per-call media options, e.g. \'{"level_meter": false}\' (no stages)')
    p.add_argument("--prepare", type=int, default=0,
                   help="make this many packets first (callgrind: two --packets, one --prepare)")
    p.add_argument("--phone", action="store_true",
                   help="a G.711 phone echo call instead (with --compare: both kinds)")
    p.add_argument("--tree", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tree:
        sys.path.insert(0, args.tree)
    else:
        sys.path.insert(0, str(HERE.parent))
    if args.compare is None and args.phone:
        print(f"{_measure_phone(args.packets):.1f}")
        return 0
    if args.compare is None:
        us = _measure(args.packets, args.stub_codec, args.complexity, args.media, args.prepare)
        print(f"{us:.1f}")
        return 0
    trees = {"before": str(Path(args.compare).resolve()), "after": str(HERE.parent)}
    print(f"load average {open('/proc/loadavg').read().split()[:3]}; {args.rounds} rounds, "
          f"{args.packets} packets each, alternating", flush=True)
    got: dict[tuple[str, object], list[float]] = {}
    kinds: tuple[object, ...] = (False, True, "phone") if args.phone else (False, True)
    for _ in range(args.rounds):
        for stub in kinds:
            for name, tree in trees.items():
                cmd = [sys.executable, __file__, "--tree", tree, "--packets", str(args.packets)]
                if stub == "phone":
                    cmd.append("--phone")
                elif stub:
                    cmd.append("--stub-codec")
                if args.media is not None:
                    cmd += ["--media", args.media]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                                     env={**os.environ, "PYTHONPATH": tree})
                got.setdefault((name, stub), []).append(float(out.stdout.split()[-1]))
    print("path                        before µs/pkt   after µs/pkt   (min / median of rounds)")
    for stub in kinds:
        b, a = got[("before", stub)], got[("after", stub)]
        label = ("G.711 phone echo call" if stub == "phone" else
                 "own Python (codec stubbed)" if stub else "whole echo path (real Opus)")
        print(f"{label:<28} {min(b):6.1f} / {statistics.median(b):6.1f}  "
              f"{min(a):6.1f} / {statistics.median(a):6.1f}")
    print(f"load average {open('/proc/loadavg').read().split()[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
