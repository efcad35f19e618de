"""The four RFC 3261 §17 transaction machines on a fake clock (timers G/H/I/J/L, A/B/D,
E/F/K, M), on unreliable and reliable transports."""

from __future__ import annotations

import pytest

from appliance.proto.sip.message import Request, Response, parse_untrusted
from appliance.proto.sip.transaction import (
    ClientTransaction,
    ServerTransaction,
    State,
    server_key,
)

ADDR = ("127.0.0.9", 5060)


def _req(method: str, branch: str = "z9hG4bKt1", cseq_method: str | None = None) -> Request:
    m = parse_untrusted((
        f"{method} sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h:5060;branch={branch}\r\n"
        "From: <sip:x@y>;tag=1\r\nTo: <sip:a@b>\r\nCall-ID: cid\r\n"
        f"CSeq: 1 {cseq_method or method}\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    ).encode())
    assert isinstance(m, Request)
    return m


def _resp(r: Request, status: int) -> Response:
    hs = tuple((k, v + (";tag=2" if k == "To" else "")) for k, v in r.headers
               if k in ("Via", "From", "To", "Call-ID", "CSeq"))
    return Response(status, "X", hs)


def _fire(t: ServerTransaction | ClientTransaction, until: float) -> list[float]:
    """Run the transaction's timers up to ``until``; the times at which it sent something."""
    sent: list[float] = []
    while (d := t.deadline()) is not None and d <= until:
        out, _ = t.handle_timeout(d)
        sent += [d] * len(out)
    return sent


def test_invite_server_non_2xx_retransmits_until_ack() -> None:
    t = ServerTransaction(_req("INVITE"), ADDR, "udp")
    assert t.respond(0.0, 486, b"486") == [b"486"]
    assert t.state is State.COMPLETED
    sent = _fire(t, 8.0)
    assert sent == [0.5, 1.5, 3.5, 7.5]  # Timer G: T1, 2T1, 4T1, then capped at T2
    assert t.receive_request(8.0, _req("INVITE")) == [b"486"]  # a retransmission: re-sent
    assert t.receive_request(8.1, _req("ACK", cseq_method="ACK")) == []
    assert t.state is State.CONFIRMED
    assert _fire(t, 13.0) == [] and t.state is State.CONFIRMED
    assert _fire(t, 13.1) == [] and t.state is State.TERMINATED  # Timer I = T4 after the ACK


def test_invite_server_timer_h() -> None:
    t = ServerTransaction(_req("INVITE"), ADDR, "udp")
    t.respond(0.0, 500, b"500")
    fails = []
    while (d := t.deadline()) is not None:
        _, f = t.handle_timeout(d)
        if f:
            fails.append((d, f))
    assert fails == [(32.0, "no-ack")] and t.done


def test_invite_server_reliable_has_no_g_and_zero_i() -> None:
    t = ServerTransaction(_req("INVITE"), ADDR, "tcp")
    t.respond(0.0, 486, b"486")
    assert "G" not in t.timers and t.timers["H"] == 32.0
    t.receive_request(1.0, _req("ACK", cseq_method="ACK"))
    assert t.deadline() == 1.0
    _fire(t, 1.0)
    assert t.done


def test_invite_server_2xx_accepted_state() -> None:
    t = ServerTransaction(_req("INVITE"), ADDR, "tcp")
    t.respond(0.0, 180, b"180")
    assert t.receive_request(0.1, _req("INVITE")) == [b"180"]
    t.respond(1.0, 200, b"200")
    assert t.state is State.ACCEPTED
    assert _fire(t, 4.0) == [1.5, 2.5]  # 2xx re-sent even on TCP (§13.3.1.4)
    t.ack_2xx()
    assert _fire(t, 20.0) == []
    assert t.receive_request(20.0, _req("INVITE")) == [b"200"]  # absorbed (RFC 6026 §8.7)
    _, failure = t.handle_timeout(33.0)
    assert t.done and failure is None


def test_non_invite_server_timer_j() -> None:
    t = ServerTransaction(_req("OPTIONS"), ADDR, "udp")
    assert t.receive_request(0.0, _req("OPTIONS")) == []  # Trying: nothing to re-send
    t.respond(0.0, 200, b"200")
    assert t.receive_request(10.0, _req("OPTIONS")) == [b"200"]
    assert t.deadline() == 32.0
    _fire(t, 32.0)
    assert t.done


def test_invite_client_timers_a_b() -> None:
    t = ClientTransaction(_req("INVITE"), ADDR, "udp", 0.0)
    sent = []
    timed_out = False
    while (d := t.deadline()) is not None:
        out, to = t.handle_timeout(d)
        sent += [d] * len(out)
        timed_out |= to
    assert sent == [0.5, 1.5, 3.5, 7.5, 15.5, 31.5] and timed_out  # Timer A doubles, B = 32


def test_invite_client_non_2xx_acks_and_timer_d() -> None:
    inv = _req("INVITE")
    t = ClientTransaction(inv, ADDR, "udp", 0.0)
    assert t.receive_response(0.1, _resp(inv, 180))[1] is not None
    assert "A" not in t.timers and "B" not in t.timers
    out, up = t.receive_response(0.2, _resp(inv, 486))
    assert up is not None and len(out) == 1
    ack = parse_untrusted(out[0])
    assert isinstance(ack, Request) and ack.method == "ACK" and ack.branch == inv.branch
    assert ack.to.tag == "2" and ack.cseq.seq == 1
    out, up = t.receive_response(1.0, _resp(inv, 486))
    assert up is None and out == [bytes(ack)]  # retransmitted final: ACK again, absorbed
    assert t.deadline() == pytest.approx(32.2)


def test_invite_client_2xx_passes_retransmissions_up() -> None:
    inv = _req("INVITE")
    t = ClientTransaction(inv, ADDR, "udp", 0.0)
    assert t.receive_response(0.1, _resp(inv, 200))[1] is not None
    assert t.state is State.ACCEPTED
    assert t.receive_response(0.6, _resp(inv, 200))[1] is not None  # RFC 6026 §7.2
    _fire(t, 40.0)
    assert t.done  # Timer M


def test_non_invite_client_e_f_k() -> None:
    bye = _req("BYE")
    t = ClientTransaction(bye, ADDR, "udp", 0.0)
    assert _fire(t, 8.0) == [0.5, 1.5, 3.5, 7.5]
    t.receive_response(8.0, _resp(bye, 100))
    assert t.state is State.PROCEEDING
    assert _fire(t, 16.0) == [11.5, 15.5]  # Proceeding: every T2
    t.receive_response(16.0, _resp(bye, 200))
    assert t.deadline() == 21.0  # Timer K = T4
    assert t.receive_response(17.0, _resp(bye, 200)) == ([], None)
    _fire(t, 21.0)
    assert t.done


def test_non_invite_client_timeout_and_reliable() -> None:
    t = ClientTransaction(_req("BYE"), ADDR, "tcp", 0.0)
    assert list(t.timers) == ["F"]
    _, to = t.handle_timeout(32.0)
    assert to and t.done


def test_server_keys() -> None:
    inv = _req("INVITE")
    ack = _req("ACK", cseq_method="ACK")
    cancel = _req("CANCEL", cseq_method="CANCEL")
    assert server_key(inv) == server_key(ack)  # the ACK of a non-2xx joins its INVITE
    assert server_key(cancel) != server_key(inv)
    assert server_key(_req("INVITE", branch="z9hG4bKother")) != server_key(inv)
    old = _req("INVITE", branch="1234")  # RFC 2543: no magic cookie
    assert server_key(old) == server_key(_req("ACK", branch="1234", cseq_method="ACK"))
    assert server_key(old)[0] == "2543"
