"""An allocation's state as bytes, so a TURN allocation outlives the relay worker that made
it (issue 40 item 2: "a worker kill keeps TURN calls alive").

The relay writes each UDP allocation to its flow cache (Redis, or the worker's own state
file) when it is made and whenever it changes (Refresh, CreatePermission, ChannelBind), and
removes it when it ends; the worker that takes over reads the records back and
:meth:`~appliance.proto.turn.TurnServer.import_allocation` re-creates them, so the client's
next ChannelData is relayed with no new Allocate.

A record is compact JSON (version 1)::

    {"v": 1,
     "c": ["198.51.100.7", 50000],      client (the 5-tuple's remote side)
     "l": ["192.0.2.1", 3478],          local: our public address it talks to
     "r": ["192.0.2.1", 49152],         relayed address (re-bound by the new worker)
     "f": 1,                            family: 1 IPv4, 2 IPv6 (matches "r")
     "u": "1700003600:sess1",           the username it was authenticated with
     "t": "00112233445566778899aabb",   transaction id of its Allocate (retransmissions)
     "e": 1700000600.0,                 expiry, Unix time
     "p": {"192.0.2.1": 1700000300.0},  permissions: peer IP -> expiry (Unix)
     "ch": [[16384, "192.0.2.1", 3478, 1700000600.0]],   channels: number, peer, expiry
     "s": 1}                            only on a TURN/TCP allocation (absent: UDP)

A TURN/TCP allocation lives as long as its connection (RFC 8656 §3.1). Its record is not
written to the cache but travels *with the connection*: the relay's keeper holds a copy of
the connection's descriptor and this record (relay/keeper.py), and the worker that adopts
the connection after a kill re-creates the allocation from it
(:meth:`~appliance.proto.turn.TurnServer.import_allocation` with the connection's client).

What is deliberately *not* in it: the shared secret or any key derived from it (the next
request is authenticated afresh: the key is re-derived from the REST secret and the
username). A TURN/TLS allocation's record travels with its connection like TURN/TCP's; the
connection's TLS keys are beside it in the keeper's record, not in this one (relay/tcp.py).

Times are Unix time so that a record means the same in any process; the server converts
with its ``unix_offset``. A record is untrusted input (the cache is shared, and may be
corrupt or written by another version): :func:`parse_record_untrusted` checks every field
and raises only :class:`~appliance.proto.turn.TurnError` (hint ``record``).
"""

from __future__ import annotations

import ipaddress
import json
import math
from dataclasses import dataclass

from appliance.proto.stun import Addr

from .channel import CHANNEL_MAX, CHANNEL_MIN
from .errors import TurnError

__all__ = ["RECORD_VERSION", "AllocationRecord", "encode_record", "parse_record_untrusted"]

RECORD_VERSION = 1
#: Bounds a record may not exceed (a server's own caps are checked again on import).
MAX_RECORD = 8192
MAX_USERNAME = 513  # RFC 8489 §14.3: USERNAME is < 513 bytes
MAX_ENTRIES = 256


@dataclass(frozen=True, slots=True)
class AllocationRecord:
    """One allocation, as written to the cache or kept with its TCP connection (times in
    Unix seconds)."""

    client: Addr
    local: Addr
    relayed: Addr
    family: int
    username: str
    tid: bytes
    expires: float
    permissions: tuple[tuple[str, float], ...]
    channels: tuple[tuple[int, Addr, float], ...]
    #: a TURN/TCP allocation (its client reaches us over a TCP connection)
    stream: bool = False


def encode_record(rec: AllocationRecord) -> bytes:
    obj = {
        "v": RECORD_VERSION,
        "c": list(rec.client), "l": list(rec.local), "r": list(rec.relayed),
        "f": rec.family, "u": rec.username, "t": rec.tid.hex(), "e": rec.expires,
        "p": dict(rec.permissions),
        "ch": [[n, p[0], p[1], t] for n, p, t in rec.channels],
    }
    if rec.stream:
        obj["s"] = 1
    return json.dumps(obj, separators=(",", ":")).encode()


def _bad(what: str) -> TurnError:
    return TurnError(f"allocation record: {what}", hint="record")


def _addr(value: object, what: str) -> Addr:
    if not (isinstance(value, list) and len(value) == 2):
        raise _bad(f"{what} is not [ip, port]")
    ip, port = value
    if not isinstance(ip, str) or type(port) is not int or not 0 <= port <= 0xFFFF:
        raise _bad(f"{what} is not [ip, port]")
    return (_ip(ip, what), port)


def _ip(text: object, what: str) -> str:
    if not isinstance(text, str) or len(text) > 45:
        raise _bad(f"{what}: not an IP address")
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise _bad(f"{what}: not an IP address") from None


def _time(value: object, what: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        raise _bad(f"{what} is not a finite time")
    return float(value)  # type: ignore[arg-type]


def parse_record_untrusted(data: bytes | bytearray | memoryview) -> AllocationRecord:
    """The record in ``data``; :class:`TurnError` (hint ``record``) for anything else."""
    if len(data) > MAX_RECORD:
        raise _bad("too long")
    try:
        obj = json.loads(bytes(data))
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are both
        raise _bad("not JSON") from None
    if not isinstance(obj, dict) or obj.get("v") != RECORD_VERSION:
        raise _bad("not a version-1 record")
    relayed = _addr(obj.get("r"), "relayed")
    family = obj.get("f")
    if family not in (1, 2) or type(family) is not int or \
            ipaddress.ip_address(relayed[0]).version != (4 if family == 1 else 6):
        raise _bad("family does not match the relayed address")
    username = obj.get("u")
    if not isinstance(username, str) or not 0 < len(username.encode("utf-8", "replace")) \
            < MAX_USERNAME:
        raise _bad("username")
    tid_text = obj.get("t")
    try:
        tid = bytes.fromhex(tid_text) if isinstance(tid_text, str) else b""
    except ValueError:
        tid = b""
    if len(tid) != 12:
        raise _bad("transaction id")
    perms = obj.get("p")
    chans = obj.get("ch")
    if not isinstance(perms, dict) or not isinstance(chans, list) or \
            len(perms) > MAX_ENTRIES or len(chans) > MAX_ENTRIES:
        raise _bad("permissions or channels")
    permissions = tuple((_ip(ip, "permission"), _time(t, "permission")) for ip, t in perms.items())
    channels: list[tuple[int, Addr, float]] = []
    for ch in chans:
        if not isinstance(ch, list) or len(ch) != 4 or type(ch[0]) is not int or \
                not CHANNEL_MIN <= ch[0] <= CHANNEL_MAX:
            raise _bad("channel")
        channels.append((ch[0], _addr(ch[1:3], "channel peer"), _time(ch[3], "channel")))
    if len({n for n, _, _ in channels}) != len(channels) or \
            len({p for _, p, _ in channels}) != len(channels):
        raise _bad("a channel number or peer twice")
    stream = obj.get("s", 0)
    if type(stream) is not int or stream not in (0, 1):
        raise _bad("stream flag")
    return AllocationRecord(
        client=_addr(obj.get("c"), "client"), local=_addr(obj.get("l"), "local"),
        relayed=relayed, family=family, username=username, tid=tid,
        expires=_time(obj.get("e"), "expiry"), permissions=permissions,
        channels=tuple(channels), stream=stream == 1)
