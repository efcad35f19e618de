"""The SIP call lifecycle's transition table (signaling/sip_call.py), without sockets: every
legal move works, illegal ones raise :class:`IllegalMove` (a :class:`CallError`) and leave
the state as it was, and the JSON views carry the same strings they always did."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from appliance.signaling.sip_call import (
    DONE,
    MOVES,
    CallError,
    CallState,
    IllegalMove,
    can_move,
    move,
)
from appliance.signaling.sip_calls import SipCall
from appliance.signaling.sip_outbound import OutboundCall

S = CallState


def inbound(state: CallState) -> SipCall:
    incoming: Any = SimpleNamespace(offer_sdp=b"", source=("127.0.0.1", 5060))
    return SipCall("rtc_sip_x", "sip_x", 0.0, incoming, state=state)


def outbound(state: CallState) -> OutboundCall:
    return OutboundCall("rtc_sip_y", "", 0.0, "t", "1000", "echo", {}, state=state)


def make(direction: str, state: CallState) -> SipCall | OutboundCall:
    return inbound(state) if direction == "inbound" else outbound(state)


LEGAL = [(d, old, new) for d, table in MOVES.items() for old, news in table.items()
         for new in sorted(news)]
ILLEGAL = [(d, old, new) for d in MOVES for old in S for new in S
           if not can_move(d, old, new)]


@pytest.mark.parametrize(("direction", "old", "new"), LEGAL)
def test_every_legal_move_works(direction: str, old: CallState, new: CallState) -> None:
    call = make(direction, old)
    move(call, new)
    assert call.state is new


@pytest.mark.parametrize(("direction", "old", "new"), ILLEGAL)
def test_every_other_move_raises_and_changes_nothing(direction: str, old: CallState,
                                                     new: CallState) -> None:
    call = make(direction, old)
    with pytest.raises(IllegalMove) as got:
        move(call, new)
    assert call.state is old
    assert isinstance(got.value, CallError) and got.value.status == 500
    assert f"from {old.value} to {new.value}" in got.value.message


def test_the_tables_say_what_each_direction_can_do() -> None:
    """A sample spelled out: the moves a reader would check first."""
    assert can_move("inbound", S.RINGING, S.ACCEPTING)
    assert not can_move("inbound", S.RINGING, S.ACTIVE)  # never active before our 200 OK
    assert not can_move("inbound", S.RINGING, S.FAILED)  # an inbound call does not fail
    assert not can_move("inbound", S.DIALING, S.RINGING)  # dialing is the outbound's
    assert can_move("outbound", S.DIALING, S.ANSWERING)  # a 2xx with no provisional first
    assert not can_move("outbound", S.ACTIVE, S.FAILED)  # answered calls end, never fail
    assert not can_move("outbound", S.RINGING, S.ACCEPTING)  # accepting is the inbound's
    for d in MOVES:  # nothing leaves a finished call, not even to itself
        for done in DONE:
            assert all(not can_move(d, done, new) for new in S)
    # every state a direction uses is reachable from where its calls start
    for d, start in (("inbound", S.RINGING), ("outbound", S.DIALING)):
        seen, todo = {start}, [start]
        while todo:
            for new in MOVES[d].get(todo.pop(), frozenset()):
                if new not in seen:
                    seen.add(new)
                    todo.append(new)
        assert seen >= set(MOVES[d]) and S.ENDED in seen


def test_views_keep_the_status_strings() -> None:
    assert inbound(S.ANSWERED).view()["status"] == "answered"
    assert type(inbound(S.ANSWERED).view()["status"]) is str
    assert outbound(S.DIALING).view()["status"] == "dialing"
    assert type(outbound(S.FAILED).view()["status"]) is str
    assert SipCall("c", "s", 0.0, SimpleNamespace()).state is S.RINGING  # where each starts
    assert OutboundCall("c", "", 0.0, "t", "1", "echo", {}).state is S.DIALING
