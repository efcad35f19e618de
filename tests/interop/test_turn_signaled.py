"""End to end through one ``appliance up`` (issue 40 item 3): TURN is on without asking, and
the credentials signaling hands out — the WHIP ``Link`` headers of ``POST /v1/sessions``
and the ``ice_servers`` beside the ephemeral key of ``POST /v1/realtime/client_secrets`` —
allocate on the running relay at exactly the URLs advertised (TURN over TCP on the media
port: TURN over UDP there is served, and allocates with the same credential, but is not
advertised, docs/turn.md); with ``--no-turn`` nothing is advertised and the relay does not
answer an Allocate.

The TURN client is the tests' own (tests/proto/turn/turn_client.py) on real sockets; coturn's
uclient and Chromium run against the same relay in test_turn_uclient.py and
test_turn_chromium.py (the latter through the demo page with these credentials).
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.procs import Proc
from proto.turn.turn_client import Client, relayed_of

from appliance.client.peer import ClientPeer
from appliance.proto.dtls import Certificate
from appliance.proto.stun import AttrType, Class, Message, Method
from appliance.proto.turn import StreamFramer, derive_turn_secret, mint_rest_credential
from appliance.proto.ufrag import load_secrets

pytestmark = [pytest.mark.interop, pytest.mark.slow]

LINK = re.compile(r'^<(turns?):([\d.]+):(\d+)\?transport=(udp|tcp)>; rel="ice-server"; '
                  r'username="([^"]+)"; credential="([^"]+)"; credential-type="password"$')
ALLOCATE = ((AttrType.REQUESTED_TRANSPORT, 17),)


def _up(tmp: Path, *extra: str) -> tuple[Proc, str]:
    proc = Proc(["up", "--http", "127.0.0.1:0", "--udp", "127.0.0.1:0", "--public-address",
                 "127.0.0.1", "--state-dir", str(tmp / "state"), "--transceivers", "1",
                 *extra], "appliance ready", timeout=60)
    base = re.search(r"web UI (\S+)/ ", proc.ready)
    assert base, proc.ready
    return proc, base.group(1)


def _post(url: str, body: bytes, ctype: str) -> tuple[int, list[str], bytes]:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=20) as resp:
        return resp.status, resp.headers.get_all("Link") or [], resp.read()


def _offer() -> bytes:
    return ClientPeer(Certificate.generate(0.0)).offer().encode()


def _allocate_udp(addr: tuple[str, int], username: str, password: str) -> Message:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(10)  # a guard: the relay answers in well under a millisecond
        s.connect(addr)
        c = Client(addr=s.getsockname(), local=addr, username=username, password=password)
        for _ in range(2):  # one 401 round, as a client does
            s.send(c.request(Method.ALLOCATE, ALLOCATE))
            msg = c.learn(s.recv(4096))
            if msg.msg_class == Class.SUCCESS:
                break
        return msg


def _allocate_tcp(addr: tuple[str, int], username: str, password: str) -> Message:
    with socket.create_connection(addr, timeout=10) as s:
        c = Client(addr=s.getsockname(), local=addr, username=username, password=password)
        framer = StreamFramer()
        for _ in range(2):
            s.sendall(c.request(Method.ALLOCATE, ALLOCATE))
            while (data := framer.poll_output()) is None:
                chunk = s.recv(4096)
                assert chunk, "the relay closed the TURN/TCP connection"
                framer.handle_input(chunk)
            msg = c.learn(bytes(data))
            if msg.msg_class == Class.SUCCESS:
                break
        return msg


def _allocates(url: str, username: str, password: str) -> None:
    m = re.fullmatch(r"turn:([\d.]+):(\d+)\?transport=(udp|tcp)", url)
    assert m, url
    addr = (m.group(1), int(m.group(2)))
    allocate = _allocate_udp if m.group(3) == "udp" else _allocate_tcp
    msg = allocate(addr, username, password)
    assert msg.msg_class == Class.SUCCESS, (url, msg.error_code)
    assert relayed_of(msg)[0] == "127.0.0.1"


@pytest.fixture(scope="module")
def turn_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, str]]:
    proc, base = _up(tmp_path_factory.mktemp("turn-up"))  # no TURN flag: on by default
    try:
        yield proc, base
    finally:
        rc = proc.stop()
        assert rc == 0, "".join(proc.stderr)[-3000:]


def test_whip_link_credentials_allocate_on_the_running_relay(
        turn_up: tuple[Proc, str]) -> None:
    proc, base = turn_up
    status, links, _ = _post(base + "/v1/sessions", _offer(), "application/sdp")
    assert status == 201
    parsed = [LINK.match(v) for v in links]
    assert parsed and all(parsed), links
    media = re.search(r"media: UDP 127\.0\.0\.1:(\d+)", "".join(proc.stdout))
    assert media
    port = int(media.group(1))
    # TCP on the media port (ICE-TCP's listener), the port actually listened on.
    urls = [v.split(">", 1)[0][1:] for v in links]
    assert urls == [f"turn:127.0.0.1:{port}?transport=tcp"], urls
    assert f"TURN: {' '.join(urls)}" in "".join(proc.stdout)
    m = parsed[0]
    assert m is not None
    _allocates(urls[0], m.group(5), m.group(6))
    # TURN over UDP is on too, unadvertised: the same credential allocates there.
    _allocates(f"turn:127.0.0.1:{port}?transport=udp", m.group(5), m.group(6))


def test_client_secret_ice_servers_allocate_on_the_running_relay(
        turn_up: tuple[Proc, str]) -> None:
    _, base = turn_up
    status, _, body = _post(base + "/v1/realtime/client_secrets", b"{}", "application/json")
    assert status == 200
    (server,) = json.loads(body)["ice_servers"]
    assert len(server["urls"]) == 1
    for url in server["urls"]:
        _allocates(url, server["username"], server["credential"])


def test_no_turn_advertises_nothing_and_the_relay_refuses(tmp_path: Path) -> None:
    proc, base = _up(tmp_path, "--no-turn")
    try:
        assert "TURN: off" in "".join(proc.stdout)
        status, links, _ = _post(base + "/v1/sessions", _offer(), "application/sdp")
        assert status == 201 and links == []
        _, _, body = _post(base + "/v1/realtime/client_secrets", b"{}", "application/json")
        assert json.loads(body)["ice_servers"] == []
        # A credential that a TURN-enabled relay would take (the derived secret): dropped
        # like any unknown first packet, unanswered (the drop is counted, so we wait for it).
        routing = load_secrets((tmp_path / "state" / "routing.secret").read_bytes())[0]
        cred = mint_rest_credential(derive_turn_secret(routing), "probe", int(time.time()) + 600)
        port = int(re.search(r"media: UDP 127\.0\.0\.1:(\d+)",  # type: ignore[union-attr]
                             "".join(proc.stdout)).group(1))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("127.0.0.1", port))
            c = Client(addr=s.getsockname(), local=("127.0.0.1", port),
                       username=cred.username, password=cred.password)
            s.send(c.request(Method.ALLOCATE, ALLOCATE))
            for _ in range(100):
                with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
                    metrics = resp.read().decode()
                if re.search(r"^appliance_relay_drops_stun_malformed_total\S* [1-9]", metrics,
                             re.M):
                    break
                time.sleep(0.1)  # a poll interval; the loop checks the counter
            else:
                pytest.fail("the relay did not count the Allocate as a drop")
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(4096)  # and nothing was answered
    finally:
        rc = proc.stop()
    assert rc == 0, "".join(proc.stderr)[-3000:]
