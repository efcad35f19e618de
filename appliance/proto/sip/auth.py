"""Digest authentication for our outbound requests (RFC 3261 §22, RFC 2617 §3, RFC 8760).

We are only ever the *client*: a trunk answers our INVITE with 401 (WWW-Authenticate) or
407 (Proxy-Authenticate); we answer the challenge once with ``Authorization`` /
``Proxy-Authorization``. Algorithms: ``MD5`` (RFC 2617) and ``SHA-256`` (RFC 8760 §2.6,
the RFC 7616 construction), with their ``-sess`` variants; ``qop=auth`` when offered (RFC
2617 §3.2.2), else the RFC 2069 compatible form. ``qop=auth-int`` is not offered by any
trunk we know and is refused (the challenge is treated as unanswerable). SHA-512-256 is
left out (RFC 8760 lists it; no trunk sends it).

:class:`Credentials` never shows its password in ``repr``/``str`` (issue 28 item 5: "never
logged").
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field

from appliance.proto.sip.errors import SipError
from appliance.proto.sip.message import split_list

_HASHES = {"md5": hashlib.md5, "sha-256": hashlib.sha256}


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    realm: str | None = None  # None: answer any realm

    def __str__(self) -> str:
        return f"Credentials({self.username!r}, password=***)"


@dataclass(frozen=True, slots=True)
class Challenge:
    realm: str
    nonce: str
    algorithm: str = "MD5"
    qop: tuple[str, ...] = ()
    opaque: str | None = None
    stale: bool = False


def _auth_params(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in split_list(text):
        k, sep, v = item.partition("=")
        if not sep:
            raise SipError("Bad auth parameter")
        v = v.strip()
        if len(v) >= 2 and v[0] == '"' and v[-1] == '"':
            v = v[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        out[k.strip().lower()] = v
    return out


def parse_challenge_untrusted(value: str) -> Challenge:
    """A ``WWW-Authenticate`` / ``Proxy-Authenticate`` value (RFC 2617 §3.2.1)."""
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() != "digest":
        raise SipError("Unsupported auth scheme")
    p = _auth_params(rest)
    if "realm" not in p or "nonce" not in p:
        raise SipError("Digest challenge without realm or nonce")
    qop = tuple(q.strip().lower() for q in p.get("qop", "").split(",") if q.strip())
    return Challenge(p["realm"], p["nonce"], p.get("algorithm", "MD5"), qop, p.get("opaque"),
                     p.get("stale", "").lower() == "true")


def _h(algorithm: str, text: str) -> str:
    return _HASHES[algorithm](text.encode("utf-8")).hexdigest()


def digest_response(algorithm: str, username: str, realm: str, password: str, nonce: str,
                    method: str, uri: str, *, qop: str | None = None, nc: str = "00000001",
                    cnonce: str = "") -> str:
    """The ``response`` value (RFC 2617 §3.2.2.1; RFC 7616 §3.4.1 for SHA-256)."""
    alg = algorithm.lower()
    sess = alg.endswith("-sess")
    base = alg[:-5] if sess else alg
    if base not in _HASHES:
        raise SipError("Unsupported digest algorithm")
    ha1 = _h(base, f"{username}:{realm}:{password}")
    if sess:
        ha1 = _h(base, f"{ha1}:{nonce}:{cnonce}")
    ha2 = _h(base, f"{method}:{uri}")
    if qop:
        return _h(base, f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")
    return _h(base, f"{ha1}:{nonce}:{ha2}")


def usable(challenge: Challenge) -> bool:
    alg = challenge.algorithm.lower()
    base = alg[:-5] if alg.endswith("-sess") else alg
    return base in _HASHES and (not challenge.qop or "auth" in challenge.qop)


def authorization(challenge: Challenge, creds: Credentials, method: str, uri: str,
                  *, cnonce: str | None = None, nc: int = 1) -> str:
    """The ``Authorization`` / ``Proxy-Authorization`` value answering ``challenge``."""
    qop = "auth" if "auth" in challenge.qop else None
    cn = cnonce if cnonce is not None else secrets.token_hex(8)
    ncs = f"{nc:08x}"
    resp = digest_response(challenge.algorithm, creds.username, challenge.realm,
                           creds.password, challenge.nonce, method, uri, qop=qop, nc=ncs,
                           cnonce=cn)
    parts = [f'username="{creds.username}"', f'realm="{challenge.realm}"',
             f'nonce="{challenge.nonce}"', f'uri="{uri}"', f'response="{resp}"',
             f"algorithm={challenge.algorithm}"]
    if qop:
        parts += [f"qop={qop}", f"nc={ncs}", f'cnonce="{cn}"']
    if challenge.opaque is not None:
        parts.append(f'opaque="{challenge.opaque}"')
    return "Digest " + ", ".join(parts)
