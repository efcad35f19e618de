"""Whole call flows between two SipEndpoints on the virtual network (RFC 3261 §13-§15)."""

from __future__ import annotations

import pytest
from proto.sip.sip_pair import A, B, Pair

from appliance.proto.sip import (
    CallAcked,
    CallAnswered,
    CallCancelled,
    CallEnded,
    CallFailed,
    CallProgress,
    Dtmf,
    IncomingCall,
    ReInvite,
    ReInviteAnswered,
    Request,
    Response,
    SipUsageError,
)

OFFER = b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n"
ANSWER = OFFER.replace(b"4000", b"5000")


def _call(p: Pair) -> tuple[str, str]:
    """a calls b; b rings and answers; returns (a's call id, b's call id)."""
    a_id = p.a.invite(p.now, "sip:agent@127.0.0.2:5062", "sip:caller@127.0.0.1", OFFER, B,
                      p.transport)
    p.run_until(lambda: p.of("b", IncomingCall))
    (inc,) = p.of("b", IncomingCall)
    assert isinstance(inc, IncomingCall)
    assert inc.offer_sdp == OFFER and inc.source == A
    p.b.ringing(p.now, inc.call_id)
    p.run(1)
    p.b.accept(p.now, inc.call_id, ANSWER)
    p.run_until(lambda: p.of("b", CallAcked) or p.of("b", CallEnded))
    p.run(0.1)
    return a_id, inc.call_id


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_call_and_callee_bye(transport: str) -> None:
    p = Pair(transport=transport)
    a_id, b_id = _call(p)
    assert [type(e) for e in p.events["a"]] == [CallProgress, CallAnswered]
    assert p.of("a", CallAnswered)[0] == CallAnswered(a_id, ANSWER)
    assert p.of("b", CallAcked) == [CallAcked(b_id, b"")]
    # 100 Trying went out before anything else from b
    first = p.sent_by("b")[0]
    assert isinstance(first, Response) and first.status == 100 and first.to.tag is None
    ok = next(m for m in p.sent_by("b") if isinstance(m, Response) and m.status == 200)
    (contact,) = ok.contacts  # the next requests come back on the dialog's transport
    assert contact.uri.param("transport") == (None if transport == "udp" else transport)
    assert ok.vias[0].rport == str(A[1]) and ok.vias[0].received == A[0]  # RFC 3581
    p.b.hangup(p.now, b_id)
    p.run(1)
    assert p.of("a", CallEnded) == [CallEnded(a_id, "bye", "remote")]
    assert p.of("b", CallEnded) == [CallEnded(b_id, "hangup", "local")]
    p.run(40)  # every transaction lingers out
    assert not p.a._server and not p.b._server and not p.a._client and not p.b._client
    assert not p.a._calls and not p.b._calls


def test_caller_bye() -> None:
    p = Pair()
    a_id, b_id = _call(p)
    p.a.hangup(p.now, a_id)
    p.run(1)
    assert p.of("b", CallEnded) == [CallEnded(b_id, "bye", "remote")]
    byes = [m for m in p.sent_by("a") if isinstance(m, Request) and m.method == "BYE"]
    assert len(byes) == 1 and byes[0].to.tag is not None and byes[0].from_.tag is not None


@pytest.mark.parametrize("seed", range(8))
def test_call_survives_loss_and_duplication(seed: int) -> None:
    """30 % loss and 20 % duplication: the transactions' retransmissions carry the call
    through, each side sees each event exactly once."""
    p = Pair(seed=seed, loss=0.3, dup=0.2)
    a_id, b_id = _call(p)
    p.run(30)
    assert len(p.of("b", IncomingCall)) == 1
    answered = p.of("a", CallAnswered)
    failed = p.of("a", CallFailed)
    # an INVITE lost 7 times in a row would time out (Timer B): the seeds used do not
    assert not failed and len(answered) == 1
    acked = p.of("b", CallAcked)
    ended = p.of("b", CallEnded)
    assert len(acked) == 1 or ended == [CallEnded(b_id, "no ACK", "local")]
    p.a.hangup(p.now, a_id)
    p.run(60)
    assert len(p.of("b", CallEnded)) == 1


def test_2xx_retransmitted_until_ack() -> None:
    """The ACK is lost for a while: b re-sends its 200 (T1, 2T1, ...) and a re-ACKs each."""
    p = Pair()
    p.a.invite(p.now, "sip:agent@127.0.0.2:5062", "sip:caller@127.0.0.1", OFFER, B)
    p.run(1)
    (inc,) = p.of("b", IncomingCall)
    assert isinstance(inc, IncomingCall)
    p.loss = 1.0  # everything lost from now on
    p.b.accept(p.now, inc.call_id, ANSWER)
    p.run(3.6)  # 200 sent at 0, retransmitted at 0.5, 1.5, 3.5
    oks = [m for m in p.sent_by("b") if isinstance(m, Response) and m.status == 200]
    assert len(oks) == 4
    p.loss = 0.0
    p.run(5)
    assert len(p.of("b", CallAcked)) == 1
    n = len([m for m in p.sent_by("b") if isinstance(m, Response) and m.status == 200])
    p.run(30)
    assert len([m for m in p.sent_by("b") if isinstance(m, Response) and m.status == 200]) == n


def test_no_ack_ends_call_with_bye() -> None:
    """§13.3.1.4: no ACK within 64·T1: the UAS sends BYE and reports the call ended."""
    p = Pair()
    p.a.invite(p.now, "sip:agent@127.0.0.2:5062", "sip:caller@127.0.0.1", OFFER, B)
    p.run(1)
    (inc,) = p.of("b", IncomingCall)
    assert isinstance(inc, IncomingCall)
    p.loss = 1.0
    p.b.accept(p.now, inc.call_id, ANSWER)
    p.run(40)
    assert p.of("b", CallEnded) == [CallEnded(inc.call_id, "no ACK", "local")]
    assert any(isinstance(m, Request) and m.method == "BYE" for m in p.sent_by("b"))


def test_cancel_before_answer() -> None:
    p = Pair()
    a_id = p.a.invite(p.now, "sip:agent@127.0.0.2:5062", "sip:caller@127.0.0.1", OFFER, B)
    p.run(1)
    (inc,) = p.of("b", IncomingCall)
    assert isinstance(inc, IncomingCall)
    p.b.ringing(p.now, inc.call_id)
    p.run(1)
    p.a.hangup(p.now, a_id)
    p.run(1)
    assert p.of("b", CallCancelled) == [CallCancelled(inc.call_id)]
    statuses = [m.status for m in p.sent_by("b") if isinstance(m, Response)]
    assert statuses == [100, 180, 200, 487]
    cancel_ok = [m for m in p.sent_by("b") if isinstance(m, Response) and m.status in (200, 487)]
    assert cancel_ok[0].cseq.method == "CANCEL" and cancel_ok[1].cseq.method == "INVITE"
    assert cancel_ok[0].to.tag == cancel_ok[1].to.tag
    acks = [m for m in p.sent_by("a") if isinstance(m, Request) and m.method == "ACK"]
    assert len(acks) == 1  # the INVITE client transaction ACKs the 487 itself
    p.run(40)
    assert not p.a._calls and not p.b._calls and not p.b._server


def test_cancel_before_any_provisional_waits() -> None:
    """§9.1: hanging up before any 1xx arrives sends CANCEL only once a 1xx came."""
    p = Pair()
    a_id = p.a.invite(p.now, "sip:agent@127.0.0.2:5062", "sip:caller@127.0.0.1", OFFER, B)
    p.a.hangup(p.now, a_id)  # nothing has reached b yet
    p.run(2)
    sent = [m.method for m in p.sent_by("a") if isinstance(m, Request)]
    assert sent[:2] == ["INVITE", "CANCEL"]
    assert len(p.of("b", CallCancelled)) == 1


def test_reject_and_ring_timeout() -> None:
    p = Pair()
    a_id = p.a.invite(p.now, "sip:agent@127.0.0.2:5062", "sip:caller@127.0.0.1", OFFER, B)
    p.run(1)
    (inc,) = p.of("b", IncomingCall)
    assert isinstance(inc, IncomingCall)
    p.b.reject(p.now, inc.call_id, 486)
    p.run(1)
    assert p.of("a", CallFailed) == [CallFailed(a_id, 486, "Busy Here")]
    with pytest.raises(SipUsageError):
        p.b.accept(p.now, inc.call_id, ANSWER)
    a2 = p.a.invite(p.now, "sip:agent@127.0.0.2:5062", "sip:caller@127.0.0.1", OFFER, B)
    p.run(p.b.config.ring_timeout + 1)
    assert p.of("a", CallFailed)[-1] == CallFailed(a2, 480, "Temporarily Unavailable")


def test_reinvite_hold() -> None:
    p = Pair()
    a_id, b_id = _call(p)
    hold = OFFER.replace(b"RTP/AVP 0\r\n", b"RTP/AVP 0\r\na=sendonly\r\n")
    p.a.reinvite(p.now, a_id, hold)
    with pytest.raises(SipUsageError):
        p.a.reinvite(p.now, a_id, hold)  # §14.1: one at a time
    p.run(1)
    assert p.of("b", ReInvite) == [ReInvite(b_id, hold)]
    p.b.answer_reinvite(p.now, b_id, ANSWER.replace(b"RTP/AVP 0\r\n", b"RTP/AVP 0\r\na=recvonly\r\n"))
    p.run(1)
    oks = [m for m in p.sent_by("b") if isinstance(m, Response) and m.status == 200
           and m.cseq.method == "INVITE"]
    assert b"a=recvonly" in oks[-1].body
    (answered,) = p.of("a", ReInviteAnswered)
    assert isinstance(answered, ReInviteAnswered) and answered.status == 200
    assert b"a=recvonly" in answered.answer_sdp
    acks = [m for m in p.sent_by("a") if isinstance(m, Request) and m.method == "ACK"]
    assert len(acks) == 2 and acks[-1].cseq.seq == oks[-1].cseq.seq
    p.run(5)  # the 2xx is not retransmitted once ACKed
    assert len([m for m in p.sent_by("b") if isinstance(m, Response) and m.status == 200
                and m.cseq.method == "INVITE"]) == 2
    # unhold; the peer refuses this one: the old session stands
    p.a.reinvite(p.now, a_id, OFFER)
    p.run(1)
    (re2,) = p.of("b", ReInvite)[1:]
    p.b.reject_reinvite(p.now, b_id, 488)
    p.run(1)
    assert p.of("a", ReInviteAnswered)[-1] == ReInviteAnswered(a_id, 488, b"")
    assert p.a._calls[a_id].state.value == "confirmed"
    with pytest.raises(SipUsageError):
        p.b.answer_reinvite(p.now, b_id, ANSWER)


def test_dtmf_info() -> None:
    p = Pair()
    a_id, b_id = _call(p)
    p.a.info_dtmf(p.now, a_id, "5", 160)
    p.run(1)
    assert p.of("b", Dtmf) == [Dtmf(b_id, "5", 160)]


def test_outbound_timeout() -> None:
    p = Pair(loss=1.0)
    a_id = p.a.invite(p.now, "sip:agent@127.0.0.2:5062", "sip:caller@127.0.0.1", OFFER, B)
    p.run(33)
    assert p.of("a", CallFailed) == [CallFailed(a_id, 408, "Request Timeout")]
    invites = [m for m in p.sent_by("a") if isinstance(m, Request) and m.method == "INVITE"]
    assert len(invites) == 7  # Timer A: 0, .5, 1.5, 3.5, 7.5, 15.5, 31.5 then B at 32
    assert not p.a._calls


def test_hangup_before_ack_waits_for_it() -> None:
    """§15: the callee's BYE waits for the ACK of its 200; it goes out once the ACK comes."""
    p = Pair()
    p.a.invite(p.now, "sip:agent@127.0.0.2:5062", "sip:caller@127.0.0.1", OFFER, B)
    p.run(1)
    (inc,) = p.of("b", IncomingCall)
    assert isinstance(inc, IncomingCall)
    p.loss = 1.0
    p.b.accept(p.now, inc.call_id, ANSWER)
    p.b.hangup(p.now, inc.call_id)
    p.run(0.2)
    assert not [m for m in p.sent_by("b") if isinstance(m, Request) and m.method == "BYE"]
    p.loss = 0.0
    p.run(3)
    byes = [m for m in p.sent_by("b") if isinstance(m, Request) and m.method == "BYE"]
    assert len(byes) == 1
    assert len(p.of("a", CallEnded)) == 1 and not p.b._calls
