"""Key schedule and record protection for the three AEAD suites we negotiate.

* PRF: RFC 5246 §5 ``P_hash`` with the suite's hash (SHA-256, or SHA-384 for AES-256-GCM,
  RFC 5289 §3).
* Master secret: RFC 7627 §4 extended master secret over the session hash — the only form
  we derive (the legacy RFC 5246 §8.1 form is never computed).
* Key block: RFC 5246 §6.3; AEAD suites have no MAC keys.
* Record AEAD: RFC 5288 §3 (AES-GCM: 4-byte implicit salt + 8-byte explicit nonce carried
  in the record) and RFC 7905 §2 (ChaCha20-Poly1305: 12-byte IV XOR the 64-bit
  epoch‖sequence, no explicit nonce). Additional data per RFC 6347 §4.1.2.1:
  epoch‖seq‖type‖version‖plaintext length.
* Exporter: RFC 5705 §4 without context.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, x25519
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from appliance.proto.dtls._wire import (
    AlertDescription,
    CipherSuite,
    DtlsError,
    NamedGroup,
    SignatureScheme,
    u16,
)


@dataclass(frozen=True, slots=True)
class SuiteParams:
    hash_name: str
    key_len: int
    fixed_iv_len: int
    explicit_nonce_len: int
    chacha: bool


SUITES: dict[CipherSuite, SuiteParams] = {
    CipherSuite.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256: SuiteParams("sha256", 16, 4, 8, False),
    CipherSuite.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384: SuiteParams("sha384", 32, 4, 8, False),
    CipherSuite.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256: SuiteParams(
        "sha256", 32, 12, 0, True
    ),
}
AEAD_TAG_LEN = 16


def prf(hash_name: str, secret: bytes, label: bytes, seed: bytes, length: int) -> bytes:
    """RFC 5246 §5: PRF(secret, label, seed) = P_<hash>(secret, label + seed)."""
    seed = label + seed
    out = bytearray()
    a = seed
    while len(out) < length:
        a = hmac.digest(secret, a, hash_name)
        out += hmac.digest(secret, a + seed, hash_name)
    return bytes(out[:length])


def transcript_hash(hash_name: str, transcript: bytes) -> bytes:
    return hashlib.new(hash_name, transcript).digest()


def extended_master_secret(hash_name: str, pre_master: bytes, session_hash: bytes) -> bytes:
    """RFC 7627 §4: the session hash binds the master secret to this handshake."""
    return prf(hash_name, pre_master, b"extended master secret", session_hash, 48)


def finished_verify_data(hash_name: str, master: bytes, label: bytes, transcript: bytes) -> bytes:
    """RFC 5246 §7.4.9: 12 bytes of PRF over the hash of every message so far."""
    return prf(hash_name, master, label, transcript_hash(hash_name, transcript), 12)


class RecordCipher:
    """AEAD protection of one direction of one epoch."""

    __slots__ = ("_aead", "_iv", "_params")

    def __init__(self, params: SuiteParams, key: bytes, iv: bytes) -> None:
        self._params = params
        self._aead: AESGCM | ChaCha20Poly1305 = (
            ChaCha20Poly1305(key) if params.chacha else AESGCM(key)
        )
        self._iv = iv

    @property
    def overhead(self) -> int:
        return self._params.explicit_nonce_len + AEAD_TAG_LEN

    def _nonce(self, seq64: bytes) -> bytes:
        if self._params.chacha:
            # RFC 7905 §2: the padded 64-bit sequence number XORed into the 12-byte IV.
            padded = b"\x00\x00\x00\x00" + seq64
            return bytes(a ^ b for a, b in zip(self._iv, padded, strict=True))
        # RFC 5288 §3: salt (4 bytes) ‖ nonce_explicit; we use epoch‖seq as the explicit
        # part, which is unique per key as RFC 5288 requires.
        return self._iv + seq64

    def encrypt(
        self, content_type: int, version: int, epoch: int, seq: int, plaintext: bytes
    ) -> bytes:
        seq64 = u16(epoch) + seq.to_bytes(6, "big")
        aad = seq64 + bytes((content_type,)) + u16(version) + u16(len(plaintext))
        sealed = self._aead.encrypt(self._nonce(seq64), plaintext, aad)
        return (seq64 if not self._params.chacha else b"") + sealed

    def decrypt(
        self, content_type: int, version: int, epoch: int, seq: int, fragment: bytes
    ) -> bytes:
        """Authenticate and decrypt; any failure is ``bad_record_mac`` (dropped by the caller)."""
        seq64 = u16(epoch) + seq.to_bytes(6, "big")
        explicit = self._params.explicit_nonce_len
        if len(fragment) < explicit + AEAD_TAG_LEN:
            raise DtlsError(
                "record shorter than AEAD overhead", hint=AlertDescription.bad_record_mac
            )
        if self._params.chacha:
            nonce = self._nonce(seq64)
        else:
            nonce = self._iv + fragment[:explicit]
        ciphertext = fragment[explicit:]
        plain_len = len(ciphertext) - AEAD_TAG_LEN
        aad = seq64 + bytes((content_type,)) + u16(version) + u16(plain_len)
        try:
            return self._aead.decrypt(nonce, ciphertext, aad)
        except InvalidTag:
            raise DtlsError(
                "record authentication failed", hint=AlertDescription.bad_record_mac
            ) from None


@dataclass(frozen=True, slots=True)
class EpochKeys:
    client: RecordCipher
    server: RecordCipher


def derive_epoch_keys(
    suite: CipherSuite, master: bytes, client_random: bytes, server_random: bytes
) -> EpochKeys:
    """RFC 5246 §6.3 key_block = PRF(master, "key expansion", server_random + client_random)."""
    p = SUITES[suite]
    block = prf(
        p.hash_name,
        master,
        b"key expansion",
        server_random + client_random,
        2 * p.key_len + 2 * p.fixed_iv_len,
    )
    k = p.key_len
    i = p.fixed_iv_len
    return EpochKeys(
        client=RecordCipher(p, block[:k], block[2 * k : 2 * k + i]),
        server=RecordCipher(p, block[k : 2 * k], block[2 * k + i : 2 * k + 2 * i]),
    )


# --- ECDHE ----------------------------------------------------------------------------


class KeyShare:
    """An ephemeral ECDHE key for one handshake (RFC 8422 §5.4, RFC 7748 for X25519)."""

    __slots__ = ("group", "_x25519", "_p256")

    def __init__(self, group: NamedGroup) -> None:
        self.group = group
        self._x25519: x25519.X25519PrivateKey | None = None
        self._p256: ec.EllipticCurvePrivateKey | None = None
        if group is NamedGroup.x25519:
            self._x25519 = x25519.X25519PrivateKey.generate()
        else:
            self._p256 = ec.generate_private_key(ec.SECP256R1())

    @property
    def public(self) -> bytes:
        if self._x25519 is not None:
            return self._x25519.public_key().public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw
            )
        assert self._p256 is not None
        return self._p256.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )

    def exchange_untrusted(self, peer_public: bytes) -> bytes:
        """The shared secret; an invalid point is ``illegal_parameter`` (RFC 8422 §5.11)."""
        try:
            if self._x25519 is not None:
                if len(peer_public) != 32:
                    raise ValueError("x25519 share must be 32 bytes")
                shared = self._x25519.exchange(
                    x25519.X25519PublicKey.from_public_bytes(peer_public)
                )
                # RFC 7748 §6.1: an all-zero result means a small-order point; abort.
                if not any(shared):
                    raise ValueError("all-zero x25519 secret")
                return shared
            assert self._p256 is not None
            # Only uncompressed points (RFC 8422 §5.1.2); from_encoded_point validates
            # that the point is on the curve.
            if len(peer_public) != 65 or peer_public[0] != 4:
                raise ValueError("not an uncompressed P-256 point")
            peer = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), peer_public)
            return self._p256.exchange(ec.ECDH(), peer)
        except ValueError as exc:
            raise DtlsError(
                f"bad ECDHE public key: {exc}", hint=AlertDescription.illegal_parameter
            ) from None


# --- signatures -----------------------------------------------------------------------

_SCHEME_HASH: dict[int, hashes.HashAlgorithm] = {
    SignatureScheme.ecdsa_secp256r1_sha256: hashes.SHA256(),
    SignatureScheme.ecdsa_secp384r1_sha384: hashes.SHA384(),
    SignatureScheme.ecdsa_secp521r1_sha512: hashes.SHA512(),
}
SUPPORTED_SIGNATURE_SCHEMES: tuple[int, ...] = tuple(_SCHEME_HASH)


def sign(key: ec.EllipticCurvePrivateKey, data: bytes) -> tuple[int, bytes]:
    """Sign with ecdsa_secp256r1_sha256, the scheme of the certificate we generate."""
    return SignatureScheme.ecdsa_secp256r1_sha256, key.sign(data, ec.ECDSA(hashes.SHA256()))


def verify_untrusted(
    public: ec.EllipticCurvePublicKey, scheme: int, signature: bytes, data: bytes
) -> None:
    """Verify a TLS 1.2 digitally-signed struct; failure is ``decrypt_error`` (RFC 5246 §7.2.2)."""
    h = _SCHEME_HASH.get(scheme)
    if h is None:
        raise DtlsError(
            f"unsupported signature scheme {scheme:#06x}", hint=AlertDescription.illegal_parameter
        )
    try:
        public.verify(signature, data, ec.ECDSA(h))
    except (InvalidSignature, ValueError):
        raise DtlsError("signature does not verify", hint=AlertDescription.decrypt_error) from None
