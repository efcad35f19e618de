"""API tokens and short-lived client tokens.

Two kinds of bearer token are accepted by the HTTP API when it is bound to a non-loopback
address (DESIGN.md "Auth"):

* the **API token**: a long-lived secret, configured or generated at start. It grants
  everything (list, metrics, events, minting client tokens, sessions).
* **client tokens**, minted by ``POST /v1/client_tokens`` for browsers, the way hosted realtime
  APIs hand ephemeral keys to web pages. A client token is self-contained and signed, so
  signaling keeps no table of them::

      ct1.<base64url(JSON claims)>.<base64url(HMAC-SHA256(key, "ct1." + claims)[:16])>

  Claims: ``exp`` (Unix seconds), ``jti`` (random id), ``scope`` (list of strings; today
  only ``"sessions"``: create, patch and delete sessions), and ``agent`` when the minter
  (a full-rights caller) chose the agent its sessions get (the demo page's agent picker on
  a deployment that needs tokens); a token without one gets the deployment's agent. A session created with a client
  token remembers the token's ``jti``, and only that token (or the API token) may patch or
  delete it, so a leaked browser token cannot tear down other callers' sessions.

The signing key is random per signaling process unless one is configured: restarting
signaling invalidates outstanding client tokens, which are short-lived anyway.
Time is an input (``now``), so tests drive expiry with a fake clock.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass

PREFIX = "ct1."
SCOPE_SESSIONS = "sessions"
KNOWN_SCOPES = frozenset({SCOPE_SESSIONS})
_MAC_LEN = 16
MAX_TOKEN_LEN = 2048  # a header longer than this is not one of ours; refuse before decoding


class TokenError(Exception):
    """A client token that does not verify. ``reason`` is a short machine code."""

    def __init__(self, detail: str, reason: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ClientClaims:
    jti: str
    exp: float
    scope: tuple[str, ...]
    agent: str | None = None  # chosen by the minter; None: the deployment's


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")


def _unb64(text: str) -> bytes:
    if not _B64URL.match(text) or len(text) % 4 == 1:
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ClientTokens:
    """Mints and verifies client tokens with one HMAC key."""

    def __init__(self, key: bytes | None = None, *, prefix: str = PREFIX) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)
        # The prefix is inside the MAC, so tokens of one prefix never verify as another's
        # (the Realtime ``ek_`` client secrets, appliance/signaling/realtime_http.py, use "ek_").
        self._prefix = prefix

    def with_prefix(self, prefix: str) -> ClientTokens:
        """The same key minting and verifying tokens that start with ``prefix``."""
        return ClientTokens(self._key, prefix=prefix)

    def _mac(self, signed: bytes) -> bytes:
        return hmac.new(self._key, signed, hashlib.sha256).digest()[:_MAC_LEN]

    def mint(self, *, now: float, ttl: float, scope: tuple[str, ...] = (SCOPE_SESSIONS,),
             agent: str | None = None) -> tuple[str, ClientClaims]:
        claims = ClientClaims(jti=secrets.token_urlsafe(9), exp=round(now + ttl, 3), scope=scope,
                              agent=agent)
        fields: dict[str, object] = {"exp": claims.exp, "jti": claims.jti, "scope": list(scope)}
        if agent is not None:
            fields["agent"] = agent
        body = json.dumps(fields, separators=(",", ":")).encode()
        signed = (self._prefix + _b64(body)).encode("ascii")
        return f"{signed.decode()}.{_b64(self._mac(signed))}", claims

    def verify_untrusted(self, token: str, *, now: float) -> ClientClaims:
        """Check format, MAC (constant time) and expiry; raises only :class:`TokenError`."""
        prefix = self._prefix
        if len(token) > MAX_TOKEN_LEN or not token.startswith(prefix):
            raise TokenError("not a client token", "malformed")
        signed, dot, mac_text = token.rpartition(".")
        if not dot or len(signed) < len(prefix):
            raise TokenError("not a client token", "malformed")
        try:
            mac = _unb64(mac_text)
            body = _unb64(signed[len(prefix) :])
        except (ValueError, UnicodeEncodeError):
            raise TokenError("client token is not base64url", "malformed") from None
        if not hmac.compare_digest(self._mac(signed.encode("ascii", "replace")), mac):
            raise TokenError("client token signature does not verify", "bad-signature")
        # The MAC verified, so the body is ours; still parse defensively.
        try:
            raw = json.loads(body)
            claims = ClientClaims(
                jti=str(raw["jti"]),
                exp=float(raw["exp"]),
                scope=tuple(str(s) for s in raw["scope"]),
                agent=None if raw.get("agent") is None else str(raw["agent"]),
            )
        except (ValueError, KeyError, TypeError):
            raise TokenError("client token claims are malformed", "malformed") from None
        if now >= claims.exp:
            raise TokenError("client token has expired", "expired")
        return claims
