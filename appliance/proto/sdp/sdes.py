"""SDES key exchange for SRTP: the ``a=crypto`` attribute (RFC 4568), as SIP trunks send it.

Grammar (RFC 4568 §9.1, the SRTP key-info of §6.1), what :meth:`CryptoAttribute.parse_untrusted`
reads — the attribute *value*, after ``a=crypto:``::

    crypto-attribute = tag 1*WSP crypto-suite 1*WSP key-params *(1*WSP session-param)
    tag              = 1*9DIGIT
    key-params       = key-param *(";" key-param)
    key-param        = "inline:" key-salt ["|" lifetime] ["|" mki]
    key-salt         = base64(master key || master salt)
    lifetime         = ["2^"] 1*DIGIT           (packets under this key)
    mki              = mki-value ":" mki-length  (decimal value, length 1..128 bytes)

    e.g.  1 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz|2^20|1:4

Suites and their key material (RFC 4568 §6.2; RFC 7714 §14.2 for the AEAD suites):

=========================  ======  =======  ============  =====================
suite                      key     salt     auth tag      SRTP profile (RFC 5764)
=========================  ======  =======  ============  =====================
AES_CM_128_HMAC_SHA1_80    16      14       80-bit HMAC   AES128_CM_HMAC_SHA1_80
AES_CM_128_HMAC_SHA1_32    16      14       32-bit HMAC   AES128_CM_HMAC_SHA1_32
AEAD_AES_128_GCM           16      12       16-byte GCM   AEAD_AES_128_GCM
AEAD_AES_256_GCM           32      12       16-byte GCM   AEAD_AES_256_GCM
=========================  ======  =======  ============  =====================

The suite -> pylibsrtp profile mapping lives with the leg (``transceiver/rtp_leg.py``):
this package never imports SRTP (STYLE.md rule 8, ``tests/proto/sdp/test_layering.py``).

Session parameters (§6.3) are kept as raw tokens; :func:`choose_crypto` accepts an offer
only when we can honour all of them (``WSH`` is a hint and harmless; ``KDR``,
``UNENCRYPTED_*``, ``UNAUTHENTICATED_SRTP``, ``FEC_*`` change the cryptographic transform
and are refused). Several keys in one attribute (``key-params`` with ``;``) and MKIs parse,
but are refused by :func:`choose_crypto`: libsrtp's MKI support is not exposed by pylibsrtp
and a trunk that offers MKI also offers a line without (RFC 4568 §5.1: one line per choice).
Deliberately omitted: key methods other than ``inline`` (there are none registered for
SRTP), the §6.4 rules for re-keying on lifetime expiry (a phone call does not send 2^31
packets; a lifetime below what a call needs is refused instead).

Key material never appears in ``repr``/``str``: both print the suite, tag and sizes only.
The wire text is :meth:`CryptoAttribute.build` — a deliberate call, never an f-string slip.
Randomness is passed in (:func:`generate_crypto`): this module has no clock and no RNG.
"""

from __future__ import annotations

import base64
import binascii
import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from appliance.proto.errors import LocalProtocolError
from appliance.proto.sdp.errors import SdpError

#: A value longer than this is not an ``a=crypto`` we would accept (the longest suite's
#: key-salt is 60 base64 characters; a few session parameters fit easily).
MAX_VALUE: Final = 1024
#: More than this many ``;``-separated keys in one line is not a real offer.
MAX_KEYS: Final = 16
#: A key lifetime must cover a long call: 2^31 packets is RFC 3711's own maximum for SRTP.
MIN_LIFETIME: Final = 1 << 20  # ~5.8 hours of 20 ms packets
MAX_TAG: Final = 999_999_999

_TAG_RE: Final = re.compile(r"[0-9]{1,9}")
_SUITE_RE: Final = re.compile(r"[A-Za-z0-9_]{1,64}")
_B64_RE: Final = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_LIFETIME_RE: Final = re.compile(r"(2\^)?([0-9]{1,20})")
_MKI_RE: Final = re.compile(r"([0-9]{1,40}):([0-9]{1,3})")
_PARAM_RE: Final = re.compile(r"[\x21-\x7e]{1,256}")  # visible characters, RFC 4568 §9.1
#: Session parameters we can honour: WSH (§6.3.7) is a window-size *hint* (ours is 1024).
HARMLESS_PARAMS: Final = frozenset({"WSH"})


class CryptoSuite(enum.Enum):
    """SRTP crypto suites we can key (RFC 4568 §6.2, RFC 7714 §14.2)."""

    AES_CM_128_HMAC_SHA1_80 = "AES_CM_128_HMAC_SHA1_80"
    AES_CM_128_HMAC_SHA1_32 = "AES_CM_128_HMAC_SHA1_32"
    AEAD_AES_128_GCM = "AEAD_AES_128_GCM"
    AEAD_AES_256_GCM = "AEAD_AES_256_GCM"

    @property
    def key_length(self) -> int:
        return 32 if self is CryptoSuite.AEAD_AES_256_GCM else 16

    @property
    def salt_length(self) -> int:
        """112-bit salt for AES-CM (RFC 3711 §8.2), 96-bit for GCM (RFC 7714 §8.1)."""
        return 12 if self.value.startswith("AEAD") else 14

    @property
    def material_length(self) -> int:
        return self.key_length + self.salt_length


#: Our preference when answering, best first: GCM authenticates with the cipher in one
#: pass and is what RFC 7714 recommends; the 80-bit tag is the universal fallback.
DEFAULT_SUITES: Final[tuple[CryptoSuite, ...]] = (
    CryptoSuite.AEAD_AES_128_GCM,
    CryptoSuite.AEAD_AES_256_GCM,
    CryptoSuite.AES_CM_128_HMAC_SHA1_80,
    CryptoSuite.AES_CM_128_HMAC_SHA1_32,
)


@dataclass(frozen=True, slots=True, repr=False)
class KeyParam:
    """One ``inline:`` key: master key || salt, and the optional lifetime and MKI."""

    material: bytes  # master key || master salt, raw
    lifetime: int | None = None  # packets; None: the suite's default (2^48 SRTP, §6.2)
    mki: tuple[int, int] | None = None  # (value, length in bytes)
    lifetime_power: bool = True  # written as 2^n (only when lifetime is a power of two)

    def __repr__(self) -> str:
        return (f"KeyParam(material=<{len(self.material)} bytes>, lifetime={self.lifetime}, "
                f"mki={'set' if self.mki else None})")

    __str__ = __repr__

    def build(self) -> str:
        out = "inline:" + base64.b64encode(self.material).decode("ascii")
        if self.lifetime is not None:
            n = self.lifetime
            if self.lifetime_power and n > 0 and n & (n - 1) == 0:
                out += f"|2^{n.bit_length() - 1}"
            else:
                out += f"|{n}"
        if self.mki is not None:
            out += f"|{self.mki[0]}:{self.mki[1]}"
        return out


@dataclass(frozen=True, slots=True, repr=False)
class CryptoAttribute:
    """One ``a=crypto`` line. ``suite`` is the raw token (an offer may name suites we do
    not know; :attr:`known_suite` maps it); ``session_params`` are raw tokens."""

    tag: int
    suite: str
    keys: tuple[KeyParam, ...]
    session_params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Caller-built attributes: refuse what cannot be written back as valid RFC 4568.
        if not 0 <= self.tag <= MAX_TAG:
            raise LocalProtocolError("crypto tag must be 0..999999999")
        if not _SUITE_RE.fullmatch(self.suite) or not self.keys:
            raise LocalProtocolError("crypto suite token or keys invalid")

    def __repr__(self) -> str:
        sizes = ",".join(str(len(k.material)) for k in self.keys)
        return (f"CryptoAttribute(tag={self.tag}, suite={self.suite}, keys=<{sizes} bytes>, "
                f"session_params={self.session_params!r})")

    __str__ = __repr__

    @property
    def known_suite(self) -> CryptoSuite | None:
        try:
            return CryptoSuite(self.suite)
        except ValueError:
            return None

    @property
    def material(self) -> bytes:
        """The first key's master key || salt (the only one :func:`choose_crypto` allows)."""
        return self.keys[0].material

    def master_key(self) -> bytes:
        suite = self._suite()
        return self.material[: suite.key_length]

    def master_salt(self) -> bytes:
        suite = self._suite()
        return self.material[suite.key_length : suite.material_length]

    def _suite(self) -> CryptoSuite:
        suite = self.known_suite
        if suite is None:
            raise LocalProtocolError(f"unknown crypto suite {self.suite!r}")
        return suite

    def build(self) -> str:
        """The attribute value (after ``a=crypto:``). Contains the key: send it, never log it."""
        parts = [str(self.tag), self.suite, ";".join(k.build() for k in self.keys)]
        parts.extend(self.session_params)
        return " ".join(parts)

    def line(self) -> str:
        """The whole SDP line, ``a=crypto:...`` (without CRLF). Contains the key."""
        return "a=crypto:" + self.build()

    @classmethod
    def parse_untrusted(cls, value: str | bytes) -> CryptoAttribute:
        """Parse an ``a=crypto`` value (the part after ``a=crypto:``; a leading
        ``a=crypto:`` is tolerated). Raises only :class:`SdpError` (code ``malformed``)."""
        if isinstance(value, bytes | bytearray):
            try:
                value = bytes(value).decode("ascii")
            except UnicodeDecodeError:
                raise _bad("a=crypto is not ASCII") from None
        if len(value) > MAX_VALUE:
            raise _bad(f"a=crypto longer than {MAX_VALUE} characters")
        if value.startswith("a=crypto:"):
            value = value[len("a=crypto:") :]
        fields = value.strip(" \t\r\n").split()
        if len(fields) < 3:
            raise _bad("a=crypto needs a tag, a suite and key parameters")
        tag_text, suite, key_text, *params = fields
        if not _TAG_RE.fullmatch(tag_text):
            raise _bad("a=crypto tag is not 1-9 digits")
        if not _SUITE_RE.fullmatch(suite):
            raise _bad("a=crypto suite is not a token")
        key_texts = key_text.split(";")
        if len(key_texts) > MAX_KEYS:
            raise _bad(f"a=crypto has more than {MAX_KEYS} keys")
        known = _known(suite)
        keys = tuple(_parse_key_param(t, known) for t in key_texts)
        for p in params:
            if not _PARAM_RE.fullmatch(p):
                raise _bad("a=crypto session parameter has invalid characters")
        return cls(int(tag_text), suite, keys, tuple(params))


def _bad(detail: str) -> SdpError:
    return SdpError("malformed", detail)


def _known(suite: str) -> CryptoSuite | None:
    try:
        return CryptoSuite(suite)
    except ValueError:
        return None


def _parse_key_param(text: str, suite: CryptoSuite | None) -> KeyParam:
    method, sep, info = text.partition(":")
    if not sep or method.lower() != "inline":
        raise _bad("a=crypto key method is not inline:")
    salt_text, *rest = info.split("|")
    if len(rest) > 2:
        raise _bad("a=crypto key has more than a lifetime and an MKI")
    if not _B64_RE.fullmatch(salt_text) or len(salt_text) % 4 not in (0, 2, 3):
        raise _bad("a=crypto key-salt is not base64")
    try:
        # RFC 4568 §6.1 writes the key-salt with padding; some trunks drop it (pad back).
        material = base64.b64decode(salt_text + "=" * (-len(salt_text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise _bad("a=crypto key-salt is not base64") from None
    if suite is not None and len(material) != suite.material_length:
        raise _bad(f"a=crypto {suite.value} needs {suite.material_length} key+salt bytes, "
                   f"has {len(material)}")
    lifetime: int | None = None
    power = True
    mki: tuple[int, int] | None = None
    for i, item in enumerate(rest):
        # Lifetime and MKI are told apart by the ':' only an MKI has (§9.1).
        m = _MKI_RE.fullmatch(item)
        if m is not None:
            if mki is not None:
                raise _bad("a=crypto key has two MKIs")
            length = int(m.group(2))
            if not 1 <= length <= 128:
                raise _bad("a=crypto MKI length must be 1..128")
            value = int(m.group(1))
            if value >= 1 << (8 * length):
                raise _bad("a=crypto MKI value does not fit its length")
            mki = (value, length)
            continue
        m = _LIFETIME_RE.fullmatch(item)
        if m is None or i != 0:  # the lifetime, when present, comes first
            raise _bad("a=crypto lifetime is not [2^]digits")
        if m.group(1):
            exp = int(m.group(2))
            if exp > 64:
                raise _bad("a=crypto lifetime exponent above 64")
            lifetime = 1 << exp
        else:
            lifetime = int(m.group(2))
            power = False
        if lifetime == 0:
            raise _bad("a=crypto lifetime is zero")
    return KeyParam(material, lifetime, mki, power)


def generate_crypto(tag: int, suite: CryptoSuite, random_bytes: bytes) -> CryptoAttribute:
    """Our own ``a=crypto`` for ``suite``, keyed by ``random_bytes`` (exactly
    ``suite.material_length`` bytes from a CSPRNG: the caller's ``secrets.token_bytes``)."""
    if len(random_bytes) != suite.material_length:
        raise LocalProtocolError(
            f"{suite.value} needs {suite.material_length} random bytes, got {len(random_bytes)}")
    return CryptoAttribute(tag, suite.value, (KeyParam(bytes(random_bytes)),))


def usable(attr: CryptoAttribute, suites: Iterable[CryptoSuite] = DEFAULT_SUITES) -> bool:
    """Whether we can key SRTP from this offered line: a suite in ``suites``, one key
    without MKI, a lifetime of at least :data:`MIN_LIFETIME`, only harmless session
    parameters (see the module docstring)."""
    suite = attr.known_suite
    if suite is None or suite not in tuple(suites) or len(attr.keys) != 1:
        return False
    key = attr.keys[0]
    if key.mki is not None or (key.lifetime is not None and key.lifetime < MIN_LIFETIME):
        return False
    return all(p.split("=", 1)[0].upper() in HARMLESS_PARAMS for p in attr.session_params)


def choose_crypto(offered: Iterable[CryptoAttribute],
                  suites: Iterable[CryptoSuite] = DEFAULT_SUITES) -> CryptoAttribute | None:
    """The offered line to answer (RFC 4568 §7.1.2): our most preferred suite among the
    usable lines, the offerer's order breaking ties; None when none is usable (SIP: 488)."""
    order = tuple(suites)
    candidates = [a for a in offered if usable(a, order)]
    if not candidates:
        return None
    return min(candidates, key=lambda a: order.index(a._suite()))


def answer_crypto(chosen: CryptoAttribute, random_bytes: bytes) -> CryptoAttribute:
    """Our answer to ``chosen``: same tag and suite (RFC 4568 §7.1.2), our own key."""
    return generate_crypto(chosen.tag, chosen._suite(), random_bytes)
