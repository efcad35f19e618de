"""An OpenSSL DTLS 1.2 peer over memory BIOs (pyOpenSSL: a TEST-ONLY dependency).

No sockets: datagrams are moved by hand between OpenSSL's memory BIO and our sans-IO
connection. A memory BIO is a byte stream, so one ``bio_read`` may return several of
OpenSSL's datagrams back to back; DTLS records are self-delimiting, so our side still
parses them (it only loses the datagram boundaries, which DTLS does not depend on).
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from OpenSSL import SSL, crypto

from appliance.proto.dtls import Certificate, fingerprint_of

OPENSSL_SUITE_NAMES = {
    0xC02B: "ECDHE-ECDSA-AES128-GCM-SHA256",
    0xC02C: "ECDHE-ECDSA-AES256-GCM-SHA384",
    0xCCA9: "ECDHE-ECDSA-CHACHA20-POLY1305",
}


def _accept_any(conn: SSL.Connection, cert: crypto.X509, errno: int, depth: int, ok: int) -> bool:
    # WebRTC peers are self-signed; the fingerprint is checked after the handshake.
    return True


class OpenSslPeer:
    def __init__(
        self,
        *,
        server: bool,
        certificate: Certificate,
        cipher: str = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305",
        srtp: bytes = b"SRTP_AEAD_AES_128_GCM:SRTP_AEAD_AES_256_GCM:SRTP_AES128_CM_SHA1_80",
        cookies: bool = False,
    ) -> None:
        ctx = SSL.Context(SSL.DTLS_SERVER_METHOD if server else SSL.DTLS_CLIENT_METHOD)
        ctx.set_cipher_list(cipher.encode())
        ctx.set_tlsext_use_srtp(srtp)
        ctx.use_certificate(x509.load_der_x509_certificate(certificate.der))
        key: ec.EllipticCurvePrivateKey = certificate.private_key
        ctx.use_privatekey(key)
        ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, _accept_any)
        if cookies:
            ctx.set_options(SSL.OP_COOKIE_EXCHANGE)
            ctx.set_cookie_generate_callback(lambda conn: b"openssl-cookie-0123456789")
            ctx.set_cookie_verify_callback(
                lambda conn, cookie: cookie == b"openssl-cookie-0123456789"
            )
        self.ssl = SSL.Connection(ctx, None)
        if server:
            self.ssl.set_accept_state()
        else:
            self.ssl.set_connect_state()
        self.done = False

    def step(self) -> None:
        if not self.done:
            try:
                self.ssl.do_handshake()
                self.done = True
            except SSL.WantReadError:
                pass

    def feed(self, datagram: bytes) -> None:
        self.ssl.bio_write(datagram)

    def outgoing(self) -> list[bytes]:
        out = []
        while True:
            try:
                data = self.ssl.bio_read(65536)
            except SSL.WantReadError:
                break
            if not data:
                break
            out.append(data)
        return out

    def peer_fingerprint(self) -> str:
        cert = self.ssl.get_peer_certificate(as_cryptography=True)
        assert cert is not None
        return fingerprint_of(cert.public_bytes(serialization.Encoding.DER))

    def recv(self) -> bytes | None:
        try:
            return self.ssl.recv(65536)
        except SSL.WantReadError:
            return None
