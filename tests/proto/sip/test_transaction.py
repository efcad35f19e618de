"""The four RFC 3261 §17 transaction machines on a fake clock (timers G/H/I/J/L, A/B/D,
E/F/K, M), on unreliable and reliable transports."""

from __future__ import annotations

import pytest

from appliance.proto.sip.message import Request, Response, parse_untrusted
from appliance.proto.sip.transaction import (
    ClientTransaction,
    NoAck,
    Output,
    Received,
    Send,
    ServerTransaction,
    State,
    TimedOut,
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


def _outputs(t: ServerTransaction | ClientTransaction) -> list[Output]:
    out = []
    while (o := t.poll_output()) is not None:
        out.append(o)
    return out


def _sent(t: ServerTransaction | ClientTransaction) -> list[bytes]:
    """Drain the outputs; the messages among them."""
    return [o.data for o in _outputs(t) if isinstance(o, Send)]


def _up(t: ClientTransaction) -> list[int]:
    """Drain the outputs; the statuses passed up."""
    return [o.response.status for o in _outputs(t) if isinstance(o, Received)]


def _fire(t: ServerTransaction | ClientTransaction, until: float) -> list[float]:
    """Run the transaction's timers up to ``until``; the times at which it sent something."""
    sent: list[float] = []
    _outputs(t)
    while (d := t.poll_timeout()) is not None and d <= until:
        t.handle_timeout(d)
        sent += [d] * len([o for o in _outputs(t) if isinstance(o, Send)])
    return sent


def test_invite_server_non_2xx_retransmits_until_ack() -> None:
    t = ServerTransaction(_req("INVITE"), ADDR, "udp")
    t.send_response(0.0, 486, b"486")
    assert _sent(t) == [b"486"]
    assert t.state is State.COMPLETED
    sent = _fire(t, 8.0)
    assert sent == [0.5, 1.5, 3.5, 7.5]  # Timer G: T1, 2T1, 4T1, then capped at T2
    t.handle_input(8.0, _req("INVITE"))
    assert _sent(t) == [b"486"]  # a retransmission: re-sent
    t.handle_input(8.1, _req("ACK", cseq_method="ACK"))
    assert _sent(t) == []
    assert t.state is State.CONFIRMED
    assert _fire(t, 13.0) == [] and t.state is State.CONFIRMED
    assert _fire(t, 13.1) == [] and t.state is State.TERMINATED  # Timer I = T4 after the ACK


def test_invite_server_timer_h() -> None:
    t = ServerTransaction(_req("INVITE"), ADDR, "udp")
    t.send_response(0.0, 500, b"500")
    fails = []
    while (d := t.poll_timeout()) is not None:
        t.handle_timeout(d)
        fails += [(d, o) for o in _outputs(t) if not isinstance(o, Send)]
    assert fails == [(32.0, NoAck())] and t.done


def test_invite_server_reliable_has_no_g_and_zero_i() -> None:
    t = ServerTransaction(_req("INVITE"), ADDR, "tcp")
    t.send_response(0.0, 486, b"486")
    assert "G" not in t.timers and t.timers["H"] == 32.0
    t.handle_input(1.0, _req("ACK", cseq_method="ACK"))
    assert t.poll_timeout() == 1.0
    _fire(t, 1.0)
    assert t.done


def test_invite_server_2xx_accepted_state() -> None:
    t = ServerTransaction(_req("INVITE"), ADDR, "tcp")
    t.send_response(0.0, 180, b"180")
    _outputs(t)
    t.handle_input(0.1, _req("INVITE"))
    assert _sent(t) == [b"180"]
    t.send_response(1.0, 200, b"200")
    assert t.state is State.ACCEPTED
    assert _fire(t, 4.0) == [1.5, 2.5]  # 2xx re-sent even on TCP (§13.3.1.4)
    t.ack_2xx()
    assert _fire(t, 20.0) == []
    t.handle_input(20.0, _req("INVITE"))
    assert _sent(t) == [b"200"]  # absorbed (RFC 6026 §8.7)
    t.handle_timeout(33.0)
    assert t.done and _outputs(t) == []  # acknowledged: no NoAck


def test_non_invite_server_timer_j() -> None:
    t = ServerTransaction(_req("OPTIONS"), ADDR, "udp")
    t.handle_input(0.0, _req("OPTIONS"))
    assert _sent(t) == []  # Trying: nothing to re-send
    t.send_response(0.0, 200, b"200")
    _outputs(t)
    t.handle_input(10.0, _req("OPTIONS"))
    assert _sent(t) == [b"200"]
    assert t.poll_timeout() == 32.0
    _fire(t, 32.0)
    assert t.done


def test_invite_client_timers_a_b() -> None:
    inv = _req("INVITE")
    t = ClientTransaction(inv, ADDR, "udp", 0.0)
    assert _sent(t) == [bytes(inv)]  # the request is the first output
    sent = []
    timed_out = []
    while (d := t.poll_timeout()) is not None:
        t.handle_timeout(d)
        out = _outputs(t)
        sent += [d] * len([o for o in out if isinstance(o, Send)])
        timed_out += [d for o in out if isinstance(o, TimedOut)]
    assert sent == [0.5, 1.5, 3.5, 7.5, 15.5, 31.5] and timed_out == [32.0]  # A doubles, B


def test_invite_client_non_2xx_acks_and_timer_d() -> None:
    inv = _req("INVITE")
    t = ClientTransaction(inv, ADDR, "udp", 0.0)
    _outputs(t)
    t.handle_input(0.1, _resp(inv, 180))
    assert _up(t) == [180]
    assert "A" not in t.timers and "B" not in t.timers
    t.handle_input(0.2, _resp(inv, 486))
    out = _outputs(t)
    assert [type(o) for o in out] == [Send, Received]  # the ACK goes out first
    assert isinstance(out[0], Send)
    ack = parse_untrusted(out[0].data)
    assert isinstance(ack, Request) and ack.method == "ACK" and ack.branch == inv.branch
    assert ack.to.tag == "2" and ack.cseq.seq == 1
    t.handle_input(1.0, _resp(inv, 486))
    assert _outputs(t) == [Send(bytes(ack))]  # retransmitted final: ACK again, absorbed
    assert t.poll_timeout() == pytest.approx(32.2)


def test_invite_client_2xx_passes_retransmissions_up() -> None:
    inv = _req("INVITE")
    t = ClientTransaction(inv, ADDR, "udp", 0.0)
    _outputs(t)
    t.handle_input(0.1, _resp(inv, 200))
    assert _up(t) == [200]
    assert t.state is State.ACCEPTED
    t.handle_input(0.6, _resp(inv, 200))
    assert _up(t) == [200]  # RFC 6026 §7.2
    _fire(t, 40.0)
    assert t.done  # Timer M


def test_non_invite_client_e_f_k() -> None:
    bye = _req("BYE")
    t = ClientTransaction(bye, ADDR, "udp", 0.0)
    assert _fire(t, 8.0) == [0.5, 1.5, 3.5, 7.5]
    t.handle_input(8.0, _resp(bye, 100))
    assert _up(t) == [100]
    assert t.state is State.PROCEEDING
    assert _fire(t, 16.0) == [11.5, 15.5]  # Proceeding: every T2
    t.handle_input(16.0, _resp(bye, 200))
    assert _up(t) == [200]
    assert t.poll_timeout() == 21.0  # Timer K = T4
    t.handle_input(17.0, _resp(bye, 200))
    assert _outputs(t) == []  # absorbed
    _fire(t, 21.0)
    assert t.done


def test_non_invite_client_timeout_and_reliable() -> None:
    t = ClientTransaction(_req("BYE"), ADDR, "tcp", 0.0)
    assert list(t.timers) == ["F"]
    t.handle_timeout(32.0)
    assert _outputs(t)[-1] == TimedOut() and t.done


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
