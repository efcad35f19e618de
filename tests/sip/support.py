"""Scaffolding for the phone-call tests: signaling with ``--sip`` on free loopback ports, a
webhook receiver that verifies every delivery with the official SDK, and SIPp runs."""

from __future__ import annotations

import base64
import json
import random
import shutil
import socket
import subprocess
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import openai
import trio

from appliance.signaling import SignalingConfig, SignalingState, serve_signaling
from appliance.signaling.sip_calls import CALL_INCOMING
from appliance.signaling.sip_config import SipSettings, parse_networks
from appliance.signaling.webhooks import Endpoint, secret_key

SIPP = shutil.which("sipp")
SCENARIOS = Path(__file__).parent / "scenarios"
SECRET = "whsec_" + base64.b64encode(b"phone-test-secret-0123456789abcd").decode()
TIMEOUT = 60.0  # generous: a loaded 2-core box


def free_port(kind: socket.SocketKind = socket.SOCK_DGRAM, host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_media_ports(host: str = "127.0.0.1", count: int = 4) -> int:
    """A base port for SIPp's ``-mp``: SIPp binds audio RTP/RTCP at base, base+1 and video at
    base+2, base+3, and exits 254 if any is taken. A port from ``free_port()`` checked only
    the base, and CI once found base+2 in use. So: an even base below the kernel's
    ephemeral range (where ``bind(port 0)`` by any other test never lands), with all
    ``count`` ports free on UDP."""
    low, _ = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10_000, max(10_002, low - count), 2)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(sock)
                sock.bind((host, port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return base
    raise AssertionError("no run of free UDP ports for SIPp's media")


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
        return openai.OpenAI(api_key="unused-on-loopback", base_url=self.base_url + "/v1",
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
                   cwd: Path | None = None) -> SippRun:
    """Start SIPp on one call of ``scenario``."""
    assert SIPP is not None
    host, port = phone.sip
    kind = socket.SOCK_STREAM if transport.startswith("t") else socket.SOCK_DGRAM
    cmd = [SIPP, f"{host}:{port}", "-sf", str(SCENARIOS / scenario), "-t", transport,
           "-i", local_ip, "-p", str(free_port(kind, local_ip)), "-mp", str(free_media_ports()),
           "-m", "1", "-nostdin", "-timeout", str(int(TIMEOUT)), "-timeout_error",
           "-max_recv_loops", "100"]
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
