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

``--core N`` times only the sans-IO core (two endpoints in process, N whole calls) and
counts its Python function calls per call (cProfile): a figure that, unlike wall time, does
not move with the load of a shared box.

    .venv/bin/python bench/sip_bench.py --core 200
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

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

    async def flush(self) -> None:
        while (out := self.ep.poll_output()) is not None:
            if isinstance(out, Transmit):
                await self.sock.sendto(out.data, out.addr)
            else:
                self.events.append(out)
                self.changed.set()

    async def reader(self) -> None:
        while True:
            data, addr = await self.sock.recvfrom(65535)
            msg = parse_untrusted(data)
            if isinstance(msg, Response) and msg.cseq.method == "OPTIONS":
                self.responses.append(msg)
                self.changed.set()
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
            self.changed = trio.Event()
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
            self.changed = trio.Event()
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
        got = trio.run(measure, args.calls, tmp)
        base = statistics.median(got["options"])
        print(f"{'mode':10} {'p50 ms':>8} {'p99 ms':>8} {'p50/options':>12}   ({args.calls} each)")
        got["accept POST"] = ACCEPT_S[-args.calls:]
        for mode in ("options", "direct", "webhook", "accept POST"):
            xs = got[mode]
            print(f"{mode:10} {pct(xs, 0.5):8.2f} {pct(xs, 0.99):8.2f} "
                  f"{statistics.median(xs) / base:12.1f}")
        if args.sipp_seconds:
            code, summary = trio.run(sipp_run, args.sipp_seconds, args.sipp_rate, tmp)
            print(f"sipp uac {args.sipp_rate} calls/s for {args.sipp_seconds} s: exit {code}; "
                  f"{summary}")


if __name__ == "__main__":
    main()
