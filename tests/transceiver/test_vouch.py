"""Flow vouching, transceiver side (appliance.transceiver.vouch, issue 20): answer only for
a client a live session authenticated, at the public address the relay names."""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.proto.proxy.vouch import Kind, Vouch, derive_key, encode, parse_untrusted
from appliance.transceiver.vouch import VouchResponder

SECRET = b"routing-secret-0123456789abcdef"
KEY = derive_key(SECRET)
CLIENT = ("203.0.113.9", 40000)
PUBLIC = ("198.51.100.1", 3478)
OLD, NEW = ("127.0.0.1", 5000), ("127.0.0.1", 5001)


@dataclass
class FakeFlow:
    public: tuple[str, int]
    relay: tuple[str, int]


@dataclass
class FakeCall:
    flows: dict[tuple[str, int], FakeFlow] = field(default_factory=dict)


@dataclass
class FakeSession:
    call: FakeCall


def responder() -> tuple[VouchResponder, list[tuple[bytes, tuple[str, int]]], FakeFlow]:
    flow = FakeFlow(PUBLIC, OLD)
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
