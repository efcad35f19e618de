"""Helpers that build and inspect raw DTLS records for tests."""

from __future__ import annotations

from appliance.proto.dtls import DtlsConnection
from appliance.proto.dtls.messages import ClientHello, HandshakeBody, parse_handshake_body_untrusted
from appliance.proto.dtls.record import (
    HandshakeFragment,
    Record,
    parse_handshake_fragments_untrusted,
    parse_records_untrusted,
)


def handshake_datagram(
    body: bytes,
    msg_type: int = 1,
    *,
    message_seq: int = 0,
    record_seq: int = 0,
    split: int | None = None,
) -> list[bytes]:
    """One handshake message as one datagram, or two fragments in two datagrams."""
    if split is None:
        frags = [HandshakeFragment(msg_type, len(body), message_seq, 0, body)]
    else:
        frags = [
            HandshakeFragment(msg_type, len(body), message_seq, 0, body[:split]),
            HandshakeFragment(msg_type, len(body), message_seq, split, body[split:]),
        ]
    return [bytes(Record(22, 0xFEFD, 0, record_seq + i, bytes(f))) for i, f in enumerate(frags)]


def plaintext_messages(datagram: bytes) -> list[HandshakeBody]:
    """Parse the epoch-0 handshake messages of a datagram (unfragmented ones only)."""
    out = []
    for record in parse_records_untrusted(datagram):
        if record.epoch == 0 and record.content_type == 22:
            for frag in parse_handshake_fragments_untrusted(record.fragment):
                if len(frag.body) == frag.length:
                    out.append(parse_handshake_body_untrusted(frag.msg_type, frag.body))
    return out


def alerts(datagram: bytes) -> list[tuple[int, int, int]]:
    """(epoch, level, description) of plaintext alerts; encrypted ones give (1, -1, -1)."""
    out = []
    for record in parse_records_untrusted(datagram):
        if record.content_type == 21:
            if record.epoch == 0:
                out.append((0, record.fragment[0], record.fragment[1]))
            else:
                out.append((record.epoch, -1, -1))
    return out


def drain(conn: DtlsConnection) -> list[bytes]:
    out = []
    while (d := conn.poll_transmit()) is not None:
        out.append(d)
    return out


def with_extensions(
    hello: ClientHello, drop: set[int] = frozenset(), add: tuple[tuple[int, bytes], ...] = ()
) -> ClientHello:  # type: ignore[assignment]
    exts = tuple((t, d) for t, d in hello.extensions if t not in drop) + add
    return ClientHello(
        hello.client_version,
        hello.random,
        hello.session_id,
        hello.cookie,
        hello.cipher_suites,
        hello.compression_methods,
        exts,
    )
