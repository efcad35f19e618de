"""A small TURN client for the tests, importable as ``proto.turn.turn_client``: builds the
requests a browser's TURN client sends (RFC 8656 §7-§12) on our STUN codec, remembers the
realm and nonce a 401/438 hands out, and signs with MESSAGE-INTEGRITY or -SHA256.

Also the test fixtures of the server: :class:`FakePorts` (relayed addresses without
sockets) and :func:`server` (a :class:`TurnServer` on a fake clock).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

from appliance.proto.stun import (
    Addr,
    AttrType,
    AttrValue,
    Class,
    Message,
    Method,
    PasswordAlgorithm,
    long_term_key,
)
from appliance.proto.turn import (
    AllocationCreated,
    AllocationEnded,
    PeerData,
    Transmit,
    TurnConfig,
    TurnServer,
    mint_rest_credential,
)

SECRET = b"turn-test-shared-secret"
NOW = 1_000.0  # the fake monotonic clock at the start of a test
UNIX = 1_700_000_000.0  # Unix time at NOW
SERVER = ("192.0.2.1", 3478)  # the relay's public (media) address
OWN = ("192.0.2.1", 3478)  # the appliance's own media address (a TURN peer)
CLIENT = ("198.51.100.7", 50000)


class FakePorts:
    """Relayed addresses without sockets: 192.0.2.1:49152, :49153, ... (or None)."""

    def __init__(self) -> None:
        self.ports = itertools.count(49152)
        self.full = False
        self.bound: list[tuple[int, Addr]] = []

    def bind(self, family: int, client: Addr, even: bool = False) -> Addr | None:
        if self.full:
            return None
        port = next(self.ports)
        if even and port % 2:
            port = next(self.ports)
        addr = ("192.0.2.1", port) if family == 1 else ("2001:db8::1", port)
        self.bound.append((family, addr))
        return addr

    def claim(self, relayed: Addr) -> bool:
        """Take back an exact address (an imported allocation's); False when ``full``."""
        if self.full:
            return False
        self.bound.append((1 if "." in relayed[0] else 2, relayed))
        return True


def config(**kw: object) -> TurnConfig:
    base: dict[str, object] = {"secrets": (SECRET,), "nonce_key": b"nonce-key",
                               "own": frozenset({OWN})}
    base.update(kw)
    return TurnConfig(**base)  # type: ignore[arg-type]


def server(**kw: object) -> tuple[TurnServer, FakePorts]:
    ports = FakePorts()
    return TurnServer(config(**kw), ports, unix_offset=UNIX - NOW), ports


def drain(srv: TurnServer) -> list[object]:
    out: list[object] = []
    while (o := srv.poll_output()) is not None:
        out.append(o)
    return out


def transmits(out: list[object]) -> list[Transmit]:
    return [o for o in out if isinstance(o, Transmit)]


def peer_data(out: list[object]) -> list[PeerData]:
    return [o for o in out if isinstance(o, PeerData)]


def events(out: list[object]) -> list[object]:
    return [o for o in out if isinstance(o, AllocationCreated | AllocationEnded)]


@dataclass
class Client:
    """One TURN client (one 5-tuple). ``username``/``password`` default to a fresh REST
    credential under :data:`SECRET`, valid for an hour of fake Unix time."""

    addr: Addr = CLIENT
    local: Addr = SERVER
    username: str = ""
    password: str = ""
    integrity: str = "sha1"  # or "sha256"
    algorithm: int | None = None  # PASSWORD-ALGORITHM to pick when offered (None: MD5)
    fingerprint: bool = True
    realm: str | None = None
    nonce: str | None = None
    offered: bytes | None = None  # PASSWORD-ALGORITHMS from the last challenge
    last: Message | None = None
    log: list[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.username:
            cred = mint_rest_credential(SECRET, "sess1", int(UNIX) + 3600)
            self.username = cred.username
            self.password = self.password or cred.password

    @property
    def key(self) -> bytes:
        assert self.realm is not None
        alg = self.algorithm if self.algorithm is not None and self.offered else PasswordAlgorithm.MD5
        return long_term_key(self.username, self.realm, self.password, alg)

    def request(self, method: Method, attrs: tuple[tuple[AttrType, AttrValue], ...] = (),
                *, auth: bool = True, tid: bytes | None = None,
                cls: Class = Class.REQUEST) -> bytes:
        """The request's bytes; signed once a realm and nonce are known (and ``auth``)."""
        all_attrs = list(attrs)
        key = None
        if auth and self.nonce is not None and self.realm is not None:
            all_attrs += [(AttrType.USERNAME, self.username), (AttrType.REALM, self.realm),
                          (AttrType.NONCE, self.nonce)]
            if self.offered is not None and self.algorithm is not None:
                all_attrs += [(AttrType.PASSWORD_ALGORITHMS, self.offered),
                              (AttrType.PASSWORD_ALGORITHM,
                               int(self.algorithm).to_bytes(2, "big") + b"\x00\x00")]
            key = self.key
        msg = Message(method, cls, tid or os.urandom(12), tuple(all_attrs))
        return msg.encode(integrity_key=key, fingerprint=self.fingerprint,
                          integrity=self.integrity)

    def learn(self, data: bytes) -> Message:
        """Parse an answer; a 401/438 teaches the realm, nonce and offered algorithms."""
        msg = Message.parse_untrusted(data)
        self.last = msg
        self.log.append(msg)
        if msg.msg_class == Class.ERROR and msg.error_code and msg.error_code[0] in (401, 438):
            realm, nonce = msg.get(AttrType.REALM), msg.get(AttrType.NONCE)
            if isinstance(realm, str) and isinstance(nonce, str):
                self.realm, self.nonce = realm, nonce
            offered = msg.get(AttrType.PASSWORD_ALGORITHMS)
            self.offered = offered if isinstance(offered, bytes) else None
        return msg


def exchange(srv: TurnServer, client: Client, method: Method,
             attrs: tuple[tuple[AttrType, AttrValue], ...] = (), *, now: float = NOW,
             tid: bytes | None = None, retry: bool = True) -> Message | None:
    """Send one request and return the answer (after one 401/438 round, as a client does:
    RFC 8489 §9.2.5). None when the server answered nothing."""
    srv.handle_input(now, client.request(method, attrs, tid=tid), client.addr, client.local)
    out = transmits(drain(srv))
    if not out:
        return None
    assert len(out) == 1 and out[0].dest == client.addr and out[0].local == client.local
    msg = client.learn(out[0].data)
    if retry and msg.msg_class == Class.ERROR and msg.error_code and \
            msg.error_code[0] in (401, 438):
        return exchange(srv, client, method, attrs, now=now, tid=tid, retry=False)
    return msg


def learn(srv: TurnServer, client: Client, *, now: float = NOW) -> None:
    """Learn the realm and a nonce the way a client does, from the 401 to an unsigned
    Allocate (a bare Refresh is too small to be challenged within the amplification bound)."""
    raw = client.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),), auth=False)
    srv.handle_input(now, raw, client.addr, client.local)
    (answer,) = transmits(drain(srv))
    msg = client.learn(answer.data)
    assert msg.error_code is not None and msg.error_code[0] == 401


def allocate(srv: TurnServer, client: Client, *, now: float = NOW,
             extra: tuple[tuple[AttrType, AttrValue], ...] = ()) -> Message | None:
    return exchange(srv, client, Method.ALLOCATE,
                    ((AttrType.REQUESTED_TRANSPORT, 17), *extra), now=now)


def relayed_of(msg: Message) -> Addr:
    v = msg.get(AttrType.XOR_RELAYED_ADDRESS)
    assert isinstance(v, tuple) and isinstance(v[0], str) and isinstance(v[1], int)
    return (v[0], v[1])
