"""IceLiteAgent on a virtual clock: answers, authentication, nomination, NAT rebinding,
consent freshness, ICE restart, and fuzzing of ``handle_input``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.errors import LocalProtocolError
from appliance.proto.ice import (
    AuthFailure,
    CheckReceived,
    ConsentExpired,
    IceEvent,
    IceLiteAgent,
    IceState,
    Nominated,
)
from appliance.proto.stun import (
    AttrType,
    Class,
    Message,
    Method,
    binding_request,
    binding_success,
    fingerprint_value,
    message_integrity,
    verify_fingerprint,
    verify_integrity,
)

LUFRAG, LPWD = "srvU", "server-password-0123456789"
RUFRAG, RPWD = "cliU", "client-password-0123456789"
CLIENT = ("198.51.100.7", 50000)
REBOUND = ("198.51.100.7", 50123)
V6 = ("2001:db8::7", 40000)


def agent(consent_timeout: float = 30.0, max_401_per_second: int = 10) -> IceLiteAgent:
    return IceLiteAgent(
        LUFRAG, LPWD, RUFRAG, RPWD, consent_timeout, max_401_per_second=max_401_per_second
    )


_counter = iter(range(1, 1 << 30))


def check(
    *,
    username: str = f"{LUFRAG}:{RUFRAG}",
    password: str = LPWD,
    use_candidate: bool = False,
    controlled: bool = False,
) -> tuple[bytes, bytes]:
    tid = next(_counter).to_bytes(12, "big")
    raw = binding_request(
        tid,
        username=username,
        password=password,
        priority=1,
        controlling=None if controlled else 42,
        controlled=42 if controlled else None,
        use_candidate=use_candidate,
    )
    return tid, raw


def drain(a: IceLiteAgent) -> tuple[list[tuple[bytes, tuple[str, int]]], list[IceEvent]]:
    out = []
    while (t := a.poll_transmit()) is not None:
        out.append(t)
    events = []
    while (e := a.poll_event()) is not None:
        events.append(e)
    return out, events


@pytest.mark.parametrize("addr", [CLIENT, V6])
def test_check_answered_with_mapped_address_and_integrity(addr: tuple[str, int]) -> None:
    a = agent()
    tid, raw = check()
    a.handle_input(0.0, raw, addr)
    out, events = drain(a)
    assert len(out) == 1
    resp, dest = out[0]
    assert dest == addr
    msg = Message.parse_untrusted(resp)
    assert msg.msg_class is Class.SUCCESS
    assert msg.transaction_id == tid
    assert msg.xor_mapped_address == addr
    assert verify_integrity(resp, LPWD.encode())
    assert verify_fingerprint(resp)
    assert events == [CheckReceived(addr, False)]
    assert a.state is IceState.CONNECTED
    assert a.checks_ok == 1
    assert a.selected is None


def test_check_received_reported_on_change_only() -> None:
    a = agent()
    for _ in range(3):
        a.handle_input(0.0, check()[1], CLIENT)
    _, events = drain(a)
    assert events == [CheckReceived(CLIENT, False)]
    assert a.checks_ok == 3


def test_wrong_password_gets_401_and_no_nomination() -> None:
    a = agent()
    tid, raw = check(password="wrong", use_candidate=True)
    a.handle_input(0.0, raw, CLIENT)
    out, events = drain(a)
    assert len(out) == 1
    msg = Message.parse_untrusted(out[0][0])
    assert msg.transaction_id == tid
    assert msg.error_code == (401, "Unauthorized")
    assert not msg.has(AttrType.MESSAGE_INTEGRITY)  # RFC 8489 §9.1.3
    assert events == [AuthFailure(CLIENT, "bad MESSAGE-INTEGRITY")]
    assert a.selected is None
    assert a.state is IceState.NEW
    assert a.auth_failures == 1
    assert a.poll_timeout() is None  # a failed check does not start consent


def test_wrong_remote_ufrag_is_an_auth_failure() -> None:
    a = agent()
    a.handle_input(0.0, check(username=f"{LUFRAG}:other")[1], CLIENT)
    out, events = drain(a)
    assert Message.parse_untrusted(out[0][0]).error_code == (401, "Unauthorized")
    assert events == [AuthFailure(CLIENT, "wrong remote ufrag")]


def test_remote_ufrag_unchecked_when_unknown() -> None:
    a = IceLiteAgent(LUFRAG, LPWD)
    a.handle_input(0.0, check(username=f"{LUFRAG}:anything")[1], CLIENT)
    assert a.checks_ok == 1
    a.set_remote_credentials("cliU")
    a.handle_input(0.0, check(username=f"{LUFRAG}:anything")[1], CLIENT)
    assert a.auth_failures == 1


def test_401_answers_are_rate_limited() -> None:
    a = agent(max_401_per_second=3)
    for i in range(10):
        a.handle_input(i * 0.01, check(password="bad")[1], CLIENT)
    out, events = drain(a)
    assert len(out) == 3
    assert len(events) == 10 and a.auth_failures == 10
    a.handle_input(1.5, check(password="bad")[1], CLIENT)
    assert len(drain(a)[0]) == 1


@pytest.mark.parametrize("username", ["nope:cliU", "srvUx:cliU", "srvU", ""])
def test_unknown_ufrag_dropped_silently(username: str) -> None:
    a = agent()
    a.handle_input(0.0, check(username=username, use_candidate=True)[1], CLIENT)
    assert drain(a) == ([], [])
    assert a.unknown_ufrag == 1
    assert a.state is IceState.NEW


def test_missing_fingerprint_or_junk_dropped() -> None:
    a = agent()
    tid = bytes(12)
    no_fp = binding_request(tid, username=f"{LUFRAG}:{RUFRAG}", password=LPWD, fingerprint=False)
    a.handle_input(0.0, no_fp, CLIENT)
    a.handle_input(0.0, b"\x16\xfe\xfd garbage", CLIENT)
    assert drain(a) == ([], [])
    assert a.malformed == 2


def test_responses_and_indications_ignored() -> None:
    a = agent()
    indication = Message(Method.BINDING, Class.INDICATION, bytes(12)).encode()
    a.handle_input(0.0, indication, CLIENT)
    a.handle_input(0.0, binding_success(bytes(12), CLIENT, integrity_key=b"x"), CLIENT)
    assert drain(a) == ([], [])
    assert a.ignored == 2


def test_role_conflict_answered_487() -> None:
    a = agent()
    tid, raw = check(controlled=True)
    a.handle_input(0.0, raw, CLIENT)
    out, events = drain(a)
    msg = Message.parse_untrusted(out[0][0])
    assert msg.error_code == (487, "Role Conflict")
    assert verify_integrity(out[0][0], LPWD.encode())
    assert events == []
    assert a.role_conflicts == 1


def _sign(plain: bytes, key: bytes) -> bytes:
    """Append MESSAGE-INTEGRITY and FINGERPRINT to hand-built bytes (for attributes our
    encoder refuses to write)."""
    out = plain + b"\x00\x08\x00\x14" + message_integrity(plain, key)
    out = out[:2] + (len(out) - 12).to_bytes(2, "big") + out[4:]  # length incl. FINGERPRINT
    return out + b"\x80\x28\x00\x04" + fingerprint_value(out).to_bytes(4, "big")


def test_unknown_required_attribute_answered_420() -> None:
    a = agent()
    unsigned = Message.parse_untrusted(check()[1]).encode(fingerprint=False)  # no MI/FP
    body = unsigned[20:] + b"\x77\x77\x00\x00"  # unknown comprehension-required, empty
    plain = unsigned[:2] + len(body).to_bytes(2, "big") + unsigned[4:20] + body
    raw = _sign(plain, LPWD.encode())
    assert Message.parse_untrusted(raw).unknown_required == (0x7777,)
    a.handle_input(0.0, raw, CLIENT)
    out, _ = drain(a)
    resp = Message.parse_untrusted(out[0][0])
    assert resp.error_code == (420, "Unknown Attribute")
    assert resp.get(AttrType.UNKNOWN_ATTRIBUTES) == (0x7777,)
    assert verify_integrity(out[0][0], LPWD.encode())
    assert a.unknown_attributes == 1


def test_use_candidate_nominates() -> None:
    a = agent()
    a.handle_input(1.0, check(use_candidate=True)[1], CLIENT)
    _, events = drain(a)
    assert events == [CheckReceived(CLIENT, True), Nominated(CLIENT)]
    assert a.state is IceState.NOMINATED
    assert a.selected == CLIENT
    # Repeated nominations of the same pair are not re-reported.
    a.handle_input(2.0, check(use_candidate=True)[1], CLIENT)
    a.handle_input(3.0, check()[1], CLIENT)
    _, events = drain(a)
    assert events == [CheckReceived(CLIENT, False)]
    assert a.state is IceState.NOMINATED
    assert a.nominations == 1


def test_nat_rebinding_moves_selected_pair() -> None:
    """Regression scenario: the client's NAT rebinds its port mid-session; the browser's
    next nominating check comes from the new port and media must follow it."""
    a = agent()
    a.handle_input(0.0, check(use_candidate=True)[1], CLIENT)
    drain(a)
    # A plain check from the new port is answered but does not move media...
    a.handle_input(5.0, check()[1], REBOUND)
    out, events = drain(a)
    assert Message.parse_untrusted(out[0][0]).xor_mapped_address == REBOUND
    assert events == [CheckReceived(REBOUND, False)]
    assert a.selected == CLIENT
    # ...a nomination does.
    a.handle_input(6.0, check(use_candidate=True)[1], REBOUND)
    _, events = drain(a)
    assert events == [CheckReceived(REBOUND, True), Nominated(REBOUND)]
    assert a.selected == REBOUND
    assert a.poll_timeout() == 36.0  # consent now follows the new pair


def test_consent_expires_at_exactly_30s() -> None:
    a = agent()
    a.handle_input(10.0, check(use_candidate=True)[1], CLIENT)
    drain(a)
    assert a.poll_timeout() == 40.0
    a.handle_timeout(39.999)
    assert a.state is IceState.NOMINATED
    assert drain(a)[1] == []
    a.handle_timeout(40.0)
    assert a.state is IceState.CLOSED
    assert drain(a)[1] == [ConsentExpired()]
    assert a.poll_timeout() is None
    # Closed is terminal: later checks are dropped unanswered.
    a.handle_input(41.0, check(use_candidate=True)[1], CLIENT)
    assert drain(a) == ([], [])
    assert a.dropped_closed == 1


def test_consent_refreshed_by_later_checks() -> None:
    a = agent()
    a.handle_input(0.0, check(use_candidate=True)[1], CLIENT)
    for t in (5.0, 10.0, 29.0):
        a.handle_input(t, check()[1], CLIENT)
        a.handle_timeout(t)
    assert a.poll_timeout() == 59.0
    a.handle_timeout(58.9)
    assert a.state is IceState.NOMINATED
    a.handle_timeout(59.0)
    assert a.state is IceState.CLOSED


def test_consent_not_refreshed_by_other_address_or_bad_checks() -> None:
    a = agent()
    a.handle_input(0.0, check(use_candidate=True)[1], CLIENT)
    a.handle_input(20.0, check()[1], REBOUND)  # valid, but not the selected pair
    a.handle_input(25.0, check(password="bad")[1], CLIENT)  # not authenticated
    a.handle_timeout(30.0)
    assert a.state is IceState.CLOSED


def test_late_check_cannot_resurrect_expired_session() -> None:
    a = agent()
    a.handle_input(0.0, check(use_candidate=True)[1], CLIENT)
    drain(a)
    a.handle_input(30.5, check()[1], CLIENT)  # shell was late calling handle_timeout
    out, events = drain(a)
    assert out == []
    assert events == [ConsentExpired()]


def test_consent_before_nomination() -> None:
    a = agent(consent_timeout=10.0)
    assert a.poll_timeout() is None
    a.handle_input(1.0, check()[1], CLIENT)
    assert a.poll_timeout() == 11.0
    a.handle_timeout(11.0)
    assert drain(a)[1][-1] == ConsentExpired()


def test_ice_restart_keeps_session_and_renominates() -> None:
    a = agent()
    a.handle_input(0.0, check(use_candidate=True)[1], CLIENT)
    drain(a)
    a.restart("newU", "new-password-0123456789", "cli2", "client-password-2")
    assert a.state is IceState.NOMINATED and a.selected == CLIENT
    # Old credentials are no longer ours: dropped without an answer.
    a.handle_input(1.0, check(use_candidate=True)[1], CLIENT)
    assert drain(a) == ([], [])
    assert a.unknown_ufrag == 1
    # New credentials: answered, and the nomination is reported again, same address.
    tid, raw = check(username="newU:cli2", password="new-password-0123456789", use_candidate=True)
    a.handle_input(2.0, raw, CLIENT)
    out, events = drain(a)
    assert verify_integrity(out[0][0], b"new-password-0123456789")
    assert events == [CheckReceived(CLIENT, True), Nominated(CLIENT)]
    assert a.poll_timeout() == 32.0


def test_restart_and_close_rules() -> None:
    a = agent()
    with pytest.raises(LocalProtocolError):
        a.restart("bad:ufrag", "pw")
    a.close()
    assert a.state is IceState.CLOSED
    with pytest.raises(LocalProtocolError):
        a.restart("ok", "pw")
    with pytest.raises(LocalProtocolError):
        IceLiteAgent("", "pw")


@given(st.binary(max_size=150))
def test_handle_input_never_raises(data: bytes) -> None:
    a = agent()
    a.handle_input(0.0, data, CLIENT)
    out, _ = drain(a)
    assert out == []  # random bytes never earn an answer


@given(st.integers(0, 200), st.integers(0, 255), st.booleans())
def test_mutated_checks_never_raise(pos: int, value: int, nominate: bool) -> None:
    a = agent()
    raw = bytearray(check(use_candidate=nominate)[1])
    raw[pos % len(raw)] = value
    a.handle_input(0.0, bytes(raw), CLIENT)
    out, _ = drain(a)
    for resp, dest in out:
        assert dest == CLIENT
        assert len(resp) <= len(raw) + 32  # never a meaningful amplifier


# -- cost limit before parsing (password-guessing storms) --------------------------------

def _storm(a: IceLiteAgent, t0: float, t1: float, per_second: int, ip: str = "203.0.113.9") -> None:
    """Wrong-password checks from many spoofed ports of ``ip``, evenly spread in [t0, t1)."""
    n = int((t1 - t0) * per_second)
    for i in range(n):
        a.handle_input(t0 + i / per_second, check(password="guess")[1], (ip, 1024 + i % 5000))


def test_guessing_storm_is_dropped_before_parsing_within_budget() -> None:
    a = agent()
    a.handle_input(0.0, check(use_candidate=True)[1], CLIENT)
    drain(a)
    _storm(a, 1.0, 3.0, 5000)  # 10,000 guesses in 2 s
    out, events = drain(a)
    # Only the budget (20 per second, a burst of 20 first) reaches parsing and the HMAC.
    assert a.auth_failures <= 20 + 2 * 20 + 1
    assert a.rate_limited == 10_000 - a.auth_failures
    assert len(events) == a.auth_failures  # no AuthFailure per dropped guess
    assert len(out) <= 10 * 2 + 10  # and the 401 limit still applies on top
    # The selected address is never limited: consent and media carry on.
    a.handle_input(3.0, check()[1], CLIENT)
    assert a.checks_ok == 2 and a.state is IceState.NOMINATED and a.poll_timeout() == 33.0


def test_port_rebinding_nominates_during_a_storm_from_other_ips() -> None:
    """NAT rebinding: same IP, new port. Its checks use the bucket of verified IPs, which a
    storm from other IPs cannot drain, so it nominates on its very first check."""
    a = agent()
    a.handle_input(0.0, check(use_candidate=True)[1], CLIENT)
    drain(a)
    _storm(a, 1.0, 2.0, 10_000)
    a.handle_input(2.0, check(use_candidate=True)[1], REBOUND)
    _, events = drain(a)
    assert Nominated(REBOUND) in events and a.selected == REBOUND
    # Once verified, the new address is trusted: the storm goes on, it is never limited.
    _storm(a, 2.0, 3.0, 10_000)
    before = a.checks_ok
    for i in range(50):
        a.handle_input(3.0 + i * 0.01, check()[1], REBOUND)
    assert a.checks_ok == before + 50


def test_new_ip_nominates_at_once_without_a_storm() -> None:
    a = agent()
    a.handle_input(0.0, check(use_candidate=True)[1], CLIENT)
    drain(a)
    moved = ("192.0.2.44", 6000)  # e.g. Wi-Fi to LTE: a new IP
    a.handle_input(5.0, check(use_candidate=True)[1], moved)
    assert a.selected == moved and a.rate_limited == 0


def test_new_ip_during_a_storm_competes_for_the_shared_budget() -> None:
    """The documented trade-off: a new IP during a storm on its own session gets the shared
    budget's share; once the storm stops, the bucket refills within a second."""
    a = agent()
    a.handle_input(0.0, check(use_candidate=True)[1], CLIENT)
    drain(a)
    moved = ("192.0.2.44", 6000)
    _storm(a, 1.0, 2.0, 10_000)
    a.handle_input(2.0, check(use_candidate=True)[1], moved)
    assert a.selected == CLIENT  # dropped: the storm spent the shared budget
    a.handle_input(3.0, check(use_candidate=True)[1], moved)  # 1 s after the storm
    assert a.selected == moved


def test_first_sources_before_nomination_are_never_limited() -> None:
    a = IceLiteAgent(LUFRAG, LPWD, RUFRAG, RPWD, unverified_checks_per_second=1,
                     trusted_sources=2)
    first, second = ("198.51.100.1", 1), ("198.51.100.2", 2)
    for i in range(30):
        a.handle_input(i * 0.001, check(password="bad")[1], first)
        a.handle_input(i * 0.001, check()[1], second)
    assert a.rate_limited == 0 and a.checks_ok == 30 and a.auth_failures == 30
    third = ("198.51.100.3", 3)
    for i in range(30):
        a.handle_input(0.1 + i * 0.001, check(password="bad")[1], third)
    assert a.rate_limited == 29  # one token (burst 1), then over budget
    # After nomination the unverified early source loses its exemption.
    a.handle_input(1.0, check(use_candidate=True)[1], second)
    for _ in range(5):
        a.handle_input(2.0, check(password="bad")[1], first)
    assert a.rate_limited == 29 + 4  # the refilled token, then over budget


def test_verified_addresses_survive_restart_and_are_capped() -> None:
    a = IceLiteAgent(LUFRAG, LPWD, RUFRAG, RPWD, unverified_checks_per_second=1,
                     trusted_sources=0)
    a.handle_input(0.0, check(use_candidate=True)[1], CLIENT)
    a.restart("srv2", "new-password-0123456789", "cli2")
    # Old credentials are dropped, but the address is still trusted (parsed, not limited).
    for _ in range(5):
        a.handle_input(1.0, check()[1], CLIENT)
    assert a.unknown_ufrag == 5 and a.rate_limited == 0
    # The first check with the new credentials comes from the selected address: it stays.
    a.handle_input(1.5, check(username="srv2:cli2", password="new-password-0123456789")[1],
                   CLIENT)
    # A flood of verified addresses cannot push the selected one out of the trusted set.
    for i in range(40):
        addr = (f"198.51.100.{i + 10}", 9)
        a.handle_input(2.0 + i, check(username="srv2:cli2",
                                         password="new-password-0123456789")[1], addr)
    assert len(a._verified) <= 8 and CLIENT in a._verified
    assert a.selected == CLIENT


def test_after_a_restart_the_first_new_check_takes_media_before_the_nomination() -> None:
    """A client restarts ICE because it lost its pair (docs/turn.md): the first check with
    the new credentials moves media to its address at once (reported as ``Nominated``);
    the nomination that follows is reported too; no other check moves it before that."""
    moved, other = ("198.51.100.7", 4000), ("198.51.100.8", 4001)
    a = agent()
    a.handle_input(0.0, check(use_candidate=True)[1], CLIENT)
    drain(a)
    a.restart("newU", "new-password-0123456789", "cli2", "client-password-2")
    new = {"username": "newU:cli2", "password": "new-password-0123456789"}
    a.handle_input(1.0, check(**new)[1], moved)
    assert drain(a)[1] == [CheckReceived(moved, False), Nominated(moved)]
    assert a.selected == moved and a.nominations == 1 and a.poll_timeout() == 31.0
    a.handle_input(1.1, check(**new)[1], other)  # once per restart
    assert drain(a)[1] == [CheckReceived(other, False)] and a.selected == moved
    a.handle_input(1.2, check(use_candidate=True, **new)[1], moved)
    assert drain(a)[1] == [CheckReceived(moved, True), Nominated(moved)]
    assert a.nominations == 2
    # No restart, no early move: a new address's plain check is only a check.
    a.handle_input(2.0, check(**new)[1], other)
    assert drain(a)[1] == [] and a.selected == moved


def test_a_restart_before_any_nomination_moves_nothing_early() -> None:
    a = agent()
    a.handle_input(0.0, check()[1], CLIENT)
    drain(a)
    a.restart("newU", "new-password-0123456789", "cli2", "client-password-2")
    a.handle_input(1.0, check(username="newU:cli2", password="new-password-0123456789")[1],
                   CLIENT)
    assert drain(a)[1] == [CheckReceived(CLIENT, False)] and a.selected is None


def test_cost_limit_arguments_checked() -> None:
    with pytest.raises(LocalProtocolError):
        IceLiteAgent(LUFRAG, LPWD, unverified_checks_per_second=0)
    with pytest.raises(LocalProtocolError):
        IceLiteAgent(LUFRAG, LPWD, trusted_sources=-1)
