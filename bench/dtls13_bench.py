"""DTLS 1.2 vs 1.3 handshake CPU per side, and 1.3 application-data records/s.

Run: ``.venv/bin/python bench/dtls13_bench.py`` (in memory, no sockets: only CPU counts).
Both versions use our engines through :class:`DtlsConnection` (``versions=``), the same
certificates, AES-128-GCM, and the default SRTP profiles; 1.3 is measured per key-exchange
group (X25519, P-256, and X25519MLKEM768 when ``cryptography`` has ML-KEM).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from appliance.proto.dtls import (  # noqa: E402
    HAVE_MLKEM,
    Certificate,
    DtlsConnection,
    Group13,
    NamedGroup,
    Role,
)
from bench.dtls_bench import NOW, Timed, ours_records  # noqa: E402


def handshake(versions: frozenset[str], ccert: Certificate, scert: Certificate,
              group13: Group13 | None, group12: NamedGroup) -> tuple[float, float, DtlsConnection, DtlsConnection]:
    tc, ts = Timed(), Timed()
    g13 = [group13] if group13 is not None else None
    client = DtlsConnection(Role.CLIENT, ccert, remote_fingerprints=[scert.fingerprint],
                            versions=versions, groups_13=g13, groups=[group12])
    server = DtlsConnection(Role.SERVER, scert, remote_fingerprints=[ccert.fingerprint],
                            versions=versions, groups_13=g13, groups=[group12])
    tc(client.start, NOW)
    # Until both are established and the client's final flight is ACKed (1.3, §7).
    while not (client.is_established and server.is_established) or client.poll_timeout():
        moved = False
        while (d := tc(client.poll_transmit)) is not None:
            ts(server.handle_datagram, NOW, d)
            moved = True
        while (d := ts(server.poll_transmit)) is not None:
            tc(client.handle_datagram, NOW, d)
            moved = True
        if not moved:
            break
    assert client.is_established and server.is_established
    return tc.cpu, ts.cpu, client, server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--handshakes", type=int, default=100)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--size", type=int, default=1000)
    args = parser.parse_args()
    ccert, scert = Certificate.generate(NOW), Certificate.generate(NOW)
    print(f"python {sys.version.split()[0]}; {args.handshakes} handshakes (median CPU ms per side), "
          f"{args.records} records of {args.size} B; ML-KEM available: {HAVE_MLKEM}")
    print(f"{'version':<8} {'group':<16} {'client ms':>10} {'server ms':>10} {'records/s':>11}")
    cases: list[tuple[str, frozenset[str], Group13 | None, NamedGroup]] = [
        ("1.2", frozenset({"1.2"}), None, NamedGroup.x25519),
        ("1.2", frozenset({"1.2"}), None, NamedGroup.secp256r1),
        ("1.3", frozenset({"1.3"}), Group13.x25519, NamedGroup.x25519),
        ("1.3", frozenset({"1.3"}), Group13.secp256r1, NamedGroup.secp256r1),
    ]
    if HAVE_MLKEM:
        cases.append(("1.3", frozenset({"1.3"}), Group13.X25519MLKEM768, NamedGroup.x25519))
    for label, versions, g13, g12 in cases:
        cs, ss = [], []
        for _ in range(args.handshakes):
            c, s, client, server = handshake(versions, ccert, scert, g13, g12)
            cs.append(c * 1000)
            ss.append(s * 1000)
        rate = ours_records(client, server, args.records, args.size)  # type: ignore[arg-type]
        name = (g13.name if g13 is not None else g12.name)
        print(f"{label:<8} {name:<16} {statistics.median(cs):>10.2f} {statistics.median(ss):>10.2f} {rate:>11,.0f}")


if __name__ == "__main__":
    main()
