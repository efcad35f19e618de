"""Write the seed corpus: ``fuzz/corpus/<target>/<name>``, small real messages.

Seeds come from the RFC test vectors, the captured ClientHellos in ``tests/vectors/`` (real
Chromium and OpenSSL bytes), the browser offers in ``tests/proto/sdp/data/`` and messages our
own encoders produce. Re-run after changing a codec: ``.venv/bin/python fuzz/make_corpus.py``
(deterministic except for the DTLS flights, which carry fresh randoms and keys).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from targets import (  # noqa: E402
    CODEC,
    NOW,
    PWD,
    TARGETS,
    TLS_KEYS,
    _certificate,
    join_datagrams,
    tls_layer,
)

from appliance.proto.dtls import DtlsConnection, Role  # noqa: E402
from appliance.proto.dtls.messages import _PARSERS  # noqa: E402
from appliance.proto.dtls.record import HandshakeFragment, Record  # noqa: E402
from appliance.proto.framing import encode_frame  # noqa: E402
from appliance.proto.proxy import STREAM, TLV_RELAY_ID, encode_header, encode_tlv  # noqa: E402
from appliance.proto.rtp import (  # noqa: E402
    ReportBlock,
    RtcpBye,
    RtcpNack,
    RtcpPli,
    RtcpReceiverReport,
    RtcpSdes,
    RtcpSenderReport,
    RtpPacket,
    SdesChunk,
    serialize_rtcp,
)
from appliance.proto.stun import (  # noqa: E402
    AttrType,
    Class,
    Message,
    Method,
    binding_error,
    binding_request,
    binding_success,
    reflexive_response,
)
from appliance.proto.turn import encode_channel_data  # noqa: E402
from appliance.proto.ufrag import UfragCodec  # noqa: E402

VECTORS = REPO / "tests" / "vectors"
SDP_DATA = REPO / "tests" / "proto" / "sdp" / "data"
TID = bytes.fromhex("b7e7a701bc34d686fa87dfae")

# RFC 5769 §2.1-2.4 (the same bytes as tests/proto/stun/test_rfc5769.py).
RFC5769 = {
    "rfc5769-request": "000100582112a442b7e7a701bc34d686fa87dfae802200105354554e207465737420"
    "636c69656e74002400046e0001ff80290008932ff9b151263b36000600096576746a3a68367659202020"
    "000800149aeaa70cbfd8cb56781ef2b5b2d3f249c1b571a280280004e57a3bcf",
    "rfc5769-response-v4": "0101003c2112a442b7e7a701bc34d686fa87dfae8022000b7465737420766563"
    "746f7220002000080001a147e112a643000800142b91f599fd9e90c38c7489f92af9ba53f06be7d7"
    "80280004c07d4c96",
    "rfc5769-response-v6": "010100482112a442b7e7a701bc34d686fa87dfae8022000b7465737420766563"
    "746f7220002000140002a1470113a9faa5d3f179bc25f4b5bed2b9d900080014a382954e4be67bf11784"
    "c97c8292c275bfe3ed4180280004c8fb0b4c",
    "rfc5769-long-term": "000100602112a44278ad3433c6ad72c029da412e00060012e3839ee38388e383aae3"
    "8383e382afe382b900000015001c662f2f3439396b39353464364f4c33346f4c394653547679363473410014"
    "000b6578616d706c652e6f72670000080014f67024656dd64a3e02b8e0712e85c9a28ca89666",
}

# tests/proto/rtp/test_rtp_packet.py: an Opus packet from Chromium with RFC 8285 extensions.
CHROME_OPUS = bytes.fromhex(
    "906f1a2b000bb800b5917c17bede000310aa22123456310005403000fcfffe"
)


def _ufrag() -> str:
    return CODEC.mint(cluster=0, transceiver=0, nonce=b"\0" * 7)


def stun_seeds() -> dict[str, bytes]:
    uf = _ufrag()
    out = {k: bytes.fromhex(v) for k, v in RFC5769.items()}
    out["plain-binding"] = binding_request(TID, fingerprint=False)
    out["ice-check"] = binding_request(
        TID, username=f"{uf}:cli1", password=PWD, priority=1853824767, controlling=42,
        use_candidate=True,
    )
    out["success"] = binding_success(TID, ("192.0.2.1", 5000), integrity_key=PWD.encode())
    out["error-401"] = binding_error(TID, 401)
    out["error-420"] = binding_error(TID, 420, integrity_key=b"k", unknown_attributes=(0x7777,))
    out["reflexive-v6"] = reflexive_response(out["plain-binding"], ("2001:db8::1", 3478))
    return out


def ufrag_seeds() -> dict[str, bytes]:
    other = UfragCodec(b"another-secret-another-secret!!")
    good = _ufrag()
    return {
        "valid": good.encode(),
        "valid-cluster7": CODEC.mint(cluster=7, transceiver=3, nonce=b"1234567").encode(),
        "other-secret": other.mint(cluster=0, transceiver=0).encode(),
        "username": f"{good}:cli1".encode(),
        "short": b"abcd",
    }


def proxy_seeds() -> dict[str, bytes]:
    tlv = encode_tlv(TLV_RELAY_ID, b"relay-0")
    return {
        "v4": encode_header(("198.51.100.7", 50000), ("203.0.113.1", 3478)) + b"\x00\x01",
        "v4-tlv": encode_header(("198.51.100.7", 50000), ("203.0.113.1", 3478), tlv) + b"x",
        "v6-tlv": encode_header(("2001:db8::7", 1), ("2001:db8::1", 3478), tlv) + CHROME_OPUS,
        "tcp4-tlv": encode_header(("198.51.100.7", 50000), ("203.0.113.1", 443), tlv, STREAM)
        + b"x",
        "tcp6": encode_header(("2001:db8::7", 1), ("2001:db8::1", 443), b"", STREAM) + b"\x00",
    }


def framing_seeds() -> dict[str, bytes]:
    # First byte: the cap (1 + 8 * byte) and the read size; then an RFC 4571 stream.
    stun = binding_request(b"\x01" * 12, username=f"{CODEC.mint(cluster=0, transceiver=0)}:c")
    return {
        "stun-then-rtp": bytes([255]) + encode_frame(stun) + encode_frame(CHROME_OPUS),
        "empty-frames": bytes([3]) + encode_frame(b"") + encode_frame(b"") + b"\x00",
        "over-cap": bytes([1]) + encode_frame(bytes(100)),
    }


def sse_seeds() -> dict[str, bytes]:
    # First byte: the read size; then an event stream as OpenAI-compatible servers send it.
    chat = (b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n'
            b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1"}]}}]}\n\n'
            b"data: [DONE]\n\n")
    responses = (b'event: response.created\r\ndata: {"type":"response.created",\r\n'
                 b'data: "sequence_number":0}\r\n\r\n: keep-alive\r\nid: 3\rretry: 9\r\r')
    return {"chat": bytes([4]) + chat, "responses-crlf": bytes([0]) + responses,
            "unterminated": bytes([7]) + b"data: tail", "not-utf8": bytes([1]) + b"data: \xff\n\n"}


def rtp_seeds() -> dict[str, bytes]:
    block = ReportBlock(1, 2, 3, 4, 5, 6, 7)
    return {
        "chrome-opus": CHROME_OPUS,
        "csrc-ext-pad": bytes(
            RtpPacket(111, 1, 2, 3, b"opus", True, (4, 5), 0xBEDE, b"\x10\xaa\x00\x00", 2)
        ),
        "two-byte-ext": bytes(RtpPacket(111, 9, 9, 9, b"x", False, (), 0x1000, b"\x01\x01\xaa\x00")),
        "pcmu": bytes(RtpPacket(0, 65535, 0, 1, bytes(160))),
        "rtcp-compound": serialize_rtcp(
            [
                RtcpSenderReport(1, 2, 3, 4, 5, 6, (block,)),
                RtcpSdes((SdesChunk(1, ((1, b"cname"), (6, b"tool"))),)),
            ]
        ),
        "rtcp-rr-bye": serialize_rtcp([RtcpReceiverReport(1, (block,)), RtcpBye((1, 2), b"bye")]),
        "rtcp-fb": serialize_rtcp([RtcpNack(1, 2, ((10, 3),)), RtcpPli(1, 2)]),
    }


def sdp_seeds() -> dict[str, bytes]:
    out = {
        p.stem: p.read_text().replace("\n", "\r\n").encode() for p in sorted(SDP_DATA.glob("*.sdp"))
    }
    out["sdpfrag"] = (
        b"a=ice-ufrag:EsAw\r\na=ice-pwd:bP+XJMM09aR8AiX1jdukzR6Y\r\n"
        b"m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n"
        b"a=candidate:1 1 udp 2122260223 192.0.2.1 61764 typ host generation 0\r\n"
        b"a=end-of-candidates\r\n"
    )
    out["candidate"] = b"candidate:1 1 udp 2122260223 192.0.2.1 61764 typ srflx raddr 10.0.0.1 rport 9"
    return out


def _client_flight1() -> bytes:
    client = DtlsConnection(Role.CLIENT, _certificate("client"), remote_fingerprints=None)
    client.start(NOW)
    d = client.poll_transmit()
    assert d is not None
    return d


def _record(body: bytes, msg_type: int = 1) -> bytes:
    return bytes(Record(22, 0xFEFD, 0, 0, bytes(HandshakeFragment(msg_type, len(body), 0, 0, body))))


def dtls_parser_seeds() -> dict[str, bytes]:
    ch_index = sorted(_PARSERS).index(1)
    out = {}
    for name in ("chromium156-dtls", "openssl-dtls12"):
        body = (VECTORS / f"{name}-clienthello.bin").read_bytes()
        out[f"{name}-clienthello"] = bytes([ch_index]) + body
        out[f"{name}-record"] = _record(body)
    out["own-client-flight1"] = _client_flight1()
    return out


def _hvr_exchange() -> list[bytes]:
    """ClientHello, then the ClientHello that echoes the server's cookie (cookie secret b"c"*32,
    as the dtls_server target uses), so the cookie path is in the corpus."""
    client = DtlsConnection(Role.CLIENT, _certificate("client"), remote_fingerprints=None)
    server = DtlsConnection(
        Role.SERVER, _certificate("server"), remote_fingerprints=None, cookie_secret=b"c" * 32
    )
    client.start(NOW)
    first = client.poll_transmit()
    assert first is not None
    server.handle_datagram(NOW, first)
    hvr = server.poll_transmit()
    assert hvr is not None
    client.handle_datagram(NOW, hvr)
    second = client.poll_transmit()
    assert second is not None
    return [first, second]


def dtls_server_seeds() -> dict[str, bytes]:
    chromium = _record((VECTORS / "chromium156-dtls-clienthello.bin").read_bytes())
    openssl = _record((VECTORS / "openssl-dtls12-clienthello.bin").read_bytes())
    return {
        "chromium": b"\0" + join_datagrams([chromium]),
        "openssl-cookie": b"\1" + join_datagrams([openssl]),
        "own-client": b"\0" + join_datagrams([_client_flight1()]),
        "own-client-cookie": b"\1" + join_datagrams(_hvr_exchange()),
    }


def dtls_client_seeds() -> dict[str, bytes]:
    client = DtlsConnection(Role.CLIENT, _certificate("client"), remote_fingerprints=None)
    server = DtlsConnection(Role.SERVER, _certificate("server"), remote_fingerprints=None)
    client.start(NOW)
    first = client.poll_transmit()
    assert first is not None
    server.handle_datagram(NOW, first)
    flight2 = []
    while (d := server.poll_transmit()) is not None:
        flight2.append(d)
    return {"server-flight2": join_datagrams(flight2)}


def dtls_handshake_seeds() -> dict[str, bytes]:
    return {
        "clean": b"",
        "flip-client-finished": bytes([1, 0, 200, 0x01]),
        "flip-server-cert": bytes([0x80, 0, 120, 0x22]),
        "truncate-flight3": bytes([1, 0, 60, 0x40]),
    }


def ice_seeds() -> dict[str, bytes]:
    uf = _ufrag()
    good = binding_request(TID, username=f"{uf}:cli1", password=PWD, priority=1, controlling=7)
    nominate = binding_request(
        TID, username=f"{uf}:cli1", password=PWD, priority=1, controlling=7, use_candidate=True
    )
    conflict = binding_request(TID, username=f"{uf}:cli1", password=PWD, controlled=7)
    wrong = binding_request(TID, username=f"{uf}:cli1", password="x" * 22, priority=1)
    return {
        "check-nominate": join_datagrams([good, nominate]),
        "role-conflict": join_datagrams([conflict]),
        "bad-password-storm": join_datagrams([wrong] * 12),
        "rfc5769": join_datagrams([bytes.fromhex(RFC5769["rfc5769-request"])]),
    }


def relay_seeds() -> dict[str, bytes]:
    plain = binding_request(TID, fingerprint=False)
    # Selector bytes (see targets.relay): 0x80 wraps in a Binding request with a valid ufrag,
    # bits 2-4 pick its transceiver (7 = the next-hop cluster), bits 0-1 the client.
    body = b"cli1" + bytes(60) + TID
    return {
        "reflexive": join_datagrams([b"\x00" + plain, b"\x02" + plain]),
        "new-flow-then-media": join_datagrams(
            [bytes([0x80]) + body, b"\x02" + CHROME_OPUS, b"\x02" + bytes([23, 0xFE, 0xFD])]
        ),
        "reroute-and-evict": join_datagrams(
            [bytes([0x80]) + body, bytes([0x84]) + body, bytes([0x81]) + body,
             bytes([0x9E]) + body, bytes([0xC2]) + body]
        ),
        "junk": join_datagrams([b"\x01" + bytes(30), b"\x00\x00\x01\x00\x00"]),
    }


def _pair13_flights(versions: frozenset[str], cookie: bool = False) -> tuple[list[bytes], list[bytes]]:
    """(client datagrams, server datagrams) of one in-memory handshake."""
    client = DtlsConnection(Role.CLIENT, _certificate("client"), remote_fingerprints=None,
                            versions=versions)
    server = DtlsConnection(Role.SERVER, _certificate("server"), remote_fingerprints=None,
                            versions=frozenset({"1.2", "1.3"}),
                            cookie_secret=b"c" * 32 if cookie else None)
    sent: tuple[list[bytes], list[bytes]] = ([], [])
    client.start(NOW)
    for _ in range(6):
        for src, dst, out in ((client, server, sent[0]), (server, client, sent[1])):
            while (d := src.poll_transmit()) is not None:
                out.append(d)
                dst.handle_datagram(NOW, d)
    return sent


def dtls13_parser_seeds() -> dict[str, bytes]:
    client, server = _pair13_flights(frozenset({"1.3"}))
    out = {f"server-{i}": b"\0" + d for i, d in enumerate(server)}
    out.update({f"client-{i}": b"\0" + d for i, d in enumerate(client)})
    return out



def tls_record_seeds() -> dict[str, bytes]:
    """Records the peer's side of the target's fixed keys seals: data (one 2^14-byte split
    included), TLS 1.3 KeyUpdates (requested and not), close_notify and a fatal alert; a key
    log and the keys' JSON records."""
    import json

    from appliance.proto.dtls.tlsrecord import HANDSHAKE, KEY_UPDATE, TLS13

    out: dict[str, bytes] = {}
    for keys in TLS_KEYS:
        name = "tls13" if keys.version == TLS13 else "tls12-" + keys.suite.split("-")[2].lower()
        peer = tls_layer(keys, peer=True)
        out[f"{name}-data"] = peer.seal(b"\x00\x03\x00\x08" + bytes(8)) + peer.seal(b"z" * 17_000)
        peer = tls_layer(keys, peer=True)
        stream = peer.seal(b"hello")
        if keys.version == TLS13:
            # RecordLayer sends only the update_not_requested answer: a client's KeyUpdate
            # is sealed through the same (private) path.
            for requested in (1, 0):
                stream += peer._seal(HANDSHAKE, bytes((KEY_UPDATE, 0, 0, 1, requested)))
                peer._key_update_write()
                stream += peer.seal(b"after update")
        out[f"{name}-close"] = stream + peer.alert(0)
        out[f"{name}-fatal"] = tls_layer(keys, peer=True).alert(20)
        out[f"{name}-keys"] = json.dumps(keys.to_record()).encode()
    out["keylog"] = b"".join(
        f"{label} {(bytes([i]) * 32).hex()} {bytes(range(48)).hex()}\n".encode()
        for i, label in enumerate(("CLIENT_RANDOM", "CLIENT_TRAFFIC_SECRET_0",
                                   "SERVER_TRAFFIC_SECRET_0")))
    return out


def dtls13_server_seeds() -> dict[str, bytes]:
    chromium = (VECTORS / "chromium156-dtls-clienthello.bin").read_bytes()
    frags = [HandshakeFragment(1, len(chromium), 0, 0, chromium[:1175]),
             HandshakeFragment(1, len(chromium), 0, 1175, chromium[1175:])]
    two = [bytes(Record(22, 0xFEFD, 0, i, bytes(f))) for i, f in enumerate(frags)]
    client13, _ = _pair13_flights(frozenset({"1.3"}))
    cookie_client, _ = _pair13_flights(frozenset({"1.3"}), cookie=True)
    return {
        "chromium-fragmented": b"\0" + join_datagrams(two),
        "chromium-cookie": b"\1" + join_datagrams(two),
        "own-13-client": b"\0" + join_datagrams(client13),
        "own-13-client-cookie": b"\1" + join_datagrams(cookie_client),
    }


def dtls13_client_seeds() -> dict[str, bytes]:
    _, server13 = _pair13_flights(frozenset({"1.2", "1.3"}))
    return {"server-13-flights": join_datagrams(server13)}


def dtls13_handshake_seeds() -> dict[str, bytes]:
    return {
        "clean": b"",
        "flip-server-ee": bytes([0x80, 0, 150, 0x04]),
        "flip-client-finished": bytes([1, 0, 40, 0x01]),
        "truncate-ack": bytes([0x82, 0, 10, 0x40]),
    }


def sctp_seeds() -> dict[str, bytes]:
    """Packets of a real data-channel session between two of our endpoints (setup, DCEP,
    data, SACK, stream reset, shutdown), framed as datagrams for the live-endpoint target."""
    import random

    from appliance.proto.sctp import chunks
    from appliance.proto.sctp.datachannel import DataChannelEndpoint

    a = DataChannelEndpoint(dtls_client=True, rng=random.Random(7), secret=b"a" * 32)
    b = DataChannelEndpoint(dtls_client=False, rng=random.Random(8), secret=b"b" * 32)
    wire: list[bytes] = []

    def pump() -> None:
        for _ in range(20):
            for src, dst in ((a, b), (b, a)):
                while (pkt := src.poll_transmit()) is not None:
                    wire.append(pkt)
                    dst.handle_input(NOW, pkt)

    a.connect(NOW)
    b.connect(NOW)
    pump()
    cid = a.open_channel(NOW, "seed", protocol="p", ordered=False, max_retransmits=2)
    pump()
    a.send(NOW, cid, "hello")
    b.send(NOW, cid, b"z" * 2500)
    pump()
    a.close_channel(NOW, cid)
    pump()
    a.shutdown(NOW)
    pump()
    setup, data, tail = wire[:4], wire[4:12], wire[12:]
    chunk = chunks.parse_packet_untrusted(wire[-1])[1][0]
    return {
        "setup": join_datagrams(setup),
        "data": join_datagrams(data),
        "reset-shutdown": join_datagrams(tail),
        "forward-tsn": join_datagrams([wire[5], bytes(chunks.COMMON_HEADER.pack(5000, 5000, 0, 0))
                                       + bytes(chunks.ForwardTsnChunk(7, ((1, 2),)))]),
        "chunk-" + type(chunk).__name__.lower(): bytes([chunk.TYPE, 0]) + bytes(chunk)[4:],
    }


def realtime_seeds() -> dict[str, bytes]:
    """Client events as @openai/agents-realtime and the OpenAI guide send them."""
    import base64
    import json

    def ev(**e: object) -> bytes:
        return json.dumps(e).encode()

    audio = base64.b64encode(bytes(4800)).decode()
    return {
        "session-update": join_datagrams([ev(type="session.update", event_id="e1", session={
            "type": "realtime", "instructions": "hi", "output_modalities": ["audio"],
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                "turn_detection": {"type": "semantic_vad"},
                                "transcription": {"model": "gpt-4o-mini-transcribe"},
                                "noise_reduction": None},
                      "output": {"voice": "alloy", "speed": 1}}})]),
        "text-turn": join_datagrams([
            ev(type="conversation.item.create", item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text",
                                                                   "text": "hello"}]}),
            ev(type="response.create", response={"output_modalities": ["text"]}),
            ev(type="response.cancel"), ev(type="output_audio_buffer.clear")]),
        "push-to-talk": join_datagrams([
            ev(type="session.update", session={"audio": {"input": {"turn_detection": None}}}),
            ev(type="input_audio_buffer.append", audio=audio),
            ev(type="input_audio_buffer.commit"), ev(type="response.create"),
            ev(type="conversation.item.truncate", item_id="item_f00001", content_index=0,
               audio_end_ms=10),
            ev(type="conversation.item.retrieve", item_id="item_f00002"),
            ev(type="conversation.item.delete", item_id="item_f00002"),
            ev(type="input_audio_buffer.clear")]),
    }
def vouch_seeds() -> dict[str, bytes]:
    from targets import VOUCH_KEY

    from appliance.proto.proxy import vouch

    q = vouch.Vouch(vouch.Kind.QUERY, ("198.51.100.7", 50000), ("203.0.113.1", 3478), 1,
                    b"12345678")
    v = vouch.Vouch(vouch.Kind.VOUCH, ("2001:db8::7", 1), ("2001:db8::1", 3478), 0, b"abcdefgh")
    other = vouch.derive_key(b"some other secret")
    return {"query-v4": vouch.encode(q, VOUCH_KEY), "vouch-v6": vouch.encode(v, VOUCH_KEY),
            "other-key": vouch.encode(q, other)}



_SIP_INVITE = (
    b"INVITE sip:agent@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.5:5060;branch=z9hG4bKs1;rport\r\n"
    b"Max-Forwards: 70\r\nFrom: \"Trunk\" <sip:+15550100@10.0.0.5>;tag=a1\r\n"
    b"To: <sip:agent@127.0.0.1>\r\nCall-ID: seed1@10.0.0.5\r\nCSeq: 1 INVITE\r\n"
    b"Contact: <sip:+15550100@10.0.0.5:5060>\r\nRecord-Route: <sip:10.0.0.5;lr>\r\n"
    b"Content-Type: application/sdp\r\nContent-Length: 85\r\n\r\n"
    b"v=0\r\no=- 1 1 IN IP4 10.0.0.5\r\ns=-\r\nc=IN IP4 10.0.0.5\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n"
)


def _sip_in_dialog(method: str, branch: str, extra: bytes = b"", body: bytes = b"") -> bytes:
    return (
        method.encode() + b" sip:agent@127.0.0.1 SIP/2.0\r\n"
        b"v: SIP/2.0/UDP 10.0.0.5:5060;branch=" + branch.encode() + b"\r\n"
        b"f: <sip:+15550100@10.0.0.5>;tag=a1\r\nt: <sip:agent@127.0.0.1>;tag=x\r\n"
        b"i: seed1@10.0.0.5\r\nCSeq: 2 " + method.encode() + b"\r\n" + extra +
        b"l: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def sip_seeds() -> dict[str, bytes]:
    return {
        "invite": _SIP_INVITE,
        "options-compact": _sip_in_dialog("OPTIONS", "z9hG4bKo", b"k: replaces, timer\r\n"),
        "info-dtmf": _sip_in_dialog("INFO", "z9hG4bKi", b"c: application/dtmf-relay\r\n",
                                    b"Signal=5\r\nDuration=160\r\n"),
        "response-200": (
            b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKr;received=1.2.3.4\r\n"
            b"From: <sip:a@b>;tag=1\r\nTo: <sip:c@d>;tag=2\r\nCall-ID: r1\r\nCSeq: 5 INVITE\r\n"
            b"Contact: <sip:c@10.0.0.9>\r\nWWW-Authenticate: Digest realm=\"r\", nonce=\"n\"\r\n"
            b"Content-Length: 0\r\n\r\n"
        ),
        "folded": (
            b"BYE sip:a@b SIP/2.0\r\nVia  : SIP  /  2.0\r\n /UDP h;branch=z9hG4bKf\r\n"
            b"From: \"A \\\"q\\\"\" <sip:x@y>\r\n  ;tag=1\r\nTo: sip:a@b;tag=2\r\nCall-ID: f\r\n"
            b"CSeq: 3\r\n BYE\r\nContent-Length: 0\r\n\r\n"
        ),
    }


def sip_stream_seeds() -> dict[str, bytes]:
    seeds = sip_seeds()
    return {"two-messages": b"\x03\r\n\r\n" + seeds["invite"] + seeds["options-compact"],
            "byte-at-a-time": b"\x00" + seeds["info-dtmf"]}


def sip_endpoint_seeds() -> dict[str, bytes]:
    return {
        "invite-bye": join_datagrams([_SIP_INVITE, _sip_in_dialog("BYE", "z9hG4bKb")]),
        "invite-cancel": join_datagrams([_SIP_INVITE, _SIP_INVITE.replace(b"INVITE", b"CANCEL")]),
        "options": join_datagrams([_sip_in_dialog("OPTIONS", "z9hG4bKo").replace(b";tag=x", b"")]),
    }


def sdp_phone_seeds() -> dict[str, bytes]:
    base = (b"v=0\r\no=t 1 1 IN IP4 203.0.113.5\r\ns=-\r\nc=IN IP4 203.0.113.5\r\nt=0 0\r\n"
            b"m=audio 20000 RTP/AVP 8 0 101\r\na=rtpmap:101 telephone-event/8000\r\n"
            b"a=fmtp:101 0-16\r\na=ptime:20\r\n")
    return {
        "g711": base,
        "savp": base.replace(b"RTP/AVP", b"RTP/SAVP")
        + b"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz|2^20|1:4\r\n",
        "hold-opus": base.replace(b"8 0 101", b"111 0").replace(b"a=ptime:20", b"a=rtpmap:111 opus/48000/2\r\na=sendonly\r\na=rtcp-mux"),
    }


def live_seeds() -> dict[str, bytes]:
    """Client events as openai-python's ``client.live`` helpers send them (a seed that
    starts with ``s`` gets a valid ``session.start`` first: the target's convention)."""
    import base64
    import json

    def ev(**e: object) -> bytes:
        return json.dumps(e).encode()

    loud = base64.b64encode(b"\x7f" * 1920 * 2).decode()  # 40 ms the target's VAD hears
    quiet = base64.b64encode(bytes(24_000)).decode()
    return {
        "start-full": join_datagrams([ev(type="session.start", event_id="s1", session={
            "model": "gpt-live-1", "instructions": "Be brief.",
            "audio": {"format": {"type": "audio/pcm", "rate": 16000},
                      "output": {"voice": {"id": "voice_1"}}},
            "delegation": {"type": "client", "acknowledgement_delay_ms": 0},
            "input": [{"role": "developer", "content": [{"type": "input_text", "text": "x"}]},
                      {"role": "assistant", "content": [{"type": "output_text", "text": "y"}]}],
            "client": {"data_channel": {"allowed_client_events": ["session.update"],
                                        "allowed_server_events": "all"}},
            "store": True, "safety_identifier": "u", "triggers": []}),
            ev(type="session.update", session={"delegation": {"type": "client"}}),
            ev(type="session.close")]),
        "s-turn": join_datagrams([
            ev(type="session.input_audio.append", audio=quiet),
            *[ev(type="session.input_audio.append", audio=loud)] * 3,
            *[ev(type="session.input_audio.append", audio=quiet)] * 3,
            ev(type="session.input_audio.mute", event_id="m"),
            ev(type="session.input_audio.unmute")]),
        "s-appends": join_datagrams([
            ev(type="session.instructions.append", content="a", delegation_id=None),
            ev(type="session.thinking.append", content="b", delegation_id=None),
            ev(type="session.commentary.append", content="c", delegation_id=None,
               event_id="c1"),
            ev(type="session.commentary.append", content="d", delegation_id="del_1")]),
        "s-refused": join_datagrams([
            ev(type="response.create"), ev(type="decision.create", event_id="d"),
            ev(type="response.item.create", item={"type": "function_call_output"}),
            ev(type="session.output_audio.fixture.play", audio=quiet),
            ev(type="session.start", session={"model": "m"}),
            ev(type="session.input_audio.commit")]),
        "g711": join_datagrams([
            ev(type="session.start", session={"model": "m", "audio": {
                "format": {"type": "audio/pcmu", "rate": 8000}}}),
            ev(type="session.input_audio.append", audio=base64.b64encode(b"\x10" * 801).decode())]),
    }


def _turn_messages() -> dict[str, bytes]:
    own = ("203.0.113.1", 3478)
    return {
        "allocate": Message(Method.ALLOCATE, Class.REQUEST, TID, (
            (AttrType.REQUESTED_TRANSPORT, 17), (AttrType.LIFETIME, 600))).encode(),
        "allocate-chromium": bytes.fromhex(
            "000300082112a44242476f7965615961557849520019000411000000"),
        "refresh-0": Message(Method.REFRESH, Class.REQUEST, TID, (
            (AttrType.LIFETIME, 0),)).encode(),
        "permission": Message(Method.CREATE_PERMISSION, Class.REQUEST, TID, (
            (AttrType.XOR_PEER_ADDRESS, own), (AttrType.XOR_PEER_ADDRESS, ("10.0.0.1", 1)),
        )).encode(),
        "permission-own": Message(Method.CREATE_PERMISSION, Class.REQUEST, TID, (
            (AttrType.XOR_PEER_ADDRESS, own),)).encode(),
        "channel-bind": Message(Method.CHANNEL_BIND, Class.REQUEST, TID, (
            (AttrType.CHANNEL_NUMBER, 0x4000), (AttrType.XOR_PEER_ADDRESS, own))).encode(),
        "send": Message(Method.SEND, Class.INDICATION, TID, (
            (AttrType.XOR_PEER_ADDRESS, own), (AttrType.DATA, b"\x00\x01ping"))).encode(),
        "channel-data": encode_channel_data(0x4000, b"\x80\x6f rtp"),
    }


def turn_seeds() -> dict[str, bytes]:
    m = _turn_messages()
    # First byte: bit 7 re-sign, bit 5 with SHA-256, bit 6 from a peer; % 3 picks the client
    # (0x80 and 0x02 are the same one).
    signed = [b"\x80" + m["allocate"], b"\x80" + m["permission"],
              b"\x80" + m["permission-own"], b"\x02" + m["send"],
              b"\x80" + m["channel-bind"], b"\x02" + m["channel-data"],
              b"\x40" + b"\x80\x6f from peer"]
    return {
        "unsigned-allocate": join_datagrams([b"\x00" + m["allocate-chromium"]]),
        "call": join_datagrams(signed),
        "call-sha256": join_datagrams([b"\xa1" + d[1:] if d[0] == 0x80 else d for d in signed]),
        "refresh-delete": join_datagrams([b"\x80" + m["allocate"], b"\x80" + m["refresh-0"],
                                          b"\x98" + m["refresh-0"]]),
        "three-clients": join_datagrams([bytes([0x80 + i]) + m["allocate"] for i in range(3)]),
    }


def relay_turn_seeds() -> dict[str, bytes]:
    m = _turn_messages()
    # First byte: bit 7 re-sign; bit 6 wrap the body as TURN data to our media address
    # (bit 4: ChannelData, else a Send indication; bit 5: the body is a valid ICE check);
    # % 3 picks the client (0x80, 0x71, 0x62, 0x50, 0x41 are all the same one).
    return {
        "allocate-bind-media": join_datagrams([
            b"\x80" + m["allocate"], b"\x80" + m["channel-bind"],
            b"\x71", b"\x50" + b"\x80\x6f media", b"\x62"]),
        "permission-send": join_datagrams([b"\x80" + m["allocate"], b"\x80" + m["permission-own"],
                                           b"\x62", b"\x41" + b"\x16\xfe\xfd hello"]),
        "raw": join_datagrams([b"\x00" + m["allocate-chromium"], b"\x00" + m["channel-data"]]),
    }


def turn_parser_seeds() -> dict[str, bytes]:
    m = _turn_messages()
    return {
        "channel-data": m["channel-data"],
        "stream": m["allocate"] + encode_channel_data(0x4001, b"abcde", pad=True) + m["send"],
        "username": b"1700003600:sess1",
        "nonce": b"obMatJos2AAABAAAAAAAAAAAA",
    }


def proxy_stream_seeds() -> dict[str, bytes]:
    tls = b"\x16\x03\x01\x00\x05hello"
    return {
        "v1-tcp4": b"PROXY TCP4 192.0.2.7 198.51.100.1 51234 443\r\n" + tls,
        "v1-tcp6": b"PROXY TCP6 2001:db8::7 2001:db8::1 51234 443\r\n" + tls,
        "v1-unknown": b"PROXY UNKNOWN\r\n",
        "v2-tcp4": encode_header(("192.0.2.7", 51234), ("198.51.100.1", 443),
                                 transport=STREAM) + tls,
        "v2-tcp6-tlv": encode_header(("2001:db8::7", 1), ("2001:db8::1", 443),
                                     encode_tlv(TLV_RELAY_ID, b"\x01"), STREAM),
        "no-header": tls,
    }


SEEDS = {
    "stun": stun_seeds,
    "ufrag": ufrag_seeds,
    "proxy": proxy_seeds,
    "proxy_stream": proxy_stream_seeds,
    "rtp": rtp_seeds,
    "sdp": sdp_seeds,
    "dtls_parsers": dtls_parser_seeds,
    "dtls_server": dtls_server_seeds,
    "dtls_client": dtls_client_seeds,
    "dtls_handshake": dtls_handshake_seeds,
    "dtls13_parsers": dtls13_parser_seeds,
    "dtls13_server": dtls13_server_seeds,
    "dtls13_client": dtls13_client_seeds,
    "dtls13_handshake": dtls13_handshake_seeds,
    "tls_records": tls_record_seeds,
    "ice": ice_seeds,
    "relay": relay_seeds,
    "sctp": sctp_seeds,
    "realtime": realtime_seeds,
    "live": live_seeds,
    "framing": framing_seeds,
    "sse": sse_seeds,
    "vouch": vouch_seeds,
    "sip": sip_seeds,
    "sip_stream": sip_stream_seeds,
    "sip_endpoint": sip_endpoint_seeds,
    "sdp_phone": sdp_phone_seeds,
    "turn": turn_seeds,
    "turn_parsers": turn_parser_seeds,
    "relay_turn": relay_turn_seeds,
}


def main(only: list[str] | None = None) -> None:
    assert set(SEEDS) == set(TARGETS), "every target needs seeds"
    for target, make in SEEDS.items():
        if only and target not in only:
            continue
        directory = HERE / "corpus" / target
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in make().items():
            TARGETS[target](data)  # every seed must pass its own target
            (directory / name).write_bytes(data)
        print(f"{target}: {len(list(directory.iterdir()))} seeds")


if __name__ == "__main__":
    main(sys.argv[1:] or None)  # optional target names: regenerate only those
