"""Long-term credentials in the TURN REST API form, and the server's stateless nonces.

**TURN REST API credentials** (draft-uberti-behave-turn-rest-00 §2.2, the form coturn's
``use-auth-secret`` and LiveKit use): a service that shares a secret with the TURN server
mints, per session and without talking to the server::

    username   = "<expiry>:<id>"        expiry: Unix time (seconds) after which it is refused
    credential = base64(HMAC-SHA1(secret, username))

and the server recomputes the credential from the username and every secret it holds (so
secrets can be rotated: the first one mints, all of them verify). The credential is then the
long-term *password* of RFC 8489 §9.2 — the MESSAGE-INTEGRITY key is
``MD5(username ":" realm ":" password)`` (or SHA-256 of it, §9.2.2) as for any user.

**Nonces** (RFC 8489 §9.2, RFC 8656 §5): the server keeps no state per challenge. A nonce is::

    ["obMatJos2" + base64(security features)]   nonce cookie (§9.2.1), when PASSWORD-
                                                ALGORITHMS was offered with it
    base64(expiry[4] || HMAC-SHA256(key, ...)[:5])   12 characters

The MAC covers the cookie, the expiry and the client's transport address, so a nonce is
good only from the address it was given to and only until it expires (then 438 Stale Nonce
hands out a new one). It is short on purpose: a 401 has to fit the amplification bound of
a 28-byte Allocate (``server.py``); the 40-bit MAC only has to make a forged *nonce*
useless, and a nonce grants nothing without the credential's MESSAGE-INTEGRITY.

Time is passed in (Unix seconds); nothing here reads a clock.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct
from dataclasses import dataclass

from .errors import TurnError

__all__ = [
    "NONCE_COOKIE",
    "NonceCodec",
    "RestCredential",
    "check_turn_url",
    "derive_turn_secret",
    "ice_server",
    "mint_rest_credential",
    "parse_rest_username_untrusted",
    "parse_turn_secrets",
    "rest_password",
    "turn_urls",
    "whip_link_headers",
]

#: §9.2.1 nonce cookie followed by the 24 Security Feature bits, bit 0 ("Password
#: algorithms") set: base64 of 0x000001 (bit 0 is the rightmost, RFC 8489 erratum 6290).
NONCE_COOKIE = "obMatJos2" + "AAAB"
_NONCE_BODY = 12  # base64 characters of expiry[4] || mac[5]
_MAC = 5
#: A REST username is "<expiry>:<id>"; we accept ids of printable characters, and cap the
#: whole at the USERNAME attribute's 513 bytes (RFC 8489 §14.3) anyway.
MAX_ID = 128


def derive_turn_secret(routing_secret: bytes) -> bytes:
    """The TURN REST API shared secret when none is configured: derived from the routing
    secret, which the relays (they verify) and signaling (it mints) both hold, as 64 hex
    characters — a printable string, so the same secret can be given to coturn or a
    credential tool. Here, not in the relay, so signaling mints without importing it."""
    return hmac.new(routing_secret, b"appliance turn-rest secret v1",
                    hashlib.sha256).hexdigest().encode()


def parse_turn_secrets(data: bytes) -> tuple[bytes, ...]:
    """A TURN secret file's contents: one shared secret per non-empty line, taken as text
    (coturn's ``static-auth-secret`` form: the HMAC key is the line's bytes); ``#`` starts a
    comment. The first mints, all verify. ValueError when it holds none."""
    lines = [line.strip() for line in data.splitlines()]
    out = tuple(line for line in lines if line and not line.startswith(b"#"))
    if not out:
        raise ValueError("holds no secret")
    return out


def rest_password(secret: bytes, username: str) -> str:
    """The credential of ``username`` under ``secret``: base64(HMAC-SHA1(secret, username))."""
    return base64.b64encode(hmac.new(secret, username.encode(), hashlib.sha1).digest()).decode()


@dataclass(frozen=True, slots=True)
class RestCredential:
    """One minted credential, as an RTCIceServer wants it."""

    username: str
    password: str
    expiry: int

    def __repr__(self) -> str:  # never print the password
        return f"RestCredential(username={self.username!r}, expiry={self.expiry})"


def mint_rest_credential(secret: bytes, ident: str, expiry: int) -> RestCredential:
    """A credential for ``ident`` valid until Unix time ``expiry``."""
    if not ident or len(ident) > MAX_ID or not ident.isprintable() or ":" in ident:
        raise ValueError("a REST credential id is 1-128 printable characters without ':'")
    username = f"{int(expiry)}:{ident}"
    return RestCredential(username, rest_password(secret, username), int(expiry))


def ice_server(cred: RestCredential, urls: list[str]) -> dict[str, object]:
    """One RTCIceServer (W3C webrtc-pc §4.2.1) for ``urls``: what a browser passes to
    ``new RTCPeerConnection({iceServers: [...]})`` as it is."""
    return {"urls": list(urls), "username": cred.username, "credential": cred.password}


def turn_urls(host: str, port: int, *, udp: bool = True, tcp: bool = True,
              tls_port: int | None = None, tcp_port: int | None = None) -> list[str]:
    """The ``turn:``/``turns:`` URLs (RFC 7065) of a server on ``host``: UDP on ``port``
    (the one actually listened on, or a proxy's), TCP on ``tcp_port`` (default ``port``:
    the media port's TCP listener has its number), TLS on ``tls_port`` when given. An IPv6
    literal is bracketed."""
    h = f"[{host}]" if ":" in host and not host.startswith("[") else host
    urls = []
    if udp:
        urls.append(f"turn:{h}:{port}?transport=udp")
    if tcp:
        urls.append(f"turn:{h}:{port if tcp_port is None else tcp_port}?transport=tcp")
    if tls_port is not None:
        urls.append(f"turns:{h}:{tls_port}?transport=tcp")
    return urls


def check_turn_url(url: str) -> str:
    """An operator's TURN URL (``--turn-url``, e.g. a proxy's ``turns:turn.example.com:443
    ?transport=tcp``), checked just enough to be safe in an RTCIceServer and inside the
    ``<…>`` of a WHIP Link header (RFC 7065 schemes, printable ASCII, no space, quote or
    angle bracket). ValueError otherwise."""
    if not url.startswith(("turn:", "turns:")) or len(url) > 512:
        raise ValueError(f"{url!r} is not a turn: or turns: URL (RFC 7065)")
    if not url.isascii() or not url.isprintable() or any(c in url for c in ' "<>\\,'):
        raise ValueError(f"{url!r}: a TURN URL has no space, quote, comma or angle bracket")
    host = url.split(":", 1)[1].split("?", 1)[0]
    if not host or host.startswith("//"):
        raise ValueError(f"{url!r}: expected turn:HOST[:PORT][?transport=udp|tcp]")
    return url


def whip_link_headers(cred: RestCredential, urls: list[str]) -> list[str]:
    """The WHIP ``Link`` header values (RFC 9725 §4.6), one per URL: ``<url>;
    rel="ice-server"; username="..."; credential="..."; credential-type="password"``.
    Usernames are ``expiry:id`` of printable characters without ``"``; the credential is base64."""
    if '"' in cred.username or "\\" in cred.username:
        raise ValueError("a username for a Link header carries no quote or backslash")
    return [
        f'<{url}>; rel="ice-server"; username="{cred.username}"; '
        f'credential="{cred.password}"; credential-type="password"'
        for url in urls
    ]


def parse_rest_username_untrusted(username: str) -> tuple[int, str]:
    """``(expiry, id)`` of a REST username ``"<expiry>:<id>"`` (a bare ``"<expiry>"`` has the
    id ``""``, as coturn accepts it). Raises only :class:`TurnError` (``bad-username``)."""
    expiry_text, _, ident = username.partition(":")
    if not expiry_text.isascii() or not expiry_text.isdigit() or len(expiry_text) > 12:
        raise TurnError("REST username does not start with an expiry", hint="bad-username")
    if len(ident) > MAX_ID:
        raise TurnError("REST username id too long", hint="bad-username")
    return int(expiry_text), ident


class NonceCodec:
    """Mints and checks the stateless nonces of the module docstring."""

    __slots__ = ("_key", "lifetime")

    def __init__(self, key: bytes, lifetime: float) -> None:
        if lifetime <= 0:
            raise ValueError("nonce lifetime must be > 0")
        self._key = key
        self.lifetime = lifetime

    def _mac(self, cookie: bool, expiry: int, client: tuple[str, int]) -> bytes:
        msg = b"%d|%d|%s|%d" % (cookie, expiry, client[0].encode(), client[1])
        return hmac.new(self._key, msg, hashlib.sha256).digest()[:_MAC]

    def mint(self, unix: float, client: tuple[str, int], *, cookie: bool) -> str:
        """A nonce for ``client``, good for ``lifetime`` seconds from ``unix``; with the
        cookie when the answer offers PASSWORD-ALGORITHMS."""
        expiry = int(unix + self.lifetime) & 0xFFFFFFFF
        body = base64.b64encode(struct.pack("!I", expiry) + self._mac(cookie, expiry, client))
        return (NONCE_COOKIE if cookie else "") + body.decode()

    def check(self, nonce: str, unix: float, client: tuple[str, int]) -> tuple[str, bool]:
        """``(verdict, cookie)``: verdict ``"ok"``, ``"stale"`` (ours, expired) or ``"bad"``
        (not ours, or another client's); ``cookie`` whether it carries the nonce cookie
        (the client must then follow the PASSWORD-ALGORITHMS rules, RFC 8489 §9.2.4)."""
        cookie = nonce.startswith(NONCE_COOKIE)
        body = nonce[len(NONCE_COOKIE) :] if cookie else nonce
        if len(body) != _NONCE_BODY or not body.isascii():
            return "bad", cookie
        try:
            raw = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            return "bad", cookie
        expiry = int(struct.unpack_from("!I", raw)[0])
        if not hmac.compare_digest(raw[4:], self._mac(cookie, expiry, client)):
            return "bad", cookie
        if expiry <= int(unix):
            return "stale", cookie
        return "ok", cookie
