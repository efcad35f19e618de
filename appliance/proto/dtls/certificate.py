"""The local certificate (self-signed ECDSA P-256) and SDP fingerprints (RFC 8122 §5).

WebRTC authenticates DTLS peers by the certificate fingerprint carried in SDP
(RFC 8827 §6.5, RFC 8842), not by a CA chain, so the certificate is generated at start
and only its hash matters.
"""

from __future__ import annotations

import datetime
import hashlib
import secrets
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import NameOID

from appliance.proto.dtls._wire import AlertDescription
from appliance.proto.errors import LocalProtocolError

# RFC 8122 §5 hash-func names we can compute; the SDP spelling is lower case.
_FINGERPRINT_HASHES = ("sha-1", "sha-224", "sha-256", "sha-384", "sha-512")


def fingerprint_of(der: bytes, algorithm: str = "sha-256") -> str:
    """``"sha-256 AB:CD:…"`` exactly as in an SDP ``a=fingerprint`` line."""
    algorithm = algorithm.lower()
    if algorithm not in _FINGERPRINT_HASHES:
        raise LocalProtocolError(f"unsupported fingerprint hash {algorithm!r}")
    digest = hashlib.new(algorithm.replace("-", ""), der).hexdigest().upper()
    return f"{algorithm} " + ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def normalize_fingerprint(fingerprint: str) -> tuple[str, str]:
    """``("sha-256", "AB:CD:…")`` from any case / spacing a caller or SDP may use."""
    parts = fingerprint.strip().split()
    if len(parts) != 2 or parts[0].lower() not in _FINGERPRINT_HASHES:
        raise LocalProtocolError(f"not an SDP fingerprint: {fingerprint!r}")
    return parts[0].lower(), parts[1].upper()


def fingerprint_matches(der: bytes, expected: Sequence[str]) -> str | None:
    """The first of ``expected`` that matches ``der``, in our canonical spelling, or None."""
    for fp in expected:
        algorithm, value = normalize_fingerprint(fp)
        mine = fingerprint_of(der, algorithm)
        # Constant-time compare: the expected value comes from signaling, but cheap to do.
        if secrets.compare_digest(mine, f"{algorithm} {value}"):
            return mine
    return None


def check_peer_certificate(
    leaf: bytes, expected: Sequence[str] | None
) -> tuple[AlertDescription | None, str | None, ec.EllipticCurvePublicKey | None]:
    """``(alert, fingerprint, public key)`` for the peer's leaf certificate (DER), shared by
    both DTLS versions: the SDP fingerprint decides (RFC 8122 §5, RFC 8827 §6.5), not a CA.
    ``expected=None`` opts out of the check. On an alert the key is None."""
    if expected is not None:
        fingerprint = fingerprint_matches(leaf, expected)
        if fingerprint is None:
            # RFC 8122 §5 / RFC 8842 §5: a fingerprint mismatch ends the association.
            return AlertDescription.bad_certificate, None, None
    else:
        fingerprint = fingerprint_of(leaf)
    try:
        with warnings.catch_warnings():
            # A non-positive serial number makes cryptography warn (and, in a later
            # release, raise ValueError: then bad_certificate below). RFC 5280 §4.1.2.2
            # asks certificate users to handle such serials gracefully, and a WebRTC
            # peer is identified by its certificate's fingerprint, never its serial.
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            key = x509.load_der_x509_certificate(leaf).public_key()
    except UnsupportedAlgorithm:
        # A well-formed certificate whose key is on a curve (or of a type) the backend
        # cannot load, e.g. prime239v3: refuse it with an alert, never let it escape.
        return AlertDescription.unsupported_certificate, fingerprint, None
    except (ValueError, x509.InvalidVersion):
        # InvalidVersion (an X.509 version other than v1/v3) is not a ValueError.
        return AlertDescription.bad_certificate, fingerprint, None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        return AlertDescription.unsupported_certificate, fingerprint, None
    return None, fingerprint, key


@dataclass(frozen=True, slots=True, eq=False)
class Certificate:
    """A certificate and its private key. ``Certificate.generate(now)`` makes a fresh one."""

    der: bytes
    private_key: ec.EllipticCurvePrivateKey

    @classmethod
    def generate(cls, now: float, *, valid_days: int = 30) -> Certificate:
        """Self-signed ECDSA P-256, valid from a day before ``now`` (clock skew) on."""
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, "appliance-" + secrets.token_hex(4))]
        )
        start = datetime.datetime.fromtimestamp(now, tz=datetime.UTC) - datetime.timedelta(days=1)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + datetime.timedelta(days=valid_days + 1))
            .sign(key, hashes.SHA256())
        )
        return cls(cert.public_bytes(serialization.Encoding.DER), key)

    @classmethod
    def from_private_key(cls, der: bytes, private_key: ec.EllipticCurvePrivateKey) -> Certificate:
        """Wrap an existing certificate (tests, or a certificate persisted by the operator)."""
        return cls(der, private_key)

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.der)
