"""docs/style.md rule 18, checked: every sans-IO core has the one verb shape.

``handle_input(now, data[, addr])``, ``poll_output()`` drained until None,
``poll_timeout()``, ``handle_timeout(now)``. A *clockless* core (nothing in it depends on
time) drops ``now`` and both timer verbs. The relay core is the documented exception.
A few cores are also driven through ``handle_input`` / ``poll_output`` alone, to show the
one stream carries everything the split polls carried.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from appliance.live.connection import LiveConnection, LiveEvent, Started
from appliance.live.idle import WakeGate
from appliance.proto.dtls import DtlsConnection
from appliance.proto.framing import Deframer, encode_frame
from appliance.proto.ice import (
    CheckReceived,
    CheckSucceeded,
    IceClient,
    IceLiteAgent,
    Nominated,
    Transmit,
)
from appliance.proto.sctp import Connected, MessageReceived, SctpAssociation
from appliance.proto.sctp import Transmit as SctpTransmit
from appliance.proto.sip.transaction import ClientTransaction, ServerTransaction
from appliance.proto.sip.ua import SipEndpoint
from appliance.proto.turn import StreamFramer, TurnServer
from appliance.realtime.machine import RealtimeConnection, ServerEvent, SessionUpdated
from appliance.relay.core import RelayCore
from appliance.transceiver.call import ServerCall
from appliance.transceiver.rtp_leg import RtpLeg

STYLE = Path(__file__).resolve().parents[1] / "docs" / "style.md"

#: Cores with a clock: (class, name of the address parameter, or None).
#: ServerCall's address is a ``Source`` (client, public, relay), hence its own name.
TIMED: list[tuple[type, str | None]] = [
    (ServerCall, "source"),
    (DtlsConnection, None),
    (SipEndpoint, "addr"),
    (ServerTransaction, None),  # data: the request that matched it, parsed
    (ClientTransaction, None),  # data: the response that matched it, parsed
    (RtpLeg, "addr"),
    (IceLiteAgent, "addr"),
    (IceClient, "addr"),
    (SctpAssociation, None),
    (TurnServer, "addr"),
    (WakeGate, None),
]

#: Cores without a clock: ``handle_input(data)`` and ``poll_output()`` only.
CLOCKLESS: list[type] = [Deframer, RealtimeConnection, LiveConnection, StreamFramer]

#: Documented exceptions (docs/style.md rule 18), with the reason. The test below checks
#: each still lacks the shape, so an exception cannot outlive its reason silently.
EXCEPTIONS: dict[type, str] = {
    RelayCore: (
        "the relay's per-datagram slow path returns its decision from handle_datagram "
        "(Flow | bytes | None) and its side queues are polled as lists, once per batch: "
        "a measured design of the relay hot path (bench/), not one poll call per output"
    ),
}


def _params(fn: Callable[..., Any]) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def _required(fn: Callable[..., Any]) -> list[str]:
    return [
        name
        for name, p in inspect.signature(fn).parameters.items()
        if name != "self" and p.default is inspect.Parameter.empty
    ]


def _says_none_when_drained(cls: type) -> None:
    doc = inspect.getdoc(cls.poll_output) or ""
    assert "None" in doc, f"{cls.__name__}.poll_output must document the None it returns"


@pytest.mark.parametrize(("cls", "addr"), TIMED, ids=lambda v: getattr(v, "__name__", str(v)))
def test_timed_core_has_the_four_verbs(cls: type, addr: str | None) -> None:
    expected = ["now", "data"] + ([addr] if addr else [])
    assert _required(cls.handle_input) == expected
    assert _params(cls.poll_output) == []
    assert _params(cls.poll_timeout) == []
    assert _params(cls.handle_timeout) == ["now"]
    _says_none_when_drained(cls)


@pytest.mark.parametrize("cls", CLOCKLESS, ids=lambda c: c.__name__)
def test_clockless_core_has_input_and_output_only(cls: type) -> None:
    assert _required(cls.handle_input) == ["data"]
    assert _params(cls.poll_output) == []
    # No half a clock: a clockless core has neither timer verb.
    assert not hasattr(cls, "poll_timeout")
    assert not hasattr(cls, "handle_timeout")
    _says_none_when_drained(cls)


@pytest.mark.parametrize("cls", list(EXCEPTIONS), ids=lambda c: c.__name__)
def test_documented_exception_still_differs(cls: type) -> None:
    assert EXCEPTIONS[cls]
    assert not hasattr(cls, "poll_output")
    assert cls.__name__ in STYLE.read_text(encoding="utf-8")


def test_style_doc_lists_every_core() -> None:
    doc = STYLE.read_text(encoding="utf-8")
    for cls in [c for c, _ in TIMED] + CLOCKLESS:
        assert cls.__name__ in doc, cls.__name__


def _drain(core: Any) -> list[Any]:
    out = []
    while (o := core.poll_output()) is not None:
        out.append(o)
    return out


def _frozen(o: object) -> bool:
    params = getattr(type(o), "__dataclass_params__", None)
    return dataclasses.is_dataclass(o) and params is not None and bool(params.frozen)


SRV = ("192.0.2.10", 3478)
CLI = ("198.51.100.7", 50000)


def test_ice_client_and_lite_agent_through_the_one_stream() -> None:
    client = IceClient("cliU", "client-password-0123456789", "srvU",
                       "server-password-0123456789", SRV, rng=random.Random(1))
    agent = IceLiteAgent("srvU", "server-password-0123456789", "cliU",
                         "client-password-0123456789")
    client.start(0.0)
    check = _drain(client)
    assert [type(o) for o in check] == [Transmit] and check[0].addr == SRV
    agent.handle_input(0.01, check[0].data, CLI)
    answer = _drain(agent)
    # Transmits come before events; every output is a frozen dataclass.
    assert [type(o) for o in answer] == [Transmit, CheckReceived, Nominated]
    assert all(_frozen(o) for o in answer)
    assert answer[0].addr == CLI and answer[2] == Nominated(CLI)
    client.handle_input(0.02, answer[0].data, SRV)
    events = _drain(client)
    assert [type(o) for o in events] == [CheckSucceeded, Nominated]
    assert events[0].mapped == CLI
    assert client.poll_output() is None and agent.poll_output() is None


def test_sctp_associations_connect_and_deliver_through_the_one_stream() -> None:
    a = SctpAssociation(rng=random.Random(1))
    b = SctpAssociation(rng=random.Random(2))
    a.connect(0.0)
    got: dict[str, list[Any]] = {"a": [], "b": []}
    now = 0.0
    sent = False
    for _ in range(20):  # INIT, INIT ACK, COOKIE ECHO, COOKIE ACK, DATA, SACK: well within
        moved = False
        for name, src, dst in (("a", a, b), ("b", b, a)):
            for o in _drain(src):
                assert _frozen(o)
                if isinstance(o, SctpTransmit):
                    now += 0.001
                    dst.handle_input(now, o.data)
                    moved = True
                else:
                    got[name].append(o)
        if not sent and any(isinstance(e, Connected) for e in got["a"]):
            a.send(now, 1, 51, b"hello")
            sent = True
            moved = True
        if not moved:
            break
    assert any(isinstance(e, Connected) for e in got["a"])
    assert any(isinstance(e, Connected) for e in got["b"])
    assert [e.data for e in got["b"] if isinstance(e, MessageReceived)] == [b"hello"]


def test_deframer_through_the_one_stream() -> None:
    d = Deframer(100)
    stream = encode_frame(b"one") + encode_frame(b"") + encode_frame(b"three")
    frames: list[bytes] = []
    for i in range(len(stream)):
        d.handle_input(stream[i : i + 1])
        frames += _drain(d)
    assert frames == [b"one", b"", b"three"]


def test_realtime_connection_through_the_one_stream() -> None:
    n = iter(range(1000))
    m = RealtimeConnection(session_id="sess_1", ids=lambda kind: f"{kind}_{next(n)}")
    m.handle_open()
    m.handle_input(json.dumps({"type": "session.update", "session": {"instructions": "hi"}}))
    out = _drain(m)
    assert all(_frozen(o) for o in out)
    # The actions come first (as the shells drain them), then the server events in order.
    assert isinstance(out[0], SessionUpdated)
    kinds = [o.event["type"] for o in out if isinstance(o, ServerEvent)]
    assert kinds == ["session.created", "session.updated"]


def test_live_connection_through_the_one_stream() -> None:
    n = iter(range(1000))
    live = LiveConnection(session_id="live_1", ids=lambda kind: f"{kind}_{next(n)}",
                          wall_clock=lambda: 0.0, vad=lambda frame: False)
    live.handle_open()
    assert live.poll_output() is None  # silent until session.start
    live.handle_input(json.dumps({"type": "session.start", "session": {"model": "m"}}))
    out = _drain(live)
    assert all(_frozen(o) for o in out)
    # Actions first (the machine's, then the core's own), then the server events.
    assert [type(o) for o in out] == [SessionUpdated, Started, LiveEvent]
    assert out[2].event["type"] == "session.started"
