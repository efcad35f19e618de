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


def openssl_tls13_handshake(ccert: Certificate, scert: Certificate, curve: str | None
                            ) -> tuple[float, float, str]:
    """The nearest OpenSSL baseline for 1.3 on this machine: OpenSSL's *TLS* 1.3 (pyOpenSSL
    exposes no DTLS 1.3 method) over memory BIOs, mutual ECDSA P-256 auth,
    TLS_AES_128_GCM_SHA256; ``curve`` None = OpenSSL's default group list (its first key
    share), else that one group. Same primitives as ours, without DTLS record, fragment and
    ACK work: a floor, not a like-for-like figure. CPU per side and the group negotiated."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from OpenSSL import SSL, crypto

    def ctx(server: bool, cert: Certificate) -> SSL.Context:
        c = SSL.Context(SSL.TLS_SERVER_METHOD if server else SSL.TLS_CLIENT_METHOD)
        c.set_min_proto_version(SSL.TLS1_3_VERSION)
        c.set_tls13_ciphersuites(b"TLS_AES_128_GCM_SHA256")
        c.use_certificate(x509.load_der_x509_certificate(cert.der))
        c.use_privatekey(cert.private_key)
        c.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, lambda *a: True)
        if curve is not None:
            c.set_tmp_ecdh(ec.SECP256R1() if curve == "prime256v1" else crypto.get_elliptic_curve(curve))
        return c

    tc, ts = Timed(), Timed()
    client = SSL.Connection(ctx(False, ccert), None)
    server = SSL.Connection(ctx(True, scert), None)
    client.set_connect_state()
    server.set_accept_state()
    done = [False, False]

    def step(i: int, conn: SSL.Connection) -> None:
        try:
            conn.do_handshake()
            done[i] = True
        except SSL.WantReadError:
            pass

    def move(src: SSL.Connection, dst: SSL.Connection, t_src: Timed, t_dst: Timed) -> None:
        while True:
            try:
                data = t_src(src.bio_read, 65536)
            except SSL.WantReadError:
                return
            t_dst(dst.bio_write, data)

    for _ in range(10):
        tc(step, 0, client)
        move(client, server, tc, ts)
        ts(step, 1, server)
        move(server, client, ts, tc)
        if all(done):
            tc(step, 0, client)
            break
    assert all(done), "OpenSSL TLS 1.3 handshake stalled"
    return tc.cpu, ts.cpu, str(client.get_group_name())


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
    for curve in (None, "prime256v1"):
        cs, ss = [], []
        group = "?"
        for _ in range(args.handshakes):
            c, s, group = openssl_tls13_handshake(ccert, scert, curve)
            cs.append(c * 1000)
            ss.append(s * 1000)
        print(f"{'TLS1.3':<8} {group:<16} {statistics.median(cs):>10.2f} "
              f"{statistics.median(ss):>10.2f} {'-':>11}  (OpenSSL, stream TLS: baseline)")


if __name__ == "__main__":
    main()
