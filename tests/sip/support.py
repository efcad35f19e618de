"""Scaffolding for the phone-call tests: signaling with ``--sip`` on free loopback ports, a
webhook receiver that verifies every delivery with the official SDK, and SIPp runs."""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import openai
import trio
from ports import free_port as _free_port
from sdk_clients import sdk

from appliance.signaling import SignalingConfig, SignalingState, serve_signaling
from appliance.signaling.sip_calls import CALL_INCOMING
from appliance.signaling.sip_config import SipSettings, parse_networks
from appliance.signaling.webhooks import Endpoint, secret_key

SIPP = shutil.which("sipp")
SCENARIOS = Path(__file__).parent / "scenarios"
SECRET = "whsec_" + base64.b64encode(b"phone-test-secret-0123456789abcd").decode()
TIMEOUT = 60.0  # generous: a loaded 2-core box


def free_port(kind: socket.SocketKind = socket.SOCK_DGRAM, host: str = "127.0.0.1") -> int:
    """Free for ``kind`` (tests/ports.py says how it is picked)."""
    return _free_port(kind, host)


def free_media_ports(host: str = "127.0.0.1", count: int = 4) -> int:
    """A base port for SIPp's ``-mp``: SIPp binds audio RTP/RTCP at base, base+1 and video at
    base+2, base+3, and exits 254 if any is taken (CI once found base+2 in use): an even
    base with all ``count`` ports free on UDP (tests/ports.py)."""
    return _free_port(socket.SOCK_DGRAM, host, count=count, step=2)


def unwrap(body: bytes, headers: dict[str, str]) -> Any:
    """The SDK's own Standard Webhooks check (raises on a bad signature or timestamp)."""
    return openai.OpenAI(api_key="unused", webhook_secret=SECRET).webhooks.unwrap(body, headers)


class Receiver:
    """``--webhook-url`` on loopback: records each request, answers 204, wakes waiters."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.raw: list[tuple[dict[str, str], bytes]] = []
        self._changed = trio.Event()

    async def serve(self, nursery: trio.Nursery) -> int:
        listeners = await nursery.start(partial(trio.serve_tcp, self.handle, 0,
                                                host="127.0.0.1"))
        return int(listeners[0].socket.getsockname()[1])

    async def handle(self, stream: trio.SocketStream) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += await stream.receive_some(65536)
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        while len(body) < int(headers["content-length"]):
            body += await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
        await stream.aclose()
        self.raw.append((headers, body))
        self.events.append(json.loads(body))
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, kind: str, n: int = 1) -> dict[str, Any]:
        """The n-th event of this type (waits for it)."""
        while True:
            got = [e for e in self.events if e["type"] == kind]
            if len(got) >= n:
                return got[n - 1]
            await self._changed.wait()


@dataclass
class Phone:
    base_url: str  # the HTTP API
    sip: tuple[str, int]  # UDP + TCP
    tls: tuple[str, int] | None
    state: SignalingState
    settings: SipSettings
    receiver: Receiver | None

    def client(self) -> openai.OpenAI:
        return sdk(self.base_url + "/v1",
                             max_retries=0, timeout=TIMEOUT)


async def start_phone(nursery: trio.Nursery, tmp_path: Path, *, webhooks: bool = True,
                      **sip: Any) -> Phone:
    rx = Receiver() if webhooks else None
    endpoints = []
    if rx is not None:
        port = await rx.serve(nursery)
        endpoints = [Endpoint(f"http://127.0.0.1:{port}/hook", secret_key(SECRET))]
    allow = sip.pop("allow", None)
    settings = SipSettings(udp_tcp=("127.0.0.1", 0), **sip)
    if allow is not None:
        settings.allow = parse_networks(allow)
    cfg = SignalingConfig(http=("127.0.0.1", 0), public_addresses=["127.0.0.1"],
                          udp_port=free_port(), webui_dir=tmp_path / "webui",
                          webhooks=endpoints, sip=settings)
    state = SignalingState(cfg)
    binds = await nursery.start(partial(serve_signaling, cfg, state=state))
    assert settings.bound is not None
    return Phone(binds[0], settings.bound[0], settings.bound[1], state, settings, rx)


class SippRun:
    """One SIPp process, its output pumped in the background; ``done`` is set at its exit."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.out = bytearray()
        self.done = trio.Event()

    async def pump(self) -> None:
        async def read(stream: trio.abc.ReceiveStream | None) -> None:
            if stream is not None:
                async for chunk in stream:
                    self.out.extend(chunk)

        async with trio.open_nursery() as n:
            n.start_soon(read, self.proc.stdout)
            n.start_soon(read, self.proc.stderr)
            await self.proc.wait()
        self.done.set()

    @property
    def text(self) -> str:
        return self.out.decode(errors="replace")[-4000:]

    async def result(self) -> tuple[int, str]:
        await self.done.wait()
        assert self.proc.returncode is not None
        return self.proc.returncode, self.text


async def run_sipp(nursery: trio.Nursery, phone: Phone, scenario: str, *,
                   transport: str = "u1", local_ip: str = "127.0.0.1",
                   cwd: Path | None = None, media_port: int | None = None,
                   extra: tuple[str, ...] = ()) -> SippRun:
    """Start SIPp on one call of ``scenario``."""
    assert SIPP is not None
    host, port = phone.sip
    kind = socket.SOCK_STREAM if transport.startswith("t") else socket.SOCK_DGRAM
    cmd = [SIPP, f"{host}:{port}", "-sf", str(SCENARIOS / scenario), "-t", transport,
           "-i", local_ip, "-p", str(free_port(kind, local_ip)), "-mp", str(media_port or free_media_ports()),
           "-m", "1", "-nostdin", "-timeout", str(int(TIMEOUT)), "-timeout_error",
           "-max_recv_loops", "100", *extra]
    proc = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, cwd=cwd)
    run = SippRun(proc)
    nursery.start_soon(run.pump)
    return run


async def until_incoming(phone: Phone, run: SippRun) -> dict[str, Any]:
    """The call's ``realtime.call.incoming`` event; fails at once if SIPp exits first."""
    assert phone.receiver is not None
    got: dict[str, Any] = {}
    async with trio.open_nursery() as n:
        async def hook() -> None:
            got.update(await phone.receiver.wait_for(CALL_INCOMING))  # type: ignore[union-attr]
            n.cancel_scope.cancel()

        n.start_soon(hook)
        await run.done.wait()
        raise AssertionError(f"SIPp exited before the webhook: {run.text}")
    return got


# -- media end to end: signaling + a relay + a transceiver, in process -------------------


ROUTING_SECRET = b"sip-media-test-routing-secret-0123456789"


@dataclass
class PhoneStack:
    phone: Phone
    transceiver: Any  # appliance.transceiver.server.Transceiver
    relay_public: tuple[str, int]
    relay: Any = None  # its RelayHandle

    def relay_stats(self) -> dict[str, Any]:
        return dict(self.relay.stats()) if self.relay is not None else {}


async def start_phone_stack(nursery: trio.Nursery, tmp_path: Path, *, agent: str = "echo",
                            webhooks: bool = False, host: str = "127.0.0.1",
                            **sip: Any) -> PhoneStack:
    """A transceiver (the echo agent by default) behind a relay worker, and signaling with
    ``--sip`` whose phone calls' media runs there (``TransceiverPhoneMedia``): every RTP
    packet of a call goes trunk -> relay -> transceiver and back."""
    from appliance.relay import RelayConfig, serve_relay
    from appliance.transceiver.server import TransceiverConfig, serve_transceiver

    ctl = str(tmp_path / "t0.sock")
    taddrs = await nursery.start(serve_transceiver, TransceiverConfig(
        id=0, secrets=(ROUTING_SECRET,), listen=("127.0.0.1", 0), control=ctl, agent=agent))
    handle = await nursery.start(serve_relay, RelayConfig(
        secrets=(ROUTING_SECRET,), listen=((host, 0),), transceivers={0: taddrs.udp},
        io="python"))
    public = (str(handle.public[0][0]), int(handle.public[0][1]))
    rx = Receiver() if webhooks else None
    endpoints = []
    if rx is not None:
        port = await rx.serve(nursery)
        endpoints = [Endpoint(f"http://127.0.0.1:{port}/hook", secret_key(SECRET))]
    sip.setdefault("agent", None if webhooks else agent)
    allow = sip.pop("allow", None)
    settings = SipSettings(udp_tcp=(host, 0), **sip)
    if allow is not None:
        settings.allow = parse_networks(allow)
    cfg = SignalingConfig(http=("127.0.0.1", 0), public_addresses=[host],
                          udp_port=public[1], webui_dir=tmp_path / "webui",
                          transceivers={0: ctl}, webhooks=endpoints, sip=settings)
    state = SignalingState(cfg)
    binds = await nursery.start(partial(serve_signaling, cfg, state=state))
    assert settings.bound is not None
    return PhoneStack(Phone(binds[0], settings.bound[0], settings.bound[1], state, settings, rx),
                      taddrs.transceiver, public, handle)


def write_tone_pcap(path: Path, *, freq: float = 1000.0, seconds: float = 3.0,
                    src: tuple[str, int] = ("127.0.0.1", 4000),
                    dst: tuple[str, int] = ("127.0.0.1", 5000),
                    dtmf: tuple[str, float] | None = None) -> int:
    """A classic pcap (Ethernet) of PCMU RTP, a ``freq`` tone in 20 ms packets, for SIPp's
    ``play_pcap_audio`` (which rewrites the addresses). Returns the packet count.
    ``dtmf=(digit, every)``: every ``every`` seconds, 100 ms of the tone are that digit's
    RFC 4733 events instead (payload type 101, the scenarios' telephone-event), the end
    packet sent three times (§2.5.1.4)."""
    import struct

    import numpy as np

    from appliance.audio import g711
    from appliance.proto.rtp import rtp_header
    from appliance.proto.rtp.dtmf import TelephoneEvent, event_for

    def events(i: int) -> bytes | None:
        """Packet ``i``'s telephone-event payload (its timestamp is the press's start)."""
        if dtmf is None:
            return None
        every = int(dtmf[1] * 50)
        k = i % every
        if i < every or k > 6:
            return None
        steps = min(k, 4) + 1  # 20 ms a step; the last three packets repeat the end
        return bytes(TelephoneEvent(event_for(dtmf[0]), k >= 4, 10, 160 * steps))

    n = int(seconds * 50)
    t = np.arange(n * 160) / 8000
    pcm = (9000 * np.sin(2 * np.pi * freq * t)).astype(np.int16)
    enc = g711.G711Encoder("pcmu")
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]
    for i in range(n):
        frame48 = np.repeat(pcm[i * 160:(i + 1) * 160], 6).astype("<i2").tobytes()
        ev = events(i)
        if ev is not None:
            start = i - i % int(dtmf[1] * 50) if dtmf is not None else i
            rtp = rtp_header(101, 100 + i, 160 * start, 0x1234ABCD, i == start) + ev
        else:
            rtp = rtp_header(0, 100 + i, 160 * i, 0x1234ABCD, i == 0) + enc.encode(frame48)
        udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(rtp), 0) + rtp
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), i, 0, 64, 17, 0,
                         socket.inet_aton(src[0]), socket.inet_aton(dst[0])) + udp
        frame = b"\x00" * 12 + b"\x08\x00" + ip
        ts = i * 0.02
        out.append(struct.pack("<IIII", int(ts), int((ts % 1) * 1e6), len(frame), len(frame)))
        out.append(frame)
    path.write_bytes(b"".join(out))
    return n


class LoopbackSniffer:
    """UDP datagrams on ``lo`` to ``port`` from ``from_port`` (AF_PACKET: needs root), to
    see what a peer that keeps nothing (SIPp's media port) received."""

    def __init__(self, port: int, from_port: int) -> None:
        self.port, self.from_port = port, from_port
        self.payloads: list[bytes] = []
        self.times: list[float] = []  # trio time each was read
        self.changed = trio.Event()
        raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
        raw.bind(("lo", 0))
        self.sock = trio.socket.from_stdlib_socket(raw)

    async def run(self) -> None:
        import struct

        with self.sock:
            while True:
                data, addr = await self.sock.recvfrom(65536)
                if addr[2] == socket.PACKET_OUTGOING:  # lo shows each packet both ways
                    continue
                ip = data[14:]
                if len(ip) < 28 or ip[9] != 17:
                    continue
                ihl = (ip[0] & 15) * 4
                sport, dport = struct.unpack("!HH", ip[ihl:ihl + 4])
                if dport == self.port and sport == self.from_port:
                    self.payloads.append(bytes(ip[ihl + 8:]))
                    self.times.append(trio.current_time())
                    self.changed.set()
                    self.changed = trio.Event()

    async def wait_for(self, n: int) -> None:
        while len(self.payloads) < n:
            await self.changed.wait()


# -- baresip, a real softphone, headless -------------------------------------------------

BARESIP = shutil.which("baresip")
BARESIP_MODULES = Path("/usr/lib/baresip/modules")


def write_tone_wav(path: Path, *, freq: float, seconds: float, rate: int = 8000) -> None:
    import wave

    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    pcm = (9000 * np.sin(2 * np.pi * freq * t)).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


class Baresip:
    """baresip 1.x with a generated config dir: ``aufile`` plays a WAV as the microphone,
    ALSA's ``null`` device is the speaker, ``sndfile`` records what it hears (and what it
    sends) into ``snd_path``, ``cons`` takes key presses over UDP (``/dial``, digits: DTMF
    while in a call). ``mediaenc`` is an account parameter (``srtp-mand``: RTP/SAVP, SDES)."""

    def __init__(self, home: Path, tone: Path, *, mediaenc: str | None = None,
                 host: str = "127.0.0.1", netns: str | None = None) -> None:
        self.home = home
        self.netns = netns
        home.mkdir(parents=True, exist_ok=True)
        self.snd = home / "snd"
        self.snd.mkdir(exist_ok=True)
        self.cons_port = free_port()
        sip_port = free_port()
        # account last: it reads the accounts file, whose codecs and mediaenc must exist
        modules = ["cons", "g711", "aufile", "alsa", "sndfile", "srtp", "menu", "account"]
        (home / "config").write_text("\n".join([
            "poll_method epoll",
            f"sip_listen {host}:{sip_port}",
            "sip_trans_def udp",
            f"audio_source aufile,{tone}",
            "audio_player alsa,null",
            "audio_alert alsa,null",
            "ausrc_srate 8000", "auplay_srate 8000",
            "ausrc_channels 1", "auplay_channels 1",
            "rtp_tos 0",
            "rtp_ports 20000-29999",
            "rtcp_mux no",
            "jitter_buffer_delay 1-10",
            f"module_path {BARESIP_MODULES}",
            *[f"module {m}.so" for m in modules],
            f"cons_listen 127.0.0.1:{self.cons_port}",
            f"snd_path {self.snd}",
            "",
        ]))
        params = ";regint=0;audio_codecs=PCMU"
        if mediaenc:
            params += f";mediaenc={mediaenc}"
        (home / "accounts").write_text(f"<sip:baresip@{host}>{params}\n")
        (home / "contacts").write_text("")
        self.proc: trio.Process | None = None
        self.out = bytearray()

    async def start(self, nursery: trio.Nursery) -> None:
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.proc = await trio.lowlevel.open_process(
            [*prefix, BARESIP or "baresip", "-f", str(self.home), "-v"], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

        async def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            async for chunk in self.proc.stdout:
                self.out.extend(chunk)

        nursery.start_soon(pump)

    async def keys(self, text: str) -> None:
        if self.netns:  # its console listens on the namespace's loopback
            code = ("import socket,sys; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                    ".sendto(sys.argv[1].encode(), ('127.0.0.1', int(sys.argv[2])))")
            await trio.run_process(["ip", "netns", "exec", self.netns, sys.executable, "-c",
                                    code, text, str(self.cons_port)])
            return
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with sock:
            await sock.sendto(text.encode(), ("127.0.0.1", self.cons_port))

    @property
    def text(self) -> str:
        return self.out.decode(errors="replace")[-6000:]

    def heard(self) -> Path | None:
        got = sorted(self.snd.glob("dump-*-dec.wav"))
        return got[-1] if got else None

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            with trio.move_on_after(5):
                await self.proc.wait()
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()


class NatNet:
    """A phone behind a NAT, in network namespaces this creates (and deletes): ``phone``
    (10.202.T.2) routes through ``nat``, whose nftables masquerades everything leaving on
    its WAN veth (10.201.T.2) towards the test's own namespace, where the veth end gets
    10.201.T.1 — the address the appliance listens on. Nothing else is touched."""

    def __init__(self) -> None:
        t = random.randrange(1, 250)
        self.tag = f"pm{os.getpid() % 10000}x{t}"
        self.nat, self.phone = f"{self.tag}-nat", f"{self.tag}-ph"
        self.outer = f"{self.tag}o"  # our end of the WAN veth
        self.wan_net = f"10.201.{t}.0/30"
        self.host = f"10.201.{t}.1"  # the appliance
        self.public = f"10.201.{t}.2"  # the NAT's outside
        self.private = f"10.202.{t}.2"  # the phone
        self._made: list[str] = []

    @staticmethod
    def _run(*argv: str, stdin: str | None = None) -> None:
        r = subprocess.run(list(argv), capture_output=True, text=True, input=stdin)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")

    def up(self) -> None:
        run, t = self._run, self.host.split(".")[2]
        for ns in (self.nat, self.phone):
            run("ip", "netns", "add", ns)
            self._made.append(ns)
            run("ip", "-n", ns, "link", "set", "lo", "up")
        run("ip", "link", "add", self.outer, "type", "veth", "peer", "name", "wan",
            "netns", self.nat)
        run("ip", "addr", "add", f"{self.host}/30", "dev", self.outer)
        run("ip", "link", "set", self.outer, "up")
        run("ip", "-n", self.nat, "addr", "add", f"{self.public}/30", "dev", "wan")
        run("ip", "-n", self.nat, "link", "set", "wan", "up")
        run("ip", "-n", self.nat, "link", "add", "lan", "type", "veth", "peer", "name", "eth0",
            "netns", self.phone)
        run("ip", "-n", self.nat, "addr", "add", f"10.202.{t}.1/30", "dev", "lan")
        run("ip", "-n", self.nat, "link", "set", "lan", "up")
        run("ip", "-n", self.phone, "addr", "add", f"{self.private}/30", "dev", "eth0")
        run("ip", "-n", self.phone, "link", "set", "eth0", "up")
        run("ip", "-n", self.phone, "route", "add", "default", "via", f"10.202.{t}.1")
        run("ip", "netns", "exec", self.nat, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        run("ip", "netns", "exec", self.nat, "nft", "-f", "-", stdin=(
            "table ip nat {\n chain post {\n  type nat hook postrouting priority 100;\n"
            '  oifname "wan" masquerade\n }\n}\n'))

    def down(self) -> None:
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True)
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()
