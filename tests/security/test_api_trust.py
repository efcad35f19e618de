"""Issue 40 item 0: the API's trust follows the real client, through every listener.

The hole this closes: `appliance up --http 127.0.0.1:PORT --udp 10.201.0.1:443 --tls
self-signed --https-on-media-port` (the deployment the flag's help suggests) served the whole
API with no token to anyone who could reach port 443: the relays splice HTTPS from the media
port to signaling over loopback, and signaling, bound to loopback, trusted every loopback
peer. Listing calls, minting client tokens and Realtime client secrets, placing calls: all
200/201 from another host.

Here a client host and an appliance host are network namespaces joined by a bridge
(tests/multihost/netns.py); three appliances run on the appliance host, one per listener
shape:

* ``media``: signaling HTTPS on loopback, HTTPS also on the media port 10.201.x.1:443 —
  the deployment of the report;
* ``https``: signaling HTTPS on 10.201.x.1:8443, and on the media port :4443 too;
* ``http``: plain HTTP on 10.201.x.1:8080.

From the client host, with no token, every route of the app (read from its URL map, so a
route added later is covered without editing this file) answers 401 through every listener,
but ``/healthz``, ``/readyz`` and the static web UI; with the printed API token the same
listeners serve the API. From the appliance host's own loopback the loopback listener still
needs no token (the convenience the README promises), while a loopback request that says it
was forwarded by a proxy (``X-Forwarded-For``) and a request from the host's own
non-loopback address through the media port are judged as remote.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "multihost"))
from netns import Net, NetnsUnavailable, NsProc  # noqa: E402

from appliance.signaling.app import create_app  # noqa: E402
from appliance.signaling.state import SignalingConfig, SignalingState  # noqa: E402

pytestmark = pytest.mark.slow

PROBE = str(Path(__file__).resolve().parent / "api_probe.py")
#: Routes anyone may ask (docs/security.md): liveness, readiness and the static web UI.
PUBLIC = {"healthz", "readyz", "index", "demo", "webui_file"}
#: The Realtime and GPT-Live surfaces' "405 Method Not Allowed" handlers: serve nothing to
#: anyone (the method is wrong before the caller is).
NOT_ALLOWED = ("realtime_405_", "live_405")
_PARAMS = {"call_id": "rtc_probe", "session_id": "live_probe", "sid": "probe", "name": "demo.js"}


def routes() -> tuple[list[list[Any]], list[list[Any]]]:
    """(protected, public) ``[method, path, websocket]`` triples, from the app itself."""
    app = create_app(SignalingState(SignalingConfig()))
    protected: list[list[Any]] = []
    public: list[list[Any]] = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint.startswith(NOT_ALLOWED):
            continue
        path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: _PARAMS[m.group(1)], rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            (public if rule.endpoint in PUBLIC else protected).append(
                [method, path, bool(rule.websocket)])
    assert len(protected) >= 15, protected  # the map was read, not an empty app
    return protected, public


def probe(net: Net, host: str, base: str, routes: list[list[Any]], *,
          token: str | None = None, headers: dict[str, str] | None = None) -> dict[str, int]:
    job = json.dumps({"base": base, "token": token, "headers": headers or {},
                      "routes": routes})
    r = subprocess.run(["ip", "netns", "exec", net.ns(host), sys.executable, PROBE, job],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    out: dict[str, int] = json.loads(r.stdout)
    return out


def _token(proc: NsProc) -> str | None:
    for line in proc.stdout:
        if line.startswith("API token (generated): "):
            return line.split(": ", 1)[1].strip()
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("this test needs root and iproute2 to create network namespaces",
                    pytrace=False)
    tmp = tmp_path_factory.mktemp("trust")
    os.chmod(tmp, 0o755)
    sub = os.getpid() % 200 + 20
    app_ip, client_ip = f"10.201.{sub}.1", f"10.201.{sub}.2"
    net: Net | None = None
    try:
        try:
            net = Net(f"aptr{os.getpid() % 100000}")
            net.host("app", {"lan": f"{app_ip}/24"})
            net.host("client", {"lan": f"{client_ip}/24"})
        except NetnsUnavailable as exc:
            pytest.fail(f"cannot create network namespaces here: {exc}", pytrace=False)
        common = ["--public-address", app_ip, "--transceivers", "1"]
        shapes = {
            "media": ["--http", "127.0.0.1:8080", "--udp", f"{app_ip}:443", "--tls",
                      "self-signed", "--https-on-media-port"],
            "https": ["--http", f"{app_ip}:8443", "--udp", f"{app_ip}:4443", "--tls",
                      "self-signed", "--https-on-media-port"],
            # Not 3478: the "media" shape's relays listen there too (TURN is on by default
            # and its media port is below 1024: the relayed-media port, docs/turn.md).
            "http": ["--http", f"{app_ip}:8080", "--udp", f"{app_ip}:3479"],
        }
        procs = {name: net.run("app", ["-m", "appliance", "up", *args, *common,
                                       "--state-dir", str(tmp / name)],
                               "appliance ready", timeout=90)
                 for name, args in shapes.items()}
        yield {"net": net, "app": app_ip, "procs": procs,
               "tokens": {name: _token(p) for name, p in procs.items()}}
    finally:
        if net is not None:
            errors = net.close()
            assert not errors, errors


def _listeners(site: dict[str, Any]) -> list[tuple[str, str]]:
    """(appliance, base URL the client host uses) for every listener shape."""
    ip = site["app"]
    return [("media", f"https://{ip}:443"), ("https", f"https://{ip}:8443"),
            ("https", f"https://{ip}:4443"), ("http", f"http://{ip}:8080")]


def test_every_route_needs_the_token_from_another_host(site: dict[str, Any]) -> None:
    protected, public = routes()
    for name, base in _listeners(site):
        got = probe(site["net"], "client", base, protected)
        served = {k: v for k, v in got.items() if v != 401}
        assert not served, f"{base} ({name}) served without a token: {served}"
        got = probe(site["net"], "client", base, public)
        assert got["GET /healthz"] == 200 and got["GET /demo"] == 200, (base, got)
        assert all(v != 401 for v in got.values()), (base, got)


def test_the_token_opens_every_listener(site: dict[str, Any]) -> None:
    asked = [["GET", "/v1/sessions", False], ["GET", "/metrics", False],
             ["POST", "/v1/client_tokens", False]]
    for name, base in _listeners(site):
        token = site["tokens"][name]
        assert token, f"{name}: reachable from other hosts, yet no API token was generated"
        got = probe(site["net"], "client", base, asked, token=token)
        assert got == {"GET /v1/sessions": 200, "GET /metrics": 200,
                       "POST /v1/client_tokens": 201}, (base, got)


def test_on_the_host_itself_only_a_loopback_client_is_trusted(site: dict[str, Any]) -> None:
    asked = [["GET", "/v1/sessions", False], ["POST", "/v1/realtime/client_secrets", False]]
    net = site["net"]
    # The loopback listener, asked from loopback: no token, as the README promises.
    got = probe(net, "app", "https://127.0.0.1:8080", asked)
    assert got == {"GET /v1/sessions": 200, "POST /v1/realtime/client_secrets": 200}, got
    # ... but not when a proxy on this host says it forwarded the request.
    got = probe(net, "app", "https://127.0.0.1:8080", asked,
                headers={"X-Forwarded-For": "203.0.113.9"})
    assert set(got.values()) == {401}, got
    # The media port from this host's own LAN address: the relay names that address, which
    # is not loopback.
    got = probe(net, "app", f"https://{site['app']}:443", asked)
    assert set(got.values()) == {401}, got
