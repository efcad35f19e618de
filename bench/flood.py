"""Hostile-traffic generator for the relay's public port (issue 9, item 4).

Sends, round-robin from many source ports, as fast as one Python process can:

* ``stun-random``  Binding requests whose USERNAME is a random string (not our format)
* ``stun-forged``  Binding requests with a well-formed routing ufrag minted with the wrong
                   secret (valid format, bad MAC)
* ``garbage``      random bytes of random length
* ``oversize``     datagrams of 1,500 to 65,000 bytes
* ``dtls-hello``   DTLS 1.2 ClientHello records (new flows that never did ICE)
* ``ice-guess``    (only with ``--ufrag UFRAG``, not in the default mix) an ICE
                   password-guessing storm through the relay: Binding requests with a
                   session's real server ufrag and a wrong MESSAGE-INTEGRITY

``--auth FILE`` (JSON: a list of ``{"ufrag": server ufrag, "remote": client ufrag, "pwd":
server ICE password}``, sessions the attacker made for itself) first makes every socket an
ICE-authenticated address of one of those sessions (socket j -> session j mod K: a valid
Binding request, retransmitted until the success response comes back), then floods from
them: with ``--kinds dtls-hello`` the ClientHellos reach the sessions' DTLS (a ClientHello
from an unauthenticated port is dropped by the relay as ``no-flow``).

``--source-ips N`` binds the sockets to N different loopback addresses (127.64.0.0/10) so
the flood comes from many source addresses as well as ports (per-source limits see N
sources); with the default 0 every socket is bound to the target's address.

``--guess UFRAG`` switches to an ICE password-guessing storm against a transceiver's internal
port instead: Binding requests with the right server ufrag and a wrong MESSAGE-INTEGRITY,
wrapped in PROXY v2 headers (spoofed client addresses, as a compromised host inside could
send them); it counts the answers (401s) it gets back.

Prints one JSON line: ``{"sent": {kind: n}, "seconds": s, "rate": pps, "answers": n}``.

    python bench/flood.py --target 127.0.0.1:3478 --duration 5
    python bench/flood.py --target 127.0.0.1:4000 --guess Ab12... --duration 5
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import random
import socket
import struct
import sys
import time
import zlib

KINDS = ("stun-random", "stun-forged", "garbage", "oversize", "dtls-hello")
MAGIC = 0x2112A442


def stun_binding(username: bytes, key: bytes) -> bytes:
    """A Binding request with USERNAME, PRIORITY, ICE-CONTROLLING, MESSAGE-INTEGRITY (keyed
    with ``key``) and FINGERPRINT, as a browser's check looks."""
    def attr(t: int, v: bytes) -> bytes:
        return struct.pack("!HH", t, len(v)) + v + b"\0" * (-len(v) % 4)

    tid = os.urandom(12)
    body = attr(0x0006, username) + attr(0x0024, struct.pack("!I", 1853824767))
    body += attr(0x802A, os.urandom(8))
    head = struct.pack("!HHI", 0x0001, len(body) + 24, MAGIC) + tid
    mi = hmac.new(key, head + body, hashlib.sha1).digest()
    body += attr(0x0008, mi)
    head = struct.pack("!HHI", 0x0001, len(body) + 8, MAGIC) + tid
    crc = (zlib.crc32(head + body) ^ 0x5354554E) & 0xFFFFFFFF
    return head + body + attr(0x8028, struct.pack("!I", crc))


def dtls_client_hello() -> bytes:
    body = (b"\xfe\xfd" + os.urandom(32) + b"\x00" + b"\x00"  # version, random, sid, cookie
            + b"\x00\x04\xc0\x2b\xc0\x2f" + b"\x01\x00"  # suites, compression
            + b"\x00\x0a\x00\x0e\x00\x06\x00\x04\x00\x01\x00\x07\x00")  # use_srtp ext
    hs = struct.pack("!B", 1) + len(body).to_bytes(3, "big") + b"\x00\x00"
    hs += b"\x00\x00\x00" + len(body).to_bytes(3, "big") + body
    return struct.pack("!BHHHIH", 22, 0xFEFF, 0, 0, random.getrandbits(32), len(hs)) + hs


def source_ip(j: int) -> str:
    """The j-th loopback source address of ``--source-ips`` (127.64.0.1 and up)."""
    j += 1
    return f"127.{64 + (j >> 16 & 63)}.{j >> 8 & 255}.{j & 255}"


_CLIENT_CERT: list[object] = []


def real_client_hello() -> bytes:
    """A ClientHello a WebRTC server accepts (our own DTLS client's: extended master
    secret, use_srtp, X25519/P-256), with a random record sequence number so the server's
    replay window does not drop the copies."""
    from appliance.proto.dtls import Certificate, DtlsConnection, Role

    if not _CLIENT_CERT:
        _CLIENT_CERT.append(Certificate.generate(time.time()))
    conn = DtlsConnection(Role.CLIENT, _CLIENT_CERT[0], remote_fingerprints=None)  # type: ignore[arg-type]
    conn.start(0.0)
    hello = conn.poll_transmit()
    assert hello is not None
    return hello[:5] + random.getrandbits(48).to_bytes(6, "big") + hello[11:]


def payloads(kind: str, rng: random.Random, n: int = 256, ufrag: str | None = None,
             real_hellos: bool = False) -> list[bytes]:
    out: list[bytes] = []
    if kind == "ice-guess":
        if not ufrag:
            raise ValueError("ice-guess needs --ufrag")
        return [stun_binding(f"{ufrag}:{i:04x}".encode(), os.urandom(16)) for i in range(n)]
    if kind == "stun-forged":
        from appliance.proto.ufrag import UfragCodec

        codec = UfragCodec(b"not-the-routing-secret-0123456789")
    for _ in range(n):
        if kind == "stun-random":
            name = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789+/",
                                       k=rng.randint(4, 32)))
            out.append(stun_binding(f"{name}:clnt".encode(), os.urandom(16)))
        elif kind == "stun-forged":
            ufrag = codec.mint(cluster=0, transceiver=rng.randint(0, 3))
            out.append(stun_binding(f"{ufrag}:clnt".encode(), os.urandom(16)))
        elif kind == "garbage":
            out.append(os.urandom(rng.randint(1, 1200)))
        elif kind == "oversize":
            out.append(os.urandom(rng.randint(1500, 65000)))
        elif kind == "dtls-hello":
            out.append(real_client_hello() if real_hellos else dtls_client_hello())
        else:
            raise ValueError(kind)
    return out


def proxy_v2(client: tuple[str, int], public: tuple[str, int]) -> bytes:
    from appliance.proto.proxy import encode_header

    return bytes(encode_header(client, public))


def run(target: tuple[str, int], duration: float, kinds: list[str], sockets: int,
        guess: str | None, public: tuple[str, int], seed: int, ufrag: str | None = None,
        source_ips: int = 0, auth: list[dict[str, str]] | None = None) -> dict[str, object]:
    rng = random.Random(seed)
    socks = []
    for j in range(sockets):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        s.bind((source_ip(j % source_ips) if source_ips else target[0], 0))
        s.setblocking(False)
        socks.append(s)
    authenticated = 0
    if auth:
        authenticated = authenticate(socks, target, auth)
    if guess is not None:
        kinds = ["ice-guess"]
        pool = {"ice-guess": [
            proxy_v2((f"203.0.113.{rng.randint(1, 254)}", rng.randint(1024, 65535)), public)
            + stun_binding(f"{guess}:clnt".encode(), os.urandom(16)) for _ in range(256)]}
    else:
        # ClientHellos from authenticated ports are aimed at real handshakes: make them
        # acceptable (the default ones lack extended_master_secret and are refused).
        pool = {k: payloads(k, rng, ufrag=ufrag, real_hellos=bool(auth)) for k in kinds}
    sent = dict.fromkeys(kinds, 0)
    answers = 0
    full = 0
    start = time.monotonic()
    end = start + duration
    i = 0
    # ClientHellos at authenticated ports must get past the DTLS replay window (RFC 6347
    # §4.1.2.6): there, each one carries a new, increasing record sequence number.
    fresh_seq = bool(auth) and "dtls-hello" in kinds
    hello_bufs = [bytearray(p) for p in pool.get("dtls-hello", [])]
    seq = 1 << 20
    while time.monotonic() < end:
        for _ in range(256):
            kind = kinds[i % len(kinds)]
            data = pool[kind][i % 256]
            if fresh_seq and kind == "dtls-hello":
                hb = hello_bufs[i % 256]
                seq += 1
                hb[5:11] = seq.to_bytes(6, "big")
                data = hb
            s = socks[i % sockets]
            i += 1
            try:
                s.sendto(data, target)
                sent[kind] += 1
            except BlockingIOError:
                full += 1
            except OSError:
                full += 1
        for s in socks:
            while True:
                try:
                    s.recv(65536)
                    answers += 1
                except (BlockingIOError, OSError):
                    break
    seconds = time.monotonic() - start
    for s in socks:
        s.close()
    total = sum(sent.values())
    out: dict[str, object] = {"sent": sent, "seconds": round(seconds, 3),
                              "rate": round(total / seconds), "answers": answers,
                              "send_buffer_full": full}
    if auth:
        out["authenticated"] = authenticated
    return out


def authenticate(socks: list[socket.socket], target: tuple[str, int],
                 sessions: list[dict[str, str]], within: float = 5.0) -> int:
    """Make socket j an ICE-authenticated address of session j mod K (see the module
    docstring); returns how many got a success response."""
    pending = {}
    for j, s in enumerate(socks):
        sess = sessions[j % len(sessions)]
        pending[s] = stun_binding(f"{sess['ufrag']}:{sess['remote']}".encode(),
                                  sess["pwd"].encode())
    ok = 0
    deadline = time.monotonic() + within
    while pending and time.monotonic() < deadline:
        for s, req in pending.items():
            try:
                s.sendto(req, target)
            except OSError:
                pass
        wait_until = time.monotonic() + 0.2
        while pending and time.monotonic() < wait_until:
            for s in list(pending):
                try:
                    data = s.recv(2048)
                except (BlockingIOError, OSError):
                    continue
                if data[:2] == b"\x01\x01":  # Binding success response
                    del pending[s]
                    ok += 1
            time.sleep(0.005)
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, metavar="HOST:PORT")
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--sockets", type=int, default=64, help="source ports to rotate through")
    p.add_argument("--guess", metavar="UFRAG", help="ICE password-guessing storm (PROXY v2)")
    p.add_argument("--public", default="127.0.0.1:3478",
                   help="relay public address to put in PROXY headers (--guess)")
    p.add_argument("--ufrag", help="server ufrag for the ice-guess kind (through the relay)")
    p.add_argument("--source-ips", type=int, default=0,
                   help="bind the sockets to this many loopback addresses (127.64.0.0/10)")
    p.add_argument("--auth", metavar="FILE",
                   help="ICE-authenticate the sockets for these sessions first (JSON)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    auth = None
    if a.auth:
        with open(a.auth) as f:
            auth = json.load(f)
    host, port = a.target.rsplit(":", 1)
    phost, pport = a.public.rsplit(":", 1)
    result = run((host, int(port)), a.duration, a.kinds.split(","), a.sockets, a.guess,
                 (phost, int(pport)), a.seed, a.ufrag, a.source_ips, auth)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
