"""The server ICE ufrag as a signed routing hint (DESIGN.md "Server ufrag").

The ufrag is minted at signaling time by the transceiver that will own the session, and it is
the only thing a relay reads to route the first packet of a flow. It carries::

     0        1        2        3        4        5        6  ...  11  12  ...  20   (bytes)
    +--------+-----------------+-----------------+------- ... ------+----- ... -----+
    |version |   cluster id    | transceiver id  |   nonce (7 B)    | MAC (9 B)     |
    +--------+-----------------+-----------------+------- ... ------+----- ... -----+

21 bytes, encoded with the standard base64 alphabet (``A-Za-z0-9+/`` are exactly the ICE
characters of RFC 8445 §5.3, and 21 bytes need no ``=`` padding): **28 ICE characters**,
inside the 4..32 that DESIGN.md allows (RFC 8445 needs ≥ 4 characters, ≥ 24 bits of
randomness: the nonce has 56).

The MAC is HMAC-SHA256(routing secret, "appliance-ufrag\\0" || the first 12 bytes), truncated
to 72 bits. An off-path attacker who wants to make a relay forward a packet must guess it:
2^-72 per try, and every failed try is dropped and counted. Verification uses
``hmac.compare_digest`` (constant time). Several secrets may be configured so the secret can
be rotated: minting uses the first, verification accepts any.

Deliberately omitted: expiry inside the ufrag. Sessions end by ICE consent (RFC 7675), and a
relay holds flows only while they are live, so a replayed old ufrag routes to a transceiver
that no longer knows it and drops it there.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import RemoteProtocolError

VERSION = 1
RAW_LEN = 21
TEXT_LEN = 28
NONCE_LEN = 7
MAC_LEN = 9
MAX_CLUSTER = 0xFFFF
MAX_TRANSCEIVER = 0xFFFF
_BODY = struct.Struct("!BHH")
_LABEL = b"appliance-ufrag\x00"
_ICE_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")


class UfragError(RemoteProtocolError):
    """A ufrag that does not route. ``hint`` is the drop reason used by counters:
    ``malformed``, ``version``, ``bad-mac``."""


@dataclass(frozen=True, slots=True)
class RoutingHint:
    version: int
    cluster: int
    transceiver: int
    nonce: bytes


def _mac(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, _LABEL + body, hashlib.sha256).digest()[:MAC_LEN]


class UfragCodec:
    """Mints and verifies routing-hint ufrags with one or more routing secrets."""

    __slots__ = ("_keys",)

    def __init__(self, secrets: bytes | Sequence[bytes]) -> None:
        keys = [secrets] if isinstance(secrets, bytes | bytearray) else list(secrets)
        if not keys or any(len(k) < 16 for k in keys):
            raise ValueError("routing secrets must be at least 16 bytes")
        self._keys: tuple[bytes, ...] = tuple(bytes(k) for k in keys)

    def mint(self, *, cluster: int, transceiver: int, nonce: bytes | None = None) -> str:
        """A fresh server ufrag for a session owned by ``transceiver`` in ``cluster``."""
        if not 0 <= cluster <= MAX_CLUSTER:
            raise ValueError(f"cluster must be 0..{MAX_CLUSTER}")
        if not 0 <= transceiver <= MAX_TRANSCEIVER:
            raise ValueError(f"transceiver must be 0..{MAX_TRANSCEIVER}")
        if nonce is None:
            nonce = os.urandom(NONCE_LEN)
        if len(nonce) != NONCE_LEN:
            raise ValueError(f"nonce must be {NONCE_LEN} bytes")
        body = _BODY.pack(VERSION, cluster, transceiver) + nonce
        return binascii.b2a_base64(body + _mac(self._keys[0], body), newline=False).decode()

    def decode_untrusted(self, ufrag: str | bytes | bytearray | memoryview) -> RoutingHint:
        """Verify and decode a server ufrag (the part of USERNAME before the colon).

        Raises only :class:`UfragError`, with the drop reason as ``hint``.
        """
        if isinstance(ufrag, str):
            try:
                text = ufrag.encode("ascii")
            except UnicodeEncodeError:
                raise UfragError("ufrag is not ASCII", hint="malformed") from None
        else:
            text = bytes(ufrag)
        if len(text) != TEXT_LEN or not _ICE_CHARS.issuperset(text):
            raise UfragError(
                f"ufrag must be {TEXT_LEN} ICE characters, got {len(text)}", hint="malformed"
            )
        try:
            raw = binascii.a2b_base64(text, strict_mode=True)
        except binascii.Error:
            raise UfragError("ufrag is not valid base64", hint="malformed") from None
        body, mac = raw[:-MAC_LEN], raw[-MAC_LEN:]
        version, cluster, transceiver = _BODY.unpack_from(body)
        if version != VERSION:
            raise UfragError(f"unknown ufrag format version {version}", hint="version")
        # Check every key, without an early exit, so timing says nothing about which matched.
        ok = False
        for key in self._keys:
            ok |= hmac.compare_digest(_mac(key, body), mac)
        if not ok:
            raise UfragError("ufrag MAC does not verify", hint="bad-mac")
        return RoutingHint(version, cluster, transceiver, body[_BODY.size :])


def load_secrets(text: bytes) -> list[bytes]:
    """Parse a secret file: one secret per non-empty line (hex or raw text), first mints."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(b"#"):
            continue
        try:
            out.append(bytes.fromhex(line.decode("ascii")))
        except (ValueError, UnicodeDecodeError):
            out.append(line)
    if not out:
        raise ValueError("secret file holds no secret")
    return out
