"""SipEndpoint against a scripted peer: the answers a UAS core owes (RFC 3261 §8.2), the
source policy and limits (issue 28 item 6), REFER/NOTIFY (RFC 3515), digest (RFC 2617)."""

from __future__ import annotations

import pytest
from proto.sip.sip_pair import NOW, drain

from appliance.proto.sip import (
    CallAcked,
    Credentials,
    Decision,
    EndpointConfig,
    IncomingCall,
    ReferProgress,
    ReInvite,
    Request,
    Response,
    SipEndpoint,
    Transmit,
    parse_untrusted,
)
from appliance.proto.sip import auth as digest

PEER = ("127.0.0.9", 41000)
HOST = "127.0.0.1"


def req(method: str, *, branch: str = "z9hG4bKpeer1", to_tag: str | None = None,
        cseq: int = 1, call_id: str = "c1@peer", body: str = "", extra: str = "",
        uri: str = "sip:agent@127.0.0.1", cseq_method: str | None = None) -> bytes:
    to = "<sip:agent@127.0.0.1>" + (f";tag={to_tag}" if to_tag else "")
    ctype = "Content-Type: application/sdp\r\n" if body and "Content-Type" not in extra else ""
    return (
        f"{method} {uri} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 10.0.0.5:5060;branch={branch};rport\r\n"
        "Max-Forwards: 70\r\n"
        "From: <sip:trunk@10.0.0.5>;tag=peer\r\n"
        f"To: {to}\r\n"
        f"Call-ID: {call_id}\r\n"
        f"CSeq: {cseq} {cseq_method or method}\r\n"
        "Contact: <sip:trunk@10.0.0.5:5060>\r\n"
        f"{extra}{ctype}Content-Length: {len(body.encode())}\r\n\r\n{body}"
    ).encode()


def responses(tx: list[Transmit]) -> list[Response]:
    out = []
    for t in tx:
        m = parse_untrusted(t.data)
        assert isinstance(m, Response)
        out.append(m)
    return out


def endpoint(**kw: object) -> SipEndpoint:
    return SipEndpoint(EndpointConfig(host=HOST, **kw))  # type: ignore[arg-type]


OFFER = "v=0\r\no=- 1 1 IN IP4 10.0.0.5\r\ns=-\r\nc=IN IP4 10.0.0.5\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n"


def incoming(ep: SipEndpoint) -> tuple[IncomingCall, str]:
    ep.handle_input(NOW, req("INVITE", body=OFFER), PEER)
    tx, ev = drain(ep)
    (call,) = ev
    assert isinstance(call, IncomingCall)
    ep.accept(NOW, call.call_id, b"v=0\r\n")
    tx, _ = drain(ep)
    tag = responses(tx)[0].to.tag
    assert tag
    ep.handle_input(NOW, req("ACK", branch="z9hG4bKack", to_tag=tag), PEER)
    _, ev = drain(ep)
    assert ev == [CallAcked(call.call_id, b"")]
    return call, tag


def test_options_answered_with_allow_and_accept() -> None:
    ep = endpoint()
    ep.handle_input(NOW, req("OPTIONS"), PEER)
    tx, ev = drain(ep)
    (r,) = responses(tx)
    assert not ev and r.status == 200
    assert "INVITE" in (r.get("Allow") or "") and r.get("Accept", ) is not None
    assert tx[0].addr == PEER  # back to the source, not to the Via's 10.0.0.5
    via = r.vias[0]
    assert via.received == "127.0.0.9" and via.rport == "41000"
    assert r.to.tag  # §8.2.6.2


@pytest.mark.parametrize(("method", "status"), [("REGISTER", 405), ("SUBSCRIBE", 405),
                                                 ("FOO", 501), ("BYE", 481), ("NOTIFY", 481),
                                                 ("INFO", 481)])
def test_out_of_dialog_methods(method: str, status: int) -> None:
    ep = endpoint()
    ep.handle_input(NOW, req(method), PEER)
    (r,) = responses(drain(ep)[0])
    assert r.status == status
    if status == 405:
        assert r.get("Allow")


def test_unknown_dialog_481_and_cancel_without_invite() -> None:
    ep = endpoint()
    ep.handle_input(NOW, req("BYE", to_tag="nope"), PEER)
    assert [r.status for r in responses(drain(ep)[0])] == [481]
    ep.handle_input(NOW, req("CANCEL", branch="z9hG4bKnone"), PEER)
    assert [r.status for r in responses(drain(ep)[0])] == [481]


def test_malformed_request_gets_400_naming_the_problem() -> None:
    ep = endpoint()
    ep.handle_input(NOW, req("OPTIONS", cseq_method="INVITE"), PEER)
    (r,) = responses(drain(ep)[0])
    assert r.status == 400 and r.reason == "CSeq method does not match the request"
    ep.handle_input(NOW, b"\x00\xffgarbage", PEER)
    assert drain(ep) == ([], [])  # nothing to address a reply to: counted and dropped
    assert ep.counters["malformed"] == 2


def test_broken_routing_header_gets_no_400() -> None:
    """Regression (fuzz target sip_endpoint): a request whose From did not parse was
    answered with a 400 echoing that From, which nobody can match and which was itself
    malformed. Such a request is now counted and dropped."""
    ep = endpoint()
    bad = req("OPTIONS").replace(b"From: <sip:trunk@10.0.0.5>;tag=peer", b"From: <sip:trunk@10.0.0.5:tag=peer")
    ep.handle_input(NOW, bad, PEER)
    assert drain(ep) == ([], []) and ep.counters["unanswerable"] == 1


def test_refused_flood_is_rate_limited() -> None:
    ep = endpoint(allow=lambda ip: Decision.REFUSE, rate=1.0, burst=2.0)
    for i in range(5):
        ep.handle_input(NOW, req("INVITE", branch=f"z9hG4bKf{i}", body=OFFER), PEER)
    assert len(drain(ep)[0]) == 2 and ep.counters["rate-limited"] == 3


def test_unsupported_uri_scheme_require_and_body() -> None:
    ep = endpoint()
    ep.handle_input(NOW, req("OPTIONS", uri="urn:x:y"), PEER)
    ep.handle_input(NOW, req("OPTIONS", branch="z9hG4bK2", extra="Require: 100rel\r\n"), PEER)
    ep.handle_input(NOW, req("INVITE", branch="z9hG4bK3", body="hi",
                             extra="Content-Type: text/plain\r\n"), PEER)
    rs = responses(drain(ep)[0])
    assert [r.status for r in rs] == [416, 420, 415]
    assert rs[1].get("Unsupported") == "100rel"


def test_invite_retransmission_absorbed() -> None:
    ep = endpoint()
    ep.handle_input(NOW, req("INVITE", body=OFFER), PEER)
    tx, ev = drain(ep)
    assert [r.status for r in responses(tx)] == [100] and len(ev) == 1
    ep.handle_input(NOW + 0.5, req("INVITE", body=OFFER), PEER)
    tx, ev = drain(ep)
    assert [r.status for r in responses(tx)] == [100] and ev == []  # re-sent, not re-reported


def test_refused_source_gets_minimal_403_or_silence() -> None:
    ep = endpoint(allow=lambda ip: Decision.REFUSE)
    data = req("INVITE", body=OFFER)
    ep.handle_input(NOW, data, PEER)
    tx, ev = drain(ep)
    (r,) = responses(tx)
    assert r.status == 403 and not ev and len(tx[0].data) <= len(data)
    # a tiny request: a 403 would be larger than it, so nothing goes back (no amplification)
    tiny = b"OPTIONS sip:a SIP/2.0\r\nv: SIP/2.0/UDP h;branch=z9hG4bKx\r\nf: <sip:a>;tag=1\r\nt: <sip:a>\r\ni: x\r\nCSeq: 1 OPTIONS\r\n\r\n"
    ep.handle_input(NOW, tiny, PEER)
    assert drain(ep) == ([], [])
    assert ep.counters["too-large-to-answer"] == 1
    quiet = endpoint(allow=lambda ip: Decision.DROP)
    quiet.handle_input(NOW, data, PEER)
    assert drain(quiet) == ([], []) and quiet.counters["dropped-source"] == 1


def test_loopback_only_by_default() -> None:
    ep = endpoint()
    ep.handle_input(NOW, req("OPTIONS"), ("198.51.100.1", 5060))
    (r,) = responses(drain(ep)[0])
    assert r.status == 403


def test_cidr_policy() -> None:
    from appliance.proto.sip.ua import cidr_policy

    pol = cidr_policy(["203.0.113.0/24", "2001:db8::/32"])
    assert pol("203.0.113.9") is Decision.ALLOW and pol("::ffff:203.0.113.9") is Decision.ALLOW
    assert pol("2001:db8::5") is Decision.ALLOW and pol("127.0.0.1") is Decision.ALLOW
    assert pol("198.51.100.1") is Decision.REFUSE and pol("not-an-ip") is Decision.REFUSE
    strict = cidr_policy(["203.0.113.0/24"], drop=True, loopback=False)
    assert strict("127.0.0.1") is Decision.DROP and strict("203.0.113.1") is Decision.ALLOW


def test_rate_limit_per_source() -> None:
    ep = endpoint(rate=1.0, burst=3.0)
    for i in range(6):
        ep.handle_input(NOW, req("OPTIONS", branch=f"z9hG4bKr{i}"), PEER)
    assert len(drain(ep)[0]) == 3 and ep.counters["rate-limited"] == 3
    ep.handle_input(NOW, req("OPTIONS", branch="z9hG4bKo"), ("127.0.0.10", 5060))
    assert len(drain(ep)[0]) == 1  # another source has its own bucket
    ep.handle_input(NOW + 1.0, req("OPTIONS", branch="z9hG4bKlater"), PEER)
    assert len(drain(ep)[0]) == 1  # one token back after a second


def test_invite_cap_and_table_bound() -> None:
    ep = endpoint(max_invites=2, max_transactions=10, burst=100.0)
    for i in range(3):
        ep.handle_input(NOW, req("INVITE", branch=f"z9hG4bKi{i}", call_id=f"c{i}", body=OFFER), PEER)
    statuses = [r.status for r in responses(drain(ep)[0])]
    assert statuses == [100, 100, 503]
    for i in range(20):
        ep.handle_input(NOW, req("OPTIONS", branch=f"z9hG4bKt{i}"), PEER)
    drain(ep)
    assert len(ep._server) <= 10 and ep.counters["table-full"] > 0
    ep.handle_timeout(NOW + 64)
    assert len(ep._server) <= 2  # only the unanswered INVITEs are left


def test_crlf_keepalive_pong_on_streams() -> None:
    ep = endpoint()
    ep.handle_input(NOW, b"\r\n\r\n", PEER, "tcp")
    assert drain(ep)[0] == [Transmit(b"\r\n", PEER, "tcp")]
    ep.handle_input(NOW, b"\r\n\r\n", PEER, "udp")
    assert drain(ep) == ([], [])


def test_reinvite_glare_and_target_refresh() -> None:
    ep = endpoint()
    call, tag = incoming(ep)
    ep.handle_input(NOW, req("INVITE", branch="z9hG4bKre1", to_tag=tag, cseq=2, body=OFFER,
                             extra=""), PEER)
    tx, ev = drain(ep)
    assert ev == [ReInvite(call.call_id, OFFER.encode())]
    assert [r.status for r in responses(tx)] == [100]
    ep.handle_input(NOW, req("INVITE", branch="z9hG4bKre2", to_tag=tag, cseq=3, body=OFFER), PEER)
    assert [r.status for r in responses(drain(ep)[0])] == [491]
    ep.reject_reinvite(NOW, call.call_id, 488, '399 127.0.0.1 "no common codec"')
    (r,) = responses(drain(ep)[0])
    assert r.status == 488 and r.get("Warning") == '399 127.0.0.1 "no common codec"'
    # an old CSeq is refused (§12.2.2)
    ep.handle_input(NOW, req("INFO", branch="z9hG4bKold", to_tag=tag, cseq=1), PEER)
    assert [r.status for r in responses(drain(ep)[0])] == [500]


def test_refer_and_notify_progress() -> None:
    ep = endpoint()
    call, tag = incoming(ep)
    ep.refer(NOW, call.call_id, "sip:+15551234@trunk.example")
    (t,) = drain(ep)[0]
    refer = parse_untrusted(t.data)
    assert isinstance(refer, Request) and refer.method == "REFER"
    assert refer.get("Refer-To") == "<sip:+15551234@trunk.example>"
    assert refer.uri.host == "10.0.0.5" and t.addr == PEER  # remote target, symmetric addr
    assert refer.to.tag == "peer" and refer.from_.tag == tag
    ok = bytes(Response(202, "Accepted", refer.headers[:1] + tuple(
        (k, v + (";tag=peer" if k == "To" and "tag=" not in v else "")) for k, v in refer.headers
        if k in ("From", "To", "Call-ID", "CSeq"))))
    ep.handle_input(NOW, ok, PEER)
    assert drain(ep)[1] == [ReferProgress(call.call_id, 202, "Accepted", False)]

    def notify(cseq: int, frag: str, state: str) -> bytes:
        return req("NOTIFY", branch=f"z9hG4bKn{cseq}", to_tag=tag, cseq=cseq, body=frag,
                   extra=f"Event: refer\r\nSubscription-State: {state}\r\n"
                         "Content-Type: message/sipfrag\r\n")

    ep.handle_input(NOW, notify(5, "SIP/2.0 100 Trying\r\n", "active;expires=60"), PEER)
    tx, ev = drain(ep)
    assert [r.status for r in responses(tx)] == [200]
    assert ev == [ReferProgress(call.call_id, 100, "Trying", False)]
    ep.handle_input(NOW, notify(6, "SIP/2.0 200 OK\r\n", "terminated;reason=noresource"), PEER)
    assert drain(ep)[1] == [ReferProgress(call.call_id, 200, "OK", True)]


def test_far_end_refer_refused() -> None:
    ep = endpoint()
    _, tag = incoming(ep)
    ep.handle_input(NOW, req("REFER", branch="z9hG4bKrf", to_tag=tag, cseq=2,
                             extra="Refer-To: <sip:x@y>\r\n"), PEER)
    assert [r.status for r in responses(drain(ep)[0])] == [403]


# ---- digest (RFC 2617 §3.5; RFC 8760 points to RFC 7616 §3.9.1 for its SHA-256 example)


def test_digest_vectors() -> None:
    assert digest.digest_response(
        "MD5", "Mufasa", "testrealm@host.com", "Circle Of Life",
        "dcd98b7102dd2f0e8b11d0f600bfb0c093", "GET", "/dir/index.html", qop="auth",
        nc="00000001", cnonce="0a4f113b") == "6629fae49393a05397450978507c4ef1"
    nonce = "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v"
    cnonce = "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ"
    args = ("Mufasa", "http-auth@example.org", "Circle of Life", nonce, "GET", "/dir/index.html")
    assert digest.digest_response("MD5", *args, qop="auth", cnonce=cnonce) == \
        "8ca523f5e9506fed4657c9700eebdbec"
    assert digest.digest_response("SHA-256", *args, qop="auth", cnonce=cnonce) == \
        "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"


def test_credentials_never_shown() -> None:
    c = Credentials("alice", "hunter2-secret")
    assert "hunter2" not in repr(c) and "hunter2" not in str(c)


@pytest.mark.parametrize(("status", "algorithm"), [(401, "MD5"), (407, "SHA-256")])
def test_outbound_invite_answers_one_challenge(status: int, algorithm: str) -> None:
    ep = endpoint()
    creds = Credentials("alice", "hunter2-secret")
    call_id = ep.invite(NOW, "sip:+15550100@trunk.example", "sip:alice@trunk.example",
                        OFFER.encode(), PEER, credentials=creds)
    (t,) = drain(ep)[0]
    inv = parse_untrusted(t.data)
    assert isinstance(inv, Request)
    hdr = "WWW-Authenticate" if status == 401 else "Proxy-Authenticate"

    def challenge(r: Request, branch_from: Request) -> bytes:
        hs = [(k, v) for k, v in branch_from.headers if k in ("Via", "From", "Call-ID", "CSeq")]
        hs.append(("To", (r.get("To") or "") + ";tag=trunk"))
        hs.append((hdr, f'Digest realm="trunk.example", nonce="abc123", algorithm={algorithm}, '
                        'qop="auth", opaque="op"'))
        return bytes(Response(status, "Unauthorized", tuple(hs)))

    ep.handle_input(NOW, challenge(inv, inv), PEER)
    tx, ev = drain(ep)
    assert not ev
    sent = [parse_untrusted(x.data) for x in tx]
    methods = [m.method for m in sent if isinstance(m, Request)]
    assert methods == ["ACK", "INVITE"]  # the 4xx is ACKed by the transaction, then retried
    again = sent[1]
    assert isinstance(again, Request)
    assert again.cseq.seq == inv.cseq.seq + 1 and again.call_id == inv.call_id
    assert again.from_.tag == inv.from_.tag and again.branch != inv.branch
    value = again.get("Authorization" if status == 401 else "Proxy-Authorization") or ""
    params = digest._auth_params(value.partition(" ")[2])
    expect = digest.digest_response(algorithm, "alice", "trunk.example", "hunter2-secret", "abc123",
                                    "INVITE", str(again.uri), qop="auth", nc=params["nc"],
                                    cnonce=params["cnonce"])
    assert params["response"] == expect and params["opaque"] == "op"
    assert "hunter2" not in value
    # a second challenge is not answered: the call fails with that status
    ep.handle_input(NOW, challenge(again, again), PEER)
    tx, ev = drain(ep)
    assert len(ev) == 1 and ev[0].call_id == call_id and ev[0].status == status  # type: ignore[union-attr]


def test_a_dialog_moves_only_along_its_transition_table() -> None:
    """Issue 39 item 4: a call's state is an enum with a transition table that raises on an
    illegal move (h11's style), and every assignment goes through it."""
    from appliance.proto.sip.dialog import TRANSITIONS, CallState, Dialog, IllegalTransition

    assert TRANSITIONS[CallState.ENDED] == frozenset()  # the end is the end
    reachable = {CallState.INCOMING, CallState.OUTGOING}
    for _ in CallState:
        reachable |= {t for s in reachable for t in TRANSITIONS[s]}
    assert reachable == set(CallState)
    uas = Dialog("sip_1", "x@h", ("192.0.2.1", 5060), "udp", outbound=False)
    for to in (CallState.EARLY, CallState.EARLY, CallState.ANSWERED, CallState.CONFIRMED):
        uas.move(to)
    with pytest.raises(IllegalTransition, match="confirmed -> early"):
        uas.move(CallState.EARLY)
    uac = Dialog("sip_2", "y@h", ("192.0.2.1", 5060), "udp", outbound=True)
    with pytest.raises(IllegalTransition):
        uac.move(CallState.ANSWERED)  # a UAS state: we never answer our own INVITE
    uac.move(CallState.ENDED)
    with pytest.raises(IllegalTransition):
        uac.move(CallState.CONFIRMED)
    assert uac.state is CallState.ENDED
