"""The TURN side of the one STUN codec: RFC 8656 §18 attributes, MESSAGE-INTEGRITY-SHA256
(RFC 8489 §14.6), PASSWORD-ALGORITHM(S) (§14.11/§14.12) and the SHA-256 long-term key; and a
two-way cross-check with aioice's TURN messages."""

from __future__ import annotations

import hashlib
import hmac

import aioice.stun as astun
import pytest

from appliance.proto.stun import (
    AttrType,
    Class,
    Message,
    Method,
    PasswordAlgorithm,
    StunError,
    encode_password_algorithms,
    find_attribute,
    long_term_key,
    message_integrity_sha256,
    parse_password_algorithm_untrusted,
    verify_integrity,
    verify_integrity_sha256,
)

TID = bytes(range(12))


def test_turn_attributes_round_trip_and_wire_bytes() -> None:
    msg = Message(Method.CHANNEL_BIND, Class.REQUEST, TID, (
        (AttrType.CHANNEL_NUMBER, 0x4001),
        (AttrType.XOR_PEER_ADDRESS, ("192.0.2.1", 3478)),
        (AttrType.LIFETIME, 600),
        (AttrType.REQUESTED_TRANSPORT, 17),
        (AttrType.REQUESTED_ADDRESS_FAMILY, 2),
        (AttrType.EVEN_PORT, 1),
        (AttrType.DONT_FRAGMENT, None),
        (AttrType.RESERVATION_TOKEN, b"12345678"),
        (AttrType.DATA, b"abc"),
        (AttrType.XOR_RELAYED_ADDRESS, ("2001:db8::1", 50000)),
        (AttrType.ADDITIONAL_ADDRESS_FAMILY, 2),
    ))
    raw = msg.encode(fingerprint=False)
    assert raw[:2] == b"\x00\x09"  # ChannelBind request (RFC 8656 §18)
    back = Message.parse_untrusted(raw)
    assert back == msg
    # §18.1: number then 16 bits of RFFU; §18.8: protocol then 24 bits of RFFU; §18.7: R bit.
    assert raw[20:28] == b"\x00\x0c\x00\x04\x40\x01\x00\x00"
    off, n = find_attribute(raw, AttrType.REQUESTED_TRANSPORT)  # type: ignore[misc]
    assert raw[off : off + n] == b"\x11\x00\x00\x00"
    off, n = find_attribute(raw, AttrType.EVEN_PORT)  # type: ignore[misc]
    assert raw[off : off + n] == b"\x80" and raw[off + 1 : off + 4] == b"\x00\x00\x00"
    off, n = find_attribute(raw, AttrType.DATA)  # type: ignore[misc]
    assert raw[off : off + n] == b"abc"
    assert find_attribute(raw, AttrType.USERNAME) is None
    assert find_attribute(raw[:-1], AttrType.DATA) is None  # bad framing: None, no raise


def test_rffu_bits_are_ignored_on_receipt() -> None:
    raw = bytearray(Message(Method.ALLOCATE, Class.REQUEST, TID,
                            ((AttrType.REQUESTED_TRANSPORT, 17),)).encode(fingerprint=False))
    raw[25:28] = b"\xff\xff\xff"
    assert Message.parse_untrusted(bytes(raw)).get(AttrType.REQUESTED_TRANSPORT) == 17


@pytest.mark.parametrize(("atype", "value"), [
    (0x000C, b"\x40\x00"), (0x0019, b"\x11"), (0x0017, b"\x01\x00\x00\x00\x00"),
    (0x0018, b"\x80\x00"), (0x001A, b"\x00"), (0x0022, b"1234567"), (0x001C, bytes(12)),
    (0x001C, bytes(18)), (0x001C, bytes(36)),
])
def test_malformed_turn_attributes_are_400(atype: int, value: bytes) -> None:
    body = atype.to_bytes(2, "big") + len(value).to_bytes(2, "big") + value
    body += b"\x00" * (-len(value) & 3)
    raw = b"\x00\x03" + len(body).to_bytes(2, "big") + b"\x21\x12\xa4\x42" + TID + body
    with pytest.raises(StunError) as exc:
        Message.parse_untrusted(raw)
    assert exc.value.hint == 400


def _independent_sha256(prefix: bytes, key: bytes, length: int) -> bytes:
    # RFC 8489 §14.6 spelled out: the header's length field is rewritten to end with the
    # MESSAGE-INTEGRITY-SHA256 attribute, then HMAC-SHA256 over everything before it.
    header = prefix[:2] + (len(prefix) - 20 + 4 + length).to_bytes(2, "big") + prefix[4:20]
    return hmac.new(key, header + prefix[20:], hashlib.sha256).digest()


def test_message_integrity_sha256() -> None:
    key = b"a long-term key"
    msg = Message(Method.ALLOCATE, Class.REQUEST, TID, ((AttrType.USERNAME, "u"),))
    raw = msg.encode(integrity_key=key, integrity="sha256")
    parsed = Message.parse_untrusted(raw)
    assert [t for t, _ in parsed.attributes] == [
        AttrType.USERNAME, AttrType.MESSAGE_INTEGRITY_SHA256, AttrType.FINGERPRINT]
    off, n = find_attribute(raw, AttrType.MESSAGE_INTEGRITY_SHA256)  # type: ignore[misc]
    assert n == 32
    assert raw[off : off + 32] == _independent_sha256(raw[: off - 4], key, 32)
    assert raw[off : off + 32] == message_integrity_sha256(raw[: off - 4], key)
    assert verify_integrity_sha256(raw, key) and not verify_integrity_sha256(raw, b"other")
    assert not verify_integrity(raw, key)  # no SHA-1 MESSAGE-INTEGRITY in it
    # A truncated (16-byte) MESSAGE-INTEGRITY-SHA256 verifies on its leading bytes (§14.6).
    short = raw[: off - 4]
    mac = _independent_sha256(short, key, 16)[:16]
    short = short[:2] + (len(short) - 20 + 20).to_bytes(2, "big") + short[4:]
    short += b"\x00\x1c\x00\x10" + mac
    assert verify_integrity_sha256(short, key)
    # Both: MESSAGE-INTEGRITY first, MESSAGE-INTEGRITY-SHA256 after it; both verify.
    both = msg.encode(integrity_key=key, integrity="both")
    assert verify_integrity(both, key) and verify_integrity_sha256(both, key)
    with pytest.raises(Exception, match="unknown integrity"):
        msg.encode(integrity_key=key, integrity="md5")


def test_attributes_after_integrity_sha256_are_ignored_but_fingerprint() -> None:
    raw = Message(Method.REFRESH, Class.REQUEST, TID).encode(
        integrity_key=b"k", fingerprint=False, integrity="sha256")
    tail = b"\x00\x06\x00\x04evil" + b"\x00\x08\x00\x14" + bytes(20)
    raw = raw[:2] + (len(raw) - 20 + len(tail)).to_bytes(2, "big") + raw[4:] + tail
    msg = Message.parse_untrusted(raw)
    assert msg.username is None and not msg.has(AttrType.MESSAGE_INTEGRITY)


def test_password_algorithms() -> None:
    assert encode_password_algorithms((PasswordAlgorithm.SHA256, PasswordAlgorithm.MD5)) == \
        bytes.fromhex("0002000000010000")
    assert parse_password_algorithm_untrusted(b"\x00\x02\x00\x00") == 2
    for bad in (b"", b"\x00\x02\x00\x01\x00", b"\x00\x02\x00"):
        with pytest.raises(StunError):
            parse_password_algorithm_untrusted(bad)
    md5 = long_term_key("user", "realm", "pass")
    sha = long_term_key("user", "realm", "pass", PasswordAlgorithm.SHA256)
    assert md5 == hashlib.md5(b"user:realm:pass").digest()
    assert sha == hashlib.sha256(b"user:realm:pass").digest()
    with pytest.raises(Exception, match="unknown password algorithm"):
        long_term_key("u", "r", "p", 7)


def test_aioice_turn_messages_parse_like_ours() -> None:
    """aioice's TURN client messages (an independent encoder) parse with our codec, and
    ours with aioice's, attribute for attribute."""
    a = astun.Message(message_method=astun.Method.CHANNEL_BIND,
                      message_class=astun.Class.REQUEST, transaction_id=TID)
    a.attributes["CHANNEL-NUMBER"] = 0x4000
    a.attributes["XOR-PEER-ADDRESS"] = ("192.0.2.7", 40000)
    a.attributes["LIFETIME"] = 600
    a.attributes["REQUESTED-TRANSPORT"] = 0x11000000
    a.attributes["DATA"] = b"payload"
    a.add_message_integrity(b"key")
    a.add_fingerprint()
    ours = Message.parse_untrusted(bytes(a))
    assert ours.method == Method.CHANNEL_BIND
    assert ours.get(AttrType.CHANNEL_NUMBER) == 0x4000
    assert ours.get(AttrType.XOR_PEER_ADDRESS) == ("192.0.2.7", 40000)
    assert ours.get(AttrType.LIFETIME) == 600
    assert ours.get(AttrType.REQUESTED_TRANSPORT) == 17
    assert ours.get(AttrType.DATA) == b"payload"
    assert verify_integrity(bytes(a), b"key")
    mine = Message(Method.ALLOCATE, Class.SUCCESS, TID, (
        (AttrType.XOR_RELAYED_ADDRESS, ("203.0.113.4", 50001)),
        (AttrType.LIFETIME, 600),
        (AttrType.XOR_MAPPED_ADDRESS, ("198.51.100.2", 1234)),
    )).encode(integrity_key=b"key")
    theirs = astun.parse_message(mine)
    assert theirs.message_method == astun.Method.ALLOCATE
    assert theirs.attributes["XOR-RELAYED-ADDRESS"] == ("203.0.113.4", 50001)
    assert theirs.attributes["LIFETIME"] == 600
    assert theirs.attributes["XOR-MAPPED-ADDRESS"] == ("198.51.100.2", 1234)
