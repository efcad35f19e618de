"""Helpers for the relay tests, importable as ``relay.support`` (tests/ is on sys.path).

Fake transceivers are plain trio UDP sockets that speak PROXY v2, so the tests check the
datagram format of DESIGN.md from the outside, the way any stand-in transceiver would see it.
STUN requests are built with aioice (an independent implementation).
"""

from __future__ import annotations

import os
import socket as stdsocket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aioice.stun as astun
import trio
from ports import TCP
from ports import free_port as _free_port

from appliance.proto.proxy import encode_header, parse_untrusted, tlvs_untrusted
from appliance.proto.proxy.vouch import is_local
from appliance.proto.ufrag import UfragCodec

SECRET = b"relay-test-secret-0123456789abcdef"
CODEC = UfragCodec(SECRET)
RTP = b"\x80\x6f" + bytes(range(170))  # 172 bytes, first byte 0x80: RTP
DTLS = b"\x16\xfe\xfd" + b"\x00" * 40  # a DTLS handshake record header and some bytes

Address = tuple[str, int]

#: Every socket the helpers opened; the ``_close_sockets`` fixture closes them after a test.
OPEN_SOCKETS: list[trio.socket.SocketType] = []


def ufrag(*, transceiver: int = 0, cluster: int = 0, codec: UfragCodec = CODEC) -> str:
    return codec.mint(cluster=cluster, transceiver=transceiver)


def stun_request(username: str | None = None, *, software: bytes | None = None) -> bytes:
    """A Binding request as a browser sends it (USERNAME, MESSAGE-INTEGRITY, FINGERPRINT),
    or a plain discovery request when ``username`` is None."""
    msg = astun.Message(
        message_method=astun.Method.BINDING,
        message_class=astun.Class.REQUEST,
        transaction_id=os.urandom(12),
    )
    if software is not None:
        msg.attributes["SOFTWARE"] = software.decode()
    if username is not None:
        msg.attributes["USERNAME"] = username
        msg.attributes["PRIORITY"] = 1853824767
        msg.attributes["ICE-CONTROLLING"] = 1
        msg.add_message_integrity(b"client-pwd-not-known-to-the-relay")
    msg.add_fingerprint()
    return bytes(msg)


def check(username_ufrag: str) -> bytes:
    return stun_request(f"{username_ufrag}:clnt")


async def eventually(pred: Callable[[], bool], within: float = 5.0) -> None:
    """Poll observable state until ``pred()`` holds (bounded by a deadline): the state
    lives in another task or process, so there is no event to wait on."""
    with trio.fail_after(within):
        while not pred():  # noqa: ASYNC110 - bounded polling of observable state
            await trio.sleep(0.005)


@dataclass
class Received:
    src: Address  # who sent the framed datagram (a relay's internal address)
    client: Address
    public: Address
    payload: bytes
    tlvs: list[tuple[int, bytes]]


@dataclass
class FakeTransceiver:
    """A UDP socket speaking PROXY v2; with ``echo`` it sends every payload back the way the
    design says a transceiver replies (same header, to the internal address it came from)."""

    sock: trio.socket.SocketType
    echo: bool = True
    got: list[Received] = field(default_factory=list)
    queries: list[bytes] = field(default_factory=list)

    @property
    def address(self) -> Address:
        name = self.sock.getsockname()
        return (name[0], name[1])

    async def run(self) -> None:
        while True:
            try:
                data, src = await self.sock.recvfrom(65536)
            except trio.ClosedResourceError:
                return
            if is_local(data):
                self.queries.append(data)  # a flow-vouch query (relay/reseed.py): not ours
                continue
            client, public, off = parse_untrusted(data)
            self.got.append(Received(src, client, public, data[off:], tlvs_untrusted(data)))
            if self.echo:
                await self.sock.sendto(encode_header(client, public) + data[off:], src)

    def payloads(self) -> list[bytes]:
        return [r.payload for r in self.got]


async def open_transceiver(nursery: trio.Nursery, *, echo: bool = True) -> FakeTransceiver:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    OPEN_SOCKETS.append(sock)
    await sock.bind(("127.0.0.1", 0))
    t = FakeTransceiver(sock, echo)
    nursery.start_soon(t.run)
    return t


class Client:
    """A client UDP socket (a browser's host candidate)."""

    def __init__(self, sock: trio.socket.SocketType, server: Address) -> None:
        self.sock = sock
        self.server = server

    @property
    def address(self) -> Address:
        name = self.sock.getsockname()
        return (name[0], name[1])

    async def send(self, data: bytes) -> None:
        await self.sock.sendto(data, self.server)

    async def recv(self, within: float = 5.0) -> tuple[bytes, Address]:
        with trio.fail_after(within):
            data, src = await self.sock.recvfrom(65536)
        return data, (src[0], src[1])

    def close(self) -> None:
        self.sock.close()


async def open_client(server: Address, host: str = "127.0.0.1") -> Client:
    family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
    sock = trio.socket.socket(family, trio.socket.SOCK_DGRAM)
    OPEN_SOCKETS.append(sock)
    await sock.bind((host, 0))
    return Client(sock, server)


def free_port() -> int:
    """A free TCP port (tests/ports.py says how it is picked)."""
    return _free_port(TCP)


def redis_server() -> Iterator[str]:
    """A throwaway redis-server on a free loopback port, no persistence; yields its URL."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with stdsocket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def stats_drops(stats: dict[str, Any]) -> dict[str, int]:
    drops = stats["counters"]["drops"]
    assert isinstance(drops, dict)
    return drops
