"""STUN codec behaviour beyond the RFC 5769 vectors: builders, attribute handling, the
relay's hot-path helpers, and a two-way cross-check with aioice's codec."""

from __future__ import annotations

import aioice.stun as astun
import pytest

from appliance.proto.errors import LocalProtocolError, RemoteProtocolError
from appliance.proto.stun import (
    MAX_AMPLIFICATION,
    AttrType,
    Class,
    Message,
    Method,
    StunError,
    binding_error,
    binding_request,
    binding_success,
    peek_username_untrusted,
    reflexive_response,
    verify_fingerprint,
    verify_integrity,
)

TID = bytes(range(12))


def test_stun_error_is_remote_protocol_error() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        Message.parse_untrusted(b"\x00" * 19)
    assert isinstance(info.value, StunError)
    assert info.value.hint == 400


def test_binding_request_fields() -> None:
    raw = binding_request(
        TID,
        username="srv:cli",
        password="secret",
        priority=123,
        controlling=2**64 - 1,
        use_candidate=True,
    )
    msg = Message.parse_untrusted(raw)
    assert (msg.method, msg.msg_class) == (Method.BINDING, Class.REQUEST)
    assert msg.username == "srv:cli"
    assert msg.priority == 123
    assert msg.ice_controlling == 2**64 - 1
    assert msg.use_candidate
    assert verify_integrity(raw, b"secret")
    assert verify_fingerprint(raw)
    # MESSAGE-INTEGRITY then FINGERPRINT are the last two attributes.
    assert [t for t, _ in msg.attributes][-2:] == [
        AttrType.MESSAGE_INTEGRITY,
        AttrType.FINGERPRINT,
    ]


def test_binding_request_rejects_both_roles() -> None:
    with pytest.raises(LocalProtocolError):
        binding_request(TID, controlling=1, controlled=2)


@pytest.mark.parametrize("mapped", [("203.0.113.7", 54321), ("2001:db8::1", 1)])
def test_binding_success_round_trip(mapped: tuple[str, int]) -> None:
    raw = binding_success(TID, mapped, integrity_key=b"k")
    msg = Message.parse_untrusted(raw)
    assert msg.msg_class is Class.SUCCESS
    assert msg.xor_mapped_address == mapped
    assert verify_integrity(raw, b"k")
    # aioice agrees, including its own integrity check.
    theirs = astun.parse_message(raw)
    assert theirs.attributes["XOR-MAPPED-ADDRESS"] == mapped
    assert theirs.check_message_integrity(b"k")


def test_binding_error_round_trip() -> None:
    raw = binding_error(TID, 420, integrity_key=b"k", unknown_attributes=(0x7777, 0x0042))
    msg = Message.parse_untrusted(raw)
    assert msg.msg_class is Class.ERROR
    assert msg.error_code == (420, "Unknown Attribute")
    assert msg.get(AttrType.UNKNOWN_ATTRIBUTES) == (0x7777, 0x0042)
    assert astun.parse_message(raw).attributes["ERROR-CODE"] == (420, "Unknown Attribute")
    raw401 = binding_error(TID, 401)
    assert Message.parse_untrusted(raw401).get(AttrType.MESSAGE_INTEGRITY) is None


def test_aioice_bytes_parse_like_ours() -> None:
    req = astun.Message(astun.Method.BINDING, astun.Class.REQUEST, transaction_id=TID)
    req.attributes["USERNAME"] = "a:b"
    req.attributes["PRIORITY"] = 99
    req.attributes["ICE-CONTROLLING"] = 12345678901234567
    req.attributes["USE-CANDIDATE"] = None
    req.add_message_integrity(b"pw")
    raw = bytes(req)
    msg = Message.parse_untrusted(raw)
    assert msg.username == "a:b"
    assert msg.priority == 99
    assert msg.ice_controlling == 12345678901234567
    assert msg.use_candidate
    assert verify_integrity(raw, b"pw")
    assert verify_fingerprint(raw)
    # And ours encodes to aioice-parseable bytes that verify under aioice.
    ours = msg.encode(b"pw")
    theirs = astun.parse_message(ours)
    assert theirs.check_message_integrity(b"pw")
    assert theirs.attributes["ICE-CONTROLLING"] == 12345678901234567
    assert ours == raw  # same attribute order, same padding: identical bytes


def _attr(atype: int, value: bytes) -> bytes:
    pad = b"\x00" * (-len(value) & 3)
    return atype.to_bytes(2, "big") + len(value).to_bytes(2, "big") + value + pad


def _message(*attrs: bytes, mtype: int = 0x0001) -> bytes:
    body = b"".join(attrs)
    return (
        mtype.to_bytes(2, "big") + len(body).to_bytes(2, "big") + b"\x21\x12\xa4\x42" + TID + body
    )


def test_unknown_attributes() -> None:
    raw = _message(_attr(0x7777, b"x"), _attr(0xC057, b"\x00\x01\x00\x02"), _attr(0x6, b"u:v"))
    msg = Message.parse_untrusted(raw)
    assert msg.unknown_required == (0x7777,)  # optional 0xC057 skipped silently
    assert msg.username == "u:v"
    assert [t for t, _ in msg.attributes] == [AttrType.USERNAME]


def test_attributes_after_integrity_are_ignored() -> None:
    raw = _message(_attr(0x8, bytes(20)), _attr(0x6, b"late"), _attr(0x7777, b""))
    msg = Message.parse_untrusted(raw)
    assert msg.username is None
    assert msg.unknown_required == ()


@pytest.mark.parametrize(
    "raw",
    [
        _message(_attr(0x8028, bytes(4)), _attr(0x6, b"x")),  # after FINGERPRINT
        _message(_attr(0x24, b"\x00\x01")),  # short PRIORITY
        _message(_attr(0x20, b"\x00\x03\x00\x00" + bytes(4))),  # bad family
        _message(_attr(0x6, b"\xff\xfe")),  # USERNAME not UTF-8
        _message(_attr(0x9, b"\x00\x00\x07\x00")),  # error class 7
        _message(mtype=0x0FFF),  # unknown method
        _message(mtype=0xC001),  # top bits set
        _message()[:4] + b"\x00\x00\x00\x00" + TID,  # RFC 3489 (no cookie)
        _message(_attr(0x6, b"abcd"))[:-1],  # length mismatch
    ],
)
def test_malformed_messages(raw: bytes) -> None:
    with pytest.raises(StunError):
        Message.parse_untrusted(raw)


def test_repeated_attribute_first_wins() -> None:
    msg = Message.parse_untrusted(_message(_attr(0x6, b"one"), _attr(0x6, b"two")))
    assert msg.username == "one"
    assert len(msg.attributes) == 2


def test_message_requires_12_byte_tid() -> None:
    with pytest.raises(LocalProtocolError):
        Message(Method.BINDING, Class.REQUEST, b"short")


def test_bytes_is_encode() -> None:
    msg = Message(Method.BINDING, Class.INDICATION, TID)
    assert bytes(msg) == msg.encode()
    assert Message.parse_untrusted(bytes(msg)).msg_class is Class.INDICATION


# --- hot path ---------------------------------------------------------------------------


def test_peek_username() -> None:
    raw = binding_request(TID, username="srv:cli", password="p", priority=1, controlling=5)
    assert peek_username_untrusted(raw) == b"srv:cli"
    assert peek_username_untrusted(memoryview(raw)) == b"srv:cli"
    assert peek_username_untrusted(bytearray(raw)) == b"srv:cli"
    assert peek_username_untrusted(binding_request(TID)) is None
    assert peek_username_untrusted(_message()) is None


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00\x01",
        binding_success(TID, ("1.2.3.4", 5)),  # a response
        _message(mtype=0x0011),  # a Binding indication
        _message()[:4] + b"\x00\x00\x00\x00" + TID,
        _message(_attr(0x6, b"abcd"))[:-4],  # attribute past the end
        _message(_attr(0x6, b"abc"))[:-1],  # padding missing
        b"\x16\xfe\xfd" + bytes(40),  # DTLS
    ],
)
def test_peek_rejects(raw: bytes) -> None:
    with pytest.raises(StunError):
        peek_username_untrusted(raw)


def test_peek_ignores_username_after_integrity() -> None:
    raw = _message(_attr(0x8, bytes(20)), _attr(0x6, b"late"))
    assert peek_username_untrusted(raw) is None


@pytest.mark.parametrize("addr", [("198.51.100.9", 40000), ("2001:db8::beef", 65535)])
def test_reflexive_response(addr: tuple[str, int]) -> None:
    req = _message()  # the smallest possible request: 20 bytes
    resp = reflexive_response(req, addr)
    assert len(resp) <= len(req) + MAX_AMPLIFICATION
    msg = Message.parse_untrusted(resp)
    assert (msg.method, msg.msg_class) == (Method.BINDING, Class.SUCCESS)
    assert msg.transaction_id == TID
    assert msg.xor_mapped_address == addr
    assert verify_fingerprint(resp)
    assert [t for t, _ in msg.attributes] == [AttrType.XOR_MAPPED_ADDRESS, AttrType.FINGERPRINT]
    # Same bytes as the general builder, and aioice reads it.
    assert resp == binding_success(TID, addr)
    assert astun.parse_message(resp).attributes["XOR-MAPPED-ADDRESS"] == addr


def test_reflexive_response_rejects_non_requests() -> None:
    with pytest.raises(StunError):
        reflexive_response(binding_success(TID, ("1.2.3.4", 5)), ("1.2.3.4", 5))
