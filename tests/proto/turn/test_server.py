"""The sans-IO TURN server (appliance.proto.turn.server) on a fake clock: authentication,
Allocate/Refresh/CreatePermission/ChannelBind, data both ways, lifetimes, quotas, no open
relay, no amplification."""

from __future__ import annotations

import ipaddress

import pytest
from proto.turn.turn_client import (
    CLIENT,
    NOW,
    OWN,
    SECRET,
    SERVER,
    UNIX,
    Client,
    allocate,
    drain,
    events,
    exchange,
    learn,
    peer_data,
    relayed_of,
    server,
    transmits,
)

from appliance.proto.stun import (
    AttrType,
    Class,
    Message,
    Method,
    PasswordAlgorithm,
    long_term_key,
    verify_fingerprint,
    verify_integrity,
    verify_integrity_sha256,
)
from appliance.proto.turn import (
    AllocationCreated,
    AllocationEnded,
    encode_channel_data,
    mint_rest_credential,
)
from appliance.proto.turn.credentials import NONCE_COOKIE

# Chromium 156's first Allocate, captured (REQUESTED-TRANSPORT only, no FINGERPRINT), and
# coturn 4.6.1's turnutils_uclient's (REQUESTED-TRANSPORT, LIFETIME, FINGERPRINT).
CHROMIUM_ALLOCATE = bytes.fromhex("000300082112a44242476f7965615961557849520019000411000000")
UCLIENT_ALLOCATE = bytes.fromhex(
    "000300182112a4421bfd4f91580b2fc60b6541be0019000411000000000d000400000309"
    "802800047a80438e")


def _error(msg: Message | None) -> int | None:
    assert msg is not None
    return msg.error_code[0] if msg.error_code else None


# -- authentication ------------------------------------------------------------------------


def test_allocate_is_challenged_then_granted() -> None:
    srv, ports = server()
    c = Client()
    srv.handle_input(NOW, c.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)),
                     c.addr, c.local)
    out = drain(srv)
    assert len(out) == 1 and not srv.allocations
    challenge = c.learn(transmits(out)[0].data)
    # RFC 8489 §9.2.4: 401 with REALM and NONCE, never signed.
    assert _error(challenge) == 401
    assert c.realm == "appliance" and c.nonce
    assert not challenge.has(AttrType.MESSAGE_INTEGRITY)
    ok = allocate(srv, c)
    assert ok is not None and ok.msg_class == Class.SUCCESS
    assert relayed_of(ok) == ("192.0.2.1", 49152)
    assert ok.get(AttrType.LIFETIME) == 600
    assert ok.xor_mapped_address == CLIENT
    raw = ok.encode(integrity_key=c.key)  # re-encoded: same bytes as sent
    assert verify_integrity(raw, c.key) and verify_fingerprint(raw)
    assert [type(e) for e in events(drain(srv))] == []  # already drained by exchange
    assert srv.by_relayed[("192.0.2.1", 49152)].client == CLIENT
    assert ports.bound == [(1, ("192.0.2.1", 49152))]


def test_allocation_created_event_follows_the_answer() -> None:
    srv, _ = server()
    c = Client()
    allocate(srv, c, now=NOW)  # learns the nonce (the allocation is made on the retry)
    srv2, _ = server()
    srv2.handle_input(NOW, c.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)),
                      c.addr, c.local)
    out = drain(srv2)
    # Transmits come first, then the event (docs/style.md rule 18).
    assert [type(o).__name__ for o in out] == ["Transmit", "AllocationCreated"]
    assert out[1] == AllocationCreated(("192.0.2.1", 49152), CLIENT, SERVER)


@pytest.mark.parametrize("request_bytes", [CHROMIUM_ALLOCATE, UCLIENT_ALLOCATE],
                         ids=["chromium-156", "turnutils_uclient"])
def test_challenge_to_real_first_allocates_fits_the_amplification_bound(
        request_bytes: bytes) -> None:
    """The 401 to the smallest first Allocate a real client sends (Chromium's 28 bytes) is at
    most request + 32 bytes: what makes the 12-character realm and nonce limits."""
    srv, _ = server()
    srv.handle_input(NOW, request_bytes, CLIENT, SERVER)
    out = transmits(drain(srv))
    assert len(out) == 1
    assert len(out[0].data) <= len(request_bytes) + 32
    msg = Message.parse_untrusted(out[0].data)
    assert msg.error_code == (401, "")
    assert msg.transaction_id == request_bytes[8:20]
    assert isinstance(msg.get(AttrType.NONCE), str)
    # FINGERPRINT echoes the request's choice.
    assert msg.has(AttrType.FINGERPRINT) == (request_bytes is UCLIENT_ALLOCATE)


def test_answers_that_would_amplify_are_not_sent() -> None:
    """A 20-byte Refresh (no attributes at all) cannot get a 401 within 52 bytes: dropped
    and counted, never sent."""
    srv, _ = server()
    bare = Message(Method.REFRESH, Class.REQUEST, bytes(12)).encode(fingerprint=False)
    assert len(bare) == 20
    srv.handle_input(NOW, bare, CLIENT, SERVER)
    assert drain(srv) == []
    assert srv.counters.drops["turn-amplification"] == 1


def test_every_unauthenticated_answer_is_bounded() -> None:
    """Whatever the request (challenge, bad nonce, bad credential, 400, 420), the answer to
    an unauthenticated request is at most request + 32 bytes."""
    srv, _ = server()
    c = Client()
    bad = Client(password="wrong")
    stale = Client(nonce="obMatJos2AAABAAAAAAAAAAAA", realm="appliance")
    for client in (c, bad, stale):
        allocate(srv, client)
        for msg in client.log:
            assert msg is not None
    sizes = []
    for raw in (
        c.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),), auth=False),
        bad.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)),
        stale.request(Method.REFRESH),
        Message(Method.ALLOCATE, Class.REQUEST, bytes(12), (
            (AttrType.MESSAGE_INTEGRITY, bytes(20)),)).encode(fingerprint=False),
    ):
        srv.handle_input(NOW + 1, raw, ("203.0.113.9", 1), SERVER)
        for t in transmits(drain(srv)):
            sizes.append((len(raw), len(t.data)))
    assert sizes and all(a <= r + 32 for r, a in sizes)


def test_big_first_request_is_offered_sha256_and_can_use_it() -> None:
    """RFC 8489 §9.2.4: with room for it the 401 carries PASSWORD-ALGORITHMS and a nonce
    with the cookie; a client that picks SHA-256 and signs with MESSAGE-INTEGRITY-SHA256 is
    answered with MESSAGE-INTEGRITY-SHA256 under the SHA-256 key."""
    srv, _ = server()
    c = Client(integrity="sha256", algorithm=PasswordAlgorithm.SHA256)
    padding = ((AttrType.SOFTWARE, "a TURN client with a long SOFTWARE attribute"),)
    srv.handle_input(NOW, c.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),
                                                      *padding)), c.addr, c.local)
    c.learn(transmits(drain(srv))[0].data)
    assert c.nonce is not None and c.nonce.startswith(NONCE_COOKIE)
    assert c.offered == bytes.fromhex("0002000000010000")  # SHA-256, MD5
    ok = exchange(srv, c, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17), *padding),
                  retry=False)
    assert ok is not None and ok.msg_class == Class.SUCCESS
    assert ok.has(AttrType.MESSAGE_INTEGRITY_SHA256) and not ok.has(AttrType.MESSAGE_INTEGRITY)
    key = long_term_key(c.username, "appliance", c.password, PasswordAlgorithm.SHA256)
    assert verify_integrity_sha256(ok.encode(integrity_key=key, integrity="sha256"), key)


def test_password_algorithms_bid_down_is_refused() -> None:
    """An on-path attacker that strips SHA-256 from PASSWORD-ALGORITHMS makes the client
    echo a list that differs from what the nonce cookie promised: 400 (RFC 8489 §9.2.4)."""
    srv, _ = server()
    c = Client(algorithm=PasswordAlgorithm.MD5)
    padding = ((AttrType.SOFTWARE, "a TURN client with a long SOFTWARE attribute"),)
    srv.handle_input(NOW, c.request(Method.ALLOCATE, padding), c.addr, c.local)
    c.learn(transmits(drain(srv))[0].data)
    assert c.offered is not None
    c.offered = bytes.fromhex("00010000")  # MD5 only: the downgraded list
    assert _error(exchange(srv, c, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),),
                           retry=False)) == 400
    assert srv.counters.drops["turn-password-algorithm"] == 1


def test_sha256_integrity_with_the_md5_key_is_accepted() -> None:
    """MESSAGE-INTEGRITY-SHA256 without PASSWORD-ALGORITHM uses the MD5 key (RFC 8489
    §9.2.4: no PASSWORD-ALGORITHM(S) means MD5)."""
    srv, _ = server()
    c = Client(integrity="sha256")
    ok = allocate(srv, c)
    assert ok is not None and ok.msg_class == Class.SUCCESS
    assert ok.has(AttrType.MESSAGE_INTEGRITY_SHA256)


@pytest.mark.parametrize(("client", "reason"), [
    (Client(password="not-the-credential"), "turn-integrity"),
    (Client(username="1600000000:sess1",
            password=mint_rest_credential(SECRET, "sess1", 1600000000).password),
     "turn-expired-credential"),
    (Client(username="alice", password="x"), "turn-bad-username"),
], ids=["wrong-password", "expired", "not-rest-form"])
def test_bad_credentials_get_401_and_are_counted(client: Client, reason: str) -> None:
    srv, _ = server()
    assert _error(allocate(srv, client)) == 401
    assert not srv.allocations
    assert srv.counters.drops[reason] == 1
    assert srv.counters.counts["turn_auth_failures"] == 1


def test_wrong_realm_is_401() -> None:
    srv, _ = server()
    c = Client()
    learn(srv, c)
    c.realm = "elsewhere"  # signed with a key for another realm
    assert _error(exchange(srv, c, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),),
                           retry=False)) == 401
    assert srv.counters.drops["turn-wrong-realm"] == 1


def test_rotated_secrets_all_verify() -> None:
    srv, _ = server(secrets=(b"new-secret", SECRET))
    c = Client()  # minted with SECRET, now the second one
    assert allocate(srv, c) is not None and srv.allocations


def test_stale_nonce_is_438_with_a_new_one() -> None:
    srv, _ = server(nonce_lifetime=60.0)
    c = Client()
    allocate(srv, c)
    old = c.nonce
    # 61 s later the nonce is stale: 438 + new nonce, then the retry succeeds (RFC 8489 §9.2.4).
    msg = exchange(srv, c, Method.REFRESH, now=NOW + 61, retry=False)
    assert _error(msg) == 438 and c.nonce != old
    assert srv.counters.drops["turn-nonce-stale"] == 1
    assert exchange(srv, c, Method.REFRESH, now=NOW + 61, retry=False).msg_class == Class.SUCCESS  # type: ignore[union-attr]


def test_nonce_is_bound_to_the_client_address() -> None:
    """A nonce handed to one address is worth nothing from another (replay from a spoofed or
    rebound source gets 438)."""
    srv, _ = server()
    c = Client()
    allocate(srv, c)
    thief = Client(addr=("203.0.113.66", 4444), realm=c.realm, nonce=c.nonce)
    assert _error(exchange(srv, thief, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),),
                           retry=False)) == 438
    assert srv.counters.drops["turn-nonce-bad"] == 1


def test_unknown_comprehension_required_attribute_is_420() -> None:
    srv, _ = server()
    raw = bytearray(Message(Method.ALLOCATE, Class.REQUEST, bytes(12), (
        (AttrType.REQUESTED_TRANSPORT, 17), (AttrType.SOFTWARE, "x" * 40),
    )).encode(fingerprint=False))
    raw += b"\x7f\x01\x00\x04abcd"  # an unknown comprehension-required attribute
    raw[2:4] = (len(raw) - 20).to_bytes(2, "big")
    srv.handle_input(NOW, bytes(raw), CLIENT, SERVER)
    msg = Message.parse_untrusted(transmits(drain(srv))[0].data)
    assert msg.error_code == (420, "")
    assert msg.get(AttrType.UNKNOWN_ATTRIBUTES) == (0x7F01,)


def test_unauthenticated_answers_are_rate_limited_per_source() -> None:
    srv, _ = server(unauth_rate=10.0, unauth_burst=5.0)
    c = Client()
    raw = c.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),))
    for _ in range(8):
        srv.handle_input(NOW, raw, CLIENT, SERVER)
    assert len(transmits(drain(srv))) == 5
    assert srv.counters.drops["turn-rate-limited"] == 3
    # Another source has its own budget; the first one refills with (fake) time.
    srv.handle_input(NOW, raw, ("203.0.113.5", 1), SERVER)
    srv.handle_input(NOW + 0.1, raw, CLIENT, SERVER)
    assert len(transmits(drain(srv))) == 2


# -- Allocate ------------------------------------------------------------------------------


def test_allocate_retransmission_is_answered_again_and_another_is_437() -> None:
    srv, _ = server()
    c = Client()
    allocate(srv, c)
    tid = c.last.transaction_id  # type: ignore[union-attr]
    again = exchange(srv, c, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),), tid=tid,
                     now=NOW + 1)
    assert again is not None and again.msg_class == Class.SUCCESS
    assert relayed_of(again) == ("192.0.2.1", 49152) and again.get(AttrType.LIFETIME) == 599
    assert _error(allocate(srv, c)) == 437
    assert len(srv.allocations) == 1


@pytest.mark.parametrize(("extra", "code"), [
    ((), 400),  # no REQUESTED-TRANSPORT
    (((AttrType.REQUESTED_TRANSPORT, 6),), 442),  # TCP
    (((AttrType.REQUESTED_TRANSPORT, 17), (AttrType.REQUESTED_ADDRESS_FAMILY, 3)), 440),
    (((AttrType.REQUESTED_TRANSPORT, 17), (AttrType.EVEN_PORT, 1)), 508),  # R: reserve
    (((AttrType.REQUESTED_TRANSPORT, 17), (AttrType.RESERVATION_TOKEN, bytes(8))), 508),
    (((AttrType.REQUESTED_TRANSPORT, 17), (AttrType.RESERVATION_TOKEN, bytes(8)),
      (AttrType.REQUESTED_ADDRESS_FAMILY, 1)), 400),
    (((AttrType.REQUESTED_TRANSPORT, 17), (AttrType.REQUESTED_ADDRESS_FAMILY, 1),
      (AttrType.ADDITIONAL_ADDRESS_FAMILY, 2)), 400),
    (((AttrType.REQUESTED_TRANSPORT, 17), (AttrType.ADDITIONAL_ADDRESS_FAMILY, 1)), 400),
], ids=["no-transport", "tcp", "family-3", "even-port", "token", "token+family",
        "family+additional", "additional-v4"])
def test_allocate_refusals(extra: tuple[tuple[AttrType, object], ...], code: int) -> None:
    srv, _ = server()
    c = Client()
    learn(srv, c)
    msg = exchange(srv, c, Method.ALLOCATE, extra)  # type: ignore[arg-type]
    assert _error(msg) == code
    assert not srv.allocations
    # An error to an authenticated request is signed (RFC 8489 §9.2.4).
    assert msg is not None and msg.has(AttrType.MESSAGE_INTEGRITY)


def test_even_port_without_reservation_is_honoured() -> None:
    srv, ports = server()
    ports.bound.clear()
    next(ports.ports)  # the next one would be odd
    ok = allocate(srv, Client(), extra=((AttrType.EVEN_PORT, 0),))
    assert ok is not None and ok.msg_class == Class.SUCCESS and relayed_of(ok)[1] % 2 == 0


def test_ipv6_and_dual_allocation_requests() -> None:
    srv, ports = server()
    c = Client()
    ok = allocate(srv, c, extra=((AttrType.REQUESTED_ADDRESS_FAMILY, 2),))
    assert ok is not None and relayed_of(ok)[0] == "2001:db8::1"
    c2 = Client(addr=("198.51.100.8", 2))
    dual = allocate(srv, c2, extra=((AttrType.ADDITIONAL_ADDRESS_FAMILY, 2),))
    assert dual is not None and dual.msg_class == Class.SUCCESS
    assert relayed_of(dual)[0] == "192.0.2.1"
    # One family per allocation: the IPv6 half is refused with ADDRESS-ERROR-CODE 440.
    assert dual.get(AttrType.ADDRESS_ERROR_CODE) == bytes((2, 0, 4, 40))
    ports.full = True
    assert _error(allocate(srv, Client(addr=("198.51.100.9", 3)))) == 508
    assert _error(allocate(srv, Client(addr=("198.51.100.9", 4)),
                           extra=((AttrType.REQUESTED_ADDRESS_FAMILY, 2),))) == 440


def test_quotas_per_username_per_source_and_total() -> None:
    srv, _ = server(max_per_username=2, max_per_source=3, max_allocations=4)
    for port in (1, 2):
        assert allocate(srv, Client(addr=("198.51.100.1", port))) is not None
    assert _error(allocate(srv, Client(addr=("198.51.100.1", 3)))) == 486  # per username
    other = mint_rest_credential(SECRET, "sess2", int(UNIX) + 60)
    assert _error(allocate(srv, Client(addr=("198.51.100.1", 4), username=other.username,
                                       password=other.password))) is None
    third = mint_rest_credential(SECRET, "sess3", int(UNIX) + 60)
    assert _error(allocate(srv, Client(addr=("198.51.100.1", 5), username=third.username,
                                       password=third.password))) == 486  # per source
    assert _error(allocate(srv, Client(addr=("198.51.100.2", 1), username=third.username,
                                       password=third.password))) is None
    fourth = mint_rest_credential(SECRET, "sess4", int(UNIX) + 60)
    assert _error(allocate(srv, Client(addr=("198.51.100.3", 1), username=fourth.username,
                                       password=fourth.password))) == 508  # total
    assert len(srv.allocations) == 4
    assert srv.counters.drops["turn-quota"] == 2 and srv.counters.drops["turn-capacity"] == 1


def test_lifetimes_are_bounded_and_expire_on_the_clock() -> None:
    srv, _ = server(default_lifetime=600, max_lifetime=3600)
    c = Client()
    ok = allocate(srv, c, extra=((AttrType.LIFETIME, 10**9),))
    assert ok is not None and ok.get(AttrType.LIFETIME) == 3600
    c2 = Client(addr=("198.51.100.8", 2))
    short = allocate(srv, c2, extra=((AttrType.LIFETIME, 1),))
    assert short is not None and short.get(AttrType.LIFETIME) == 600  # never below default
    assert srv.poll_timeout() == NOW + 600
    srv.handle_timeout(NOW + 599.9)
    assert len(srv.allocations) == 2
    srv.handle_timeout(NOW + 600)
    assert [e for e in events(drain(srv))] == [
        AllocationEnded(("192.0.2.1", 49153), c2.addr, "expired")]
    assert srv.poll_timeout() == NOW + 3600
    # A refresh moves the deadline; the stale heap entry is skipped.
    refreshed = exchange(srv, c, Method.REFRESH, ((AttrType.LIFETIME, 1200),), now=NOW + 100)
    assert refreshed is not None and refreshed.get(AttrType.LIFETIME) == 1200
    assert srv.poll_timeout() == NOW + 1300
    srv.handle_timeout(NOW + 1299)
    assert len(srv.allocations) == 1
    srv.handle_timeout(NOW + 1300)
    assert not srv.allocations and not srv.by_relayed and srv.poll_timeout() is None
    assert srv.counters.counts["turn_allocations_expired"] == 2


def test_refresh_with_lifetime_zero_deletes() -> None:
    srv, _ = server()
    c = Client()
    allocate(srv, c)
    msg = exchange(srv, c, Method.REFRESH, ((AttrType.LIFETIME, 0),))
    assert msg is not None and msg.msg_class == Class.SUCCESS
    assert msg.get(AttrType.LIFETIME) == 0
    assert not srv.allocations
    # The retransmitted delete gets 437, which the client takes as success (RFC 8656 §8.3).
    assert _error(exchange(srv, c, Method.REFRESH, ((AttrType.LIFETIME, 0),))) == 437
    assert srv.counters.counts["turn_allocations_deleted"] == 1


def test_refresh_by_another_username_is_441_and_family_mismatch_443() -> None:
    srv, _ = server()
    c = Client()
    allocate(srv, c)
    other = mint_rest_credential(SECRET, "someone-else", int(UNIX) + 60)
    intruder = Client(username=other.username, password=other.password)
    learn(srv, intruder)
    assert _error(exchange(srv, intruder, Method.REFRESH)) == 441
    assert _error(exchange(srv, c, Method.REFRESH,
                           ((AttrType.REQUESTED_ADDRESS_FAMILY, 2),))) == 443


# -- permissions, channels and data ----------------------------------------------------------


def _allocated(**kw: object) -> tuple[object, Client, tuple[str, int]]:
    srv, _ = server(**kw)
    c = Client()
    ok = allocate(srv, c)
    assert ok is not None
    return srv, c, relayed_of(ok)


def test_create_permission_only_for_allowed_peers_all_or_nothing() -> None:
    srv, c, _ = _allocated()
    assert _error(exchange(srv, c, Method.CREATE_PERMISSION,  # type: ignore[arg-type]
                           ((AttrType.XOR_PEER_ADDRESS, OWN),))) is None
    # 198.51.100.20 is nobody we relay to: 403, and the allowed one in the same request is
    # not installed either.
    msg = exchange(srv, c, Method.CREATE_PERMISSION,  # type: ignore[arg-type]
                   ((AttrType.XOR_PEER_ADDRESS, ("192.0.2.1", 1)),
                    (AttrType.XOR_PEER_ADDRESS, ("198.51.100.20", 9))))
    assert _error(msg) == 403
    alloc = srv.allocations[(c.addr, c.local)]  # type: ignore[attr-defined]
    assert set(alloc.permissions) == {"192.0.2.1"}
    assert _error(exchange(srv, c, Method.CREATE_PERMISSION,  # type: ignore[arg-type]
                           ((AttrType.XOR_PEER_ADDRESS, ("2001:db8::9", 9)),))) == 443
    assert _error(exchange(srv, c, Method.CREATE_PERMISSION)) == 400  # type: ignore[arg-type]


@pytest.mark.parametrize("peer", [
    ("224.0.0.1", 5000), ("0.0.0.0", 5000), ("255.255.255.255", 5000), ("10.9.9.9", 1),
])
def test_peers_never_relayed_to(peer: tuple[str, int]) -> None:
    srv, c, _ = _allocated(peers=(ipaddress.ip_network("10.0.0.0/8"),
                                  ipaddress.ip_network("0.0.0.0/0")))
    if peer[0] == "10.9.9.9":  # inside --turn-peer: allowed; the others never are
        assert _error(exchange(srv, c, Method.CREATE_PERMISSION,  # type: ignore[arg-type]
                               ((AttrType.XOR_PEER_ADDRESS, peer),))) is None
    else:
        assert _error(exchange(srv, c, Method.CREATE_PERMISSION,  # type: ignore[arg-type]
                               ((AttrType.XOR_PEER_ADDRESS, peer),))) == 403


def test_ipv4_mapped_peer_cannot_bypass_ipv4_networks() -> None:
    srv, _ = server(peers=(ipaddress.ip_network("::/0"),))
    c = Client()
    allocate(srv, c, extra=((AttrType.REQUESTED_ADDRESS_FAMILY, 2),))
    assert _error(exchange(srv, c, Method.CREATE_PERMISSION,
                           ((AttrType.XOR_PEER_ADDRESS, ("::ffff:127.0.0.1", 6379)),))) == 403
    assert _error(exchange(srv, c, Method.CREATE_PERMISSION,
                           ((AttrType.XOR_PEER_ADDRESS, ("2001:db8::5", 1)),))) is None


def test_send_indication_relays_only_with_permission_and_to_our_media_port() -> None:
    srv, c, relayed = _allocated()
    send = c.request(Method.SEND, ((AttrType.XOR_PEER_ADDRESS, OWN), (AttrType.DATA, b"ping!")),
                     auth=False, cls=Class.INDICATION)
    srv.handle_input(NOW, send, c.addr, c.local)
    assert drain(srv) == [] and srv.counters.drops["turn-no-permission"] == 1
    exchange(srv, c, Method.CREATE_PERMISSION, ((AttrType.XOR_PEER_ADDRESS, OWN),))
    srv.handle_input(NOW, send, c.addr, c.local)
    (pd,) = peer_data(drain(srv))
    assert (pd.relayed, pd.peer, bytes(pd.data)) == (relayed, OWN, b"ping!")
    assert send[pd.offset : pd.offset + len(pd.data)] == b"ping!"
    # The permission is for our IP, but only our media port is ours to relay to: a Send to
    # another port of this host (a local service) is dropped.
    local_service = c.request(Method.SEND, ((AttrType.XOR_PEER_ADDRESS, ("192.0.2.1", 6379)),
                                            (AttrType.DATA, b"FLUSHALL\r\n")),
                              auth=False, cls=Class.INDICATION)
    srv.handle_input(NOW, local_service, c.addr, c.local)
    assert drain(srv) == [] and srv.counters.drops["turn-peer-forbidden"] == 1
    # From an address with no allocation: dropped.
    srv.handle_input(NOW, send, ("198.51.100.99", 1), c.local)
    assert drain(srv) == [] and srv.counters.drops["turn-no-allocation"] == 1


def test_permission_expires_after_300_seconds() -> None:
    srv, c, _ = _allocated()
    exchange(srv, c, Method.CREATE_PERMISSION, ((AttrType.XOR_PEER_ADDRESS, OWN),))
    send = c.request(Method.SEND, ((AttrType.XOR_PEER_ADDRESS, OWN), (AttrType.DATA, b"x")),
                     auth=False, cls=Class.INDICATION)
    srv.handle_input(NOW + 299, send, c.addr, c.local)
    assert len(peer_data(drain(srv))) == 1
    srv.handle_input(NOW + 300, send, c.addr, c.local)
    assert drain(srv) == []


def test_permission_cap() -> None:
    srv, c, _ = _allocated(peers=(ipaddress.ip_network("10.0.0.0/8"),), max_permissions=2)
    for i in (1, 2):
        assert _error(exchange(srv, c, Method.CREATE_PERMISSION,
                               ((AttrType.XOR_PEER_ADDRESS, (f"10.0.0.{i}", 1)),))) is None
    assert _error(exchange(srv, c, Method.CREATE_PERMISSION,
                           ((AttrType.XOR_PEER_ADDRESS, ("10.0.0.3", 1)),))) == 508
    # Refreshing an existing one still works; after expiry the room comes back.
    assert _error(exchange(srv, c, Method.CREATE_PERMISSION,
                           ((AttrType.XOR_PEER_ADDRESS, ("10.0.0.1", 7)),))) is None
    assert _error(exchange(srv, c, Method.CREATE_PERMISSION,
                           ((AttrType.XOR_PEER_ADDRESS, ("10.0.0.3", 1)),), now=NOW + 301)) is None


def test_channel_bind_and_channel_data_both_ways() -> None:
    srv, c, relayed = _allocated()
    bind = exchange(srv, c, Method.CHANNEL_BIND,
                    ((AttrType.CHANNEL_NUMBER, 0x4001), (AttrType.XOR_PEER_ADDRESS, OWN)))
    assert bind is not None and bind.msg_class == Class.SUCCESS
    # The binding installed the permission (RFC 8656 §11.2).
    data = encode_channel_data(0x4001, b"rtp-ish") + b"\x00"  # optional padding over UDP
    srv.handle_input(NOW, data, c.addr, c.local)
    (pd,) = peer_data(drain(srv))
    assert (pd.peer, bytes(pd.data), pd.offset) == (OWN, b"rtp-ish", 4)
    srv.from_peer(NOW, relayed, OWN, b"answer")
    (t,) = transmits(drain(srv))
    assert t.dest == c.addr and t.data == encode_channel_data(0x4001, b"answer")
    fast = srv.channel_header(NOW, relayed, OWN, 6)
    assert fast is not None and fast[1] == encode_channel_data(0x4001, b"answer")[:4]
    # Unbound channel, short datagram, reserved number: dropped and counted.
    for junk, reason in ((encode_channel_data(0x4002, b"x"), "turn-channel-unbound"),
                         (b"\x40\x01\x00\x09abc", "turn-channel-short"),
                         (b"\x80\x00\x00\x00", "turn-not-turn")):
        srv.handle_input(NOW, junk, c.addr, c.local)
        assert drain(srv) == [] and srv.counters.drops[reason] == 1


def test_data_from_peer_without_channel_is_a_data_indication() -> None:
    srv, c, relayed = _allocated()
    srv.from_peer(NOW, relayed, OWN, b"early")
    assert drain(srv) == [] and srv.counters.drops["turn-no-permission"] == 1
    exchange(srv, c, Method.CREATE_PERMISSION, ((AttrType.XOR_PEER_ADDRESS, OWN),))
    srv.from_peer(NOW, relayed, OWN, b"hello")
    (t,) = transmits(drain(srv))
    msg = Message.parse_untrusted(t.data)
    assert (msg.method, msg.msg_class) == (Method.DATA, Class.INDICATION)
    assert msg.get(AttrType.XOR_PEER_ADDRESS) == OWN and msg.get(AttrType.DATA) == b"hello"
    assert srv.channel_header(NOW, relayed, OWN, 5) is None  # no channel: the slow form
    srv.from_peer(NOW, ("192.0.2.1", 1), OWN, b"x")
    assert drain(srv) == [] and srv.counters.drops["turn-no-allocation"] == 1


def test_stream_clients_get_padded_channel_data() -> None:
    srv, _ = server()
    c = Client()
    learn(srv, c)
    srv.handle_input(NOW, c.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)),
                     c.addr, c.local, stream=True)
    relayed = relayed_of(c.learn(transmits(drain(srv))[0].data))
    exchange(srv, c, Method.CHANNEL_BIND,
             ((AttrType.CHANNEL_NUMBER, 0x4000), (AttrType.XOR_PEER_ADDRESS, OWN)))
    srv.from_peer(NOW, relayed, OWN, b"abcde")
    (t,) = transmits(drain(srv))
    assert t.data == encode_channel_data(0x4000, b"abcde", pad=True) and len(t.data) == 12
    assert srv.channel_header(NOW, relayed, OWN, 5) is None  # padding needed: slow form


def test_closing_a_stream_client_deletes_its_allocation() -> None:
    srv, _ = server()
    c = Client()
    learn(srv, c)
    srv.handle_input(NOW, c.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)),
                     c.addr, c.local, stream=True)
    relayed = relayed_of(c.learn(transmits(drain(srv))[0].data))
    srv.close(NOW, ("203.0.113.50", 1), c.local)  # someone else's connection: nothing
    assert srv.allocations
    srv.close(NOW, c.addr, c.local)
    assert events(drain(srv)) == [AllocationEnded(relayed, c.addr, "closed")]
    assert not srv.allocations and srv.counters.counts["turn_allocations_closed"] == 1


@pytest.mark.parametrize("number", [0x3FFF, 0x8000, 0xFFFF])
def test_channel_numbers_outside_the_range_are_400(number: int) -> None:
    srv, c, _ = _allocated()
    assert _error(exchange(srv, c, Method.CHANNEL_BIND,  # type: ignore[arg-type]
                           ((AttrType.CHANNEL_NUMBER, number),
                            (AttrType.XOR_PEER_ADDRESS, OWN)))) == 400


def test_rfc5766_channel_numbers_are_accepted() -> None:
    """coturn's turnutils_uclient binds channels at random in 0x4000-0x7FFF (RFC 5766 §11);
    RFC 8656 narrowed that to 0x4FFF for QUIC's sake, which this port does not carry."""
    srv, c, relayed = _allocated()
    assert _error(exchange(srv, c, Method.CHANNEL_BIND,  # type: ignore[arg-type]
                           ((AttrType.CHANNEL_NUMBER, 0x7860),
                            (AttrType.XOR_PEER_ADDRESS, OWN)))) is None
    srv.handle_input(NOW, encode_channel_data(0x7860, b"x"), c.addr, c.local)  # type: ignore[attr-defined]
    assert len(peer_data(drain(srv))) == 1  # type: ignore[arg-type]


def test_channel_bind_to_our_ip_on_another_port_is_403() -> None:
    srv, c, _ = _allocated()
    assert _error(exchange(srv, c, Method.CHANNEL_BIND,  # type: ignore[arg-type]
                           ((AttrType.CHANNEL_NUMBER, 0x4000),
                            (AttrType.XOR_PEER_ADDRESS, ("192.0.2.1", 22))))) == 403


def test_channel_rebinding_rules() -> None:
    """RFC 8656 §12: while bound and for 5 minutes after it expires, a channel number stays
    with its peer and the peer with its number; refreshing the same pair is fine."""
    peer2 = ("10.0.0.2", 5000)
    srv, c, _ = _allocated(peers=(ipaddress.ip_network("10.0.0.0/8"),))

    def bind(number: int, peer: tuple[str, int], now: float) -> int | None:
        return _error(exchange(srv, c, Method.CHANNEL_BIND,  # type: ignore[arg-type]
                               ((AttrType.CHANNEL_NUMBER, number),
                                (AttrType.XOR_PEER_ADDRESS, peer)), now=now))

    assert bind(0x4000, OWN, NOW) is None
    assert bind(0x4000, peer2, NOW) == 400  # number taken by another peer
    assert bind(0x4001, OWN, NOW) == 400  # peer already has another number
    assert bind(0x4000, OWN, NOW + 500) is None  # refresh: bound until NOW + 1100
    data = encode_channel_data(0x4000, b"x")
    srv.handle_input(NOW + 1099, data, c.addr, c.local)  # type: ignore[attr-defined]
    assert len(peer_data(drain(srv))) == 0  # permission (300 s) ran out first
    exchange(srv, c, Method.CREATE_PERMISSION, ((AttrType.XOR_PEER_ADDRESS, OWN),),
             now=NOW + 1099)
    srv.handle_input(NOW + 1099, data, c.addr, c.local)  # type: ignore[attr-defined]
    assert len(peer_data(drain(srv))) == 1
    srv.handle_input(NOW + 1100, data, c.addr, c.local)  # type: ignore[attr-defined]
    assert drain(srv) == []  # the binding expired
    assert bind(0x4000, peer2, NOW + 1399) == 400  # still in its cooldown
    assert bind(0x4000, peer2, NOW + 1400) is None  # free again
    assert srv.counters.drops["turn-channel-conflict"] == 3  # type: ignore[attr-defined]


def test_channel_cap() -> None:
    srv, c, _ = _allocated(peers=(ipaddress.ip_network("10.0.0.0/8"),), max_channels=2)
    for i in range(2):
        assert _error(exchange(srv, c, Method.CHANNEL_BIND,  # type: ignore[arg-type]
                               ((AttrType.CHANNEL_NUMBER, 0x4000 + i),
                                (AttrType.XOR_PEER_ADDRESS, ("10.0.0.1", 100 + i))))) is None
    assert _error(exchange(srv, c, Method.CHANNEL_BIND,  # type: ignore[arg-type]
                           ((AttrType.CHANNEL_NUMBER, 0x4002),
                            (AttrType.XOR_PEER_ADDRESS, ("10.0.0.1", 102))))) == 508


def test_requests_on_a_missing_allocation_are_437() -> None:
    srv, _ = server()
    c = Client()
    learn(srv, c)
    for method, attrs in ((Method.REFRESH, ()),
                          (Method.CREATE_PERMISSION, ((AttrType.XOR_PEER_ADDRESS, OWN),)),
                          (Method.CHANNEL_BIND, ((AttrType.CHANNEL_NUMBER, 0x4000),
                                                 (AttrType.XOR_PEER_ADDRESS, OWN)))):
        assert _error(exchange(srv, c, method, attrs)) == 437  # type: ignore[arg-type]


def test_state_stays_bounded_under_an_allocation_flood() -> None:
    """Many sources and usernames allocating as fast as they can: the table stops at the
    cap, every refusal is counted, and expiry frees everything."""
    srv, _ = server(max_allocations=50, max_per_source=3, max_per_username=2)
    for i in range(300):
        cred = mint_rest_credential(SECRET, f"u{i}", int(UNIX) + 60)
        allocate(srv, Client(addr=(f"198.51.{i % 7}.{i % 250 + 1}", i), username=cred.username,
                             password=cred.password))
    assert len(srv.allocations) == 50 == len(srv.by_relayed)
    assert srv.counters.counts["turn_allocations_created"] == 50
    srv.handle_timeout(NOW + 10_000)
    assert not srv.allocations and not srv._per_source and not srv._per_user


def test_junk_is_dropped_quietly() -> None:
    srv, c, _ = _allocated()
    for junk in (b"", b"\x80\x00", b"\x00\x03\x00", b"\x17\x03", c.request(Method.BINDING),
                 Message(Method.ALLOCATE, Class.SUCCESS, bytes(12)).encode()):
        srv.handle_input(NOW, junk, c.addr, c.local)  # type: ignore[attr-defined]
    assert drain(srv) == []  # type: ignore[arg-type]
