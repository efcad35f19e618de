"""WAN setup benchmark (issue 19 item 1): where the round trips of a call's setup go.

For each emulated round trip (``--rtts``, default 0, 50, 100, 200 ms) it starts
bench/wan_proxy.py in front of both servers and makes ``--calls`` calls with each client to
each server, alternating servers call by call so both see the same moment of a noisy box:

* servers: (1) ``appliance up`` (echo agent) with ``--public-address 127.0.0.2``, the proxy
  listening on 127.0.0.2 at the relay's own UDP port (``up`` advertises its bind port; it
  has no separate advertised-port flag) and forwarding to the relay on 127.0.0.1; (2) the
  aiortc echo server of bench/aiortc_echo_server.py behind the proxy's SDP front on
  127.0.0.3 (which rewrites aiortc's host candidate to a per-session delay listener and
  strips the offer's candidates, so aiortc reaches the client only through the proxy);
* clients: (a) ours (``appliance.client.peer.ClientPeer`` driven here, so the first STUN
  success is visible; browser-like: DTLS client, first audio frame the moment DTLS is up,
  then every 20 ms); (b) Debian's headless Chromium under Playwright with a fake
  microphone (flags as tests/browser/), a fresh browser context per call (a fresh HTTP
  connection, as our client's one request per connection).

Each call's timeline: POST → answer read, then from the answer: ICE (ours: first STUN Binding
success; Chromium: ``iceconnectionstatechange`` → connected), DTLS done (ours: handshake
complete; Chromium: the sender's ``RTCDtlsTransport`` → connected) and first echoed audio
(ours: first SRTP packet back; Chromium: the remote track's ``unmute``, which fires on the
first RTP packet, cross-checked by ``getStats()`` inbound-rtp ``packetsReceived > 0`` polled
every 5 ms); and POST → first echo. Medians over the calls, in ms and in round trips
(ms ÷ RTT). For the appliance
it also prints the median of its own setup timeline (``GET /v1/sessions/{id}``), in ms
from ``answer_sent``, as the cross-check of where the round trips go.

    flock /tmp/bench.lock .venv/bin/python bench/wan_setup.py                  # everything
    .venv/bin/python bench/wan_setup.py --rtts 100 --calls 3 --clients ours
    .venv/bin/python bench/wan_setup.py --jitter-ms 5 --loss 0.01 --seed 2

Client variants (``--clients``): ``ours`` offers DTLS 1.2 only (the load generator's
default), ``ours13`` offers 1.2 and 1.3 (as browsers do), ``ours13fs`` / ``oursfs`` add
``false_start`` (as DTLS 1.3 server: media once its flight is out); a ``+active`` suffix (e.g.
``chromium+active``) munges the offer to ``a=setup:active`` before it is POSTed, which
forces the server into the passive DTLS role (the appliance's behaviour before issue 19:
docs/adr-dtls-active.md). Each row says the DTLS version and the *client's* DTLS role it
ended with (``cli``/``srv``: our client's own state; Chromium's ``getStats()`` transport).

POST → answer is 2 RTT for our client (a fresh TCP connection per request: the proxy holds
its first bytes one RTT for the handshake the kernel did locally) and may be less for
Chromium, which can have preconnected while the page loaded; the steps after the answer do
not depend on it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from capacity import (  # noqa: E402  (bench scripts import their sibling)
    PY,
    REPO,
    _stop,
    free_port,
    start_aiortc,
    wait_http,
)

from appliance.client.call import enable_rx_timestamps, read_ready  # noqa: E402
from appliance.client.http import request  # noqa: E402
from appliance.client.peer import ClientPeer, Connected, Failed, RtpReceived  # noqa: E402
from appliance.loadgen.media import CYCLE, ToneStream, encode_tone  # noqa: E402
from appliance.proto.dtls import Certificate  # noqa: E402
from appliance.proto.mux import Kind, classify  # noqa: E402

STEPS = ("answer", "ice", "dtls", "echo")
SERVER_STEPS = ("first_stun", "ice_nominated", "dtls_done", "first_rtp_in", "first_rtp_out")
APPLIANCE_PUBLIC = "127.0.0.2"  # the proxy's address, advertised by `appliance up`
AIORTC_FRONT = "127.0.0.3"
CHROMIUM = "/usr/bin/chromium"
CALL_TIMEOUT = 15.0


# -- processes ------------------------------------------------------------------------------


@contextmanager
def start_appliance(transceivers: int, extra: tuple[str, ...] = ()) -> Iterator[tuple[str, int]]:
    """``appliance up`` on 127.0.0.1, advertising the proxy's address; yields (url, udp)."""
    http, udp = free_port(), free_port_on(APPLIANCE_PUBLIC)
    state = tempfile.mkdtemp(prefix="wan-setup-")
    args = [PY, "-m", "appliance", "up", "--http", f"127.0.0.1:{http}",
            "--udp", f"127.0.0.1:{udp}", "--public-address", APPLIANCE_PUBLIC,
            "--state-dir", state, "--transceivers", str(transceivers), "--agent", "echo", *extra]
    log = open(Path(state) / "appliance.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{http}", 30, proc)
        yield f"http://127.0.0.1:{http}", udp
    finally:
        _stop(proc)
        log.close()
        shutil.rmtree(state, ignore_errors=True)


def free_port_on(host: str) -> int:
    """A UDP port free on 127.0.0.1 and on ``host`` alike (the relay binds one, the proxy
    the other, with the same number: `up` advertises the port it binds)."""
    import socket

    for _ in range(50):
        port = free_port(socket.SOCK_DGRAM)
        # ... and for TCP on 127.0.0.1: `up` listens for ICE-TCP on the same number.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, \
                socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            try:
                s.bind((host, port))
                t.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no UDP port free on both 127.0.0.1 and {host}")


@contextmanager
def start_proxy(rtt_ms: float, args: argparse.Namespace, *, appliance: tuple[str, int] | None,
                aiortc: str | None) -> Iterator[dict[str, str]]:
    """bench/wan_proxy.py for one RTT; yields {"appliance": url, "aiortc": url}."""
    cmd = [PY, str(HERE / "wan_proxy.py"), "--rtt-ms", str(rtt_ms),
           "--jitter-ms", str(args.jitter_ms), "--loss", str(args.loss), "--seed", str(args.seed)]
    if appliance is not None:
        url, udp = appliance
        http_port = int(url.rsplit(":", 1)[1])
        cmd += ["--udp", f"{APPLIANCE_PUBLIC}:{udp}=127.0.0.1:{udp}",
                "--tcp", f"{APPLIANCE_PUBLIC}:0=127.0.0.1:{http_port}"]
    if aiortc is not None:
        cmd += ["--sdp-front", f"{AIORTC_FRONT}:0=127.0.0.1:{int(aiortc.rsplit(':', 1)[1])}"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        bound = json.loads(line)
        out: dict[str, str] = {}
        if appliance is not None:
            out["appliance"] = "http://" + bound["tcp"][0]
        if aiortc is not None:
            out["aiortc"] = "http://" + bound["front"][0]
        yield out
    finally:
        _stop(proc)
        if proc.stdout is not None:
            proc.stdout.close()


# -- our client -------------------------------------------------------------------------------


def _is_binding_success(data: bytes) -> bool:
    return classify(data) is Kind.STUN and data[:2] == b"\x01\x01"


async def our_call(base: str, cert: Certificate, tone: ToneStream, index: int,
                   variant: str = "ours") -> tuple[dict[str, float | None], str, dict[str, Any]]:
    """One call; (timeline in ms from the POST, session location, DTLS version and role)."""
    import socket

    versions = frozenset({"1.2", "1.3"}) if variant.startswith("ours13") else frozenset({"1.2"})
    # "fs": --false-start (as DTLS client, RFC 7918; as DTLS 1.3 server, 0.5-RTT media).
    peer = ClientPeer(cert, dtls_versions=versions, false_start="fs" in variant.split("+")[0])
    offer = peer.offer()
    if variant.endswith("+active"):
        offer = offer.replace("a=setup:actpass", "a=setup:active")
    t: dict[str, float | None] = dict.fromkeys(STEPS)
    t0 = trio.current_time()
    resp = await request("POST", base + "/v1/sessions", body=offer.encode(),
                         headers={"Content-Type": "application/sdp"})
    now = trio.current_time()
    if resp.status != 201:
        raise RuntimeError(f"POST → {resp.status}: {resp.body[:200]!r}")
    t["answer"] = (now - t0) * 1000
    location = resp.header("location") or ""
    peer.accept_answer(resp.body.decode(), now)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    sock.bind(("127.0.0.1", 0))
    stamped = enable_rx_timestamps(sock)
    buf = bytearray(2048)
    counter = 0
    next_media: float | None = None

    def flush() -> None:
        while (out := peer.poll_transmit()) is not None:
            try:
                sock.sendto(out[0], out[1])
            except OSError:
                pass

    def send_frame(at: float) -> None:
        nonlocal counter, next_media
        peer.send_rtp(tone.payload(counter % CYCLE, index, counter), (counter * 960) & 0xFFFFFFFF,
                      marker=counter == 0)
        counter += 1
        next_media = at + 0.020

    try:
        flush()
        deadline = t0 + CALL_TIMEOUT
        while t["echo"] is None:
            now = trio.current_time()
            if now > deadline:
                raise RuntimeError(f"no echo within {CALL_TIMEOUT} s: {t}")
            wake = [x for x in (peer.poll_timeout(), next_media, deadline) if x is not None]
            with trio.move_on_at(min(wake)):
                await trio.lowlevel.wait_readable(sock)
            now = trio.current_time()
            for data, addr, at in read_ready(sock, buf, now, now - time.time(), stamped):
                if t["ice"] is None and _is_binding_success(data):
                    t["ice"] = (at - t0) * 1000
                peer.handle_datagram(at, data, addr)
            peer.handle_timeout(now)
            while (ev := peer.poll_event()) is not None:
                if isinstance(ev, Connected):
                    t["dtls"] = (now - t0) * 1000
                    send_frame(now)  # a microphone has a frame ready (as the load generator)
                elif isinstance(ev, RtpReceived) and t["echo"] is None:
                    t["echo"] = (ev.at - t0) * 1000
                elif isinstance(ev, Failed):
                    raise RuntimeError(f"call failed: {ev.reason}")
            if next_media is not None and now >= next_media and t["echo"] is None:
                send_frame(now)
            flush()
        dtls = peer.dtls
        transport = {"tlsVersion": dtls.version if dtls else None,
                     "dtlsRole": peer.dtls_role.value}
        peer.close()
        flush()
    finally:
        sock.close()
    return t, location, transport


async def _delete(url: str) -> None:
    with trio.move_on_after(5):
        await request("DELETE", url)


async def _timeline(api: str, location: str) -> dict[str, Any]:
    with trio.move_on_after(5):
        resp = await request("GET", api + location)
        if resp.status == 200:
            tl = json.loads(resp.body).get("timeline") or {}
            return tl if isinstance(tl, dict) else {}
        print(f"  GET {location} → {resp.status}", flush=True)
    return {}


def run_ours(base: str, api: str | None, cert: Certificate, tone: ToneStream, index: int,
             variant: str) -> tuple[dict[str, float | None], dict[str, Any], dict[str, Any]]:
    async def go() -> tuple[dict[str, float | None], dict[str, Any], dict[str, Any]]:
        t, location, transport = await our_call(base, cert, tone, index, variant)
        # The timeline before the DELETE: an ended session may be forgotten. The DELETE goes
        # through the proxy (the SDP front closes that session's UDP listener on it).
        server = await _timeline(api, location) if api else {}
        await _delete(base + location)
        return t, server, transport

    return trio.run(go)


# -- Chromium ---------------------------------------------------------------------------------

PAGE = """<!doctype html><meta charset="utf-8"><title>wan setup</title><script>
function gathered(pc, maxMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const t = setTimeout(resolve, maxMs);
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") { clearTimeout(t); resolve(); }
    });
  });
}
async function runCall(munge) {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  const pc = new RTCPeerConnection({ bundlePolicy: "max-bundle", rtcpMuxPolicy: "require" });
  pc.addTrack(stream.getAudioTracks()[0], stream);
  const t = { answer: null, ice: null, pair: null, dtls: null, unmute: null, echo: null };
  let t0 = null;
  const since = () => performance.now() - t0;
  pc.oniceconnectionstatechange = () => {
    if (t0 !== null && pc.iceConnectionState === "connected" && t.ice === null) t.ice = since();
  };
  pc.ontrack = (ev) => {
    ev.track.onunmute = () => { if (t.unmute === null) t.unmute = since(); };
  };
  // As the demo page does (webui/demo.js): the offer goes once gathering is done.
  await pc.setLocalDescription(await pc.createOffer());
  await gathered(pc, 1000);
  const dtls = pc.getTransceivers()[0].sender.transport;
  dtls.onstatechange = () => { if (dtls.state === "connected" && t.dtls === null) t.dtls = since(); };
  if (dtls.iceTransport) {
    dtls.iceTransport.onselectedcandidatepairchange = () => { if (t.pair === null) t.pair = since(); };
  }
  t0 = performance.now();
  const resp = await fetch("/v1/sessions", {
    method: "POST", headers: { "Content-Type": "application/sdp" },
    body: munge ? pc.localDescription.sdp.replaceAll("a=setup:actpass", "a=setup:" + munge)
                : pc.localDescription.sdp });
  const answer = await resp.text();
  t.answer = since();
  if (resp.status !== 201) throw new Error(`POST -> ${resp.status}: ${answer.slice(0, 200)}`);
  const location = resp.headers.get("Location");
  await pc.setRemoteDescription({ type: "answer", sdp: answer });
  const deadline = performance.now() + CALL_TIMEOUT_MS;
  let transport = null;
  while (t.echo === null && performance.now() < deadline) {
    const stats = await pc.getStats();
    stats.forEach((s) => {
      if (s.type === "inbound-rtp" && s.kind === "audio" && s.packetsReceived > 0 && t.echo === null) t.echo = since();
    });
    if (t.echo === null) await new Promise((r) => setTimeout(r, 5));
  }
  const final = await pc.getStats();
  const pairs = [];
  final.forEach((s) => {
    if (s.type === "transport") transport = { dtlsState: s.dtlsState, tlsVersion: s.tlsVersion, dtlsRole: s.dtlsRole };
    if (s.type === "candidate-pair") {
      const l = final.get(s.localCandidateId) || {};
      pairs.push({ local: `${l.address}:${l.port} ${l.candidateType}`, state: s.state, nominated: s.nominated,
                   requestsSent: s.requestsSent, responsesReceived: s.responsesReceived });
    }
  });
  transport = { ...(transport || {}), pairs };
  pc.close();
  stream.getTracks().forEach((x) => x.stop());
  return { t, location, transport };
}
</script>""".replace("CALL_TIMEOUT_MS", str(int(CALL_TIMEOUT * 1000)))


def launch_chromium(pw: Any, tone_wav: Path) -> Any:
    sys.path.insert(0, str(REPO / "tests"))
    from browser.helpers import launch  # type: ignore[import-not-found]

    return launch(pw, tone_wav)


def run_chromium(browser: Any, base: str, api: str | None, variant: str = "chromium"
                 ) -> tuple[dict[str, float | None], dict[str, Any], dict[str, Any]]:
    ctx = browser.new_context(permissions=["microphone"])
    try:
        page = ctx.new_page()
        page.route(base + "/__wan_bench",
                   lambda route: route.fulfill(status=200, content_type="text/html", body=PAGE))
        page.goto(base + "/__wan_bench")
        r = page.evaluate("(m) => runCall(m)",
                          "active" if variant.endswith("+active") else None)
    finally:
        ctx.close()
    t = r["t"]
    # The first echoed packet: the unmute event (fires on the first RTP packet) when it
    # came, else the getStats poll (5 ms resolution plus the cost of getStats).
    t["echo_poll"] = t["echo"]
    if t.get("unmute") is not None:
        t["echo"] = t["unmute"]
    server: dict[str, Any] = {}
    if r.get("location"):
        async def after() -> dict[str, Any]:
            tl = await _timeline(api, r["location"]) if api else {}
            await _delete(base + r["location"])
            return tl

        server = trio.run(after)
    return t, server, r.get("transport") or {}


# -- report -----------------------------------------------------------------------------------


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _cell(ms: float | None, rtt: float) -> str:
    if ms is None:
        return "-"
    return f"{ms:7.1f}" + (f" ({ms / rtt:4.2f})" if rtt > 0 else "       ")


def report(results: dict[tuple[float, str, str], list[dict[str, Any]]]) -> None:
    print("\nmedian ms (round trips = ms / RTT): POST → answer read; then ICE, DTLS and the"
          " first echo from the answer; and POST → first echo")
    cols = ("POST→answer", "→ICE", "→DTLS", "→echo", "POST→echo")
    print(f"{'RTT':>4} {'client':15} {'server':10} {'DTLS':8} {'n':>2} "
          + " ".join(f"{c:>15}" for c in cols))
    for (rtt, client, server), calls in results.items():
        ok = [c["t"] for c in calls if c.get("t")]
        dtls = sorted({_dtls_label(c.get("transport") or {}) for c in calls if c.get("t")})

        def med(step: str, base: str | None = "answer", ok: list[Any] = ok) -> float | None:
            return _median([t[step] - (t[base] if base else 0.0) for t in ok
                            if t.get(step) is not None and (base is None or t.get(base) is not None)])

        cells = [med("answer", None), med("ice"), med("dtls"), med("echo"), med("echo", None)]
        fails = len(calls) - len(ok)
        print(f"{rtt:4.0f} {client:15} {server:10} {'/'.join(dtls):8} {len(ok):2d} "
              + " ".join(f"{_cell(v, rtt):>15}" for v in cells)
              + (f"  {fails} failed" if fails else ""))
    print("\nthe appliance's own timeline (GET /v1/sessions/{id}), median ms after answer_sent")
    print(f"{'RTT':>4} {'client':15} " + " ".join(f"{s:>15}" for s in SERVER_STEPS))
    for (rtt, client, server), calls in results.items():
        if server != "appliance":
            continue
        tls = [c["server"] for c in calls if c.get("server")]
        scells: list[str] = []
        for s in SERVER_STEPS:
            v = _median([float(tl[s]) - float(tl.get("answer_sent") or 0) for tl in tls
                         if isinstance(tl.get(s), int | float)])
            scells.append(f"{_cell(v, rtt):>15}")
        print(f"{rtt:4.0f} {client:15} " + " ".join(scells))
    seen = sorted({(k[2], str(c["transport"].get("tlsVersion")), str(c["transport"].get("dtlsRole")))
                   for k, calls in results.items() for c in calls if c.get("transport")})
    for server, version, role in seen:
        print(f"Chromium against {server}: DTLS version {version}, Chromium's role {role}")


def _dtls_label(transport: dict[str, Any]) -> str:
    """``1.3 srv``: the DTLS version and the client's DTLS role (Chromium spells versions as
    its tlsVersion, FEFD/FEFC)."""
    version = {"FEFD": "1.2", "FEFC": "1.3"}.get(str(transport.get("tlsVersion")),
                                                 str(transport.get("tlsVersion") or "?"))
    role = {"client": "cli", "server": "srv"}.get(str(transport.get("dtlsRole")), "?")
    return f"{version} {role}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rtts", default="0,50,100,200", help="emulated round trips, ms")
    p.add_argument("--calls", type=int, default=5, help="calls per client, server and RTT")
    p.add_argument("--clients", default="ours,ours13,chromium",
                   help="ours, ours13, chromium; a +active suffix forces the server passive")
    p.add_argument("--servers", default="appliance,aiortc")
    p.add_argument("--transceivers", type=int, default=1)
    p.add_argument("--dtls-versions", default=None,
                   help="passed to appliance up (default: its own, 1.2,1.3)")
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="PATH", help="write every call's timeline here")
    args = p.parse_args(argv)
    rtts = [float(x) for x in args.rtts.split(",")]
    clients = args.clients.split(",")
    servers = args.servers.split(",")
    print(f"wan_setup {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  load {_load()}  "
          f"rtts {rtts} calls {args.calls} clients {clients} servers {servers} "
          f"appliance --dtls-versions {args.dtls_versions or 'default'}", flush=True)
    results: dict[tuple[float, str, str], list[dict[str, Any]]] = {}
    cert = Certificate.generate(0.0)
    tone = encode_tone()
    with ExitStack() as stack:
        extra = ("--dtls-versions", args.dtls_versions) if args.dtls_versions else ()
        app = (stack.enter_context(start_appliance(args.transceivers, extra))
               if "appliance" in servers else None)
        aio = stack.enter_context(start_aiortc()).url if "aiortc" in servers else None
        browser = None
        if any(c.startswith("chromium") for c in clients):
            from playwright.sync_api import sync_playwright

            sys.path.insert(0, str(REPO / "tests"))
            from browser.helpers import write_tone_wav  # type: ignore[import-not-found]

            wav = write_tone_wav(Path(stack.enter_context(tempfile.TemporaryDirectory()))
                                 / "tone.wav")
            pw = stack.enter_context(sync_playwright())
            browser = launch_chromium(pw, wav)
            stack.callback(browser.close)
        api = {"appliance": app[0] if app else None, "aiortc": None}
        for rtt in rtts:
            with start_proxy(rtt, args, appliance=app, aiortc=aio) as bases:
                for i in range(args.calls):
                    for client in clients:
                        for server in servers:
                            key = (rtt, client, server)
                            rec: dict[str, Any] = {"rtt": rtt, "client": client,
                                                   "server": server, "i": i}
                            try:
                                if client.startswith("ours"):
                                    rec["t"], rec["server"], rec["transport"] = run_ours(
                                        bases[server], api[server], cert, tone, i, client)
                                else:
                                    rec["t"], rec["server"], rec["transport"] = run_chromium(
                                        browser, bases[server], api[server], client)
                            except Exception as exc:  # one failed call must not end the run
                                rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
                                print(f"  {key}: {rec['error']}", flush=True)
                            results.setdefault(key, []).append(rec)
            print(f"RTT {rtt:.0f} ms done, load {_load()}", flush=True)
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(
            [r for calls in results.values() for r in calls], indent=1))
    return 0


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
