"""Peek at a TLS ClientHello's SNI and ALPN without terminating TLS (issue 40 item 4).

The media port's TCP listener splits TLS connections between HTTPS signaling and TURN/TLS
by what the client asks for before any key is exchanged: RFC 6066 §3 ``server_name`` and
RFC 7301 §3.1 ``application_layer_protocol_negotiation`` (``stun.turn``, RFC 7443 §3). The
ClientHello itself is parsed by the one ClientHello codec, :class:`.messages.ClientHello`
(``stream=True``: a TLS ClientHello has no DTLS cookie), so there is one parser of it.

Wire (RFC 8446 §5.1, §4)::

    struct { ContentType type;            // 22 = handshake
             ProtocolVersion legacy_record_version;
             uint16 length;               // <= 2^14
             opaque fragment[length]; } TLSPlaintext;
    struct { HandshakeType msg_type;      // 1 = client_hello
             uint24 length;
             ClientHello body; } Handshake;

Deliberately omitted: a ClientHello split over several records (RFC 8446 §5.1 allows it;
no browser, OpenSSL or coturn client does it for hellos under 2^14 bytes) is refused with
:class:`DtlsError`, as is anything that is not a ClientHello. ECH (the encrypted inner
hello) is not looked into: the outer SNI is what a splitter sees.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.proto.dtls._wire import DtlsError, ExtensionType, Reader
from appliance.proto.dtls.messages import (
    ClientHello,
    find_extension,
    parse_alpn_untrusted,
    parse_server_name_untrusted,
)

#: RFC 8446 §5.1 ContentType.handshake; §4 HandshakeType.client_hello.
HANDSHAKE = 22
CLIENT_HELLO = 1
#: RFC 8446 §5.1: a record's fragment is at most 2^14 bytes; header 5.
MAX_HELLO_BYTES = 5 + (1 << 14)


@dataclass(frozen=True, slots=True)
class HelloPeek:
    """What a splitter needs: the SNI host name (lower-cased ASCII) and ALPN offers; and
    the hello's random, which names the connection in OpenSSL's key log (relay/tls.py)."""

    server_name: str | None
    alpn: tuple[bytes, ...]
    random: bytes = b""


def peek_client_hello_untrusted(head: bytes | memoryview) -> HelloPeek | None:
    """The SNI and ALPN of the ClientHello at the start of ``head``, or None when more bytes
    are needed. Raises only :class:`DtlsError` (not TLS, not a ClientHello, malformed)."""
    r = Reader(head)
    if r.remaining < 5:
        return None
    if r.uint(1) != HANDSHAKE:
        raise DtlsError("not a TLS handshake record")
    if r.uint(1) != 3:  # legacy_record_version 3.x (RFC 8446 §5.1: 0x0301 or 0x0303)
        raise DtlsError("not a TLS record version")
    r.uint(1)
    length = r.uint(2)
    if length < 4 or length > (1 << 14):
        raise DtlsError(f"TLS record length {length}")
    if r.remaining < length:
        return None
    record = Reader(r.take(length))
    if record.uint(1) != CLIENT_HELLO:
        raise DtlsError("first handshake message is not a ClientHello")
    size = record.uint(3)
    if size > record.remaining:
        raise DtlsError("ClientHello split over records")
    hello = ClientHello.parse_untrusted(record.take(size), stream=True)
    sni_raw = find_extension(hello.extensions, ExtensionType.server_name)
    alpn_raw = find_extension(hello.extensions,
                              ExtensionType.application_layer_protocol_negotiation)
    server_name = None
    if sni_raw is not None:
        name = parse_server_name_untrusted(sni_raw)
        if name is not None:
            try:
                server_name = name.decode("ascii").lower().rstrip(".")
            except UnicodeDecodeError:
                raise DtlsError("non-ASCII host_name") from None
    alpn = parse_alpn_untrusted(alpn_raw) if alpn_raw is not None else ()
    return HelloPeek(server_name, alpn, hello.random)
