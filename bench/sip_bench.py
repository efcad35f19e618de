"""Phone-call signaling on loopback (issue 28 item 8): INVITE -> 200 OK, with and without
the webhook round trip, and a SIPp load run.

Signaling runs in this process with ``--sip`` on loopback UDP. The caller is our own
sans-IO :class:`~appliance.proto.sip.SipEndpoint` on a trio UDP socket (one call at a time:
INVITE, time to the 200, ACK, BYE, next call). Modes, in the same run:

* ``options``: OPTIONS -> 200, the baseline (one parse, one answer: the floor of any SIP
  round trip through this process);
* ``direct``: ``--sip-agent echo`` with no webhook: the INVITE is answered at once
  (100, 180, media offer judged and answered, 200);
* ``webhook``: the ``realtime.call.incoming`` webhook goes to a receiver here that answers
  204 and then calls ``POST /v1/realtime/calls/{id}/accept`` (httpx), as an application's
  backend does: two HTTP round trips and the signed webhook on top of ``direct``.

Figures are p50/p99 in milliseconds and the ratio of each p50 to the baseline's. Media is
the no-transceiver answerer (phone_media.RelayAnswerMedia): no RTP is timed here.

``--sipp-seconds N`` (default 0: off) adds a SIPp run (Debian ``sip-tester``): its built-in
``uac`` scenario at ``--sipp-rate`` calls/s (default 20) for N seconds against
``--sip-agent echo``, each call held 1 s; prints calls made and failed.

    .venv/bin/python bench/sip_bench.py --calls 300
    .venv/bin/python bench/sip_bench.py --calls 100 --sipp-seconds 10

``--rtp-calls N`` (issue 28 item 8a) adds INVITE -> *first RTP back*: the same caller, but
against a transceiver running the echo agent behind a relay worker (all in this process,
tests/sip/support.py ``start_phone_stack``). The caller's offer names a UDP socket of its
own; after the 200 it sends PCMU (a 1 kHz tone, 20 ms packets) to the answer's address and
the time is taken when the first RTP packet comes back, in ``direct`` and ``webhook`` mode.

    .venv/bin/python bench/sip_bench.py --calls 100 --rtp-calls 100

``--sipp-rtp-seconds N`` (item 8b): ``appliance up --sip … --sip-agent echo`` as its own
processes (``--transceivers``, default 2 as ``up``'s), and SIPp at ``--sipp-rate`` calls/s
for N s, each call playing a 2 s PCMU tone from a pcap (``play_pcap_audio``, scenario
echo_pcap.xml's shape, each call on its own ``[auto_media_port]``) and hanging up; prints
calls made, successful and failed, and the transceivers' phone counters over the run
(RTP in and echoed out, drops) from ``/metrics``.

``--per-core N`` (item 8c): on one ``appliance up --transceivers 1``, the transceiver's CPU
(utime + stime from /proc, as bench/capacity.py reads it) over a steady window with no
call, with N PCMU phone calls (SIPp, a tone from a pcap, echoed) and with N Opus WebRTC
calls (``python -m appliance.loadgen``, the echo agent): CPU per call each, and their
ratio, which is G.711 calls per core over Opus calls per core.

    .venv/bin/python bench/sip_bench.py --calls 0 --sipp-rtp-seconds 60 --per-core 10

``--core N`` times only the sans-IO core (two endpoints in process, N whole calls) and
counts its Python function calls per call (cProfile): a figure that, unlike wall time, does
not move with the load of a shared box.

    .venv/bin/python bench/sip_bench.py --core 200
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from appliance.proto.sip import (
    CallAnswered,
    CallEnded,
    CallFailed,
    EndpointConfig,
    Response,
    SipEndpoint,
    Transmit,
    parse_untrusted,
)
from appliance.signaling import SignalingConfig, SignalingState, serve_signaling
from appliance.signaling.sip_config import SipSettings
from appliance.signaling.webhooks import Endpoint, secret_key

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # capacity.py
from sip.support import free_media_ports  # noqa: E402  (four free UDP ports for SIPp's -mp)

SECRET = "whsec_" + "YmVuY2gtc2VjcmV0LWJlbmNoLXNlY3JldC0wMTIz"
OFFER = (b"v=0\r\no=bench 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
         b"m=audio 40000 RTP/AVP 0 8 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\n"
         b"a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-15\r\na=sendrecv\r\n")


ACCEPT_S: list[float] = []  # the backend's accept POST alone (webhook mode)


def free_port(kind: socket.SocketKind = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Caller:
    """A UAC on a trio UDP socket around a sans-IO SipEndpoint."""

    def __init__(self, sock: trio.socket.SocketType, port: int, target: tuple[str, int]) -> None:
        self.sock, self.target = sock, target
        self.ep = SipEndpoint(EndpointConfig(host="127.0.0.1", port=port))
        self.events: list[object] = []
        self.responses: list[Response] = []
        self.changed = trio.Event()

    def _wake(self) -> None:
        """Wake every waiter (several calls may wait at once: ``--per-core``), each then
        waits on the fresh event."""
        self.changed.set()
        self.changed = trio.Event()

    async def flush(self) -> None:
        while (out := self.ep.poll_output()) is not None:
            if isinstance(out, Transmit):
                await self.sock.sendto(out.data, out.addr)
            else:
                self.events.append(out)
                self._wake()

    async def reader(self) -> None:
        while True:
            data, addr = await self.sock.recvfrom(65535)
            msg = parse_untrusted(data)
            if isinstance(msg, Response) and msg.cseq.method == "OPTIONS":
                self.responses.append(msg)
                self._wake()
                continue
            self.ep.handle_input(trio.current_time(), data, (addr[0], addr[1]))
            await self.flush()

    async def timers(self) -> None:
        while True:
            d = self.ep.poll_timeout()
            await trio.sleep_until(d if d is not None else trio.current_time() + 0.05)
            self.ep.handle_timeout(trio.current_time())
            await self.flush()

    async def wait(self, pred: object) -> object:
        while True:
            for ev in self.events:
                if pred(ev):  # type: ignore[operator]
                    self.events.remove(ev)
                    return ev
            await self.changed.wait()

    async def options(self, n: int) -> str:
        return (f"OPTIONS sip:{self.target[0]}:{self.target[1]} SIP/2.0\r\n"
                f"Via: SIP/2.0/UDP 127.0.0.1:{self.sock.getsockname()[1]};branch=z9hG4bKo{n}\r\n"
                f"From: <sip:bench@127.0.0.1>;tag=b{n}\r\nTo: <sip:{self.target[0]}>\r\n"
                f"Call-ID: opt{n}@bench\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\n"
                "Content-Length: 0\r\n\r\n")

    async def time_options(self, n: int) -> float:
        t0 = trio.current_time()
        await self.sock.sendto((await self.options(n)).encode(), self.target)
        while not self.responses:
            await self.changed.wait()
        self.responses.clear()
        return trio.current_time() - t0

    async def time_call(self) -> float:
        t0 = trio.current_time()
        cid = self.ep.invite(t0, f"sip:agent@127.0.0.1:{self.target[1]}", "sip:bench@127.0.0.1",
                             OFFER, self.target)
        await self.flush()
        ev = await self.wait(lambda e: getattr(e, "call_id", None) == cid
                             and isinstance(e, CallAnswered | CallFailed))
        took = trio.current_time() - t0
        if isinstance(ev, CallFailed):
            raise RuntimeError(f"call failed: {ev.status} {ev.reason}")
        self.ep.hangup(trio.current_time(), cid)
        await self.flush()
        await self.wait(lambda e: isinstance(e, CallEnded) and e.call_id == cid)
        return took


async def accept_on_webhook(base_url: str, client: httpx.AsyncClient,
                            stream: trio.SocketStream) -> None:
    """The backend: 204 to the webhook, then accept the call over HTTP."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += await stream.receive_some(65536)
    head, _, body = buf.partition(b"\r\n\r\n")
    length = next(int(ln.split(b":", 1)[1]) for ln in head.split(b"\r\n")
                  if ln.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += await stream.receive_some(65536)
    await stream.send_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
    await stream.aclose()
    event = json.loads(body)
    if event.get("type") == "realtime.call.incoming":
        t0 = trio.current_time()
        r = await client.post(f"{base_url}/v1/realtime/calls/{event['data']['call_id']}/accept",
                              json={"type": "realtime"})
        r.raise_for_status()
        ACCEPT_S.append(trio.current_time() - t0)


async def start(nursery: trio.Nursery, tmp: Path, *, webhook: bool, agent: str | None
                ) -> tuple[str, tuple[str, int]]:
    endpoints: list[Endpoint] = []
    holder: dict[str, str] = {}
    if webhook:
        client = httpx.AsyncClient()  # a backend keeps one (its connection pool)

        async def handler(stream: trio.SocketStream) -> None:
            await accept_on_webhook(holder["base"], client, stream)

        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        endpoints = [Endpoint(f"http://127.0.0.1:{port}/hook", secret_key(SECRET))]
    settings = SipSettings(udp_tcp=("127.0.0.1", 0), agent=agent, rate=1e4, max_invites=1024)
    cfg = SignalingConfig(http=("127.0.0.1", 0), public_addresses=["127.0.0.1"],
                          udp_port=free_port(), webui_dir=tmp / "webui", webhooks=endpoints,
                          sip=settings)
    binds = await nursery.start(partial(serve_signaling, cfg, state=SignalingState(cfg)))
    holder["base"] = binds[0]
    assert settings.bound is not None
    return binds[0], settings.bound[0]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


async def measure(calls: int, tmp: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for mode in ("direct", "webhook"):
        async with trio.open_nursery() as nursery:
            _, sip = await start(nursery, tmp / mode, webhook=mode == "webhook",
                                 agent="echo" if mode == "direct" else None)
            sock = trio.socket.socket(type=socket.SOCK_DGRAM)
            await sock.bind(("127.0.0.1", 0))
            caller = Caller(sock, sock.getsockname()[1], sip)
            nursery.start_soon(caller.reader)
            nursery.start_soon(caller.timers)
            if mode == "direct":
                for i in range(10):  # warm-up
                    await caller.time_options(i)
                out["options"] = [await caller.time_options(100 + i) for i in range(calls)]
            for _ in range(5):
                await caller.time_call()
            out[mode] = [await caller.time_call() for _ in range(calls)]
            nursery.cancel_scope.cancel()
    return out


async def sipp_run(seconds: int, rate: int, tmp: Path) -> tuple[int, str]:
    sipp = shutil.which("sipp")
    if sipp is None:
        return -1, "sipp missing (make sysdeps)"
    async with trio.open_nursery() as nursery:
        _, sip = await start(nursery, tmp / "sipp", webhook=False, agent="echo")
        cmd = [sipp, f"{sip[0]}:{sip[1]}", "-sn", "uac", "-i", "127.0.0.1", "-p",
               str(free_port()), "-r", str(rate), "-m", str(rate * seconds), "-d", "1000",
               "-l", str(rate * 4), "-nostdin", "-timeout", str(seconds + 60), "-timeout_error",
               "-trace_stat", "-stf", str(tmp / "stat.csv"), "-mp", str(free_media_ports())]
        proc = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True,
                                      check=False, cwd=tmp)
        nursery.cancel_scope.cancel()
    stat = (tmp / "stat.csv").read_text().splitlines() if (tmp / "stat.csv").exists() else []
    summary = ""
    if len(stat) >= 2:
        head, last = stat[0].split(";"), stat[-1].split(";")
        row = dict(zip(head, last, strict=False))
        summary = (f"calls {row.get('TotalCallCreated')}, successful "
                   f"{row.get('SuccessfulCall(C)')}, failed {row.get('FailedCall(C)')}")
    return proc.returncode, summary


# -- media: first RTP back, SIPp with RTP, G.711 against Opus per core (item 8) ----------

TONE = None  # 160 PCMU bytes of a 1 kHz tone, made on first use


def tone_payload(i: int) -> bytes:
    global TONE
    if TONE is None:
        import numpy as np

        from appliance.audio import g711

        t = np.arange(50 * 160) / 8000
        pcm = np.repeat((9000 * np.sin(2 * np.pi * 1000 * t)).astype("<i2"), 6)
        enc = g711.G711Encoder("pcmu")
        TONE = b"".join(enc.encode(pcm[k * 960:(k + 1) * 960].tobytes()) for k in range(50))
    k = i % 50
    return TONE[k * 160:(k + 1) * 160]


def answer_addr(sdp: bytes) -> tuple[str, int]:
    host, port = "", 0
    for line in sdp.decode(errors="replace").splitlines():
        if line.startswith("c=IN IP4 "):
            host = line.split()[2]
        elif line.startswith("m=audio "):
            port = int(line.split()[1])
    if not host or not port:
        raise RuntimeError(f"no audio address in the answer: {sdp!r}")
    return host, port


async def media_call(caller: Caller, *, hold: float | None, echoes: list[int] | None = None
                     ) -> float:
    """One call with RTP: INVITE (our offer names a fresh UDP socket), and after the 200 a
    1 kHz PCMU tone at 20 ms to the answer's address. Returns INVITE -> first RTP back;
    with ``hold`` the call then stays up that long (counting packets back into
    ``echoes``) before the BYE, else it ends at the first packet back."""
    from appliance.proto.rtp import rtp_header

    media = trio.socket.socket(type=socket.SOCK_DGRAM)
    with media:
        await media.bind(("127.0.0.1", 0))
        offer = OFFER.replace(b"m=audio 40000", f"m=audio {media.getsockname()[1]}".encode())
        t0 = trio.current_time()
        cid = caller.ep.invite(t0, f"sip:agent@127.0.0.1:{caller.target[1]}",
                               "sip:bench@127.0.0.1", offer, caller.target)
        await caller.flush()
        ev = await caller.wait(lambda e: getattr(e, "call_id", None) == cid
                               and isinstance(e, CallAnswered | CallFailed))
        if isinstance(ev, CallFailed):
            raise RuntimeError(f"call failed: {ev.status} {ev.reason}")
        assert isinstance(ev, CallAnswered)
        dest = answer_addr(ev.answer_sdp)
        first: list[float] = []
        ssrc = int.from_bytes(os.urandom(4), "big")

        async def send() -> None:
            i = 0
            nxt = trio.current_time()
            while True:
                await media.sendto(rtp_header(0, i & 0xFFFF, 160 * i, ssrc, i == 0)
                                   + tone_payload(i), dest)
                i += 1
                nxt += 0.02  # a real-time sender (a phone's packet clock), not a wait
                await trio.sleep_until(nxt)

        async def recv(scope: trio.CancelScope) -> None:
            while True:
                data = await media.recv(2048)
                if len(data) > 12 and data[0] >> 6 == 2 and data[1] & 0x7F == 0:
                    if not first:
                        first.append(trio.current_time() - t0)
                        if hold is None:
                            scope.cancel()
                    if echoes is not None:
                        echoes[0] += 1

        async with trio.open_nursery() as n:
            n.start_soon(send)
            n.start_soon(recv, n.cancel_scope)
            if hold is not None:
                await trio.sleep(hold)  # the call's length: what is being measured
                n.cancel_scope.cancel()
        caller.ep.hangup(trio.current_time(), cid)
        await caller.flush()
        await caller.wait(lambda e: isinstance(e, CallEnded) and e.call_id == cid)
    if not first:
        raise RuntimeError("no RTP came back")
    return first[0]


async def accept_each_call(phone: Any) -> None:
    """The backend of ``webhook`` mode: accept each ``realtime.call.incoming`` over HTTP."""
    from appliance.signaling.sip_calls import CALL_INCOMING

    client = httpx.AsyncClient()
    n = 0
    assert phone.receiver is not None
    while True:
        n += 1
        ev = await phone.receiver.wait_for(CALL_INCOMING, n)
        # the echo agent, as in direct mode (the default for an accept is the Realtime agent)
        r = await client.post(f"{phone.base_url}/v1/realtime/calls/{ev['data']['call_id']}"
                              "/accept", params={"agent": "echo"}, json={"type": "realtime"})
        r.raise_for_status()


async def measure_rtp(calls: int, tmp: Path) -> dict[str, list[float]]:
    """INVITE -> first RTP back, direct and through the webhook, one call at a time."""
    from sip.support import start_phone_stack

    out: dict[str, list[float]] = {}
    for mode in ("direct", "webhook"):
        (tmp / f"rtp-{mode}").mkdir()
        async with trio.open_nursery() as nursery:
            stack = await start_phone_stack(nursery, tmp / f"rtp-{mode}",
                                            webhooks=mode == "webhook", rate=1e4,
                                            max_invites=1024)
            phone = stack.phone
            if mode == "webhook":
                nursery.start_soon(accept_each_call, phone)
            sock = trio.socket.socket(type=socket.SOCK_DGRAM)
            await sock.bind(("127.0.0.1", 0))
            caller = Caller(sock, sock.getsockname()[1], phone.sip)
            nursery.start_soon(caller.reader)
            nursery.start_soon(caller.timers)
            for _ in range(3):
                await media_call(caller, hold=None)
            out[mode] = [await media_call(caller, hold=None) for _ in range(calls)]
            nursery.cancel_scope.cancel()
    return out


def metric_sum(text: str, name: str) -> float:
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith(name + "{") or ln.startswith(name + " "))


def read_metrics(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        return str(r.read().decode())


PHONE_COUNTERS = ("phone_rtp_in", "phone_rtp_out", "phone_stray", "phone_learning",
                  "drop_phone_no_relay", "drop_phone_pending", "phones_created",
                  "sessions_refused_overloaded")


def phone_counters(url: str) -> dict[str, float]:
    text = read_metrics(url)
    return {c: metric_sum(text, f"appliance_transceiver_{c}_total") for c in PHONE_COUNTERS}


def sipp_rtp_scenario(tmp: Path, tone_s: float) -> Path:
    """echo_pcap.xml with a ``tone_s`` tone (tone.pcap in ``tmp``) and the pause to match."""
    from sip.support import SCENARIOS, write_tone_pcap

    write_tone_pcap(tmp / "tone.pcap", seconds=tone_s)
    text = (SCENARIOS / "echo_pcap.xml").read_text()
    assert '<pause milliseconds="3500"/>' in text
    path = tmp / "echo_load.xml"
    assert "m=audio [media_port] " in text
    # [auto_media_port]: each call offers (and plays its pcap from) a port of its own;
    # with [media_port] every call's RTP comes from one address and the calls' media
    # cannot be told apart (SIPp's RTP is plain and each pcap has the same SSRC)
    path.write_text(text.replace('<pause milliseconds="3500"/>',
                                 f'<pause milliseconds="{int(tone_s * 1000 + 500)}"/>')
                    .replace("m=audio [media_port] ", "m=audio [auto_media_port] "))
    return path


def sipp_rtp_run(url: str, sip_port: int, seconds: int, rate: int, tmp: Path) -> str:
    """SIPp with RTP against ``appliance up`` (its own processes): calls made, failed."""
    import subprocess

    sipp = shutil.which("sipp")
    if sipp is None:
        return "sipp missing (make sysdeps)"
    scen = sipp_rtp_scenario(tmp, 2.0)
    before = phone_counters(url)
    cmd = [sipp, f"127.0.0.1:{sip_port}", "-sf", str(scen), "-i", "127.0.0.1", "-p",
           str(free_port()), "-r", str(rate), "-m", str(rate * seconds), "-l", str(rate * 8),
           "-nostdin", "-timeout", str(seconds + 90), "-timeout_error", "-trace_stat",
           "-trace_err",
           "-stf", str(tmp / "stat_rtp.csv"), "-mp", str(free_media_ports())]
    proc = subprocess.run(cmd, capture_output=True, cwd=tmp, check=False)
    after = phone_counters(url)
    stat = (tmp / "stat_rtp.csv").read_text().splitlines() \
        if (tmp / "stat_rtp.csv").exists() else []
    summary = f"exit {proc.returncode}"
    if len(stat) >= 2:
        row = dict(zip(stat[0].split(";"), stat[-1].split(";"), strict=False))
        summary += (f"; calls {row.get('TotalCallCreated')}, successful "
                    f"{row.get('SuccessfulCall(C)')}, failed {row.get('FailedCall(C)')}")
    sent = rate * seconds * 100  # packets in each call's pcap (2 s at 20 ms)
    delta = {k: after[k] - before[k] for k in after}
    summary += f"; RTP packets SIPp played {sent}; transceiver: " + ", ".join(
        f"{k} {v:.0f}" for k, v in delta.items())
    if proc.returncode != 0:
        errs = sorted(tmp.glob("*_errors.log"))
        tail = errs[-1].read_text(errors="replace")[-1500:] if errs else proc.stderr[-1500:]
        summary += f"\nSIPp errors (tail):\n{tail!s}"
    return summary


async def phone_load(sip: tuple[str, int], n: int, hold: float, start_gap: float,
                     echoes: list[int]) -> None:
    sock = trio.socket.socket(type=socket.SOCK_DGRAM)
    await sock.bind(("127.0.0.1", 0))
    caller = Caller(sock, sock.getsockname()[1], sip)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller.reader)
        nursery.start_soon(caller.timers)
        async with trio.open_nursery() as calls:
            for i in range(n):
                calls.start_soon(partial(media_call, caller, hold=hold - i * start_gap,
                                         echoes=echoes))
                await trio.sleep(start_gap)  # the ramp: one call every start_gap
        nursery.cancel_scope.cancel()


def codec_us_per_frame(frames: int = 1000) -> dict[str, float]:
    """CPU µs per 20 ms frame decoded and encoded (48 kHz PCM on the agent side, as the
    pipeline does): G.711 µ-law with its 8 <-> 48 kHz resampler, and Opus at the
    transceiver's default complexity. The codec's share of a call, beside the whole."""
    import time

    import numpy as np

    from appliance.audio import g711
    from appliance.transceiver import opus

    t = np.arange(frames * 960) / 48000
    pcm = (9000 * np.sin(2 * np.pi * 700 * t)).astype("<i2")
    frames48 = [pcm[i * 960:(i + 1) * 960].tobytes() for i in range(frames)]
    out: dict[str, float] = {}
    for name, dec, enc in (("pcmu", g711.G711Decoder("pcmu"), g711.G711Encoder("pcmu")),
                           ("opus", opus.OpusDecoder(), opus.OpusEncoder())):
        payloads = [enc.encode(f) for f in frames48]  # what arrives
        t0 = time.process_time()
        for f, p in zip(frames48, payloads, strict=True):
            dec.decode(p)
            enc.encode(f)
        out[name] = (time.process_time() - t0) / frames * 1e6
    return out


def per_core(n: int, steady: float, tmp: Path) -> None:
    """G.711 echo calls per core against Opus echo calls per core (module docstring)."""
    import threading
    import time

    import capacity

    sip_port = free_port()
    extra = ["--agent", "echo", "--sip", f"127.0.0.1:{sip_port}", "--sip-agent", "echo"]
    with capacity.start_appliance("pcm", extra) as server:
        def window(seconds: float) -> float:
            core = server.core_pids()
            c0, t0 = capacity.cpu_seconds(core), time.monotonic()
            time.sleep(seconds)
            return (capacity.cpu_seconds(core) - c0) / (time.monotonic() - t0)

        idle = window(steady)
        gap, ramp = 0.1, n * 0.1 + 2.0
        echoes = [0]
        th = threading.Thread(target=lambda: trio.run(
            phone_load, ("127.0.0.1", sip_port), n, ramp + steady + 1.0, gap, echoes))
        th.start()
        time.sleep(ramp)
        got = echoes[0]
        pcmu = window(steady)
        pcmu_pps = (echoes[0] - got) / steady
        th.join()
        opus_step = capacity.measure(server, n, rate=10.0, steady=steady)
        opus = opus_step.server_cpu
        done = opus_step.summary.get("completed")
    per_pcmu, per_opus = (pcmu - idle) / n, (opus - idle) / n
    print(f"transceiver CPU (cores), {steady:.0f} s windows: idle {idle:.3f}; {n} PCMU phone "
          f"calls {pcmu:.3f} ({pcmu_pps:.0f} packets/s echoed back); {n} Opus WebRTC calls "
          f"{opus:.3f} ({done} completed)")
    print(f"per call above idle: PCMU {per_pcmu * 100:.2f} % of a core, Opus "
          f"{per_opus * 100:.2f} %; calls per core PCMU {1 / per_pcmu:.0f}, Opus "
          f"{1 / per_opus:.0f}; G.711/Opus ratio {per_opus / per_pcmu:.1f}")
    codec = codec_us_per_frame()
    print(f"the codec alone (this process), µs per 20 ms frame decoded + encoded: PCMU with "
          f"its resampler {codec['pcmu']:.0f}, Opus {codec['opus']:.0f} "
          f"({codec['opus'] / codec['pcmu']:.1f}x); at 50 frames/s that is "
          f"{codec['pcmu'] * 50 / 1e4:.2f} % and {codec['opus'] * 50 / 1e4:.2f} % of a core")


def core_calls(n: int) -> float:
    """``--core N``: N whole calls (INVITE, 100, 180, 200, ACK, BYE, 200) between two
    sans-IO endpoints in this process, no sockets, no trio: the SIP core's own cost. Returns
    seconds per call; under callgrind, ``--core N`` minus ``--core 0`` is the instructions."""
    import time

    a_addr, b_addr = ("127.0.0.1", 5060), ("127.0.0.2", 5062)
    a = SipEndpoint(EndpointConfig(host=a_addr[0], port=a_addr[1]))
    b = SipEndpoint(EndpointConfig(host=b_addr[0], port=b_addr[1], rate=1e9, burst=1e9))
    now = 1000.0

    def pump() -> list[object]:
        events: list[object] = []
        moved = True
        while moved:
            moved = False
            for ep, src in ((a, a_addr), (b, b_addr)):
                while (out := ep.poll_output()) is not None:
                    moved = True
                    if isinstance(out, Transmit):
                        (b if out.addr == b_addr else a).handle_input(now, out.data, src)
                    else:
                        events.append(out)
        return events

    from appliance.proto.sip import IncomingCall
    t0 = time.perf_counter()
    for _ in range(n):
        cid = a.invite(now, "sip:agent@127.0.0.2:5062", "sip:bench@127.0.0.1", OFFER, b_addr)
        inc = next(e for e in pump() if isinstance(e, IncomingCall))
        b.ringing(now, inc.call_id)
        b.accept(now, inc.call_id, OFFER)
        pump()
        a.hangup(now, cid)
        pump()
        now += 0.001
    return (time.perf_counter() - t0) / max(n, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--sipp-seconds", type=int, default=0)
    ap.add_argument("--sipp-rate", type=int, default=20)
    ap.add_argument("--rtp-calls", type=int, default=0,
                    help="INVITE -> first RTP back, N calls each mode (transceiver in process; "
                         "runs with --calls > 0: its ratio is to the 200 OK p50)")
    ap.add_argument("--sipp-rtp-seconds", type=int, default=0,
                    help="SIPp with RTP (a pcap) against `appliance up` for N seconds")
    ap.add_argument("--transceivers", type=int, default=2,
                    help="--sipp-rtp-seconds: transceivers of `appliance up` (default 2)")
    ap.add_argument("--per-core", type=int, default=0, metavar="N",
                    help="transceiver CPU per call: N PCMU phone calls vs N Opus WebRTC calls")
    ap.add_argument("--steady", type=float, default=15.0,
                    help="--per-core's measuring window, seconds")
    ap.add_argument("--core", type=int, default=None, metavar="N",
                    help="only the sans-IO core: N calls between two endpoints in process")
    args = ap.parse_args()
    if args.core is not None:
        import cProfile
        import pstats

        per = core_calls(args.core)
        prof = cProfile.Profile()
        prof.runcall(core_calls, args.core)
        calls = pstats.Stats(prof).total_calls  # type: ignore[attr-defined]
        print(f"core: {args.core} calls, {per * 1e6:.0f} µs per call (both endpoints), "
              f"{calls / max(args.core, 1):.0f} Python function calls per call")
        return
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.calls:
            got = trio.run(measure, args.calls, tmp)
            base = statistics.median(got["options"])
            print(f"{'mode':10} {'p50 ms':>8} {'p99 ms':>8} {'p50/options':>12}   "
                  f"({args.calls} each)")
            got["accept POST"] = ACCEPT_S[-args.calls:]
            for mode in ("options", "direct", "webhook", "accept POST"):
                xs = got[mode]
                print(f"{mode:10} {pct(xs, 0.5):8.2f} {pct(xs, 0.99):8.2f} "
                      f"{statistics.median(xs) / base:12.1f}")
            if args.rtp_calls:
                rtp = trio.run(measure_rtp, args.rtp_calls, tmp)
                for mode in ("direct", "webhook"):
                    xs, ok = rtp[mode], got[mode]
                    print(f"first RTP {mode:8} p50 {pct(xs, 0.5):7.2f} p99 {pct(xs, 0.99):7.2f}"
                          f" ms ({args.rtp_calls} calls); p50 / its 200 OK p50 "
                          f"{statistics.median(xs) / statistics.median(ok):.1f}")
        if args.sipp_rtp_seconds:
            import capacity

            sip_port = free_port()
            # `up`'s default of two transceivers; --sip-rate: SIPp is one source IP, and 20
            # calls/s are 40 transactions/s (INVITE, BYE), over the default 20 per IP
            with capacity.start_appliance("sip", ["--agent", "echo", "--sip",
                                                  f"127.0.0.1:{sip_port}", "--sip-agent",
                                                  "echo", "--sip-rate", "1000"],
                                          transceivers=args.transceivers) as server:
                print(f"sipp RTP {args.sipp_rate} calls/s for {args.sipp_rtp_seconds} s: "
                      + sipp_rtp_run(server.url, sip_port, args.sipp_rtp_seconds,
                                     args.sipp_rate, tmp))
        if args.per_core:
            per_core(args.per_core, args.steady, tmp)
        if args.sipp_seconds:
            code, summary = trio.run(sipp_run, args.sipp_seconds, args.sipp_rate, tmp)
            print(f"sipp uac {args.sipp_rate} calls/s for {args.sipp_seconds} s: exit {code}; "
                  f"{summary}")


if __name__ == "__main__":
    main()
