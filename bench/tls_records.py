"""What TURN/TLS's records cost the relay now that it does them itself (issue 40 items 2, 7).

    .venv/bin/python bench/tls_records.py [--records 100000] [--size 176]

After OpenSSL's handshake the relay protects and checks a TURN/TLS connection's records
with its own layer (proto/dtls/tlsrecord.py), so that a successor can carry the connection
on after a worker kill (docs/turn.md "Over TLS: the records are ours"). This measures, per
record of ``--size`` bytes (176: a ChannelData with 20 ms of Opus), in one run on one core,
without syscalls:

* ``openssl``: the baseline — ``SSLObject.write`` + the outgoing BIO's read (a record out),
  and the incoming BIO's write + ``SSLObject.read`` (a record in), as the relay did before;
* ``ours``: ``RecordLayer.seal`` and ``RecordLayer.open`` (a record's span found first, as
  the reader does);
* ``ours + board``: the same with a kept connection's board (relay/board.py): the chunk
  and write state published before the send (one record a send here: the worst case),
  the read state before the take (``TlsLink``).

for TLS 1.3 (AES-256-GCM, what Python's client picks) and TLS 1.2 (ECDHE-ECDSA-AES128-GCM).
Ratios are against ``openssl`` in the same run (the host's speed drifts by the hour).
"""

from __future__ import annotations

import argparse
import os
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from appliance.proto.dtls.tlspeek import peek_client_hello_untrusted  # noqa: E402
from appliance.proto.dtls.tlsrecord import (  # noqa: E402
    TLS12_CIPHERS,
    KeyLog,
    RecordLayer,
    SessionKeys,
    record_spans_untrusted,
    server_random_untrusted,
    session_keys,
)
from appliance.proto.turn import StreamFramer  # noqa: E402
from appliance.relay.board import Board, Outgoing  # noqa: E402
from appliance.relay.tls import TlsLink  # noqa: E402


def _pump(a: ssl.MemoryBIO, b: ssl.MemoryBIO) -> None:
    data = a.read()
    if data:
        b.write(data)


def handshake(version: ssl.TLSVersion, cert: str, key: str):  # type: ignore[no-untyped-def]
    """A finished handshake over memory BIOs: (client objects, server objects, keys)."""
    fd = os.memfd_create("bench-keylog")
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(cert, key)
    sctx.options |= ssl.OP_NO_TICKET
    sctx.num_tickets = 0
    sctx.set_ciphers(TLS12_CIPHERS)
    sctx.keylog_filename = f"/proc/self/fd/{fd}"
    cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cctx.check_hostname = False
    cctx.verify_mode = ssl.CERT_NONE
    cctx.maximum_version = version
    if version == ssl.TLSVersion.TLSv1_2:
        cctx.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")
    ci, co, si, so = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = cctx.wrap_bio(ci, co)
    s = sctx.wrap_bio(si, so, server_side=True)
    first = b""
    hello = b""
    for _ in range(10):
        for obj in (c, s):
            try:
                obj.do_handshake()
            except ssl.SSLWantReadError:
                pass
        out = co.read()
        hello = hello or out
        si.write(out)
        out = so.read()
        first = first or out
        ci.write(out)
        if s.version() and c.version():
            try:
                s.do_handshake()
                c.do_handshake()
                break
            except ssl.SSLWantReadError:
                continue
    _pump(co, si)
    _pump(so, ci)
    log = KeyLog()
    log.feed(os.pread(fd, 1 << 20, 0))
    os.close(fd)
    random = peek_client_hello_untrusted(hello).random  # type: ignore[union-attr]
    keys = session_keys(log.take(random), s.version() or "", s.cipher()[0],  # type: ignore[index]
                        random, server_random_untrusted(first))
    assert keys is not None
    return (c, ci, co), (s, si, so), keys


def per_record(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn(n)
    return (time.perf_counter() - start) / n * 1e6


def measure(name: str, version: ssl.TLSVersion, cert: str, key: str, n: int,
            payload: bytes) -> None:
    """One version's rows (module docstring)."""
    (c, ci, co), (s, si, so), keys = handshake(version, cert, key)
    first = 1 if keys.version == 0x0303 else 0
    # Records from the client, made once, opened by each contender in turn.
    c_layer = RecordLayer(SessionKeys(keys.suite, keys.write, keys.read),
                          0, first, 0, first)
    wire = [c_layer.seal(payload) for _ in range(n)]

    def ossl_out(k: int) -> None:
        for _ in range(k):
            s.write(payload)
            so.read()

    def ossl_in(k: int) -> None:
        for i in range(k):
            si.write(wire[i])
            s.read(65536)

    ossl = (per_record(ossl_out, n), per_record(ossl_in, n))

    layer = RecordLayer(keys, 0, first, 0, first)

    def ours_out(k: int) -> None:
        for _ in range(k):
            layer.seal(payload)

    def ours_in(k: int) -> None:
        for i in range(k):
            data = wire[i]
            spans, _, _ = record_spans_untrusted(data)
            off, size = spans[0]
            layer.open(memoryview(data)[off : off + size])

    ours = (per_record(ours_out, n), per_record(ours_in, n))

    board = Board.create(16)
    link = TlsLink(RecordLayer(keys, 0, first, 0, first), StreamFramer(), 0)
    link.attach(board, 0)
    out = Outgoing(board, 0, 0, 0, 0, first)
    backlog = bytearray()

    def board_out(k: int) -> None:
        lay = link.layer
        for _ in range(k):
            records = lay.seal(payload)
            backlog.extend(records)
            out.appended(len(records), lay.wgen, lay.wseq)
            out.chunk(backlog)  # as push() does before its send
            out.wrote(len(backlog))
            backlog.clear()

    def board_in(k: int) -> None:
        for i in range(k):
            data = wire[i]
            spans, end, _ = record_spans_untrusted(data)
            off, size = spans[0]
            link.layer.open(memoryview(data)[off : off + size])
            link.taking(end)
            link.took(end)

    boarded = (per_record(board_out, n), per_record(board_in, n))
    board.close()
    base = sum(ossl)
    for label, (o, i) in (("openssl", ossl), ("ours", ours), ("ours + board", boarded)):
        print(f"{name:8} {label:14} {o:7.2f} {i:7.2f} {o + i:7.2f} "
              f"{(o + i) / base:10.2f}")



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=176)
    args = ap.parse_args()
    payload = bytes(args.size)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{tmp}/k", "-out",
                        f"{tmp}/c", "-subj", "/CN=bench", "-days", "1"],
                       capture_output=True, check=True)
        cases = [("TLS 1.3", ssl.TLSVersion.TLSv1_3), ("TLS 1.2", ssl.TLSVersion.TLSv1_2)]
        print(f"per {args.size}-byte record, µs (one core, no syscalls), "
              f"{args.records} records each way")
        print(f"{'':8} {'':14} {'out':>7} {'in':>7} {'sum':>7} {'× openssl':>10}")
        for name, version in cases:
            measure(name, version, f"{tmp}/c", f"{tmp}/k", args.records, payload)

if __name__ == "__main__":
    main()
