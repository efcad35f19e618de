"""TURN for clients (issue 40 item 3, appliance/signaling/ice_servers.py): the WHIP ``Link``
headers of a 201 (RFC 9725 §4.6), ``ice_servers`` beside the ephemeral key, the client token
and alone from ``GET /v1/ice_servers``; and that what signaling mints is what the relay's
TURN core accepts — the same server object the relay runs (proto/turn/server.py), keyed
the way the relay CLI keys it from the same routing secret."""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from proto.turn.turn_client import SERVER, Client, allocate, relayed_of
from proto.turn.turn_client import server as turn_server
from signaling.fakes import OFFER

from appliance.config import resolve
from appliance.proto.stun import Class
from appliance.proto.turn import derive_turn_secret
from appliance.relay import cli as relay_cli
from appliance.signaling import cli as signaling_cli
from appliance.signaling.ice_servers import TurnAdvert

SECRET = b"0123456789abcdef0123456789abcdef"  # the routing secret both sides hold
URLS = ("turn:198.51.100.1:3478?transport=udp", "turn:198.51.100.1:3478?transport=tcp",
        "turns:198.51.100.1:3478?transport=tcp")
TURN = TurnAdvert(derive_turn_secret(SECRET), URLS)
#: RFC 9725 §4.6 / RFC 8288: <uri>; rel="ice-server"; username=…; credential=…; type
LINK = re.compile(r'^<(?P<url>turns?:[^>]+)>; rel="ice-server"; username="(?P<u>[^"]+)"; '
                  r'credential="(?P<c>[^"]+)"; credential-type="password"$')


def _relay_accepts(username: str, password: str, secrets: tuple[bytes, ...]) -> bool:
    """An authenticated Allocate with this credential on the relay's TURN core, at the
    signaling fake clock's Unix time (1.7e9, the core's too): success or not."""
    srv, _ = turn_server(secrets=secrets, own=frozenset({SERVER}))
    msg = allocate(srv, Client(username=username, password=password))
    return msg is not None and msg.msg_class == Class.SUCCESS and bool(relayed_of(msg))


def _links(resp: Any) -> list[re.Match[str]]:
    out = [LINK.match(v) for v in resp.headers.get_all("Link")]
    assert all(out), resp.headers.get_all("Link")
    return [m for m in out if m is not None]


async def test_whip_201_has_a_link_per_turn_server_the_relay_accepts(make_env: Any) -> None:
    env = await make_env(turn=TURN)
    resp = await env.client().post("/v1/sessions", data=OFFER,
                                   headers={"Content-Type": "application/sdp"})
    assert resp.status_code == 201
    links = _links(resp)
    assert [m["url"] for m in links] == list(URLS)
    assert len({(m["u"], m["c"]) for m in links}) == 1  # one credential for the session
    username, password = links[0]["u"], links[0]["c"]
    expiry = int(username.split(":")[0])
    assert expiry == int(env.clock() + TURN.ttl)  # as long as a call may last, no longer
    assert "Link" in resp.headers["Access-Control-Expose-Headers"]  # a page may read them
    # The relay, keyed from the same routing secret (relay/cli.py), accepts it ...
    assert _relay_accepts(username, password, (derive_turn_secret(SECRET),))
    # ... a relay with another secret does not (the check can fail).
    assert not _relay_accepts(username, password, (derive_turn_secret(b"other"),))
    # Each session gets its own credential.
    again = await env.client().post("/v1/sessions", data=OFFER,
                                    headers={"Content-Type": "application/sdp"})
    assert _links(again)[0]["u"] != username


async def test_ice_servers_beside_the_ephemeral_key_and_the_client_token(
        make_env: Any) -> None:
    env = await make_env(turn=TURN)
    c = env.client()
    out = await (await c.post("/v1/realtime/client_secrets",
                              json={"expires_after": {"seconds": 600}})).get_json()
    (server,) = out["ice_servers"]  # one RTCIceServer: every URL, one credential
    assert set(server) == {"urls", "username", "credential"}
    assert server["urls"] == list(URLS)
    # Valid from the secret's last moment for a call's length.
    assert int(server["username"].split(":")[0]) == int(env.clock() + 600 + TURN.ttl)
    assert _relay_accepts(server["username"], server["credential"], (TURN.secret,))
    # The call that secret places gets Link headers too (a WHIP-like 201).
    call = await c.post("/v1/realtime/calls", data=OFFER,
                        headers={"Content-Type": "application/sdp",
                                 "Authorization": f"Bearer {out['value']}"})
    assert call.status_code == 201 and [m["url"] for m in _links(call)] == list(URLS)
    tok = await (await c.post("/v1/client_tokens", json={"ttl": 120})).get_json()
    (server,) = tok["ice_servers"]
    assert int(server["username"].split(":")[0]) == int(env.clock() + 120 + TURN.ttl)
    assert _relay_accepts(server["username"], server["credential"], (TURN.secret,))


async def test_get_ice_servers_needs_what_a_session_needs(make_env: Any) -> None:
    """The demo page asks before its offer; a client token may ask, no token may not."""
    env = await make_env(turn=TURN, http=("0.0.0.0", 8080), api_token="tok")
    c = env.client()
    assert (await c.get("/v1/ice_servers")).status_code == 401
    tok = await (await c.post("/v1/client_tokens",
                              headers={"Authorization": "Bearer tok"})).get_json()
    resp = await c.get("/v1/ice_servers", headers={"Authorization": f"Bearer {tok['token']}"})
    assert resp.status_code == 200 and resp.headers["Cache-Control"] == "no-store"
    body = await resp.get_json()
    (server,) = body["ice_servers"]
    assert body["expires_at"] == int(server["username"].split(":")[0])
    assert _relay_accepts(server["username"], server["credential"], (TURN.secret,))


async def test_without_turn_nothing_is_advertised(make_env: Any) -> None:
    """--no-turn (or no secret known): no Link header, empty lists, the same shapes."""
    env = await make_env()
    c = env.client()
    resp = await c.post("/v1/sessions", data=OFFER, headers={"Content-Type": "application/sdp"})
    assert resp.status_code == 201 and resp.headers.get_all("Link") == []
    assert await (await c.get("/v1/ice_servers")).get_json() == {"ice_servers": [],
                                                                  "expires_at": None}
    assert (await (await c.post("/v1/client_tokens")).get_json())["ice_servers"] == []


async def test_credentials_are_never_logged(make_env: Any,
                                            caplog: pytest.LogCaptureFixture) -> None:
    env = await make_env(turn=TURN)
    caplog.set_level(logging.DEBUG)
    resp = await env.client().post("/v1/sessions", data=OFFER,
                                   headers={"Content-Type": "application/sdp"})
    link = _links(resp)[0]
    assert link["c"] not in caplog.text and link["u"] not in caplog.text
    assert TURN.secret.decode() not in repr(TURN)


def _signaling(argv: list[str]) -> Any:
    parser = argparse.ArgumentParser()
    signaling_cli.add_arguments(parser)
    args = parser.parse_args(argv)
    resolve(args, {}, "signaling", signaling_cli.DEFAULTS)
    return signaling_cli.build_config(args)[0]


def test_standalone_signaling_learns_the_secret_as_the_relay_does(tmp_path: Path) -> None:
    routing = tmp_path / "routing.secret"
    routing.write_bytes(SECRET.hex().encode() + b"\n")
    base = ["--public-address", "203.0.113.9", "--udp-port", "3478", "--webui-dir",
            str(tmp_path)]
    cfg = _signaling([*base, "--secret-file", str(routing), "--public-tcp-port", "443"])
    parser = argparse.ArgumentParser()
    relay_cli.add_arguments(parser)
    args = parser.parse_args(["--secret-file", str(routing), "--listen", "203.0.113.9:3478"])
    resolve(args, {}, "relay", relay_cli.DEFAULTS)
    relay = relay_cli.build_config(args).turn
    assert relay is not None and cfg.turn is not None
    assert cfg.turn.secret == relay.secrets[0]  # what signaling mints, the relay verifies
    assert cfg.turn.urls == ("turn:203.0.113.9:443?transport=tcp",)  # TCP: not UDP (docs)
    # No TCP listener named: nothing to advertise (asking for it is an error).
    assert _signaling([*base, "--secret-file", str(routing)]).turn is None
    with pytest.raises(ValueError, match="--public-tcp-port"):
        _signaling([*base, "--secret-file", str(routing), "--turn"])
    # A proxy in front: --turn-url replaces them; a TURN secret file is used as the relay's.
    turn_file = tmp_path / "turn.secret"
    turn_file.write_bytes(b"shared\n")
    proxied = _signaling([*base, "--turn-secret-file", str(turn_file),
                          "--turn-url", "turns:turn.example.com:443?transport=tcp"])
    assert proxied.turn is not None and proxied.turn.secret == b"shared"
    assert proxied.turn.urls == ("turns:turn.example.com:443?transport=tcp",)
    # No secret known: nothing advertised (asking for it is an error); --no-turn: off.
    assert _signaling(base).turn is None
    assert _signaling([*base, "--secret-file", str(routing), "--no-turn"]).turn is None
    with pytest.raises(ValueError, match="--secret-file"):
        _signaling([*base, "--turn"])
    with pytest.raises(ValueError, match="turn: or turns:"):
        _signaling([*base, "--secret-file", str(routing), "--turn-url", "http://x"])
