"""HTTPS material: a self-signed certificate for ``--tls self-signed``.

Browsers give the microphone only to secure contexts, so off localhost the demo page needs
HTTPS. The certificate (ECDSA P-256, 1 year, SANs for localhost, the loopback addresses, the
host name and every advertised address) is kept in the state directory and reused while it is
valid and covers the same names, so a browser exception granted once keeps working.
Its SHA-256 fingerprint is printed so users can check what their browser shows.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CERT_NAME = "signaling-cert.pem"
KEY_NAME = "signaling-key.pem"


def fingerprint(cert_pem: bytes) -> str:
    """``AB:CD:…`` SHA-256 of the DER certificate (what browsers display)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def _names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    dns: list[str] = ["localhost"]
    ips: list[str] = ["127.0.0.1", "::1"]
    try:
        hn = socket.gethostname()
        if hn:
            dns.append(hn)
    except OSError:
        pass
    for h in hosts:
        h = h.strip("[]")
        if not h or h in ("0.0.0.0", "::"):
            continue
        try:
            ipaddress.ip_address(h)
        except ValueError:
            dns.append(h)
        else:
            ips.append(h)
    out: list[x509.GeneralName] = [x509.DNSName(d) for d in dict.fromkeys(dns)]
    out += [x509.IPAddress(ipaddress.ip_address(i)) for i in dict.fromkeys(ips)]
    return out


def _covers(cert: x509.Certificate, names: list[x509.GeneralName], now: datetime.datetime) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have = set(san)
    return all(n in have for n in names) and cert.not_valid_after_utc > now + datetime.timedelta(days=7)


def ensure_self_signed(directory: str | Path, hosts: Iterable[str] = ()) -> tuple[str, str, str]:
    """Create (or reuse) a self-signed certificate; returns (cert path, key path, SHA-256)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert_path, key_path = d / CERT_NAME, d / KEY_NAME
    names = _names(hosts)
    now = datetime.datetime.now(datetime.UTC)
    if cert_path.exists() and key_path.exists():
        try:
            pem = cert_path.read_bytes()
            if _covers(x509.load_pem_x509_certificate(pem), names, now):
                return str(cert_path), str(key_path), fingerprint(pem)
        except ValueError:
            pass  # unreadable: make a new one
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "appliance (self-signed)")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_pem)
    os.chmod(key_path, 0o600)
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_path.write_bytes(cert_pem)
    return str(cert_path), str(key_path), fingerprint(cert_pem)
