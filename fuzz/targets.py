"""Fuzz targets: one ``target(data: bytes) -> None`` per untrusted-input boundary.

Each target feeds ``data`` to the code that faces the network (or the HTTP body) and lets
**only that module's error** pass (STYLE.md rule 5: every ``*_untrusted`` parser raises only
its module's error, never ``IndexError`` or ``struct.error``). Anything else escaping — or a
failed ``assert`` on an invariant — is a finding. State machines that promise never to raise
for peer bytes (``DtlsConnection.handle_datagram``, ``IceLiteAgent.handle_input``,
``RelayCore.handle_datagram``) get no exception at all.

The same functions are driven three ways:

* ``fuzz/run.py`` under atheris (libFuzzer, coverage-guided) for a fixed budget: ``make fuzz``;
* ``fuzz/run.py --engine random`` (corpus-seeded random mutation, no extra dependency);
* ``tests/fuzz/test_deep.py`` under hypothesis, inside ``make test``.

Seeds live in ``fuzz/corpus/<target>/`` (written by ``fuzz/make_corpus.py``). Targets whose
input is several datagrams use :func:`split_datagrams` framing: a 2-byte big-endian length
before each datagram (a short tail is the last datagram).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import struct
from collections.abc import Callable

from appliance.proto.dtls import (
    Certificate,
    DtlsConnection,
    DtlsError,
    Role,
)
from appliance.proto.dtls.messages import (
    _PARSERS,
    _PARSERS13,
    parse_alpn_untrusted,
    parse_body13_untrusted,
    parse_cookie_untrusted,
    parse_ec_point_formats_untrusted,
    parse_handshake_body_untrusted,
    parse_key_share_ch_untrusted,
    parse_key_share_hrr_untrusted,
    parse_key_share_sh_untrusted,
    parse_renegotiation_info_untrusted,
    parse_server_name_untrusted,
    parse_signature_algorithms_untrusted,
    parse_supported_groups_untrusted,
    parse_supported_versions_ch_untrusted,
    parse_supported_versions_sh_untrusted,
    parse_use_srtp_untrusted,
)
from appliance.proto.dtls.record import (
    parse_handshake_fragments_untrusted,
    parse_records_untrusted,
)
from appliance.proto.dtls.record13 import (
    Ack,
    parse_ciphertext_untrusted,
    split_inner_plaintext_untrusted,
)
from appliance.proto.dtls.tlspeek import peek_client_hello_untrusted
from appliance.proto.dtls.tlsrecord import (
    TLS13,
    KeyLog,
    RecordLayer,
    SessionKeys,
    record_spans_untrusted,
)
from appliance.proto.errors import LocalProtocolError
from appliance.proto.framing import Deframer, FramingError, encode_frame
from appliance.proto.ice import IceLiteAgent
from appliance.proto.mux import Kind, classify
from appliance.proto.proxy import (
    ProxyError,
    encode_header,
    parse_transport_untrusted,
    parse_untrusted,
    tlvs_untrusted,
)
from appliance.proto.proxy.stream import parse_stream_header_untrusted
from appliance.proto.rtp import (
    RtpError,
    RtpPacket,
    parse_header_extensions_untrusted,
    parse_rtcp_untrusted,
    rtp_header_fields_untrusted,
    serialize_rtcp,
)
from appliance.proto.sctp import SctpAssociation, SctpError
from appliance.proto.sctp import chunks as sctp_chunks
from appliance.proto.sctp.datachannel import DataChannelEndpoint, DataChannelOpen
from appliance.proto.sdp import (
    SdpError,
    build_answer,
    parse_candidate_untrusted,
    parse_offer_untrusted,
    parse_sdpfrag_untrusted,
)
from appliance.proto.sdp.phone import PhoneRefusal, answer_phone_offer_untrusted
from appliance.proto.sip import Decision, EndpointConfig, SipEndpoint, StreamFramer, Transmit
from appliance.proto.sip import SipError as SipParseError
from appliance.proto.sip import parse_untrusted as parse_sip_untrusted
from appliance.proto.sip.ua import IncomingCall
from appliance.proto.sse import SseDecoder, SseError
from appliance.proto.stun import (
    MAX_AMPLIFICATION,
    AttrType,
    Class,
    Message,
    Method,
    StunError,
    binding_request,
    long_term_key,
    peek_username_untrusted,
    reflexive_response,
    verify_fingerprint,
    verify_integrity,
)
from appliance.proto.turn import (
    NonceCodec,
    TurnConfig,
    TurnError,
    TurnServer,
    encode_channel_data,
    is_turn,
    mint_rest_credential,
    parse_channel_data_untrusted,
    parse_record_untrusted,
    parse_rest_username_untrusted,
)
from appliance.proto.turn import StreamFramer as TurnStreamFramer
from appliance.proto.turn import Transmit as TurnTransmit
from appliance.proto.ufrag import UfragCodec, UfragError
from appliance.relay.core import TURN_HOP, CoreConfig, Flow, RelayCore, Relayed
from appliance.relay.transport import Transport as RelayTransport
from appliance.relay.transport import UdpSink
from appliance.relay.turn import TurnGate, TurnSettings, own_media_map

Target = Callable[[bytes], None]

NOW = 1_700_000_000.0
SECRET = b"fuzz-routing-secret-0123456789ab"
CODEC = UfragCodec(SECRET)
PWD = "fuzzpasswordfuzzpassword"  # 24 ICE characters: the ICE-lite agent's local password


def split_datagrams(data: bytes, limit: int = 16) -> list[bytes]:
    """``[len16][bytes]...`` framing used by the multi-datagram targets (see module doc)."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data) and len(out) < limit:
        if pos + 2 > len(data):
            out.append(data[pos:])
            break
        (n,) = struct.unpack_from("!H", data, pos)
        out.append(data[pos + 2 : pos + 2 + n])
        pos += 2 + n
    return out


def join_datagrams(datagrams: list[bytes]) -> bytes:
    """Inverse of :func:`split_datagrams` (for seeds)."""
    return b"".join(struct.pack("!H", len(d)) + d for d in datagrams)


# --- STUN -------------------------------------------------------------------------------


def stun(data: bytes) -> None:
    """``Message.parse_untrusted``, the verifiers, the relay's ``peek_username_untrusted``
    and ``reflexive_response`` (with its amplification bound)."""
    try:
        msg = Message.parse_untrusted(data)
    except StunError:
        msg = None
    if msg is not None:
        # Everything the ICE agent reads from a parsed message must be safe to read.
        _ = (msg.username, msg.priority, msg.use_candidate, msg.ice_controlled)
        _ = (msg.ice_controlling, msg.xor_mapped_address, msg.error_code)
    verify_fingerprint(data)
    verify_integrity(data, b"key")
    try:
        username = peek_username_untrusted(data)
    except StunError:
        return
    assert username is None or isinstance(username, bytes)
    if username is None:
        for addr in (("192.0.2.1", 1), ("2001:db8::1", 65535)):
            resp = reflexive_response(data, addr)
            assert len(resp) <= len(data) + MAX_AMPLIFICATION, "relay amplifies"
            assert Message.parse_untrusted(resp).xor_mapped_address == addr


# --- ufrag ------------------------------------------------------------------------------


def ufrag(data: bytes) -> None:
    """``UfragCodec.decode_untrusted`` on bytes and on the text a USERNAME would give."""
    for value in (data, data.decode("utf-8", "replace"), data.decode("latin-1")):
        try:
            hint = CODEC.decode_untrusted(value)
        except UfragError as exc:
            reason = exc.hint  # the relay turns it into a counter name: a closed set
            assert reason in ("malformed", "version", "bad-mac"), reason
        else:
            # Only a ufrag we minted verifies: re-minting it must give the same text.
            text = value if isinstance(value, str) else value.decode("ascii")
            again = CODEC.mint(cluster=hint.cluster, transceiver=hint.transceiver, nonce=hint.nonce)
            assert again == text, "a forged ufrag verified"


# --- PROXY v2 ---------------------------------------------------------------------------


def proxy(data: bytes) -> None:
    """``proxy.parse_untrusted`` and ``tlvs_untrusted``; a header that parses re-encodes
    (DGRAM or STREAM: ICE-TCP flows, RFC 6544)."""
    try:
        src, dst, offset, transport = parse_transport_untrusted(data)
    except ProxyError:
        return
    assert parse_untrusted(data) == (src, dst, offset)
    assert 16 <= offset <= len(data)
    try:
        tlvs_untrusted(data)
    except ProxyError:
        pass
    # What the relay forwards is re-framed from the parsed addresses: it must be the same
    # header, bit for bit (TLVs are carried opaquely).
    tlvs = bytes(data[16 + (12 if data[13] >> 4 == 1 else 36) : offset])
    assert encode_header(src, dst, tlvs, transport) == bytes(data[:offset])


def proxy_stream(data: bytes) -> None:
    """``proxy.stream.parse_stream_header_untrusted`` (a front proxy's v1/v2 header on a TCP
    connection): only ProxyError escapes; a parsed header ends inside the bytes, and every
    shorter prefix of it is still "need more" or the same refusal."""
    try:
        got = parse_stream_header_untrusted(data)
    except ProxyError:
        return
    if got is not None:
        assert 0 < got[2] <= len(data)
        assert parse_stream_header_untrusted(data[: got[2]]) == got


# --- RFC 4571 framing (ICE-TCP) -------------------------------------------------------------


def framing(data: bytes) -> None:
    """``framing.Deframer`` on a stream cut at points the first byte picks: only FramingError
    escapes, the frames polled are the stream re-cut at its length prefixes (checked against
    a one-shot reading of the same bytes), and a partial frame never holds more than the
    cap allows."""
    cap = 1 + (data[0] if data else 0) * 8
    stream = data[1:]
    deframer = Deframer(cap)
    got: list[bytes] = []
    failed = False
    step = 1 + (data[0] % 7 if data else 0)
    try:
        for i in range(0, len(stream), step):
            deframer.handle_input(stream[i : i + step])
            while (frame := deframer.poll_output()) is not None:
                got.append(frame)
            assert deframer.buffered <= cap + 1 + step, "deframer buffers without bound"
    except FramingError:
        failed = True
    # The reference reading: walk the prefixes directly.
    want: list[bytes] = []
    pos, bad = 0, False
    while pos + 2 <= len(stream):
        n = int.from_bytes(stream[pos : pos + 2], "big")
        if n > cap:
            bad = True
            break
        if pos + 2 + n > len(stream):
            break
        want.append(stream[pos + 2 : pos + 2 + n])
        pos += 2 + n
    assert failed == bad and got == want
    assert b"".join(encode_frame(f) for f in got) == stream[:pos]


# --- Server-Sent Events (an LLM's stream) -----------------------------------------------------


def sse(data: bytes) -> None:
    """``sse.SseDecoder`` on a stream cut at points the first byte picks: only SseError
    escapes, and the events are those of the same bytes read whole."""
    def read(pieces: list[bytes]) -> list[tuple[str, str]] | None:
        decoder, out = SseDecoder(), []
        try:
            for piece in pieces:
                decoder.handle_input(piece)
                while (ev := decoder.poll_event()) is not None:
                    out.append(ev)
            decoder.handle_eof()
        except SseError:
            return None
        while (ev := decoder.poll_event()) is not None:
            out.append(ev)
        return out

    step = 1 + (data[0] % 13 if data else 0)
    stream = data[1:]
    assert read([stream[i : i + step] for i in range(0, len(stream), step)]) == read([stream])


# --- RTP / RTCP -------------------------------------------------------------------------


def rtp(data: bytes) -> None:
    """RTP (hot-path header read, full parse, RFC 8285 extensions) and compound RTCP."""
    kind = classify(data)
    assert isinstance(kind, Kind)
    try:
        fields = rtp_header_fields_untrusted(data)
    except RtpError:
        fields = None
    try:
        pkt = RtpPacket.parse_untrusted(data)
    except RtpError:
        assert fields is None, "hot path accepted what the full parser refused"
    else:
        assert fields is not None and fields[:4] == (
            pkt.payload_type,
            pkt.sequence,
            pkt.timestamp,
            pkt.ssrc,
        )
        assert bytes(data[fields[5] : fields[6]]) == pkt.payload
        if pkt.extension_profile is not None:
            try:
                parse_header_extensions_untrusted(pkt.extension_profile, pkt.extension_data)
            except RtpError:
                pass
    for profile in (0xBEDE, 0x1000):
        try:
            parse_header_extensions_untrusted(profile, data)
        except RtpError:
            pass
    try:
        packets = parse_rtcp_untrusted(data)
    except RtpError:
        return
    # What parsed must serialise again (the transceiver re-emits nothing it parsed, but a
    # serialiser crash on parsed values would be a latent bug).
    serialize_rtcp(packets)


# --- SDP --------------------------------------------------------------------------------


def sdp(data: bytes) -> None:
    """``parse_offer_untrusted`` + ``build_answer`` (our answer must re-parse), the trickle
    fragment parser and the candidate parser."""
    try:
        offer = parse_offer_untrusted(data)
    except SdpError:
        offer = None
    if offer is not None:
        try:
            answer = build_answer(
                offer,
                ice_ufrag="abcd",
                ice_pwd="p" * 22,
                fingerprint="sha-256 " + ":".join(["AB"] * 32),
                candidates=[("203.0.113.7", 3478), ("2001:db8::7", 3478)],
                ssrc=1,
                cname="c",
                session_id=1,
            )
        except SdpError:
            pass
        else:
            parse_offer_untrusted(answer.text)  # our own answers always parse
    try:
        parse_sdpfrag_untrusted(data)
    except SdpError:
        pass
    line = data[:512].decode("utf-8", "replace")
    try:
        parse_candidate_untrusted(line.removeprefix("a=").removeprefix("candidate:"))
    except SdpError:
        pass


# --- DTLS -------------------------------------------------------------------------------


@functools.cache
def _certificate(name: str) -> Certificate:
    del name  # one certificate per role, made once per process (they are slow to make)
    return Certificate.generate(NOW)


def dtls_parsers(data: bytes) -> None:
    """Record and handshake-fragment codecs, every handshake body parser, the extension
    parsers, and the TLS ClientHello peek of the media port's split (relay/tls.py). The
    first byte picks the handshake message type."""
    for fn in (parse_records_untrusted, parse_handshake_fragments_untrusted,
               peek_client_hello_untrusted):
        try:
            fn(data)
        except DtlsError:
            pass
    if not data:
        return
    types = sorted(_PARSERS)
    msg_type, body = types[data[0] % len(types)], data[1:]
    try:
        parse_handshake_body_untrusted(msg_type, body)
    except DtlsError:
        pass
    for ext in (
        parse_supported_groups_untrusted,
        parse_signature_algorithms_untrusted,
        parse_ec_point_formats_untrusted,
        parse_use_srtp_untrusted,
        parse_renegotiation_info_untrusted,
        parse_server_name_untrusted,
        parse_alpn_untrusted,
    ):
        try:
            ext(body)
        except DtlsError:
            pass


def _drive(conn: DtlsConnection, datagrams: list[bytes]) -> None:
    now = NOW
    for d in datagrams:
        conn.handle_datagram(now, d)  # never raises for peer bytes
        while conn.poll_transmit() is not None:
            pass
        while conn.poll_event() is not None:
            pass
        now += 0.5
        conn.handle_timeout(now)


def dtls_server(data: bytes) -> None:
    """A fresh server (``DtlsConnection(Role.SERVER, cert, remote_fingerprints=None)``, as
    before the offer's fingerprint is known) fed ``split_datagrams(data[1:])``. Bit 0 of the
    first byte switches HelloVerifyRequest cookies on."""
    if not data:
        return
    server = DtlsConnection(
        Role.SERVER,
        _certificate("server"),
        remote_fingerprints=None,
        cookie_secret=b"c" * 32 if data[0] & 1 else None,
    )
    _drive(server, split_datagrams(data[1:]))


def dtls_client(data: bytes) -> None:
    """A started client (``appliance.client`` is one) fed hostile server flights."""
    client = DtlsConnection(Role.CLIENT, _certificate("client"), remote_fingerprints=None)
    client.start(NOW)
    while client.poll_transmit() is not None:
        pass
    _drive(client, split_datagrams(data))



# --- TLS records after OpenSSL's handshake (proto/dtls/tlsrecord.py) ---------------------

#: Fixed keys of the ``tls_records`` target: a TLS 1.3 suite, a TLS 1.2 AES-GCM suite (its
#: explicit nonce) and a TLS 1.2 ChaCha20 one. The seeds are records sealed by the peer's
#: side of these keys (``tls_layer(keys, peer=True)``), so they authenticate here.
TLS_KEYS = (
    SessionKeys("TLS_AES_128_GCM_SHA256", bytes(range(32)), bytes(range(32, 64))),
    SessionKeys("ECDHE-ECDSA-AES256-GCM-SHA384", bytes(range(36)), bytes(range(36, 72))),
    SessionKeys("ECDHE-ECDSA-CHACHA20-POLY1305", bytes(range(44)), bytes(range(44, 88))),
)


def tls_layer(keys: SessionKeys, *, peer: bool = False) -> RecordLayer:
    """The server's record layer right after the handshake (TLS 1.2: the Finished records
    were seq 0), or the client's (``peer``: read and write keys swapped)."""
    if peer:
        keys = SessionKeys(keys.suite, keys.write, keys.read)
    return RecordLayer(keys, *((0, 0, 0, 0) if keys.version == TLS13 else (0, 1, 0, 1)))


def tls_records(data: bytes) -> None:
    """A TURN/TLS connection's bytes after the handshake (relay/tls.py): the record
    splitter (its spans back to back, ``want`` the next record's size), each span opened by
    a layer of every suite in :data:`TLS_KEYS` (a KeyUpdate in them moves the state; a
    successor must accept any state the layer reaches), the key log reader (bounded), and
    the keys' JSON record. Only DtlsError escapes."""
    try:
        spans, end, want = record_spans_untrusted(data)
    except DtlsError:
        spans = []
    else:
        at = 0
        for off, n in spans:
            assert off == at and n == 5 + int.from_bytes(data[off + 3 : off + 5], "big")
            at += n
        assert end == at and (want > len(data) - end if want else len(data) - end < 5)
    for keys in TLS_KEYS:
        layer = tls_layer(keys)
        for off, n in spans:
            try:
                layer.open(data[off : off + n])
            except DtlsError:
                pass
        successor = RecordLayer(keys, *layer.state)
        assert successor.state == layer.state
        layer.seal(layer.pending() + b"x")
    log = KeyLog(limit=2)
    for i in range(0, len(data), 7):
        log.feed(data[i : i + 7])
        assert len(log.entries) <= 2
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return
    try:
        keys = SessionKeys.from_record_untrusted(obj)
    except DtlsError:
        return
    assert SessionKeys.from_record_untrusted(keys.to_record()) == keys
    tls_layer(keys).seal(b"usable")


# --- ICE-lite ---------------------------------------------------------------------------


def ice(data: bytes) -> None:
    """The transceiver's ICE-lite agent. Each datagram goes in raw; if it parses as STUN it
    also goes in re-signed with the agent's password (so the authenticated paths — 420,
    487, nomination — see hostile attributes too). Invariant: never raises, and the 401
    rate limit holds."""
    agent = IceLiteAgent(CODEC.mint(cluster=0, transceiver=0, nonce=b"\0" * 7), PWD, "cli1")
    now = NOW
    errors_401 = 0
    for d in split_datagrams(data):
        inputs = [d]
        try:
            msg = Message.parse_untrusted(d)
        except StunError:
            pass
        else:
            try:
                inputs.append(msg.encode(PWD.encode()))
            except LocalProtocolError:
                pass  # e.g. the re-signed message would exceed a datagram
        for raw in inputs:
            agent.handle_input(now, raw, ("192.0.2.9", 5000))
        while (out := agent.poll_transmit()) is not None:
            code = Message.parse_untrusted(out[0]).error_code
            errors_401 += code is not None and code[0] == 401
        while agent.poll_event() is not None:
            pass
        now += 0.01
    assert errors_401 <= agent.max_401_per_second * (1 + int(now - NOW) + 1)


# --- relay first-packet routing ---------------------------------------------------------

_RELAY_CLIENTS = (("198.51.100.1", 4000), ("198.51.100.1", 4001), ("2001:db8::5", 9))
_PUBLIC = ("203.0.113.1", 3478)
_PUBLIC6 = ("2001:db8::1", 3478)


def relay(data: bytes) -> None:
    """``RelayCore.handle_datagram`` (the relay's whole slow path) on a tiny flow table.

    Each datagram's first byte picks the client address and whether the rest is sent raw
    or wrapped in a Binding request whose USERNAME starts with a *valid* minted ufrag (so
    the routing, re-routing and eviction paths are reachable). Invariants: never raises,
    answers only with a bounded reflexive response, flow table and buckets stay capped."""
    core = RelayCore(
        CoreConfig(
            secrets=(SECRET,),
            transceivers={0: ("127.0.0.1", 4000), 1: ("127.0.0.1", 4001)},
            next_hops={7: ("127.0.0.1", 5000)},
            max_flows=2,
            max_sources=2,
            new_flow_rate=5.0,
            new_flow_burst=2.0,
        )
    )
    now = NOW
    for d in split_datagrams(data, limit=32):
        if not d:
            continue
        sel, body = d[0], d[1:]
        client = _RELAY_CLIENTS[sel % 3]
        public = _PUBLIC6 if ":" in client[0] else _PUBLIC
        if sel & 0x80:
            target = (sel >> 2) & 7  # transceivers 0/1 known, cluster 7 a next hop
            uf = CODEC.mint(
                cluster=7 if target == 7 else 0, transceiver=target, nonce=bytes(7)
            )
            name = uf + ":" + body[:64].decode("latin-1")
            body = binding_request(body[64:76].ljust(12, b"\0"), username=name)
        result = core.handle_datagram(now, client, body, public)
        if isinstance(result, bytes):
            assert len(result) <= len(body) + MAX_AMPLIFICATION, "relay amplifies"
        else:
            assert result is None or isinstance(result, Flow)
        assert len(core.flows) <= core.config.max_flows
        assert len(core.buckets) <= core.config.max_sources
        now += (sel & 3) * 0.25
        if sel & 0x40:
            core.sweep(now + 31)




def dtls_handshake(data: bytes) -> None:
    """A real client and server handshake in memory while ``data`` corrupts their flights:
    reaches the parsers and states behind ServerHello (Certificate, ClientKeyExchange,
    CertificateVerify, ChangeCipherSpec, encrypted Finished) that random bytes never reach.

    ``data`` is a list of 4-byte edits ``(which, pos_hi, pos_lo, value)``: ``which`` picks
    the datagram (bit 7: server → client, bits 0-6: its index in that direction), bit 6 of
    ``value`` selects truncation at ``pos`` instead of xor-ing ``value`` in."""
    _handshake(data, frozenset({"1.2"}))


def _handshake(data: bytes, versions: frozenset[str]) -> None:
    edits: dict[tuple[bool, int], list[tuple[int, int]]] = {}
    for i in range(0, len(data) - 3, 4):
        which, hi, lo, value = data[i : i + 4]
        edits.setdefault((bool(which & 0x80), which & 0x7F), []).append(((hi << 8) | lo, value))
    client = DtlsConnection(Role.CLIENT, _certificate("client"), remote_fingerprints=None,
                            versions=versions)
    server = DtlsConnection(Role.SERVER, _certificate("server"), remote_fingerprints=None,
                            versions=versions)
    sent = {False: 0, True: 0}
    now = NOW
    client.start(now)
    for _ in range(12):  # flights, with a retransmission round when something was lost
        moved = False
        for src, dst, from_server in ((client, server, False), (server, client, True)):
            while (d := src.poll_transmit()) is not None:
                moved = True
                buf = bytearray(d)
                for pos, value in edits.get((from_server, sent[from_server]), ()):
                    if not buf:
                        break
                    if value & 0x40:
                        del buf[pos % len(buf) :]
                    else:
                        buf[pos % len(buf)] ^= value or 1
                sent[from_server] += 1
                dst.handle_datagram(now, bytes(buf))
            while src.poll_event() is not None:
                pass
        if not moved:
            now += 2.0
            client.handle_timeout(now)
            server.handle_timeout(now)


# --- DTLS 1.3 (RFC 9147) -----------------------------------------------------------------

_BOTH = frozenset({"1.2", "1.3"})


def dtls13_parsers(data: bytes) -> None:
    """Unified-header records, ACK, inner plaintext, every 1.3 body parser (first byte picks
    the type) and the 1.3 extension payload parsers."""
    for fn in (
        lambda b: parse_ciphertext_untrusted(b, 0),
        Ack.parse_untrusted,
        split_inner_plaintext_untrusted,
        parse_supported_versions_ch_untrusted,
        parse_supported_versions_sh_untrusted,
        parse_key_share_ch_untrusted,
        parse_key_share_sh_untrusted,
        parse_key_share_hrr_untrusted,
        parse_cookie_untrusted,
    ):
        try:
            fn(data[1:])
        except DtlsError:
            pass
    if data:
        types = sorted(_PARSERS13)
        try:
            parse_body13_untrusted(types[data[0] % len(types)], data[1:])
        except DtlsError:
            pass


def dtls13_server(data: bytes) -> None:
    """A 1.2+1.3 server fed ``split_datagrams(data[1:])``; bit 0 of the first byte turns
    cookies (HelloRetryRequest / HelloVerifyRequest) on."""
    if not data:
        return
    server = DtlsConnection(Role.SERVER, _certificate("server"), remote_fingerprints=None,
                            cookie_secret=b"c" * 32 if data[0] & 1 else None, versions=_BOTH)
    _drive(server, split_datagrams(data[1:]))


def dtls13_client(data: bytes) -> None:
    """A started 1.2+1.3 client fed hostile server flights (1.3 or 1.2 shaped)."""
    client = DtlsConnection(Role.CLIENT, _certificate("client"), remote_fingerprints=None,
                            versions=_BOTH)
    client.start(NOW)
    while client.poll_transmit() is not None:
        pass
    _drive(client, split_datagrams(data))


def dtls13_handshake(data: bytes) -> None:
    """:func:`dtls_handshake` with DTLS 1.3 on both sides: corrupts encrypted flights,
    record numbers and ACKs that random bytes never reach."""
    _handshake(data, frozenset({"1.3"}))


# --- SCTP -------------------------------------------------------------------------------


def _live_sctp() -> DataChannelEndpoint:
    """An established data-channel endpoint (the DTLS server side, as the transceiver is)
    with one DCEP channel open and data in flight, built by an in-memory handshake."""
    import random

    a = DataChannelEndpoint(dtls_client=True, rng=random.Random(1), secret=b"a" * 32)
    b = DataChannelEndpoint(dtls_client=False, rng=random.Random(2), secret=b"b" * 32)
    a.connect(NOW)
    for _ in range(8):
        for src, dst in ((a, b), (b, a)):
            while (pkt := src.poll_transmit()) is not None:
                dst.handle_input(NOW, pkt)
    assert b.association.is_established
    cid = a.open_channel(NOW, "fuzz")
    a.send(NOW, cid, "x" * 3000)
    while (pkt := a.poll_transmit()) is not None:
        b.handle_input(NOW, pkt)
    b.send(NOW, cid, b"in flight")
    while b.poll_event() is not None:
        pass
    return b


def sctp(data: bytes) -> None:
    """Every SCTP chunk parser (first byte picks the chunk type, second the flags), the
    packet parser, DCEP OPEN, then the datagrams of ``data`` fed to a live endpoint: odd
    datagrams get our verification tag and a valid CRC32c so they reach the chunk
    handlers. ``handle_input``/``handle_timeout`` must never raise; buffers stay bounded."""
    if len(data) >= 2:
        parser = sctp_chunks.PARSERS.get(data[0])
        if parser is not None:
            try:
                parser(data[1], data[2:])
            except SctpError:
                pass
    for fn in (sctp_chunks.parse_packet_untrusted, DataChannelOpen.parse_untrusted):
        try:
            fn(data)  # type: ignore[operator]
        except SctpError:
            pass
    ep = _live_sctp()
    assoc: SctpAssociation = ep.association
    for i, pkt in enumerate(split_datagrams(data)):
        if i % 2 and len(pkt) >= 12:
            pkt = sctp_chunks.serialize_packet(5000, 5000, assoc.my_tag, pkt[12:])
        ep.handle_input(NOW + i, pkt)
        ep.handle_timeout(NOW + i + 0.5)
        while ep.poll_transmit() is not None:
            pass
        while ep.poll_event() is not None:
            pass
    rx = assoc.receiver
    assert rx is None or rx.buffered <= 2 * assoc.max_receive_buffer, "unbounded reassembly"
    assert assoc.sender.total_queued <= assoc.max_send_buffer


def realtime(data: bytes) -> None:
    """OpenAI Realtime client events (the ``oai-events`` channel, issue 17): each datagram is
    one channel message. The parser raises only ``EventError``; the state machine, fed the
    same messages between audio frames, never raises and answers every message."""
    from appliance.realtime.agent import id_source
    from appliance.realtime.interface import AudioDelta
    from appliance.realtime.machine import RealtimeConnection, StartResponse
    from appliance.realtime.protocol import EventError, parse_client_event_untrusted

    conn = RealtimeConnection(session_id="sess_fuzz", ids=id_source("f"),
                              queued_seconds=lambda: 0.05)
    conn.handle_open()
    for i, message in enumerate(split_datagrams(data)):
        try:
            parse_client_event_untrusted(message)
        except EventError:
            pass
        conn.handle_message(message)
        conn.handle_frame(bytes(1920), speech=bool(i % 3))
        while (action := conn.poll_action()) is not None:
            if isinstance(action, StartResponse):
                conn.handle_delta(action.request.response_id, AudioDelta(bytes(960)))
        while conn.poll_event() is not None:
            pass
def live(data: bytes) -> None:
    """GPT-Live client events (``GET /v1/live/sessions``, issue 42): each datagram is one
    WebSocket message. The parser raises only ``LiveError``; the core, fed the same
    messages between audio appends, never raises, answers each with JSON the socket can
    send, and keeps its timeline moving forward."""
    import json

    from appliance.live.connection import LiveConnection
    from appliance.live.protocol import parse_client_event_untrusted
    from appliance.live.schema import LiveError
    from appliance.realtime.agent import id_source
    from appliance.realtime.interface import AudioDelta, TranscriptDelta
    from appliance.realtime.machine import StartResponse, Transcribe

    conn = LiveConnection(session_id="live_fuzz", ids=id_source("f"), wall_clock=lambda: 0.0,
                          vad=lambda frame: frame[:1] == b"\x7f")
    conn.handle_open()
    start = b'{"type":"session.start","session":{"model":"m"}}'
    last = 0
    for i, message in enumerate([start, *split_datagrams(data)] if data[:1] == b"s"
                                else split_datagrams(data)):
        try:
            parse_client_event_untrusted(message)
        except LiveError:
            pass
        conn.handle_input(message)
        while (action := conn.poll_action()) is not None:
            if isinstance(action, StartResponse):
                rid = action.request.response_id
                conn.handle_delta(rid, TranscriptDelta("ok"))
                conn.handle_delta(rid, AudioDelta(bytes(962)))
                if i % 2:
                    conn.handle_response_end(rid)
            elif isinstance(action, Transcribe):
                conn.machine.handle_transcript_delta(action.item_id, "heard")
                conn.machine.handle_transcript(action.item_id, "heard")
        while (event := conn.poll_event()) is not None:
            json.dumps(event)
            for key in ("start_ms", "end_ms"):
                assert event.get(key, 0) >= 0, event
        assert conn.input_ms >= last
        last = conn.input_ms
    conn.close("expired")
    while conn.poll_output() is not None:
        pass


# --- flow vouching (PROXY v2 LOCAL + vouch TLV, issue 20) ------------------------------

from appliance.proto.proxy import vouch as _vouch  # noqa: E402 - appended section

VOUCH_KEY = _vouch.derive_key(b"fuzz-vouch-secret-0123456789abcdef")


def vouch(data: bytes) -> None:
    """``proxy.vouch.parse_untrusted``: only VouchError escapes; what verifies re-encodes
    bit for bit (so nothing but the MAC'd bytes can be accepted)."""
    try:
        msg = _vouch.parse_untrusted(data, [VOUCH_KEY])
    except _vouch.VouchError:
        return
    assert _vouch.encode(msg, VOUCH_KEY) == bytes(data), "a vouch verified but re-encodes differently"



# --- SIP (issue 28) ---------------------------------------------------------------------


def _sip_views(msg: object) -> None:
    """Every typed view of a parsed message must work (the parser validated them)."""
    from appliance.proto.sip import Request

    assert isinstance(msg, Request) or hasattr(msg, "status")
    m = msg  # type: ignore[assignment]
    m.vias, m.from_, m.to, m.cseq, m.call_id, m.max_forwards, m.content_type  # type: ignore[attr-defined]  # noqa: B018
    if isinstance(m, Request):
        m.contacts, m.routes, m.record_routes  # noqa: B018


def sip(data: bytes) -> None:
    """``sip.parse_untrusted`` (datagram and stream rules): only SipError escapes; a parsed
    message's typed views work and its serialisation parses back to a fixed point."""
    for stream in (False, True):
        try:
            msg = parse_sip_untrusted(data, stream=stream)
        except SipParseError:
            continue
        _sip_views(msg)
        once = parse_sip_untrusted(bytes(msg), stream=stream)
        assert parse_sip_untrusted(bytes(once), stream=stream) == once
        assert once.body == msg.body


def sip_stream(data: bytes) -> None:
    """``StreamFramer`` cut at a stride the first byte picks: only SipError escapes, the
    buffer stays bounded, every message it yields is one whole header block + body."""
    step = 1 + (data[0] % 13 if data else 0)
    framer = StreamFramer(max_message=2048)
    try:
        for i in range(1, len(data), step):
            framer.feed(data[i : i + step])
            for message in framer:
                assert len(message) <= 2048 and b"\r\n\r\n" in message
                try:
                    parse_sip_untrusted(message, stream=True)
                except SipParseError:
                    pass
    except SipParseError:
        return


def sip_endpoint(data: bytes) -> None:
    """``SipEndpoint.handle_input`` on a datagram sequence, answering every call: never
    raises, and everything it transmits parses."""
    ep = SipEndpoint(EndpointConfig(host="127.0.0.1", allow=lambda ip: Decision.ALLOW))
    now = NOW
    for i, datagram in enumerate(split_datagrams(data)):
        ep.handle_input(now, datagram, ("127.0.0.2", 5060), "udp" if i % 3 else "tcp")
        now += 0.3
        ep.handle_timeout(now)
        while (out := ep.poll_output()) is not None:
            if isinstance(out, Transmit):
                if out.data != b"\r\n":
                    parse_sip_untrusted(out.data)
            elif isinstance(out, IncomingCall):
                ep.accept(now, out.call_id, b"v=0\r\n")
    ep.handle_timeout(now + 100)


def sdp_phone(data: bytes) -> None:
    """``answer_phone_offer_untrusted``: only SdpError escapes; an answer is valid SDP."""
    try:
        got = answer_phone_offer_untrusted(data, address="192.0.2.1", port=4000, session_id=1,
                                           crypto_answer=["1 AES_CM_128_HMAC_SHA1_80 inline:x"])
    except SdpError:
        return
    if not isinstance(got, PhoneRefusal):
        parse_offer_untrusted(got[1])

# --- TURN -------------------------------------------------------------------------------------

TURN_SECRET = b"fuzz-turn-secret"
TURN_CRED = mint_rest_credential(TURN_SECRET, "fuzz", int(NOW) + 3600)
TURN_OWN = ("203.0.113.1", 3478)
_TURN_CLIENTS = (("198.51.100.1", 4000), ("198.51.100.1", 4001), ("198.51.100.2", 9))
_AUTH_ATTRS = frozenset((AttrType.USERNAME, AttrType.REALM, AttrType.NONCE,
                         AttrType.MESSAGE_INTEGRITY, AttrType.MESSAGE_INTEGRITY_SHA256,
                         AttrType.FINGERPRINT, AttrType.PASSWORD_ALGORITHM,
                         AttrType.PASSWORD_ALGORITHMS))


class _FuzzPorts:
    def __init__(self) -> None:
        self.next = 49152

    def bind(self, family: int, client: tuple[str, int],
             even: bool = False) -> tuple[str, int] | None:
        self.next += 1 + (even and self.next % 2 == 0)
        if self.next % 5 == 0:
            return None  # sometimes out of ports: 508/440 paths
        return ("203.0.113.1", self.next) if family == 1 else ("2001:db8::1", self.next)


def turn_parsers(data: bytes) -> None:
    """ChannelData, the TURN stream framer (cut where the first byte says; its buffer stays
    bounded), REST usernames and nonces: only TurnError escapes (nonce checks never raise)."""
    is_turn(data)
    try:
        parse_channel_data_untrusted(data)
    except TurnError:
        pass
    framer = TurnStreamFramer(64 + (data[0] if data else 0) * 4)
    step = 1 + (data[0] % 5 if data else 0)
    try:
        for i in range(0, len(data), step):
            framer.handle_input(data[i : i + step])
            while framer.poll_output() is not None:
                pass
            assert framer.buffered <= framer.max_message + 3 + step, "framer unbounded"
    except TurnError:
        pass
    text = data.decode("utf-8", "replace")
    try:
        parse_rest_username_untrusted(text)
    except TurnError:
        pass
    assert NonceCodec(b"k", 60).check(text, NOW, ("192.0.2.1", 1))[0] in ("ok", "stale", "bad")
    try:  # an allocation's flow-cache record (snapshot.py): untrusted after a worker kill
        parse_record_untrusted(data)
    except TurnError:
        pass


def turn(data: bytes) -> None:
    """``TurnServer`` with tiny quotas. Each datagram's first byte picks the client and the
    mode: raw; re-signed with a valid REST credential and nonce (so Allocate, Refresh,
    CreatePermission and ChannelBind see hostile attributes past authentication); or fed to
    ``from_peer`` as a peer's datagram. Invariants: never raises; every unsigned error answer
    is at most the request + 32 bytes; quotas and per-allocation caps hold."""
    cfg = TurnConfig(secrets=(TURN_SECRET,), nonce_key=b"fuzz-nonce", own=frozenset({TURN_OWN}),
                     max_allocations=3, max_per_source=2, max_per_username=3,
                     max_permissions=2, max_channels=2, unauth_burst=1000.0)
    srv = TurnServer(cfg, _FuzzPorts())
    now = NOW
    for d in split_datagrams(data, limit=24):
        if not d:
            continue
        sel, body = d[0], d[1:]
        client = _TURN_CLIENTS[sel % 3]
        if sel & 0x40 and srv.by_relayed:
            relayed = sorted(srv.by_relayed)[sel % len(srv.by_relayed)]
            srv.from_peer(now, relayed, TURN_OWN, body)
        else:
            raw = body
            if sel & 0x80:
                try:
                    msg = Message.parse_untrusted(body)
                    attrs = tuple((t, v) for t, v in msg.attributes if t not in _AUTH_ATTRS)
                    attrs += ((AttrType.USERNAME, TURN_CRED.username),
                              (AttrType.REALM, cfg.realm),
                              (AttrType.NONCE, srv.nonces.mint(now, client, cookie=False)))
                    key = long_term_key(TURN_CRED.username, cfg.realm, TURN_CRED.password)
                    raw = Message(msg.method, msg.msg_class, msg.transaction_id, attrs,
                                  ).encode(key, integrity="sha256" if sel & 0x20 else "sha1")
                except (StunError, LocalProtocolError):
                    raw = body
            srv.handle_input(now, raw, client, TURN_OWN)
            while (out := srv.poll_output()) is not None:
                if isinstance(out, TurnTransmit) and out.data[:1] == b"\x01":
                    answer = Message.parse_untrusted(out.data)
                    signed = answer.has(AttrType.MESSAGE_INTEGRITY) or answer.has(
                        AttrType.MESSAGE_INTEGRITY_SHA256)
                    if not signed:
                        assert len(out.data) <= len(raw) + 32, "TURN amplifies"
        while srv.poll_output() is not None:
            pass
        assert len(srv.allocations) <= 3 and len(srv.by_relayed) == len(srv.allocations)
        for alloc in srv.allocations.values():
            assert len(alloc.channels) <= 2 and len(alloc.permissions) <= 2
        now += (sel >> 3 & 3) * 100.0
        srv.handle_timeout(now)


class _FuzzSockets(_FuzzPorts):
    def close(self, relayed: tuple[str, int]) -> None:
        pass

    def send(self, relayed: tuple[str, int], peer: tuple[str, int], data: memoryview) -> None:
        assert peer[0].startswith("10."), f"relayed to {peer}, outside --turn-peer"


def relay_turn(data: bytes) -> None:
    """``RelayCore.handle_datagram`` with TURN attached (relay/turn.py): the same datagram
    modes as ``turn`` (raw, re-signed, and a body wrapped as ChannelData on channel 0x4000,
    or as a Send indication to our media address, carrying a Binding request with a valid
    minted ufrag), through the relay's routing. Invariants: never raises; an unsigned answer
    is at most the request + 32 bytes; a :class:`Relayed` slice lies inside the datagram and
    its flow's client is a relayed address through ``TURN_HOP``; nothing is sent to a peer
    outside --turn-peer; the flow table stays capped."""
    core = RelayCore(CoreConfig(secrets=(SECRET,), transceivers={0: ("127.0.0.1", 4000)},
                                max_flows=3))
    core.sinks[(RelayTransport.UDP, _PUBLIC)] = UdpSink(_PUBLIC, lambda b, p: (len(p), 0, 0))
    settings = TurnSettings(secrets=(TURN_SECRET,), max_allocations=3, max_per_source=2,
                            peers=(ipaddress.ip_network("10.0.0.0/8"),))
    gate = TurnGate(core, settings, own_media_map([], [_PUBLIC]), _FuzzSockets(),
                    unix_offset=0.0)
    srv = gate.server
    key = long_term_key(TURN_CRED.username, settings.realm, TURN_CRED.password)
    check = binding_request(bytes(12), username=CODEC.mint(cluster=0, transceiver=0,
                                                           nonce=bytes(7)) + ":fuzz")
    now = NOW
    for d in split_datagrams(data, limit=24):
        if not d:
            continue
        sel, body = d[0], d[1:]
        client = _TURN_CLIENTS[sel % 3]
        raw = body
        if sel & 0x40:
            inner = check if sel & 0x20 else body
            raw = (encode_channel_data(0x4000, inner) if sel & 0x10 else
                   Message(Method.SEND, Class.INDICATION, bytes(12), (
                       (AttrType.XOR_PEER_ADDRESS, _PUBLIC), (AttrType.DATA, inner),
                   )).encode(fingerprint=False))
        elif sel & 0x80:
            try:
                msg = Message.parse_untrusted(body)
                attrs = tuple((t, v) for t, v in msg.attributes if t not in _AUTH_ATTRS)
                attrs += ((AttrType.USERNAME, TURN_CRED.username),
                          (AttrType.REALM, settings.realm),
                          (AttrType.NONCE, srv.nonces.mint(now, client, cookie=False)))
                raw = Message(msg.method, msg.msg_class, msg.transaction_id, attrs).encode(key)
            except (StunError, LocalProtocolError):
                raw = body
        res = core.handle_datagram(now, client, raw, _PUBLIC)
        if isinstance(res, bytes):
            answer = Message.parse_untrusted(res) if res[:1] in (b"\x00", b"\x01") else None
            if answer is not None and not answer.has(AttrType.MESSAGE_INTEGRITY):
                assert len(res) <= len(raw) + MAX_AMPLIFICATION, "TURN in the relay amplifies"
        elif isinstance(res, Relayed):
            assert 0 <= res.offset and res.offset + res.length <= len(raw)
            assert res.flow.upstream is TURN_HOP and res.flow.client in srv.by_relayed
        for sink in core.sinks.values():
            sink.pending.clear()
        assert len(core.flows) <= 3 and len(srv.allocations) <= 3
        now += (sel >> 2 & 3) * 200.0
        gate.sweep(now)


TARGETS: dict[str, Target] = {
    "stun": stun,
    "ufrag": ufrag,
    "proxy": proxy,
    "proxy_stream": proxy_stream,
    "rtp": rtp,
    "sdp": sdp,
    "dtls_parsers": dtls_parsers,
    "dtls_server": dtls_server,
    "dtls_client": dtls_client,
    "dtls_handshake": dtls_handshake,
    "dtls13_parsers": dtls13_parsers,
    "dtls13_server": dtls13_server,
    "dtls13_client": dtls13_client,
    "dtls13_handshake": dtls13_handshake,
    "tls_records": tls_records,
    "ice": ice,
    "relay": relay,
    "sctp": sctp,
    "realtime": realtime,
    "live": live,
    "framing": framing,
    "sse": sse,
    "vouch": vouch,
    "sip": sip,
    "sip_stream": sip_stream,
    "sip_endpoint": sip_endpoint,
    "sdp_phone": sdp_phone,
    "turn": turn,
    "turn_parsers": turn_parsers,
    "relay_turn": relay_turn,
}
