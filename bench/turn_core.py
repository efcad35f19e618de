"""TURN's CPU cost in the relay, without sockets (issue 40 item 7, the in-process part).

    .venv/bin/python bench/turn_core.py [--packets 200000] [--allocations 5000]

Prints, per datagram, the time one relay worker's core spends on:

* ``direct``: a known flow's SRTP-sized datagram through ``RelayCore.handle_datagram`` (the
  slow path's call — the hot loop's fast path skips even that, so this is an upper bound for
  direct traffic);
* ``turn-in``: the same payload as ChannelData from a TURN client to our own media address
  (demux, the TURN server's channel/permission checks, the in-process routing as a client at
  the relayed address: everything the relay does for it but the syscalls);
* ``turn-out``: the transceiver's reply to that flow wrapped as ChannelData (``TurnGate.back``:
  the 4-byte header in front of the payload, no copy);
* ``turn-out-data-indication``: the same before a channel is bound (a Data indication,
  built and copied);

and the TURN server's ``allocations/s``: an authenticated Allocate (long-term key, HMAC,
nonce check, relayed address from a fake port table) plus its Refresh(0), per second.
Syscalls are not included (they are the same per datagram on both paths: one receive and
one send in a batch, docs/performance.md "Relay").
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from appliance.proto.stun import AttrType, Class, Message, Method, binding_request, long_term_key  # noqa: E402
from appliance.proto.turn import encode_channel_data, mint_rest_credential  # noqa: E402
from appliance.proto.ufrag import UfragCodec  # noqa: E402
from appliance.relay.core import CoreConfig, Flow, RelayCore, Relayed  # noqa: E402
from appliance.relay.transport import Transport, UdpSink  # noqa: E402
from appliance.relay.turn import TurnGate, TurnSettings, own_media_map  # noqa: E402

SECRET = b"bench-routing-secret-0123456789ab"
TURN_SECRET = b"bench-turn-secret"
PUBLIC = ("0.0.0.0", 3478)
MEDIA = ("203.0.113.1", 3478)
SRTP = b"\x80\x6f" + bytes(170)


class Ports:
    def __init__(self) -> None:
        self.n = 1024

    def bind(self, family: int, client: tuple[str, int], even: bool = False) -> tuple[str, int]:
        self.n = self.n + 1 if self.n < 65535 else 1025
        return ("203.0.113.1", self.n)

    def close(self, relayed: tuple[str, int]) -> None:
        pass


def _setup() -> tuple[RelayCore, TurnGate]:
    core = RelayCore(CoreConfig(secrets=(SECRET,), transceivers={0: ("127.0.0.1", 4000)},
                                unknown_stun_rate=1e9, unknown_stun_burst=1e9))
    sink = UdpSink(PUBLIC, lambda b, p: (len(p), 0, 0))
    core.sinks[(Transport.UDP, PUBLIC)] = sink
    gate = TurnGate(core, TurnSettings(secrets=(TURN_SECRET,), max_allocations=10**6,
                                       max_per_source=10**6, max_per_username=10**6),
                    own_media_map([MEDIA], [PUBLIC]), Ports(), unix_offset=time.time())
    return core, gate


class Client:
    def __init__(self, core: RelayCore, addr: tuple[str, int]) -> None:
        self.core, self.addr = core, addr
        cred = mint_rest_credential(TURN_SECRET, "bench", int(time.time()) + 3600)
        self.user, self.pwd = cred.username, cred.password
        self.realm = self.nonce = ""

    def ask(self, now: float, method: Method, attrs: tuple[tuple[AttrType, object], ...]) -> Message:
        for _ in range(2):
            extra: tuple[tuple[AttrType, object], ...] = ()
            key = None
            if self.nonce:
                extra = ((AttrType.USERNAME, self.user), (AttrType.REALM, self.realm),
                         (AttrType.NONCE, self.nonce))
                key = long_term_key(self.user, self.realm, self.pwd)
            raw = Message(method, Class.REQUEST, os.urandom(12),
                          attrs + extra).encode(key)  # type: ignore[arg-type]
            res = self.core.handle_datagram(now, self.addr, raw, PUBLIC)
            assert isinstance(res, bytes)
            msg = Message.parse_untrusted(res)
            if msg.msg_class == Class.SUCCESS:
                return msg
            self.realm = str(msg.get(AttrType.REALM))
            self.nonce = str(msg.get(AttrType.NONCE))
        raise RuntimeError(msg.error_code)


def per_packet(fn: object, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()  # type: ignore[operator]
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packets", type=int, default=200_000)
    ap.add_argument("--allocations", type=int, default=5_000)
    a = ap.parse_args()
    core, gate = _setup()
    now = 1000.0
    uf = UfragCodec(SECRET).mint(cluster=0, transceiver=0)
    check = binding_request(bytes(12), username=f"{uf}:clnt", password="pw")

    # direct: a known flow (made by its check), then SRTP through the slow-path call.
    direct_client = ("198.51.100.1", 5000)
    assert isinstance(core.handle_datagram(now, direct_client, check, PUBLIC), Flow)
    direct = per_packet(lambda: core.handle_datagram(now, direct_client, SRTP, PUBLIC),
                        a.packets)

    # turn-in: ChannelData to our media address from an allocation with a bound channel.
    c = Client(core, ("198.51.100.2", 6000))
    c.ask(now, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),))
    c.ask(now, Method.CHANNEL_BIND, ((AttrType.CHANNEL_NUMBER, 0x4000),
                                     (AttrType.XOR_PEER_ADDRESS, MEDIA)))
    res = core.handle_datagram(now, c.addr, encode_channel_data(0x4000, check), PUBLIC)
    assert isinstance(res, Relayed)
    flow = res.flow
    chan = encode_channel_data(0x4000, SRTP)
    turn_in = per_packet(lambda: core.handle_datagram(now, c.addr, chan, PUBLIC), a.packets)

    # turn-out: the transceiver's reply, wrapped as ChannelData (header only, no copy).
    sink = core.sinks[(Transport.UDP, PUBLIC)]
    buf = memoryview(bytearray(256) + SRTP)

    def out() -> None:
        gate.back(now, flow, buf, 256, len(SRTP))
        sink.pending.clear()

    turn_out = per_packet(out, a.packets)

    # turn-out before a channel: a Data indication (second client, permission only).
    d = Client(core, ("198.51.100.3", 7000))
    d.ask(now, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),))
    d.ask(now, Method.CREATE_PERMISSION, ((AttrType.XOR_PEER_ADDRESS, MEDIA),))
    send = Message(Method.SEND, Class.INDICATION, bytes(12), (
        (AttrType.XOR_PEER_ADDRESS, MEDIA), (AttrType.DATA, check))).encode(fingerprint=False)
    res2 = core.handle_datagram(now, d.addr, send, PUBLIC)
    assert isinstance(res2, Relayed)
    flow2 = res2.flow

    def out_ind() -> None:
        gate.back(now, flow2, buf, 256, len(SRTP))
        sink.pending.clear()

    turn_ind = per_packet(out_ind, a.packets // 4)

    # allocations/s: Allocate + Refresh(0), authenticated, nonce already known.
    e = Client(core, ("198.51.100.4", 1))
    e.ask(now, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),))
    e.ask(now, Method.REFRESH, ((AttrType.LIFETIME, 0),))
    t0 = time.perf_counter()
    for _ in range(a.allocations):
        e.ask(now, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),))
        e.ask(now, Method.REFRESH, ((AttrType.LIFETIME, 0),))
    per_s = a.allocations / (time.perf_counter() - t0)

    print(f"python {sys.version.split()[0]}; per datagram (µs, one core, no syscalls):")
    print(f"  direct (slow-path call)       {direct:6.2f}")
    print(f"  turn-in  ChannelData -> own   {turn_in:6.2f}")
    print(f"  turn-out own -> ChannelData   {turn_out:6.2f}")
    print(f"  turn-out Data indication      {turn_ind:6.2f}")
    print(f"allocations/s (Allocate + Refresh 0, client side included): {per_s:,.0f}")


if __name__ == "__main__":
    main()
