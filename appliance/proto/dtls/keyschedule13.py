"""The TLS 1.3 key schedule with DTLS labels, record protection and key exchange.

* HKDF-Extract/Expand (RFC 5869) and HKDF-Expand-Label / Derive-Secret (RFC 8446 §7.1)
  with the label prefix ``"dtls13"`` instead of ``"tls13 "`` (RFC 9147 §5.9).
* Traffic keys: ``key``, ``iv`` (RFC 8446 §7.3) and the record-number key ``sn``
  (RFC 9147 §4.2.3); KeyUpdate's ``"traffic upd"`` (RFC 8446 §7.2).
* Record AEAD: nonce = iv XOR the 64-bit record sequence number (RFC 8446 §5.3; in DTLS
  1.3 the epoch is *not* part of it, as BoringSSL — Chromium — does), additional data =
  the unified header with the plaintext sequence number (RFC 9147 §4).
* Record-number encryption (RFC 9147 §4.2.3): AES-ECB or ChaCha20 over the first 16
  bytes of ciphertext gives the mask XORed into the 1- or 2-byte sequence number.
* Exporter (RFC 8446 §7.5), used for EXTRACTOR-dtls_srtp (RFC 5764 §4.2).
* Key shares: X25519 (RFC 7748), P-256 (uncompressed, RFC 8446 §4.2.8.2) and, when
  ``cryptography`` has ML-KEM (≥ 47 with an ML-KEM-capable OpenSSL), the hybrid
  X25519MLKEM768 (draft-ietf-tls-ecdhe-mlkem §3: ML-KEM part first in shares and secret).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag, UnsupportedAlgorithm
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from appliance.proto.dtls._wire import (
    AlertDescription,
    CipherSuite13,
    DtlsError,
    Group13,
    NamedGroup,
)
from appliance.proto.dtls.crypto import KeyShare

try:  # cryptography >= 47 (and a backend with ML-KEM); optional, see docs/dtls13.md
    from cryptography.hazmat.primitives.asymmetric import mlkem as _mlkem

    _mlkem.MLKEM768PrivateKey.generate()
    HAVE_MLKEM = True
except (ImportError, UnsupportedAlgorithm, AttributeError):  # pragma: no cover - env
    _mlkem = None  # type: ignore[assignment]
    HAVE_MLKEM = False

LABEL_PREFIX = b"dtls13"
AEAD_TAG_LEN = 16


@dataclass(frozen=True, slots=True)
class Suite13:
    hash_name: str
    hash_len: int
    key_len: int
    chacha: bool


SUITES13: dict[CipherSuite13, Suite13] = {
    CipherSuite13.TLS_AES_128_GCM_SHA256: Suite13("sha256", 32, 16, False),
    CipherSuite13.TLS_AES_256_GCM_SHA384: Suite13("sha384", 48, 32, False),
    CipherSuite13.TLS_CHACHA20_POLY1305_SHA256: Suite13("sha256", 32, 32, True),
}


def hkdf_extract(hash_name: str, salt: bytes, ikm: bytes) -> bytes:
    return hmac.digest(salt, ikm, hash_name)


def hkdf_expand(hash_name: str, prk: bytes, info: bytes, length: int) -> bytes:
    out = bytearray()
    block = b""
    counter = 1
    while len(out) < length:
        block = hmac.digest(prk, block + info + bytes((counter,)), hash_name)
        out += block
        counter += 1
    return bytes(out[:length])


def expand_label(hash_name: str, secret: bytes, label: bytes, context: bytes, length: int,
                 prefix: bytes = LABEL_PREFIX) -> bytes:
    """RFC 8446 §7.1 HKDF-Expand-Label with the DTLS 1.3 prefix (RFC 9147 §5.9), or TLS
    1.3's ``"tls13 "`` (proto/dtls/tlsrecord.py)."""
    full = prefix + label
    info = length.to_bytes(2, "big") + bytes((len(full),)) + full + bytes((len(context),)) + context
    return hkdf_expand(hash_name, secret, info, length)


def derive_secret(hash_name: str, secret: bytes, label: bytes, transcript: bytes) -> bytes:
    h = hashlib.new(hash_name, transcript).digest()
    return expand_label(hash_name, secret, label, h, len(h))


class KeySchedule:
    """RFC 8446 §7.1 secrets for one handshake; the transcript is passed in as bytes."""

    __slots__ = ("suite", "p", "handshake_secret", "master_secret")

    def __init__(self, suite: CipherSuite13, shared_secret: bytes) -> None:
        self.suite = suite
        self.p = p = SUITES13[suite]
        zeros = bytes(p.hash_len)
        early = hkdf_extract(p.hash_name, zeros, zeros)  # no PSK: IKM is zeros
        derived = derive_secret(p.hash_name, early, b"derived", b"")
        self.handshake_secret = hkdf_extract(p.hash_name, derived, shared_secret)
        derived = derive_secret(p.hash_name, self.handshake_secret, b"derived", b"")
        self.master_secret = hkdf_extract(p.hash_name, derived, zeros)

    def handshake_traffic(self, transcript: bytes) -> tuple[bytes, bytes]:
        """(client, server) handshake traffic secrets over ClientHello..ServerHello."""
        hs = self.handshake_secret
        return (derive_secret(self.p.hash_name, hs, b"c hs traffic", transcript),
                derive_secret(self.p.hash_name, hs, b"s hs traffic", transcript))

    def application_traffic(self, transcript: bytes) -> tuple[bytes, bytes, bytes]:
        """(client, server, exporter master) over ClientHello..server Finished."""
        ms, h = self.master_secret, self.p.hash_name
        return (derive_secret(h, ms, b"c ap traffic", transcript),
                derive_secret(h, ms, b"s ap traffic", transcript),
                derive_secret(h, ms, b"exp master", transcript))

    def finished(self, base_secret: bytes, transcript: bytes) -> bytes:
        """RFC 8446 §4.4.4 verify_data = HMAC(finished_key, Transcript-Hash)."""
        h = self.p.hash_name
        key = expand_label(h, base_secret, b"finished", b"", self.p.hash_len)
        return hmac.digest(key, hashlib.new(h, transcript).digest(), h)

    def next_secret(self, secret: bytes) -> bytes:
        """RFC 8446 §7.2: application_traffic_secret_N+1."""
        return expand_label(self.p.hash_name, secret, b"traffic upd", b"", self.p.hash_len)

    def export(self, exporter_master: bytes, label: bytes, context: bytes, length: int) -> bytes:
        """RFC 8446 §7.5 TLS-Exporter(label, context_value, key_length)."""
        h = self.p.hash_name
        secret = derive_secret(h, exporter_master, label, b"")
        return expand_label(h, secret, b"exporter", hashlib.new(h, context).digest(), length)


class RecordProtection13:
    """AEAD and record-number protection for one direction of one epoch."""

    __slots__ = ("_aead", "_iv", "_sn", "_chacha", "_ecb")

    def __init__(self, suite: CipherSuite13, traffic_secret: bytes) -> None:
        p = SUITES13[suite]
        key = expand_label(p.hash_name, traffic_secret, b"key", b"", p.key_len)
        self._iv = expand_label(p.hash_name, traffic_secret, b"iv", b"", 12)
        sn_key = expand_label(p.hash_name, traffic_secret, b"sn", b"", p.key_len)
        self._chacha = p.chacha
        self._aead: AESGCM | ChaCha20Poly1305 = ChaCha20Poly1305(key) if p.chacha else AESGCM(key)
        self._sn = sn_key
        # ECB has no state between blocks, so one encryptor serves every record.
        self._ecb = None if p.chacha else Cipher(algorithms.AES(sn_key), modes.ECB()).encryptor()

    def _nonce(self, seq: int) -> bytes:
        n = int.from_bytes(self._iv, "big") ^ seq
        return n.to_bytes(12, "big")

    def seal(self, seq: int, header: bytes, inner: bytes) -> bytes:
        return self._aead.encrypt(self._nonce(seq), inner, header)

    def open(self, seq: int, header: bytes, ciphertext: bytes) -> bytes:
        try:
            return self._aead.decrypt(self._nonce(seq), ciphertext, header)
        except InvalidTag:
            raise DtlsError("record authentication failed",
                            hint=AlertDescription.bad_record_mac) from None

    def mask(self, ciphertext: bytes) -> bytes:
        """RFC 9147 §4.2.3: the mask over ``ciphertext[0:16]`` (caller checks ≥ 16 bytes)."""
        sample = ciphertext[:16]
        if self._chacha:
            # cryptography's 16-byte ChaCha20 nonce is counter(4, little-endian) ‖ nonce(12),
            # exactly "Ciphertext[0..3] as counter, Ciphertext[4..15] as nonce".
            enc = Cipher(algorithms.ChaCha20(self._sn, sample), mode=None).encryptor()
            return enc.update(bytes(16))
        assert self._ecb is not None
        return self._ecb.update(sample)


# --- key exchange ----------------------------------------------------------------------


class KeyShare13:
    """One ephemeral key share of a 1.3 handshake (client: keypair; server: response)."""

    __slots__ = ("group", "_ec", "_kem")

    def __init__(self, group: Group13) -> None:
        self.group = group
        self._kem: object | None = None
        if group is Group13.X25519MLKEM768:
            if not HAVE_MLKEM:
                raise DtlsError("ML-KEM unavailable", hint=AlertDescription.internal_error)
            self._kem = _mlkem.MLKEM768PrivateKey.generate()
            self._ec = KeyShare(NamedGroup.x25519)
        else:
            self._ec = KeyShare(NamedGroup(int(group)))

    @property
    def public(self) -> bytes:
        """The client's key_share entry: for the hybrid, ML-KEM encapsulation key ‖ X25519."""
        if self._kem is not None:
            kem_pub = self._kem.public_key().public_bytes_raw()  # type: ignore[attr-defined]
            return bytes(kem_pub) + self._ec.public
        return self._ec.public

    def client_finish_untrusted(self, server_share: bytes) -> bytes:
        """Client: the shared secret from the server's share."""
        if self._kem is not None:
            if len(server_share) != 1088 + 32:
                raise DtlsError("bad X25519MLKEM768 server share",
                                hint=AlertDescription.illegal_parameter)
            try:
                kem_ss: bytes = self._kem.decapsulate(server_share[:1088])  # type: ignore[attr-defined]
            except ValueError:
                raise DtlsError("bad ML-KEM ciphertext",
                                hint=AlertDescription.illegal_parameter) from None
            return kem_ss + self._ec.exchange_untrusted(server_share[1088:])
        return self._ec.exchange_untrusted(server_share)


def server_key_exchange_untrusted(group: Group13, client_share: bytes) -> tuple[bytes, bytes]:
    """Server: ``(our key_share bytes, shared secret)`` answering the client's share."""
    if group is Group13.X25519MLKEM768:
        if not HAVE_MLKEM or len(client_share) != 1184 + 32:
            raise DtlsError("bad X25519MLKEM768 client share",
                            hint=AlertDescription.illegal_parameter)
        try:
            peer = _mlkem.MLKEM768PublicKey.from_public_bytes(client_share[:1184])
            kem_ss, ciphertext = peer.encapsulate()
        except ValueError:
            raise DtlsError("bad ML-KEM encapsulation key",
                            hint=AlertDescription.illegal_parameter) from None
        ec = KeyShare(NamedGroup.x25519)
        return bytes(ciphertext) + ec.public, bytes(kem_ss) + ec.exchange_untrusted(
            client_share[1184:])
    ec = KeyShare(NamedGroup(int(group)))
    return ec.public, ec.exchange_untrusted(client_share)


def supported_groups() -> tuple[Group13, ...]:
    """Our default preference: the post-quantum hybrid first when we have ML-KEM."""
    base = (Group13.x25519, Group13.secp256r1)
    return ((Group13.X25519MLKEM768, *base) if HAVE_MLKEM else base)
