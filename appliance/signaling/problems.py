"""Problem details (RFC 9457) for every error the HTTP API returns.

Each answer is ``application/problem+json`` with ``type``, ``title``, ``status``, ``detail``
and the extension member ``code`` (a stable machine code, the same vocabulary the
control channel uses, docs/control-protocol.md). ``type`` is a URN built from ``code``
(RFC 9457 §3.1.1 allows any URI; nothing needs to dereference it).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from quart import Response

CONTENT_TYPE = "application/problem+json"


class Problem(Exception):
    """Raised inside a request handler; turned into a problem+json response."""

    def __init__(
        self, status: int, code: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers or {}


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_body(status: int, code: str, detail: str) -> dict[str, Any]:
    return {
        "type": f"urn:appliance:problem:{code}",
        "title": _title(status),
        "status": status,
        "code": code,
        "detail": detail,
    }


def problem_response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None
) -> Response:
    resp = Response(
        json.dumps(problem_body(status, code, detail)), status=status, content_type=CONTENT_TYPE
    )
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def from_control(resp: dict[str, Any]) -> Problem:
    """Pass a control-channel error's status/code/detail straight through (never a 5xx for
    what the transceiver calls bad input; a 5xx from it stays a 5xx)."""
    try:
        status = int(resp.get("status", 502))
    except (TypeError, ValueError):
        status = 502
    if not 400 <= status <= 599:
        status = 502
    code = str(resp.get("code") or "transceiver-error")
    detail = str(resp.get("detail") or "the transceiver refused the request")
    return Problem(status, code, detail)
