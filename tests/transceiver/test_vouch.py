"""Flow vouching, transceiver side (appliance.transceiver.vouch, issue 20): answer only for
a client a live session authenticated, at the public address the relay names."""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.proto.proxy.vouch import Kind, Vouch, derive_key, encode, parse_untrusted
from appliance.transceiver.call import Flow
from appliance.transceiver.vouch import VouchResponder

SECRET = b"routing-secret-0123456789abcdef"
KEY = derive_key(SECRET)
CLIENT = ("203.0.113.9", 40000)
PUBLIC = ("198.51.100.1", 3478)
OLD, NEW = ("127.0.0.1", 5000), ("127.0.0.1", 5001)


@dataclass
class FakeCall:
    flows: dict[tuple[str, int], Flow] = field(default_factory=dict)


@dataclass
class FakeSession:
    call: FakeCall


def responder() -> tuple[VouchResponder, list[tuple[bytes, tuple[str, int]]], Flow]:
    flow = Flow(CLIENT, PUBLIC, OLD)
    sent: list[tuple[bytes, tuple[str, int]]] = []
    by_client = {CLIENT: FakeSession(FakeCall({CLIENT: flow}))}
    counters: dict[str, int] = {}
    r = VouchResponder(2, [SECRET], by_client, lambda d, a: sent.append((d, a)), counters)  # type: ignore[arg-type]
    return r, sent, flow


def query(**kw: object) -> bytes:
    fields = {"kind": Kind.QUERY, "client": CLIENT, "public": PUBLIC, "transceiver": 2,
              "nonce": b"nonce-01", **kw}
    return encode(Vouch(**fields), KEY)  # type: ignore[arg-type]


def test_vouches_for_its_client_and_points_return_traffic_at_the_asker() -> None:
    r, sent, flow = responder()
    r.handle_datagram(query(), NEW)
    [(data, to)] = sent
    assert to == NEW and flow.relay == NEW
    assert parse_untrusted(data, [KEY]) == Vouch(Kind.VOUCH, CLIENT, PUBLIC, 2, b"nonce-01")
    assert r.counters["vouch_answers"] == 1


def test_silence_for_anything_else() -> None:
    r, sent, flow = responder()
    r.handle_datagram(query(client=("203.0.113.9", 1)), NEW)  # not our client
    r.handle_datagram(query(public=("198.51.100.1", 1)), NEW)  # not its public address
    r.handle_datagram(query(transceiver=3), NEW)  # asked of another transceiver
    r.handle_datagram(query(kind=Kind.VOUCH), NEW)
    r.handle_datagram(encode(Vouch(Kind.QUERY, CLIENT, PUBLIC, 2, b"nonce-01"),
                             derive_key(b"not our secret")), NEW)
    assert sent == [] and flow.relay == OLD
    assert r.counters["drop_vouch"] == 3 and r.counters["vouch_answers"] == 0
    assert r.counters["vouch_refused"] == 2 == r.counters["vouch_queries"]


def test_what_was_sent_since_the_old_worker_was_heard_goes_again_through_the_asker() -> None:
    """Regression (issue 41 item 2): a worker asks because it has no flow for the client —
    it was just started after the one that had it died, and what we sent that one since we
    last heard from it (the echo of the client's last packets) may have died with it. It is
    sent again through the asker, oldest first, before the answer releases the client's
    held packets (tests/transceiver/test_relay_move.py has the call's side)."""
    r, sent, flow = responder()
    flow.unconfirmed.extend([b"srtp-41", b"srtp-42"])
    r.handle_datagram(query(), NEW)
    assert sent[:2] == [(flow.header + b"srtp-41", NEW), (flow.header + b"srtp-42", NEW)]
    (answer, to), = sent[2:]
    assert to == NEW and parse_untrusted(answer, [KEY]).kind is Kind.VOUCH
    assert flow.relay == NEW and not flow.unconfirmed
    assert r.counters["vouch_resent"] == 2
    # A second worker asking (a reshuffle) has nothing more to be sent.
    r.handle_datagram(query(nonce=b"nonce-02"), OLD)
    assert len(sent) == 4 and r.counters["vouch_resent"] == 2
