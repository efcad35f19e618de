"""ICE-TCP passive candidates in the answer (RFC 6544 §4.2, §4.5): one per advertised
address beside the UDP one, always of lower priority, and parsed back by aiortc (an
independent SDP implementation) as TCP passive host candidates."""

from __future__ import annotations

import aiortc.sdp
from proto.sdp.test_answer import CANDIDATES, answer, lines, load

from appliance.proto.sdp import build_sdpfrag_answer


def test_tcp_passive_beside_udp() -> None:
    a = answer(load("chrome.sdp"), tcp_candidates=[(h, 443) for h, _ in CANDIDATES])
    cands = [x for x in lines(a) if x.startswith("a=candidate:")]
    assert cands == [
        "a=candidate:1 1 udp 2130706431 203.0.113.7 3478 typ host",
        "a=candidate:2 1 udp 2130706175 2001:db8::7 3478 typ host",
        f"a=candidate:3 1 tcp {(90 << 24) | (((4 << 13) | 8191) << 8) | 255} 203.0.113.7 443 "
        "typ host tcptype passive",
        f"a=candidate:4 1 tcp {(90 << 24) | (((4 << 13) | 8190) << 8) | 255} 2001:db8::7 443 "
        "typ host tcptype passive",
    ]
    prios = [int(x.split()[3]) for x in cands]
    assert min(prios[:2]) > max(prios[2:]), "UDP must win whenever it works"
    parsed = aiortc.sdp.SessionDescription.parse(a.text)
    tcp = [c for c in parsed.media[0].ice_candidates if c.protocol == "tcp"]
    assert [(c.ip, c.port, c.type, c.tcpType) for c in tcp] == [
        ("203.0.113.7", 443, "host", "passive"), ("2001:db8::7", 443, "host", "passive")]


def test_no_tcp_by_default_and_in_restart_frag() -> None:
    assert " tcp " not in answer(load("chrome.sdp")).text
    frag = build_sdpfrag_answer("AAEB+kq9x0", "p" * 24, CANDIDATES[:1],
                                tcp_candidates=[("203.0.113.7", 3478)])
    assert "a=candidate:2 1 tcp " in frag and "tcptype passive" in frag
