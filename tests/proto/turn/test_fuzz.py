"""Fuzz the TURN core with hypothesis: every parser raises only its module's error
(``TurnError``; ``StunError`` for the STUN codec under it), whole and byte-at-a-time, and the
server never raises for peer bytes, never amplifies, and stays bounded. The same properties,
corpus-seeded, run as the ``turn`` and ``turn_parsers`` targets of fuzz/targets.py (``make
fuzz``, tests/fuzz/test_deep.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from proto.turn.turn_client import NOW, OWN, SERVER, Client, allocate, server

from appliance.proto.stun import AttrType, Class, Message, Method, StunError
from appliance.proto.turn import (
    AllocationMissing,
    StreamFramer,
    Transmit,
    TurnError,
    encode_channel_data,
    message_spans_untrusted,
    parse_channel_data_untrusted,
    parse_rest_username_untrusted,
)


@given(st.binary(max_size=300))
def test_parsers_raise_only_their_error(data: bytes) -> None:
    for n in (len(data), *range(min(len(data), 24))):  # whole, then every short prefix
        chunk = data[:n]
        try:
            parse_channel_data_untrusted(chunk)
        except TurnError:
            pass
        try:
            Message.parse_untrusted(chunk)
        except StunError:
            pass
        try:
            parse_rest_username_untrusted(chunk.decode("latin-1"))
        except TurnError:
            pass


@given(st.binary(max_size=400))
def test_message_spans_agree_with_the_stream_framer(data: bytes) -> None:
    """The peeking reader (relay/tcp.py) takes, from any bytes and any prefix of them,
    exactly the messages the StreamFramer delivers before it breaks, and only TurnError
    escapes."""
    for n in (len(data), *range(0, len(data), 11)):
        chunk = data[:n]
        f = StreamFramer(256)
        expect: list[bytes] = []
        broke = False
        try:
            f.handle_input(chunk)
            while (m := f.poll_output()) is not None:
                expect.append(m)
        except TurnError:
            broke = True
        try:
            spans, end, want = message_spans_untrusted(chunk, 256)
        except TurnError:
            assert broke
            continue
        assert not broke
        assert [chunk[o : o + k] for o, k in spans] == expect
        assert end == n - f.buffered and (want == 0) == (end == n)


@given(st.binary(max_size=400), st.integers(1, 17))
def test_stream_framer_whole_equals_byte_at_a_time(data: bytes, step: int) -> None:
    def run(step: int) -> tuple[list[bytes], bool]:
        f = StreamFramer(256)
        out: list[bytes] = []
        try:
            for i in range(0, len(data), step):
                f.handle_input(data[i : i + step])
                while (m := f.poll_output()) is not None:
                    out.append(m)
                assert f.buffered <= 256 + 3 + step
        except TurnError:
            return out, True
        return out, False

    whole, failed = run(max(1, len(data)))
    cut, cut_failed = run(step)
    # Whatever the split, the same messages come out, and a broken stream breaks either way.
    assert failed == cut_failed
    assert cut[: len(whole)] == whole if failed else cut == whole


_ATTRS = st.sampled_from([
    (AttrType.REQUESTED_TRANSPORT, 17), (AttrType.LIFETIME, 0), (AttrType.LIFETIME, 99999),
    (AttrType.XOR_PEER_ADDRESS, OWN), (AttrType.XOR_PEER_ADDRESS, ("10.0.0.1", 5)),
    (AttrType.CHANNEL_NUMBER, 0x4000), (AttrType.CHANNEL_NUMBER, 0x4001),
    (AttrType.REQUESTED_ADDRESS_FAMILY, 2), (AttrType.DATA, b"x"), (AttrType.EVEN_PORT, 0),
    (AttrType.DONT_FRAGMENT, None),
])
_METHODS = st.sampled_from([Method.ALLOCATE, Method.REFRESH, Method.CREATE_PERMISSION,
                            Method.CHANNEL_BIND, Method.SEND, Method.DATA, Method.BINDING])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_METHODS, st.lists(_ATTRS, max_size=4), st.integers(0, 3),
                          st.booleans(), st.binary(max_size=8)), max_size=25))
def test_server_survives_authenticated_sequences(steps: list[tuple[
        Method, list[tuple[AttrType, object]], int, bool, bytes]]) -> None:
    """Signed requests of every method with any mix of attributes, from three clients,
    interleaved with ChannelData and peer data: never raises, unsigned answers never exceed
    request + 32, quotas and caps hold."""
    srv, _ = server(max_allocations=2, max_per_source=2, max_permissions=2, max_channels=1)
    srv.look_up_misses = True  # a shell with a cache: misses are asked about, then answered
    clients = [Client(addr=("198.51.100.1", 1000 + i)) for i in range(3)]
    for c in clients:
        allocate(srv, c)  # learn a nonce (and maybe allocate)
    now = NOW
    for method, attrs, who, channel, junk in steps:
        c = clients[who % 3]
        cls = Class.INDICATION if method in (Method.SEND, Method.DATA) else Class.REQUEST
        if channel:
            raw = encode_channel_data(0x4000, junk)
        else:
            raw = c.request(method, tuple(attrs), cls=cls)  # type: ignore[arg-type]
        srv.handle_input(now, raw, c.addr, SERVER)
        for relayed in list(srv.by_relayed):
            srv.from_peer(now, relayed, OWN, junk)
        missing = []
        while (out := srv.poll_output()) is not None:
            if isinstance(out, Transmit) and out.data[:1] == b"\x01":
                msg = Message.parse_untrusted(out.data)
                if not msg.has(AttrType.MESSAGE_INTEGRITY) and \
                        not msg.has(AttrType.MESSAGE_INTEGRITY_SHA256):
                    assert len(out.data) <= len(raw) + 32
            elif isinstance(out, AllocationMissing):
                missing.append(out)
        if junk[:1] != b"\x00":  # found nowhere (else: left in flight until given up)
            for m in missing:
                srv.looked_up(now, m.client, m.local)
        assert len(srv.allocations) <= 2
        for alloc in srv.allocations.values():
            assert len(alloc.permissions) <= 2 and len(alloc.channels) <= 1
        now += 50.0
        srv.handle_timeout(now)


@given(st.binary(max_size=200), st.integers(0, 2))
def test_server_never_raises_for_raw_bytes(data: bytes, who: int) -> None:
    srv, _ = server()
    c = Client(addr=("198.51.100.1", who))
    allocate(srv, c)
    srv.handle_input(NOW, data, c.addr, SERVER)
    srv.handle_input(NOW, data, c.addr, SERVER, stream=True)
    while (out := srv.poll_output()) is not None:
        if isinstance(out, Transmit) and data and out.data[:1] == b"\x01":
            msg = Message.parse_untrusted(out.data)
            if not msg.has(AttrType.MESSAGE_INTEGRITY):
                assert len(out.data) <= len(data) + 32
