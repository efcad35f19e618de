"""DTLS cost: full-handshake CPU time per side and application-data records/s.

Run: ``.venv/bin/python bench/dtls_bench.py`` (pyOpenSSL, a test dependency, is the
baseline measured in the same run; memory BIOs, no sockets, so only CPU is counted).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from appliance.proto.dtls import Certificate, CipherSuite, DtlsConnection, Role  # noqa: E402

NOW = 1_700_000_000.0


class Timed:
    """Accumulates process CPU time spent inside calls made through it."""

    def __init__(self) -> None:
        self.cpu = 0.0

    def __call__(self, fn: Callable[..., object], *args: object) -> object:
        t = time.process_time()
        try:
            return fn(*args)
        finally:
            self.cpu += time.process_time() - t


def ours_handshake(suite: CipherSuite, ccert: Certificate, scert: Certificate) -> tuple[float, float, DtlsConnection, DtlsConnection]:
    tc, ts = Timed(), Timed()
    client = DtlsConnection(Role.CLIENT, ccert, remote_fingerprints=[scert.fingerprint], cipher_suites=[suite])
    server = DtlsConnection(Role.SERVER, scert, remote_fingerprints=[ccert.fingerprint], cipher_suites=[suite])
    tc(client.start, NOW)
    while not (client.is_established and server.is_established):
        moved = False
        while (d := tc(client.poll_transmit)) is not None:
            ts(server.handle_datagram, NOW, d)
            moved = True
        while (d := ts(server.poll_transmit)) is not None:
            tc(client.handle_datagram, NOW, d)
            moved = True
        assert moved, "handshake stalled"
    return tc.cpu, ts.cpu, client, server


def ours_records(client: DtlsConnection, server: DtlsConnection, n: int, size: int) -> float:
    payload = b"\xab" * size
    t = time.process_time()
    for _ in range(n):
        client.send_application_data(payload)
        d = client.poll_transmit()
        assert d is not None
        server.handle_datagram(NOW, d)
        server.poll_event()
    return n / (time.process_time() - t)


def openssl_handshake(ccert: Certificate, scert: Certificate, cipher: str) -> tuple[float, float, object, object]:
    from interop.dtls_openssl_peer import OpenSslPeer

    tc, ts = Timed(), Timed()
    client = OpenSslPeer(server=False, certificate=ccert, cipher=cipher)
    server = OpenSslPeer(server=True, certificate=scert, cipher=cipher)
    for _ in range(20):
        tc(client.step)
        for d in tc(client.outgoing):  # type: ignore[union-attr]
            ts(server.feed, d)
        ts(server.step)
        for d in ts(server.outgoing):  # type: ignore[union-attr]
            tc(client.feed, d)
        if client.done and server.done:
            tc(client.step)
            break
    assert client.done and server.done
    return tc.cpu, ts.cpu, client, server


def openssl_records(client: object, server: object, n: int, size: int) -> float:
    payload = b"\xab" * size
    t = time.process_time()
    for _ in range(n):
        client.ssl.send(payload)  # type: ignore[attr-defined]
        for d in client.outgoing():  # type: ignore[attr-defined]
            server.feed(d)  # type: ignore[attr-defined]
        server.recv()  # type: ignore[attr-defined]
    return n / (time.process_time() - t)


SUITE_NAMES = {
    CipherSuite.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256: "ECDHE-ECDSA-AES128-GCM-SHA256",
    CipherSuite.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384: "ECDHE-ECDSA-AES256-GCM-SHA384",
    CipherSuite.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256: "ECDHE-ECDSA-CHACHA20-POLY1305",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--handshakes", type=int, default=100)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--size", type=int, default=1000, help="application-data bytes per record")
    args = parser.parse_args()
    ccert, scert = Certificate.generate(NOW), Certificate.generate(NOW)
    print(f"python {sys.version.split()[0]}; {args.handshakes} handshakes, {args.records} records of {args.size} B")
    print(f"{'suite':<48} {'impl':<8} {'client ms':>10} {'server ms':>10} {'records/s':>11}")
    for suite in CipherSuite:
        rows = {}
        for impl in ("ours", "openssl"):
            cs, ss = [], []
            for _ in range(args.handshakes):
                if impl == "ours":
                    c, s, client, server = ours_handshake(suite, ccert, scert)
                else:
                    c, s, client, server = openssl_handshake(ccert, scert, SUITE_NAMES[suite])
                cs.append(c * 1000)
                ss.append(s * 1000)
            if impl == "ours":
                rate = ours_records(client, server, args.records, args.size)  # type: ignore[arg-type]
            else:
                rate = openssl_records(client, server, args.records, args.size)
            rows[impl] = (statistics.median(cs), statistics.median(ss), rate)
            print(f"{suite.name:<48} {impl:<8} {rows[impl][0]:>10.2f} {rows[impl][1]:>10.2f} {rate:>11,.0f}")
        o, b = rows["ours"], rows["openssl"]
        print(f"{'':<48} {'ratio':<8} {o[0] / b[0]:>9.1f}x {o[1] / b[1]:>9.1f}x {b[2] / o[2]:>10.1f}x slower")


if __name__ == "__main__":
    main()
