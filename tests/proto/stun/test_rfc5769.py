"""RFC 5769 test vectors: byte-exact parse, integrity, fingerprint and round-trip, plus a
cross-check against aioice's independent codec."""

from __future__ import annotations

import aioice.stun as astun
import pytest

from appliance.proto.stun import (
    AttrType,
    Class,
    Message,
    Method,
    long_term_key,
    saslprep,
    verify_fingerprint,
    verify_integrity,
)

PASSWORD = b"VOkJxbRl1RmTxUk/WvJxBt"

# RFC 5769 §2.1 Sample Request (padding bytes are 0x20 in the RFC).
REQUEST = bytes.fromhex(
    "000100582112a442b7e7a701bc34d686fa87dfae"
    "802200105354554e20746573742063 6c69656e74"
    "002400046e0001ff"
    "80290008932ff9b151263b36"
    "000600096576746a3a683676592020 20"
    "000800149aeaa70cbfd8cb56781ef2b5b2d3f249c1b571a2"
    "80280004e57a3bcf"
)
# §2.2 Sample IPv4 Response.
RESPONSE_V4 = bytes.fromhex(
    "0101003c2112a442b7e7a701bc34d686fa87dfae"
    "8022000b7465737420766563746f7220"
    "002000080001a147e112a643"
    "000800142b91f599fd9e90c38c7489f92af9ba53f06be7d7"
    "80280004c07d4c96"
)
# §2.3 Sample IPv6 Response.
RESPONSE_V6 = bytes.fromhex(
    "010100482112a442b7e7a701bc34d686fa87dfae"
    "8022000b7465737420766563746f7220"
    "002000140002a1470113a9faa5d3f179bc25f4b5bed2b9d9"
    "00080014a382954e4be67bf11784c97c8292c275bfe3ed41"
    "80280004c8fb0b4c"
)
# §2.4 Sample Request with Long-Term Authentication (zero padding).
LONG_TERM = bytes.fromhex(
    "000100602112a44278ad3433c6ad72c029da412e"
    "00060012e3839ee38388e383aae38383e382afe382b90000"
    "0015001c662f2f3439396b39353464364f4c33346f4c394653547679363473 41"
    "0014000b6578616d706c652e6f726700"
    "00080014f67024656dd64a3e02b8e0712e85c9a28ca89666"
)
LT_USERNAME = "\u30de\u30c8\u30ea\u30c3\u30af\u30b9"
LT_PASSWORD = "The\u00adM\u00aatr\u2168"


def test_vector_lengths() -> None:
    assert (len(REQUEST), len(RESPONSE_V4), len(RESPONSE_V6), len(LONG_TERM)) == (
        108,
        80,
        92,
        116,
    )


def test_sample_request() -> None:
    msg = Message.parse_untrusted(REQUEST)
    assert msg.method is Method.BINDING
    assert msg.msg_class is Class.REQUEST
    assert msg.transaction_id == bytes.fromhex("b7e7a701bc34d686fa87dfae")
    assert msg.get(AttrType.SOFTWARE) == "STUN test client"
    assert msg.priority == 0x6E0001FF
    assert msg.ice_controlled == 0x932FF9B151263B36
    assert msg.ice_controlling is None
    assert msg.username == "evtj:h6vY"
    assert not msg.use_candidate
    assert msg.unknown_required == ()
    assert verify_integrity(REQUEST, PASSWORD)
    assert not verify_integrity(REQUEST, PASSWORD + b"x")
    assert verify_fingerprint(REQUEST)
    # Byte-exact round trip (the RFC pads with spaces; RFC 8489 senders pad with zeros).
    assert msg.encode(PASSWORD, padding=0x20) == REQUEST


@pytest.mark.parametrize(
    ("raw", "mapped"),
    [
        (RESPONSE_V4, ("192.0.2.1", 32853)),
        (RESPONSE_V6, ("2001:db8:1234:5678:11:2233:4455:6677", 32853)),
    ],
    ids=["ipv4", "ipv6"],
)
def test_sample_responses(raw: bytes, mapped: tuple[str, int]) -> None:
    msg = Message.parse_untrusted(raw)
    assert msg.msg_class is Class.SUCCESS
    assert msg.get(AttrType.SOFTWARE) == "test vector"
    assert msg.xor_mapped_address == mapped
    assert verify_integrity(raw, PASSWORD)
    assert verify_fingerprint(raw)
    assert msg.encode(PASSWORD, padding=0x20) == raw
    # Zero-padded re-encoding differs only in padding and still verifies.
    ours = msg.encode(PASSWORD)
    assert verify_integrity(ours, PASSWORD)
    assert verify_fingerprint(ours)
    again = Message.parse_untrusted(ours)
    assert again.attributes[:2] == msg.attributes[:2]  # MI/FINGERPRINT cover the padding


def test_long_term_request() -> None:
    assert saslprep(LT_PASSWORD) == "TheMatrIX"
    msg = Message.parse_untrusted(LONG_TERM)
    assert msg.username == LT_USERNAME
    assert msg.get(AttrType.NONCE) == "f//499k954d6OL34oL9FSTvy64sA"
    assert msg.get(AttrType.REALM) == "example.org"
    key = long_term_key(LT_USERNAME, "example.org", LT_PASSWORD)
    assert verify_integrity(LONG_TERM, key)
    assert not verify_fingerprint(LONG_TERM)  # the vector has no FINGERPRINT
    assert msg.encode(key, fingerprint=False) == LONG_TERM


def test_fingerprint_detects_corruption() -> None:
    bad = bytearray(REQUEST)
    bad[30] ^= 1  # inside SOFTWARE
    assert not verify_fingerprint(bytes(bad))
    assert not verify_integrity(bytes(bad), PASSWORD)
    Message.parse_untrusted(bytes(bad))  # still well formed


@pytest.mark.parametrize(
    "raw", [REQUEST, RESPONSE_V4, RESPONSE_V6, LONG_TERM], ids=["2.1", "2.2", "2.3", "2.4"]
)
def test_aioice_parses_vectors_like_us(raw: bytes) -> None:
    theirs = astun.parse_message(raw)
    ours = Message.parse_untrusted(raw)
    assert theirs.transaction_id == ours.transaction_id
    assert int(theirs.message_method) == int(ours.method)
    assert theirs.attributes.get("USERNAME") == ours.username
    assert theirs.attributes.get("PRIORITY") == ours.priority
    assert theirs.attributes.get("ICE-CONTROLLED") == ours.ice_controlled
    assert theirs.attributes.get("XOR-MAPPED-ADDRESS") == ours.xor_mapped_address
    assert theirs.attributes["MESSAGE-INTEGRITY"] == ours.get(AttrType.MESSAGE_INTEGRITY)
