"""Hypothesis on the SIP parsers: only SipError escapes, whole and byte-at-a-time.

Random bytes rarely get past a start line, so the main strategy builds messages from SIP
pieces (methods, header names in every spelling, values with the characters that matter
to the grammar: quotes, angle brackets, commas, semicolons, folding) and then mutates them.
The corpus-seeded deep runs live in tests/fuzz/test_deep.py (targets sip, sip_stream,
sip_endpoint, sdp_phone).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.proto.sip import SipError, StreamFramer, parse_untrusted

NAMES = ["Via", "v", "From", "f", "To", "t", "Call-ID", "i", "CSeq", "Contact", "m",
         "Max-Forwards", "Content-Length", "l", "Route", "Record-Route", "Require", "X-Y",
         "Content-Type", "c", "Allow", "k"]
PIECES = ["SIP/2.0/UDP h:5060", ";branch=z9hG4bK1", ";rport", ";tag=1", "<sip:a@b>",
          '"quoted \\" name"', "sip:u:p@[::1]:5070;lr", ",", ";", " ", "\r\n ", "1 INVITE",
          "70", "0", "5", "tel:+1-555", "*", "=", "?h=v", "<", ">", '"', "application/sdp"]


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(["INVITE", "ACK", "BYE", "OPTIONS", "CANCEL", "X!"]))
    if draw(st.booleans()):
        start = f"{method} {draw(st.sampled_from(['sip:a@b', 'sips:h', 'tel:1', '<sip:x>']))} SIP/2.0"
    else:
        start = f"SIP/2.0 {draw(st.sampled_from(['200 OK', '100', '4000 x', '180 Ringing']))}"
    lines = [start]
    for _ in range(draw(st.integers(0, 14))):
        name = draw(st.sampled_from(NAMES))
        value = "".join(draw(st.lists(st.sampled_from(PIECES), max_size=6)))
        lines.append(f"{name}{draw(st.sampled_from([':', ' :', ': ', '']))}{value}")
    body = draw(st.binary(max_size=20))
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(messages(), st.binary(max_size=300)), cut=st.integers(0, 400))
def test_only_sip_error_escapes(data: bytes, cut: int) -> None:
    for chunk in (data, data[:cut]):
        for stream in (False, True):
            try:
                msg = parse_untrusted(chunk, stream=stream)
            except SipError as e:
                error: SipError | None = e
                msg = None
            else:
                error = None
            if error is not None:
                assert 400 <= error.status <= 599 and error.reason
                continue
            assert msg is not None
            # a message that parsed serialises to one that parses to itself after one round
            once = parse_untrusted(bytes(msg), stream=stream)
            assert parse_untrusted(bytes(once), stream=stream) == once


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(messages(), min_size=1, max_size=4), step=st.integers(1, 9))
def test_framer_only_sip_error_escapes(parts: list[bytes], step: int) -> None:
    stream = b"".join(parts)
    framer = StreamFramer(max_message=4096)
    try:
        for i in range(0, len(stream), step):
            framer.feed(stream[i : i + step])
            for m in framer:
                assert b"\r\n\r\n" in m
                try:
                    parse_untrusted(m, stream=True)
                except SipError:
                    pass
    except SipError:
        pass
