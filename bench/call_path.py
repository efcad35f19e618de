"""The transceiver's whole call path per echoed packet, N sessions at once, in process.

Unlike ``pcm_path.py`` (one :class:`Session`, packets handed to it directly) this runs the
real :class:`~appliance.transceiver.server.Transceiver`: its receive loop on a loopback UDP
socket, PROXY v2 parsing, routing, the shared pacer, every session's timer task and trio's
scheduler. ``-n`` PCM echo sessions are connected in memory (ICE + DTLS, as in
``pcm_path.py``); then every tick of a fake trio clock (20 ms) the driver sends one
SRTP packet per session — PROXY header + datagram, as a relay would — to the transceiver's
socket, lets trio run until every task is blocked, and reads back the echoes. With
``--stub-codec`` Opus is replaced by constant-time stand-ins, so only the non-codec share
is left.

Instruction counts are what compare on a shared machine: run it twice under callgrind with
the same ``--prepare`` and two ``--ticks``, subtract, divide by ``n`` × the tick difference
(``--instr`` does all that, in fresh processes, for this tree and optionally ``--compare``
another one)::

    .venv/bin/python bench/call_path.py -n 20 --ticks 100 --stub-codec          # µs/packet
    .venv/bin/python bench/call_path.py -n 20 --instr --compare /tmp/before       # callgrind
    .venv/bin/python bench/call_path.py -n 20 --ticks 300 --stub-codec --cprofile  # split

The driver's own sendto/recv per packet is in the count (a few thousand user-space
instructions, the same for both trees); the kernel's part is not (valgrind counts user
space only).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OFFER = HERE.parent / "tests" / "proto" / "sdp" / "data" / "chrome-audio-only.sdp"
PUBLIC = ("198.51.100.1", 3478)


OPS = {"opcodes": 0, "calls": 0}


def _tracer(frame: Any, event: str, arg: Any) -> Any:
    """sys.settrace: count Python function calls (resumptions of coroutines included) and
    bytecodes executed — deterministic, unlike time on a shared machine."""
    if event == "call":
        OPS["calls"] += 1
        frame.f_trace_opcodes = True
    elif event == "opcode":
        OPS["opcodes"] += 1
    return _tracer


def _run(n: int, ticks: int, prepare: int, stub: bool, profile: str | None,
         opcodes: bool = False) -> float:
    """N sessions, ``ticks`` packets each through the transceiver; CPU µs per packet."""
    import trio
    import trio.testing

    import appliance
    from appliance.agents import resolve
    from appliance.proto.dtls import Certificate, DtlsConnection, HandshakeComplete, Role
    from appliance.proto.ice import IceClient
    from appliance.proto.mux import Kind, classify
    from appliance.proto.proxy import encode_header, parse_untrusted
    from appliance.proto.rtp import RtpPacket
    from appliance.proto.sdp import build_answer, parse_offer_untrusted
    from appliance.proto.srtp import SrtpSession
    from appliance.transceiver import session as session_mod
    from appliance.transceiver.opus import FRAME_BYTES, OpusEncoder
    from appliance.transceiver.server import Transceiver, TransceiverConfig, _bind

    print(f"appliance from {Path(appliance.__file__).parent}", file=sys.stderr)
    if profile or opcodes:
        # Tracing slows the loop ~10x, which would trip the receive loop's time bounds
        # (yield after 2 ms, flush after 0.5 ms) where an untraced run does not: off for
        # both trees alike, so a tick's datagrams are one pass and one flush.
        from appliance.transceiver import server as server_mod
        server_mod.YIELD_AFTER = server_mod.FLUSH_AFTER = 1e9  # type: ignore[misc]
    made = max(ticks, prepare)
    frame = bytes(FRAME_BYTES)
    payload = OpusEncoder().encode(bytes(i % 251 for i in range(FRAME_BYTES)))

    class StubDecoder:
        errors = 0

        def decode(self, payload: bytes) -> bytes:
            return frame

        def conceal(self, fec_from: bytes | None = None) -> bytes:
            return frame

    class StubEncoder:
        def encode(self, pcm: bytes) -> bytes:
            return payload

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
    result: list[float] = []

    async def main() -> None:
        sock = _bind(("127.0.0.1", 0))
        tr = Transceiver(TransceiverConfig(id=0, secrets=(secrets.token_bytes(32),)), sock)
        driver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        driver.bind(("127.0.0.1", 0))
        driver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        driver.setblocking(False)
        relay = driver.getsockname()
        target = sock.getsockname()
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, trio.testing.MockClock)
        async with trio.open_nursery() as nursery:
            tr._nursery = nursery
            nursery.start_soon(tr.receive_loop)
            nursery.start_soon(tr.pacer.run)
            wires: list[list[bytes]] = []
            for i in range(n):
                client = ("203.0.113.7", 20000 + i)
                ufrag, pwd = f"srv{i:05d}", secrets.token_hex(12)
                answer = build_answer(offer, ice_ufrag=ufrag, ice_pwd=pwd,
                                      fingerprint=server_cert.fingerprint, candidates=[PUBLIC],
                                      ssrc=0xABC000 + i, cname="bench", session_id=i + 1,
                                      prefer_active=False)
                ice = IceClient("Clnt", "clientpasswordclientpass", ufrag, pwd, PUBLIC)
                dtls = DtlsConnection(Role.CLIENT, cert,
                                      remote_fingerprints=[server_cert.fingerprint])
                state: dict[str, Any] = {"srtp": None}

                def setup_send(data: bytes, to: tuple[str, int], ice: Any = ice,
                               dtls: Any = dtls, state: dict[str, Any] = state) -> None:
                    _, _, off = parse_untrusted(data)
                    body = bytes(data[off:])
                    now = trio.current_time()
                    kind = classify(body)
                    if kind is Kind.STUN:
                        ice.handle_datagram(now, body, PUBLIC)
                        if dtls.state.value == "client-idle" and ice.state.value == "nominated":
                            dtls.start(now)
                    elif kind is Kind.DTLS:
                        dtls.handle_datagram(now, body)
                        while (ev := dtls.poll_event()) is not None:
                            if isinstance(ev, HandshakeComplete):
                                assert ev.srtp_profile is not None
                                state["srtp"] = SrtpSession.from_exporter(
                                    dtls.export_keying_material, ev.srtp_profile, "client")

                session = session_mod.Session(
                    session_id=f"s{i}", transceiver=0, agent=resolve("echo"), answer=answer,
                    candidates=[PUBLIC], local_ufrag=ufrag, local_pwd=pwd,
                    dtls=DtlsConnection(Role.SERVER, server_cert, remote_fingerprints=[
                        str(f) for f in answer.transport.fingerprints]),
                    ssrc=0xABC000 + i, cname="bench", send=setup_send,
                    now=trio.current_time(), on_end=tr._on_end, counters=tr.counters,
                    pacer=tr.pacer)
                if stub:
                    session.decoder = StubDecoder()  # type: ignore[assignment]
                    session.encoder = StubEncoder()  # type: ignore[assignment]
                # the one call table (issue 39); a tree from before it had tr.sessions
                table = tr.calls if hasattr(tr, "calls") else tr.sessions
                table[session.id] = session
                tr.by_ufrag[ufrag] = session
                await nursery.start(session.run)
                ice.start(trio.current_time())
                source = (client, PUBLIC, relay)
                for _ in range(50):
                    now = trio.current_time()
                    while (out := ice.poll_transmit()) is not None:
                        session.handle_input(now, out[0], source)
                    while (d := dtls.poll_transmit()) is not None:
                        session.handle_input(now, d, source)
                    if state["srtp"] is not None and session.state == "connected":
                        break
                    clock.jump(0.001)
                    await trio.sleep(0)  # noqa: ASYNC115 (as the recorded figures were taken)
                    ice.handle_timeout(trio.current_time())
                    dtls.handle_timeout(trio.current_time())
                srtp = state["srtp"]
                assert srtp is not None and session.state == "connected"
                session._send = tr.send  # from now on, out through the transceiver's socket
                tr.by_client[client] = session
                header = encode_header(client, PUBLIC, b"")
                wires.append([header + srtp.protect(bytes(RtpPacket(
                    111, (1000 + k) & 0xFFFF, 960 * k, 0x1234 + i, payload, k == 0)))
                    for k in range(made)])
            await trio.testing.wait_all_tasks_blocked()
            echoed = 0
            warm = min(20, ticks // 4)
            t0 = 0.0
            prof = cProfile.Profile() if profile else None
            for k in range(ticks):
                if k == warm:
                    t0, echoed = time.process_time(), 0
                    if prof is not None:
                        prof.enable()
                    if opcodes:
                        sys.settrace(_tracer)
                clock.jump(0.020)
                want = tr.counters["datagrams_in"] + n
                for w in wires:
                    driver.sendto(w[k], target)
                for _ in range(1000):
                    await trio.testing.wait_all_tasks_blocked()
                    if tr.counters["datagrams_in"] >= want:
                        break
                    await trio.sleep(0)  # noqa: ASYNC115 (as the recorded figures were taken)
                while True:
                    try:
                        driver.recv(2048)
                    except BlockingIOError:
                        break
                    echoed += 1
            cpu = time.process_time() - t0
            sys.settrace(None)
            if prof is not None:
                prof.disable()
                prof.dump_stats(profile)
            packets = n * (ticks - warm)
            assert echoed >= 0.98 * packets, f"only {echoed} of {packets} packets echoed"
            result.append(cpu / packets * 1e6)
            nursery.cancel_scope.cancel()
        sock.close()
        driver.close()

    trio.run(main, clock=trio.testing.MockClock(rate=0))
    return result[0]


# -- reading a cProfile of the loop by layer ---------------------------------------------------

LAYERS = (  # (label, path fragments), first match wins
    ("socket loop / PROXY", ("transceiver/server.py", "proto/proxy/", "netio/")),
    ("session drain", ("transceiver/session.py",)),
    ("ServerCall / RTP / RTCP", ("transceiver/call.py", "proto/rtp/", "transceiver/rtcp.py",
                                 "proto/mux")),
    ("SRTP", ("proto/srtp/", "pylibsrtp")),
    ("jitter / pacer / packetizer", ("transceiver/jitter.py", "transceiver/pacer.py",
                                     "transceiver/packetizer.py")),
    ("media / PcmPipeline", ("transceiver/media.py",)),
    ("stages / VAD / agent", ("transceiver/stages/", "appliance/agents/")),
    ("trio scheduling", ("trio/", "outcome/", "sniffio/")),
    ("bench driver", ("bench/call_path.py",)),
)


def split(path: str) -> list[tuple[str, float]]:
    """Own time per layer (cProfile tottime), as fractions of the total."""
    st = pstats.Stats(path)
    by: dict[str, float] = {}
    total = 0.0
    def layer(file: str) -> str:
        for lab, frags in LAYERS:
            if any(f in file for f in frags):
                return lab
        return "other"

    stats = st.stats  # type: ignore[attr-defined]
    for (file, _line, _name), (_cc, _nc, tt, _ct, callers) in stats.items():
        if file == "~" and callers:  # a builtin or C call: its callers' layer pays
            for (cfile, _l, _n), edge in callers.items():
                lab = layer(cfile)
                by[lab] = by.get(lab, 0.0) + edge[2]
                total += edge[2]
            continue
        by[layer(file)] = by.get(layer(file), 0.0) + tt
        total += tt
    return sorted(((k, v / total) for k, v in by.items()), key=lambda kv: -kv[1])


# -- callgrind -----------------------------------------------------------------------------


def _instructions(tree: str, args: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
               sys.executable, __file__, "--tree", tree, *args]
        subprocess.run(cmd, capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": tree})
        for line in out.read_text().splitlines():
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError("no callgrind summary")


def instr_per_packet(tree: str, n: int, lo: int, hi: int) -> float:
    base = ["-n", str(n), "--prepare", str(hi), "--stub-codec"]
    a = _instructions(tree, [*base, "--ticks", str(lo)])
    b = _instructions(tree, [*base, "--ticks", str(hi)])
    return (b - a) / (n * (hi - lo))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=20, help="sessions (default 20)")
    p.add_argument("--ticks", type=int, default=100, help="packets per session")
    p.add_argument("--prepare", type=int, default=0, help="packets made per session first")
    p.add_argument("--stub-codec", action="store_true")
    p.add_argument("--cprofile", action="store_true", help="own time per layer (cProfile)")
    p.add_argument("--opcodes", action="store_true",
                   help="count Python bytecodes and calls per packet (sys.settrace)")
    p.add_argument("--top", type=int, default=0, help="with --cprofile: the top functions")
    p.add_argument("--instr", action="store_true",
                   help="callgrind instructions per packet (ticks 40 and 140, codec stubbed)")
    p.add_argument("--compare", default=None, metavar="DIR", help="another tree, same run")
    p.add_argument("--tree", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.path.insert(0, args.tree or str(HERE.parent))
    if args.instr:
        trees = {"this": str(HERE.parent)}
        if args.compare:
            trees = {"before": str(Path(args.compare).resolve()), **trees}
        got = {}
        for name, tree in trees.items():
            got[name] = instr_per_packet(tree, args.n, 40, 140)
            print(f"{name}: {got[name]:,.0f} instructions per echoed packet "
                  f"(n {args.n}, codec stubbed, {tree})", flush=True)
        if "before" in got:
            print(f"after / before: {got['this'] / got['before']:.3f}")
        return 0
    prof = None
    if args.cprofile:
        prof = tempfile.mktemp(suffix=".pstats")
    us = _run(args.n, args.ticks, args.prepare, args.stub_codec, prof, args.opcodes)
    if args.opcodes:
        packets = args.n * (args.ticks - min(20, args.ticks // 4))
        print(f"{OPS['opcodes'] / packets:.0f} bytecodes, {OPS['calls'] / packets:.1f} Python "
              f"calls per echoed packet (n {args.n}, {packets} packets)")
        return 0
    print(f"{us:.1f}")
    if prof is not None:
        for label, share in split(prof):
            print(f"  {100 * share:5.1f} %  {us * share:6.1f} µs  {label}")
        if args.top:
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
        os.unlink(prof)
    return 0


if __name__ == "__main__":
    sys.exit(main())
