"""Issue 18 #4: one TCP port for HTTPS and ICE-TCP (`appliance up --tls self-signed
--https-on-media-port`). The relays own the media port; a connection whose first byte
starts a TLS record is relayed to signaling's HTTPS listener, an RFC 4571 frame goes to
ICE-TCP. Tested end to end through that one port: HTTPS health check, a session created by
``POST /v1/sessions`` over HTTPS, then the call's ICE, DTLS and SRTP over ICE-TCP with the
echo agent — and /metrics over the same port shows both kinds of connection.
"""

from __future__ import annotations

import re
import socket as stdsocket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trio
from e2e.procs import Proc
from reliability.support import opus_frame
from reliability.tcp_support import TcpCall

from appliance.client.peer import ClientPeer
from appliance.proto.dtls import Certificate

pytestmark = pytest.mark.slow

INSECURE = ssl.create_default_context()
INSECURE.check_hostname = False
INSECURE.verify_mode = ssl.CERT_NONE  # a self-signed certificate made for this test
# Offer http/1.1 as browsers and curl do: with TURN/TLS on the same port a TLS client that
# offers no ALPN is taken for a `turns:` client (docs/turn.md "Over TLS", rule 4).
INSECURE.set_alpn_protocols(["http/1.1"])


def https(method: str, url: str, body: bytes | None = None,
          content_type: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    if content_type:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=10, context=INSECURE) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


async def test_https_and_ice_tcp_on_one_port(tmp_path: Path) -> None:
    proc = Proc(["up", "--http", "127.0.0.1:0", "--udp", "127.0.0.1:0", "--tls", "self-signed",
                 "--https-on-media-port", "--public-address", "127.0.0.1",
                 "--state-dir", str(tmp_path / "state"), "--transceivers", "1"],
                "appliance ready", timeout=60)
    try:
        out = "".join(proc.stdout)
        m = re.search(r"HTTPS also on the media port: https://127\.0\.0\.1:(\d+)/", out)
        assert m, out
        port = int(m.group(1))
        assert f"media: UDP 127.0.0.1:{port}" in out
        base = f"https://127.0.0.1:{port}"
        status, body = await trio.to_thread.run_sync(https, "GET", base + "/healthz")
        assert status == 200, body

        peer = ClientPeer(Certificate.generate(time.time()))
        status, body = await trio.to_thread.run_sync(
            https, "POST", base + "/v1/sessions", peer.offer().encode(), "application/sdp")
        assert status == 201, body[:500]
        answer = body.decode()
        assert re.search(rf"1 tcp \d+ 127\.0\.0\.1 {port} typ host tcptype passive", answer)
        peer.accept_answer(answer, trio.current_time())
        sock = stdsocket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        call = TcpCall("shared", 0, peer, sock)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call.run, opus_frame())
            with trio.fail_after(20):
                await call.connected.wait()
                while call.received < 25:  # noqa: ASYNC110 - the call's task fills it
                    await trio.sleep(0.05)
            assert call.failed is None
            status, body = await trio.to_thread.run_sync(https, "GET", base + "/metrics")
            assert status == 200
            text = body.decode()

            def metric(name: str) -> float:
                return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                           if line.startswith(f"appliance_relay_{name}"))

            assert metric("tcp_https_total") >= 3  # healthz, the POST, this GET
            assert metric("tcp_established_total") == 1  # the call
            nursery.cancel_scope.cancel()
    finally:
        rc = proc.stop()
    assert rc == 0, "".join(proc.stderr)[-3000:]
