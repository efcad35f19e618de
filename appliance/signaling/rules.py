"""The request rules both HTTP paths apply: the Quart routes (app.py) and the WHIP fast
path in front of them (fastpath.py), so the two cannot drift apart
(tests/signaling/test_fastpath.py compares their answers).

Each rule is a function of plain values (a header's text, a content length, a record) that
returns what the route needs or raises :class:`~.problems.Problem`; none touches a request
object, so either path can call it.
"""

from __future__ import annotations

import hmac
import re

from werkzeug.exceptions import HTTPException

from .problems import Problem
from .proxied import CLIENT_IS_LOCAL
from .registry import SessionRecord
from .state import SignalingState
from .tokens import PREFIX as CLIENT_TOKEN_PREFIX
from .tokens import SCOPE_SESSIONS, ClientClaims, TokenError

SDP = "application/sdp"
SDPFRAG = "application/trickle-ice-sdpfrag"
_AGENT_RE = re.compile(r"^[\x21-\x7e]{1,256}$")  # names, module:attr or ws:// URLs
_CORS_EXPOSE = "Location, ETag, Accept-Patch, Link"

#: Added to every /v1/ answer. Bearer tokens, never cookies: any origin may call the API
#: (browser WHIP clients).
CORS_RESPONSE_HEADERS = (("Access-Control-Allow-Origin", "*"),
                         ("Access-Control-Expose-Headers", _CORS_EXPOSE))


def authorize_header(state: SignalingState, authorization: str, *,
                     sessions: bool) -> ClientClaims | None:
    """Check an ``Authorization`` header value: None when the caller has full rights, the
    claims of a client token otherwise; raises :class:`Problem` (401/403).

    No token is needed only when signaling is bound to loopback *and* the request's real
    client is on this host (``proxied.CLIENT_IS_LOCAL``, set per request by the trust edge:
    a caller spliced in by the relays or forwarded by a proxy is judged by its own address,
    issue 40 item 0)."""
    if not state.config.requires_auth() and CLIENT_IS_LOCAL.get():
        return None
    challenge = {"WWW-Authenticate": 'Bearer realm="appliance"'}
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Problem(401, "missing-token", "an Authorization: Bearer token is required",
                      challenge)
    if state.api_token and hmac.compare_digest(token.encode(), state.api_token.encode()):
        return None
    if token.startswith(CLIENT_TOKEN_PREFIX):
        try:
            claims = state.tokens.verify_untrusted(token, now=state.clock())
        except TokenError as exc:
            raise Problem(401, f"token-{exc.reason}", str(exc),
                          {"WWW-Authenticate": 'Bearer realm="appliance", error="invalid_token"'}) from None
        if not sessions or SCOPE_SESSIONS not in claims.scope:
            raise Problem(403, "token-scope", "a client token may only create, patch and "
                          "delete sessions; this needs the API token")
        return claims
    raise Problem(401, "bad-token", "the bearer token is not valid",
                  {"WWW-Authenticate": 'Bearer realm="appliance", error="invalid_token"'})


def check_owner(rec: SessionRecord, claims: ClientClaims | None) -> None:
    if claims is not None and rec.owner != claims.jti:
        raise Problem(403, "not-owner", "this client token did not create this session")


def check_body_headers(mimetype: str, content_length: int | None, expected: str,
                       max_body: int) -> None:
    """Content-Type and Content-Length, before any of the body is read (415, 413)."""
    if mimetype != expected:
        got = mimetype or "none"
        raise Problem(415, "unsupported-media-type",
                      f"Content-Type must be {expected}, got {got}",
                      {"Accept-Post" if expected == SDP else "Accept-Patch": expected})
    if content_length is not None and content_length > max_body:
        raise Problem(413, "body-too-large", f"request body exceeds {max_body} bytes")


def decode_body(raw: bytes, expected: str) -> str:
    if not raw.strip():
        raise Problem(400, "empty-body", f"the request body must be an {expected} document")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Problem(400, "bad-encoding", f"the body is not UTF-8 (byte {exc.start})") from None


def check_agent(agent: str | None, *, full_rights: bool = True,
                granted: str | None = None) -> str | None:
    """The agent a caller asked for, checked. Only a full-rights caller (the API token, or
    anyone on a loopback bind) may name one: a spec is code to import, a file to load or a
    URL the transceiver connects to with the deployment's own keys (a ``realtime+wss://``
    bridge sends ``$APPLIANCE_REALTIME_KEY``), so a browser's client token gets the agent
    its minter ``granted`` it (or the configured one) and a 403 for asking otherwise."""
    if agent is not None and not _AGENT_RE.match(agent):
        raise Problem(400, "bad-agent", "agent must be 1..256 printable ASCII characters")
    if full_rights:
        return agent
    if agent is not None and agent != granted:
        raise Problem(403, "agent-not-allowed",
                      f"this client token was minted for the agent {granted!r}: mint one for "
                      f"{agent!r} (POST /v1/client_tokens {{\"agent\": ...}}) to use it"
                      if granted is not None else
                      "a client token cannot choose the agent: the deployment's is used (or "
                      "mint the token with one: POST /v1/client_tokens {\"agent\": ...})")
    return granted


def agent_for(asked: str | None, claims: ClientClaims | None) -> str | None:
    """:func:`check_agent` for a request authorized with ``claims`` (None: full rights)."""
    return check_agent(asked, full_rights=claims is None,
                       granted=None if claims is None else claims.agent)


def created_headers(rec: SessionRecord) -> list[tuple[str, str]]:
    """The 201's headers after Content-Type/Length (RFC 9725 §4.2)."""
    return [("Location", f"/v1/sessions/{rec.id}"), ("ETag", rec.etag),
            ("Accept-Patch", SDPFRAG), ("Cache-Control", "no-store")]


def http_problem(exc: HTTPException, max_body: int) -> Problem:
    """A werkzeug HTTP error (404, 405, 408, 413, ...) as the problem we answer with."""
    status = exc.code or 400
    code = re.sub(r"[^a-z0-9]+", "-", (exc.name or "error").lower()).strip("-")
    detail = exc.description or exc.name or "error"
    if status == 413:
        code, detail = "body-too-large", f"request body exceeds {max_body} bytes"
    headers = {}
    if status == 405 and exc.get_headers():
        headers = {k: v for k, v in exc.get_headers() if k.lower() == "allow"}
    return Problem(status, code, detail, headers)
