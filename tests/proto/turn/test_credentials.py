"""TURN REST API credentials and the server's stateless nonces."""

from __future__ import annotations

import pytest

from appliance.proto.turn import (
    NonceCodec,
    TurnError,
    mint_rest_credential,
    parse_rest_username_untrusted,
    rest_password,
)
from appliance.proto.turn.credentials import NONCE_COOKIE


def test_rest_password_matches_an_independent_computation() -> None:
    """The vector was computed with OpenSSL, the way coturn's documentation shows it:
    ``printf '1700003600:sess1' | openssl dgst -sha1 -hmac turn-test-shared-secret -binary
    | base64``."""
    assert rest_password(b"turn-test-shared-secret", "1700003600:sess1") == \
        "C67p/DeVCUDvxYV+VMRZhPrCC/A="
    cred = mint_rest_credential(b"turn-test-shared-secret", "sess1", 1700003600)
    assert (cred.username, cred.password, cred.expiry) == (
        "1700003600:sess1", "C67p/DeVCUDvxYV+VMRZhPrCC/A=", 1700003600)
    assert "C67p" not in repr(cred)  # never printed


@pytest.mark.parametrize("ident", ["", "a:b", "x" * 129, "tab\there"])
def test_mint_refuses_bad_ids(ident: str) -> None:
    with pytest.raises(ValueError, match="REST credential id"):
        mint_rest_credential(b"s", ident, 1)


def test_parse_rest_username() -> None:
    assert parse_rest_username_untrusted("1700003600:sess1") == (1700003600, "sess1")
    assert parse_rest_username_untrusted("1700003600") == (1700003600, "")
    assert parse_rest_username_untrusted("5:a:b") == (5, "a:b")
    for bad in ("alice", ":x", "-1:x", "１２:x", "1" * 13 + ":x", "1:" + "x" * 129):
        with pytest.raises(TurnError):
            parse_rest_username_untrusted(bad)


def test_nonces_expire_and_are_bound_to_the_client() -> None:
    codec = NonceCodec(b"k", lifetime=60)
    client = ("198.51.100.7", 5000)
    n = codec.mint(1000.0, client, cookie=False)
    assert len(n) == 12
    assert codec.check(n, 1059.0, client) == ("ok", False)
    assert codec.check(n, 1060.0, client) == ("stale", False)
    assert codec.check(n, 1000.0, ("198.51.100.7", 5001)) == ("bad", False)
    assert NonceCodec(b"other", 60).check(n, 1000.0, client) == ("bad", False)
    c = codec.mint(1000.0, client, cookie=True)
    assert c.startswith(NONCE_COOKIE) and len(c) == 25
    assert codec.check(c, 1000.0, client) == ("ok", True)
    # The cookie is under the MAC: adding or removing it breaks the nonce.
    assert codec.check(NONCE_COOKIE + n, 1000.0, client)[0] == "bad"
    assert codec.check(c[len(NONCE_COOKIE):], 1000.0, client)[0] == "bad"
    for junk in ("", "!" * 12, "é" * 12, "A" * 11, NONCE_COOKIE):
        assert codec.check(junk, 1000.0, client)[0] == "bad"


def test_ice_server_and_whip_link_headers_carry_the_minted_credential() -> None:
    from appliance.proto.turn.credentials import ice_server, whip_link_headers

    cred = mint_rest_credential(b"s3cret", "sess1", 2_000_000_000)
    urls = ["turn:198.51.100.1:3478?transport=udp", "turn:198.51.100.1:3478?transport=tcp"]
    assert ice_server(cred, urls) == {
        "urls": urls,
        "username": "2000000000:sess1",
        "credential": rest_password(b"s3cret", "2000000000:sess1"),
    }
    links = whip_link_headers(cred, urls)
    assert links[0] == (
        '<turn:198.51.100.1:3478?transport=udp>; rel="ice-server"; '
        f'username="2000000000:sess1"; credential="{cred.password}"; '
        'credential-type="password"'
    )
    assert len(links) == 2


def test_turn_urls_carry_the_port_and_bracket_ipv6() -> None:
    from appliance.proto.turn.credentials import turn_urls

    assert turn_urls("203.0.113.5", 3478) == [
        "turn:203.0.113.5:3478?transport=udp",
        "turn:203.0.113.5:3478?transport=tcp",
    ]
    assert turn_urls("2001:db8::1", 443, udp=False, tls_port=443) == [
        "turn:[2001:db8::1]:443?transport=tcp",
        "turns:[2001:db8::1]:443?transport=tcp",
    ]


def test_turn_urls_take_a_tcp_port_of_their_own() -> None:
    """A load balancer may map another TCP port to the media port (--public-tcp-port)."""
    from appliance.proto.turn.credentials import turn_urls

    assert turn_urls("203.0.113.5", 3478, tcp_port=443, tls_port=443) == [
        "turn:203.0.113.5:3478?transport=udp",
        "turn:203.0.113.5:443?transport=tcp",
        "turns:203.0.113.5:443?transport=tcp",
    ]


def test_the_derived_secret_is_the_routing_secret_s_and_printable() -> None:
    from appliance.proto.turn.credentials import derive_turn_secret

    a, b = derive_turn_secret(b"routing-1"), derive_turn_secret(b"routing-2")
    assert a != b and a == derive_turn_secret(b"routing-1")
    assert len(a) == 64 and a.decode().isalnum()  # hex: usable as coturn's static-auth-secret


def test_turn_secret_files_are_read_as_coturn_reads_them() -> None:
    from appliance.proto.turn.credentials import parse_turn_secrets

    assert parse_turn_secrets(b"# rotation\n new \n\nold\n") == (b"new", b"old")
    with pytest.raises(ValueError, match="no secret"):
        parse_turn_secrets(b"# only a comment\n\n")


@pytest.mark.parametrize("url", ["turns:turn.example.com:443?transport=tcp",
                                 "turn:203.0.113.5:3478?transport=udp", "turn:[2001:db8::1]"])
def test_operator_turn_urls_are_accepted(url: str) -> None:
    from appliance.proto.turn.credentials import check_turn_url

    assert check_turn_url(url) == url


@pytest.mark.parametrize("url", ["stun:203.0.113.5", "https://x", "turn:", "turn://x",
                                 'turn:x>; rel="next"', "turn:a b", "turn:x,turn:y",
                                 "turn:h\u00e9st", "turn:" + "a" * 600])
def test_operator_turn_urls_that_could_break_a_link_header_are_refused(url: str) -> None:
    """--turn-url goes inside the <…> of a WHIP Link header and into an RTCIceServer."""
    from appliance.proto.turn.credentials import check_turn_url

    with pytest.raises(ValueError, match="turn"):
        check_turn_url(url)
