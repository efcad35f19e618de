"""Ask one listener of the API every route, as a client on another host would.

Run inside a network namespace by tests/security/test_api_trust.py:

    python api_probe.py '{"base": "https://10.201.0.1:443", "token": null,
                          "headers": {}, "routes": [["GET", "/v1/sessions", false], ...]}'

Prints one JSON object: ``{"METHOD PATH": status, ...}``. A WebSocket route is asked with
an RFC 6455 upgrade request and answers its handshake status (101 when it would upgrade).
TLS certificates are not checked: the appliance under test made a self-signed one.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import sys
from urllib.parse import urlsplit


def ask(base: str, method: str, path: str, websocket: bool, token: str | None,
        extra: dict[str, str]) -> int:
    url = urlsplit(base)
    port = url.port or (443 if url.scheme == "https" else 80)
    conn: http.client.HTTPConnection
    if url.scheme == "https":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the appliance's own self-signed certificate
        # http/1.1, as every browser, curl and httpx offer: on the media port (TURN on by
        # default) a hello offering no ALPN is a `turns:` client's (docs/turn.md, rule 4).
        ctx.set_alpn_protocols(["http/1.1"])
        conn = http.client.HTTPSConnection(url.hostname or "", port, timeout=15, context=ctx)
    else:
        conn = http.client.HTTPConnection(url.hostname or "", port, timeout=15)
    headers = dict(extra)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body: bytes | None = None
    if websocket:
        headers.update({"Connection": "Upgrade", "Upgrade": "websocket",
                        "Sec-WebSocket-Version": "13",
                        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode()})
        path += "?model=probe"  # the Realtime socket's one required parameter
    elif method in ("POST", "PATCH", "PUT"):
        body = b"{}"
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=body, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def main() -> int:
    job = json.loads(sys.argv[1])
    out = {f"{m} {p}": ask(job["base"], m, p, ws, job.get("token"), job.get("headers") or {})
           for m, p, ws in job["routes"]}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
