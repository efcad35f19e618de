"""Geo-steered ingress (issue 10 item 2): the candidates signaling sends in ``create`` come
from the request's context — a region header set by a CDN/LB, the client's network prefix
(HTTP peer, or X-Forwarded-For behind a trusted proxy) — falling back to --public-address."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from signaling.fakes import OFFER

from appliance.config import load_config, resolve
from appliance.signaling.cli import DEFAULTS, add_arguments, build_config
from appliance.signaling.geo import IngressMap, parse_candidate, parse_ingress_map

SDP = {"Content-Type": "application/sdp"}
DEFAULT = [["198.51.100.1", 3478], ["2001:db8::5", 3478]]  # the fixture's --public-address
EU = [["192.0.2.10", 3478], ["192.0.2.11", 3479]]
US = [["203.0.113.20", 3478]]


def geo(**overrides: Any) -> IngressMap:
    kw: dict[str, Any] = {
        "ingress": ["eu=192.0.2.10:3478,192.0.2.11:3479", "us=203.0.113.20",
                    "ap=[2001:db8:a0::1]:443"],
        "prefixes": ["10.1.0.0/16=eu", "10.1.2.0/24=us", "10.0.0.0/8=ap", "fd00:1::/32=us"],
        "region_header": "X-Region",
    }
    kw.update(overrides)
    return parse_ingress_map(**kw)


TOKEN = "geo-test-token"


async def sent_candidates(env: Any, *, peer: str = "127.0.0.1",
                          headers: dict[str, str] | None = None) -> list[list[Any]]:
    """POST an offer as if from ``peer`` and return what the fake transceiver was asked to
    advertise (also checked against the answer the client got)."""
    before = {k: len(f.requests) for k, f in env.fakes.items()}
    # Remote peers: the API token, as from any other host (issue 40 item 0).
    resp = await env.client().post("/v1/sessions", data=OFFER.encode(),
                                   headers={**SDP, "Authorization": f"Bearer {TOKEN}",
                                            **(headers or {})},
                                   scope_base={"client": (peer, 40000)})
    assert resp.status_code == 201, await resp.get_data()
    new = [r for k, f in env.fakes.items() for r in f.requests[before[k]:]]
    assert [r["op"] for r in new] == ["create"]
    cands: list[list[Any]] = new[0]["candidates"]
    answer = (await resp.get_data()).decode()
    for ip, port in cands:
        assert f" {ip} {port} typ host" in answer
    return cands


async def test_without_a_map_every_client_gets_the_public_addresses(make_env: Any) -> None:
    env = await make_env(api_token=TOKEN, n=1)
    assert await sent_candidates(env, peer="10.1.2.3", headers={"X-Region": "eu"}) == DEFAULT


async def test_region_header_picks_the_region(make_env: Any) -> None:
    env = await make_env(api_token=TOKEN, n=1, ingress=geo())
    assert await sent_candidates(env, peer="198.18.0.1", headers={"X-Region": "eu"}) == EU
    assert await sent_candidates(env, peer="198.18.0.1", headers={"x-region": " us "}) == US
    # The header wins over the prefix of the peer address...
    assert await sent_candidates(env, peer="10.1.2.3", headers={"X-Region": "eu"}) == EU
    # ...but an unknown region is ignored: prefix, then default.
    assert await sent_candidates(env, peer="10.1.2.3", headers={"X-Region": "mars"}) == US
    assert await sent_candidates(env, peer="198.18.0.1", headers={"X-Region": "mars"}) == DEFAULT


async def test_client_prefix_longest_match_then_default(make_env: Any) -> None:
    env = await make_env(api_token=TOKEN, n=2, ingress=geo(region_header=None))
    assert await sent_candidates(env, peer="10.1.2.3") == US  # /24 beats /16 and /8
    assert await sent_candidates(env, peer="10.1.9.9") == EU  # /16
    assert await sent_candidates(env, peer="10.200.0.1") == [["2001:db8:a0::1", 443]]  # /8
    assert await sent_candidates(env, peer="fd00:1:2::3") == US  # IPv6 prefix
    assert await sent_candidates(env, peer="::ffff:10.1.9.9") == EU  # v4-mapped peer
    assert await sent_candidates(env, peer="192.0.2.200") == DEFAULT
    # Without --region-header the header means nothing.
    assert await sent_candidates(env, peer="192.0.2.200", headers={"X-Region": "eu"}) == DEFAULT
    text = (await (await env.client().get("/metrics")).get_data()).decode()
    assert 'appliance_ingress_answers_total{region="us"} 2' in text
    assert 'appliance_ingress_answers_total{region=""} 2' in text


async def test_x_forwarded_for_is_believed_only_from_a_trusted_proxy(make_env: Any) -> None:
    xff = {"X-Forwarded-For": "10.1.2.3"}
    untrusted = await make_env(api_token=TOKEN, n=1, ingress=geo(region_header=None))
    # A client speaking to signaling directly cannot pick a region by forging the header.
    assert await sent_candidates(untrusted, peer="192.0.2.200", headers=xff) == DEFAULT

    env = await make_env(api_token=TOKEN, n=1, ingress=geo(region_header=None,
                                           trusted_proxies=["172.16.0.0/12", "fd99::1"]))
    assert await sent_candidates(env, peer="172.16.0.5", headers=xff) == US
    # Right-most hop that is not a trusted proxy: the forged left-most entry is ignored.
    chain = {"X-Forwarded-For": "10.1.2.3, 10.1.9.9, 172.16.3.3"}
    assert await sent_candidates(env, peer="172.16.0.5", headers=chain) == EU
    assert await sent_candidates(env, peer="fd99::1",
                                 headers={"X-Forwarded-For": "[fd00:1::7]:5555"}) == US
    # The same header from an untrusted peer: the peer's own address decides.
    assert await sent_candidates(env, peer="10.200.0.1", headers=xff) == [["2001:db8:a0::1", 443]]
    # Garbage stops the walk: the proxy's own address is all we know (no prefix: default).
    assert await sent_candidates(env, peer="172.16.0.5",
                                 headers={"X-Forwarded-For": "10.1.2.3, junk"}) == DEFAULT


async def test_region_header_behind_trusted_proxies_only_from_them(make_env: Any) -> None:
    env = await make_env(api_token=TOKEN, n=1, ingress=geo(trusted_proxies=["172.16.0.0/12"]))
    hdr = {"X-Region": "eu"}
    assert await sent_candidates(env, peer="172.16.0.5", headers=hdr) == EU
    # Straight from a client (not through the CDN): the header is not believed.
    assert await sent_candidates(env, peer="10.1.2.3", headers=hdr) == US
    assert await sent_candidates(env, peer="192.0.2.200", headers=hdr) == DEFAULT


async def test_every_transceiver_tried_gets_the_same_choice(make_env: Any) -> None:
    env = await make_env(api_token=TOKEN, n=2, ingress=geo())
    env.fakes[0].create_error = {"ok": False, "status": 503, "code": "draining", "detail": "d"}
    env.fakes[1].create_error = {"ok": False, "status": 503, "code": "draining", "detail": "d"}
    resp = await env.client().post("/v1/sessions", data=OFFER.encode(),
                                   headers={**SDP, "X-Region": "eu",
                                            "Authorization": f"Bearer {TOKEN}"},
                                   scope_base={"client": ("10.1.2.3", 1)})
    assert resp.status_code == 503
    sent = [r["candidates"] for f in env.fakes.values() for r in f.requests if r["op"] == "create"]
    assert sent == [EU, EU]


# -- configuration --------------------------------------------------------------------------


def parse(argv: list[str], config: dict[str, Any] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv)
    resolve(args, config or {}, "signaling", DEFAULTS)
    return args


def test_flags_build_the_map() -> None:
    cfg, _ = build_config(parse([
        "--public-address", "198.51.100.1", "--udp-port", "3479",
        "--ingress", "eu=192.0.2.10,192.0.2.11:4000", "--ingress", "eu=192.0.2.12:3478",
        "--ingress", "us=[2001:db8::9]:3478", "--ingress-prefix", "10.0.0.0/8=eu",
        "--ingress-prefix", "2001:db8:1::/48=us", "--region-header", "CF-IPCountry",
        "--trusted-proxy", "127.0.0.1", "--trusted-proxy", "10.9.0.0/16",
    ]))
    g = cfg.ingress
    assert g.regions == {"eu": [("192.0.2.10", 3479), ("192.0.2.11", 4000), ("192.0.2.12", 3478)],
                         "us": [("2001:db8::9", 3478)]}
    assert [(str(n), r) for n, r in g.prefixes] == [("2001:db8:1::/48", "us"), ("10.0.0.0/8", "eu")]
    assert g.region_header == "CF-IPCountry"
    assert [str(n) for n in g.trusted_proxies] == ["127.0.0.1/32", "10.9.0.0/16"]


def test_toml_tables_build_the_same_map(tmp_path: Path) -> None:
    path = tmp_path / "appliance.toml"
    path.write_text(
        '[signaling]\n'
        'public_address = ["198.51.100.1"]\n'
        'region_header = "X-Region"\n'
        'trusted_proxy = ["172.16.0.0/12"]\n'
        '[signaling.ingress]\n'
        'eu = ["192.0.2.10:3478", "192.0.2.11:3479"]\n'
        'us = "203.0.113.20:3478"\n'
        '[signaling.ingress_prefix]\n'
        '"10.1.0.0/16" = "eu"\n'
    )
    cfg, _ = build_config(parse(["--config", str(path)], load_config(path)))
    g = cfg.ingress
    assert g.regions == {"eu": [("192.0.2.10", 3478), ("192.0.2.11", 3479)],
                         "us": [("203.0.113.20", 3478)]}
    assert [(str(n), r) for n, r in g.prefixes] == [("10.1.0.0/16", "eu")]
    assert g.region_header == "X-Region"
    choice = g.pick([("198.51.100.1", 3478)], peer="172.16.0.1",
                    forwarded_for=["10.1.0.9"], region=None)
    assert (choice.region, choice.reason, choice.client) == ("eu", "prefix", "10.1.0.9")
    # Flags still override the file.
    cfg2, _ = build_config(parse(["--config", str(path), "--region-header", "X-PoP"],
                                 load_config(path)))
    assert cfg2.ingress.region_header == "X-PoP"


@pytest.mark.parametrize(("kw", "message"), [
    ({"ingress": ["eu"]}, "expected KEY=VALUE"),
    ({"ingress": ["eu=relay.example.com:3478"]}, "must be an IP address"),
    ({"ingress": ["eu=0.0.0.0:3478"]}, "cannot be advertised"),
    ({"ingress": ["eu=192.0.2.1:0"]}, "port must be"),
    ({"ingress": ["e u=192.0.2.1"]}, "region"),
    ({"ingress": ["eu=192.0.2.1"], "prefixes": ["10.0.0.0/33=eu"]}, "not a CIDR"),
    ({"ingress": ["eu=192.0.2.1"], "prefixes": ["10.0.0.0/8=us"]}, "no --ingress for region"),
    ({"prefixes": ["10.0.0.0/8=eu"]}, "need at least one --ingress"),
    ({"region_header": "X-Region"}, "need at least one --ingress"),
    ({"ingress": ["eu=192.0.2.1"], "region_header": "X Region"}, "not an HTTP header"),
    ({"ingress": ["eu=192.0.2.1"], "trusted_proxies": ["proxy.local"]}, "--trusted-proxy"),
])
def test_bad_geo_config_is_a_clear_error(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_ingress_map(**kw)


def test_cli_reports_geo_errors_as_usage_errors() -> None:
    with pytest.raises(ValueError, match="no --ingress for region"):
        build_config(parse(["--public-address", "198.51.100.1",
                            "--ingress", "eu=192.0.2.1", "--ingress-prefix", "10.0.0.0/8=us"]))


def test_candidate_forms() -> None:
    assert parse_candidate("192.0.2.1", 3478) == ("192.0.2.1", 3478)
    assert parse_candidate("[2001:db8::1]", 3478) == ("2001:db8::1", 3478)
    assert parse_candidate("2001:db8::1", 3478) == ("2001:db8::1", 3478)
    assert parse_candidate("[2001:db8::1]:9", 3478) == ("2001:db8::1", 9)
    assert parse_candidate("192.0.2.1:9", 3478) == ("192.0.2.1", 9)
