"""The TLS 1.2/1.3 record layer that takes over from OpenSSL after the handshake
(proto/dtls/tlsrecord.py, issue 40 item 2), against real peers.

* The standard library's ``ssl`` is the client over memory BIOs; the server is ``ssl`` too
  until its handshake is done, then its ``SSLObject`` is dropped and a
  :class:`RecordLayer` built from the key log (exactly what relay/tls.py does) carries the
  connection: TLS 1.3 (AES-256-GCM, OpenSSL's choice) and TLS 1.2 with each AEAD suite.
* ``openssl s_client`` over loopback TCP for the other TLS 1.3 suites (Python 3.11 cannot
  pick a TLS 1.3 suite) and for KeyUpdate (s_client's ``k``/``K`` commands).
* A successor built from ``keys`` and ``state`` carries on mid-stream; the errors a peer
  can cause are :class:`DtlsError` with the alert to send; hypothesis fuzzes every parser
  (STYLE.md rule 10) and the record splitter on real records cut at arbitrary points.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.dtls import DtlsError
from appliance.proto.dtls._wire import AlertDescription
from appliance.proto.dtls.tlspeek import peek_client_hello_untrusted
from appliance.proto.dtls.tlsrecord import (
    HANDSHAKE,
    KEY_UPDATE,
    SUITES,
    TLS12_CIPHERS,
    TLS13,
    KeyLog,
    RecordLayer,
    SessionKeys,
    record_spans_untrusted,
    server_random_untrusted,
    session_keys,
)

# --- the server's side: ssl for the handshake, then RecordLayer ----------------------------


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed P-256 certificate (so the TLS 1.2 suites are ECDHE-ECDSA)."""
    d = tmp_path_factory.mktemp("tlsrecord-cert")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tlsrecord test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = d / "cert.pem", d / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


class KeyLogFile:
    """The server context's key log in a memfd, read as it grows (relay/tls.py's way)."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("tlsrecord-keylog")
        self.offset = 0
        self.log = KeyLog()

    @property
    def path(self) -> str:
        return f"/proc/self/fd/{self.fd}"

    def take(self, client_random: bytes) -> dict[str, bytes]:
        while data := os.pread(self.fd, 1 << 16, self.offset):
            self.offset += len(data)
            self.log.feed(data)
        return self.log.take(client_random)


@pytest.fixture
def server_ctx(cert: tuple[str, str]) -> Iterator[tuple[ssl.SSLContext, KeyLogFile]]:
    """The relay's TURN/TLS server context: no tickets (nothing written after Finished), the
    TLS 1.2 suites this layer speaks, the key log on."""
    keylog = KeyLogFile()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*cert)
    ctx.options |= ssl.OP_NO_TICKET
    ctx.num_tickets = 0
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.keylog_filename = keylog.path
    yield ctx, keylog
    os.close(keylog.fd)


class Server:
    """One connection's server side: ``ssl`` until the handshake is done, then
    :meth:`take_over` drops the ``SSLObject`` and returns the :class:`RecordLayer`."""

    def __init__(self, ctx: ssl.SSLContext, keylog: KeyLogFile) -> None:
        self.keylog = keylog
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj: ssl.SSLObject | None = ctx.wrap_bio(self.inc, self.out, server_side=True)
        self.hello = bytearray()
        self.first_flight: bytes | None = None
        self.done = False

    def handshake_input(self, data: bytes) -> bytes:
        """The client's bytes in; what to send back."""
        assert self.obj is not None
        if self.first_flight is None:
            self.hello += data
        self.inc.write(data)
        try:
            self.obj.do_handshake()
            self.done = True
        except ssl.SSLWantReadError:
            pass
        out = self.out.read()
        if out and self.first_flight is None:
            self.first_flight = out
        return out

    def take_over(self) -> tuple[RecordLayer, SessionKeys]:
        assert self.done and self.obj is not None and self.first_flight is not None
        assert self.inc.pending == 0  # nothing of the client's is left inside OpenSSL
        version, suite = self.obj.version(), self.obj.cipher()
        assert version is not None and suite is not None
        self.obj = None  # from here on OpenSSL has no part in the connection
        peek = peek_client_hello_untrusted(bytes(self.hello))
        assert peek is not None
        keys = session_keys(self.keylog.take(peek.random), version, suite[0], peek.random,
                            server_random_untrusted(self.first_flight))
        assert keys is not None, (version, suite)
        # TLS 1.2: the Finished messages were each side's record 0 under these keys.
        return RecordLayer(keys, *((0, 0, 0, 0) if version == "TLSv1.3" else (0, 1, 0, 1))), keys


class Client:
    """The standard library's OpenSSL as the client, over memory BIOs."""

    def __init__(self, version: ssl.TLSVersion, ciphers: str | None) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.minimum_version = ctx.maximum_version = version
        if ciphers:
            ctx.set_ciphers(ciphers)
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.inc, self.out)
        self.eof = False

    def step(self, data: bytes) -> bytes:
        self.inc.write(data)
        try:
            self.obj.do_handshake()
        except ssl.SSLWantReadError:
            pass
        return self.out.read()

    def send(self, data: bytes) -> bytes:
        self.obj.write(data)
        return self.out.read()

    def receive(self, records: bytes) -> bytes:
        """What the client reads from ``records``; a close_notify sets :attr:`eof` (the
        standard library's ``SSLObject.read`` returns b"" for it)."""
        self.inc.write(records)
        got = b""
        while True:
            try:
                data = self.obj.read(1 << 16)
            except ssl.SSLWantReadError:
                return got
            if not data:
                self.eof = True
                return got
            got += data


def connect(client: Client, server: Server) -> tuple[RecordLayer, SessionKeys]:
    to_server = client.step(b"")
    while not server.done:
        to_server = client.step(server.handshake_input(to_server))
    assert to_server == b""
    client.obj.do_handshake()  # the client is done too
    return server.take_over()


def open_all(layer: RecordLayer, stream: bytes) -> bytes:
    spans, end, want = record_spans_untrusted(stream)
    assert (end, want) == (len(stream), 0)
    return b"".join(layer.open(stream[at : at + n]) for at, n in spans)


#: (client's max version, client's cipher string, the suite OpenSSL agrees)
CASES = [
    (ssl.TLSVersion.TLSv1_3, None, "TLS_AES_256_GCM_SHA384"),
    (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES128-GCM-SHA256"),
    (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES256-GCM-SHA384"),
    (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-ECDSA-CHACHA20-POLY1305"),
]
CASE_IDS = [c[2] for c in CASES]


@pytest.fixture(params=CASES, ids=CASE_IDS)
def conn(request: pytest.FixtureRequest, server_ctx: tuple[ssl.SSLContext, KeyLogFile]
         ) -> tuple[Client, RecordLayer, SessionKeys]:
    version, ciphers, suite = request.param
    client = Client(version, ciphers)
    layer, keys = connect(client, Server(*server_ctx))
    assert keys.suite == suite
    return client, layer, keys


MESSAGES = [b"ping", b"x" * 1, bytes(range(256)) * 70, b"y" * 40_000]  # 17920 B, 40000 B:
# more than one record (2^14 each way)


def test_records_both_ways_with_openssl_client(conn: tuple[Client, RecordLayer, SessionKeys]
                                               ) -> None:
    """What the client writes opens here, what we seal the client reads, record after
    record (the sequence numbers of both sides stay in step)."""
    client, layer, keys = conn
    for data in MESSAGES:
        assert open_all(layer, client.send(data)) == data
        assert client.receive(layer.seal(b"echo " + data)) == b"echo " + data
    assert layer.state[1] >= len(MESSAGES) + 2 and not layer.closed
    assert layer.pending() == b""


def test_successor_carries_on_mid_stream(conn: tuple[Client, RecordLayer, SessionKeys]) -> None:
    """A second RecordLayer from the keys (through their JSON record, as a successor gets
    them) and ``state`` goes on where the first stopped, both ways; the client never
    notices."""
    client, first, keys = conn
    for data in (b"one", b"two" * 9000):
        assert open_all(first, client.send(data)) == data
        assert client.receive(first.seal(data.upper())) == data.upper()
    handed = json.loads(json.dumps({"keys": keys.to_record(), "state": first.state}))
    second = RecordLayer(SessionKeys.from_record_untrusted(handed["keys"]), *handed["state"])
    assert second.state == first.state
    for data in (b"three", b"four" * 5000):
        assert open_all(second, client.send(data)) == data
        assert client.receive(second.seal(data.upper())) == data.upper()


# --- errors a peer causes ------------------------------------------------------------------


def _bad(layer: RecordLayer, record: bytes) -> DtlsError:
    with pytest.raises(DtlsError) as info:
        layer.open(record)
    return info.value


@pytest.mark.parametrize("where", [5, 13, -17, -1])
def test_a_flipped_bit_is_bad_record_mac(conn: tuple[Client, RecordLayer, SessionKeys],
                                         where: int) -> None:
    client, layer, _ = conn
    record = bytearray(client.send(b"hello"))
    record[where] ^= 0x10
    assert _bad(layer, bytes(record)).hint == AlertDescription.bad_record_mac


def test_a_replayed_record_is_refused(conn: tuple[Client, RecordLayer, SessionKeys]) -> None:
    """A replay does not authenticate (its sequence number is spent); a refused record
    leaves the layer where it was, so the next real record still opens."""
    client, layer, _ = conn
    first, second = client.send(b"first"), client.send(b"second")
    assert layer.open(first) == b"first"
    state = layer.state
    assert _bad(layer, first).hint == AlertDescription.bad_record_mac
    assert layer.state == state
    assert layer.open(second) == b"second"


def test_close_notify_closes(conn: tuple[Client, RecordLayer, SessionKeys]) -> None:
    client, layer, _ = conn
    assert open_all(layer, client.send(b"last words")) == b"last words"
    with pytest.raises(ssl.SSLWantReadError):
        client.obj.unwrap()  # sends close_notify, then waits for ours
    assert open_all(layer, client.out.read()) == b""
    assert layer.closed
    # whatever comes next (even a record that would authenticate) is refused
    assert _bad(layer, b"\x17\x03\x03\x00\x00").hint == AlertDescription.unexpected_message


def test_a_fatal_alert_from_the_client_raises(conn: tuple[Client, RecordLayer, SessionKeys]
                                              ) -> None:
    """The client's OpenSSL answers a record of ours it cannot authenticate with a fatal
    bad_record_mac alert: opening that alert raises."""
    client, layer, _ = conn
    record = bytearray(layer.seal(b"tampered"))
    record[-1] ^= 1
    with pytest.raises(ssl.SSLError):
        client.receive(bytes(record))
    alert = client.out.read()
    assert alert
    with pytest.raises(DtlsError, match="alert 20"):
        open_all(layer, alert)


def test_an_outer_handshake_record_is_refused(conn: tuple[Client, RecordLayer, SessionKeys]
                                              ) -> None:
    """A record of outer type handshake after the handshake: TLS 1.2 renegotiation (which
    the context forbids too), or a TLS 1.3 record left unprotected. Refused for its type,
    before any decryption."""
    client, layer, _ = conn
    state = layer.state
    record = bytearray(client.send(b"a record"))
    record[0] = HANDSHAKE
    assert _bad(layer, bytes(record)).hint == AlertDescription.unexpected_message
    assert layer.state == state


def test_a_truncated_record_is_refused(conn: tuple[Client, RecordLayer, SessionKeys]) -> None:
    client, layer, _ = conn
    record = client.send(b"cut short")
    spans, end, want = record_spans_untrusted(record[:-1])
    assert (spans, end, want) == ([], 0, len(record))
    _bad(layer, record[:-1])
    # the header says what it says: a body cut and the length patched does not authenticate
    patched = record[:3] + (len(record) - 6).to_bytes(2, "big") + record[5:-1]
    _bad(layer, patched)
    assert layer.open(record) == b"cut short"


def test_an_unprotected_ccs_in_tls13_is_refused(
        conn: tuple[Client, RecordLayer, SessionKeys]) -> None:
    """RFC 8446 §5: a middlebox-compatibility CCS is dropped only before the peer's
    Finished; after it, it is an unexpected_message."""
    _, layer, _ = conn
    # (TLS 1.2: a CCS after the handshake would be renegotiation's: refused the same way.)
    assert _bad(layer, b"\x14\x03\x03\x00\x01\x01").hint == AlertDescription.unexpected_message


def test_our_close_notify_is_eof_to_the_client(conn: tuple[Client, RecordLayer, SessionKeys]
                                               ) -> None:
    """``alert(0)`` is a close_notify the client's OpenSSL takes as a clean end: its read
    returns b"" (Python 3.11's ``SSLObject.read`` does not raise SSLZeroReturnError for
    it), its ``unwrap()`` completes at once, and its own close_notify closes us."""
    client, layer, _ = conn
    assert client.receive(layer.seal(b"bye")) == b"bye"
    assert not client.eof
    assert client.receive(layer.alert(AlertDescription.close_notify)) == b""
    assert client.eof
    client.obj.unwrap()  # no SSLWantReadError: ours was received
    assert open_all(layer, client.out.read()) == b"" and layer.closed


def test_our_fatal_alert_reaches_the_client(conn: tuple[Client, RecordLayer, SessionKeys]
                                            ) -> None:
    client, layer, _ = conn
    with pytest.raises(ssl.SSLError, match="(?i)unexpected.message"):
        client.receive(layer.alert(AlertDescription.unexpected_message))


# --- openssl s_client: each TLS 1.3 suite, and KeyUpdate -----------------------------------

OPENSSL = shutil.which("openssl")


class SClient:
    """``openssl s_client`` on loopback TCP against a :class:`Server`. ``-quiet`` keeps its
    stdout to the data it reads; ``-no_ign_eof`` (after ``-quiet``) keeps the ``k``/``K``
    command letters (s_client ignores them when it ignores EOF)."""

    def __init__(self, server: Server, suite: str, stderr: IO[bytes]) -> None:
        assert OPENSSL is not None
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        self.proc = subprocess.Popen(
            [OPENSSL, "s_client", "-connect", f"127.0.0.1:{port}", "-tls1_3", "-ciphersuites",
             suite, "-quiet", "-no_ign_eof"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        with listener:
            self.sock, _ = listener.accept()
        while not server.done:
            data = self.sock.recv(1 << 16)
            assert data, "s_client hung up during the handshake"
            self.sock.sendall(server.handshake_input(data))
        self.buf = bytearray()

    def type_line(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def printed(self) -> bytes:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def record(self) -> bytes:
        """The next whole record s_client sent."""
        while True:
            spans, _, _ = record_spans_untrusted(self.buf)
            if spans:
                at, n = spans[0]
                record = bytes(self.buf[at : at + n])
                del self.buf[: at + n]
                return record
            data = self.sock.recv(1 << 16)
            assert data, "s_client hung up"
            self.buf += data

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.sock.close()


@pytest.fixture(scope="module")
def openssl_version() -> str:
    if OPENSSL is None:
        pytest.skip("no openssl binary")
    version = subprocess.run([OPENSSL, "version"], capture_output=True, check=True).stdout
    print("peer:", version.decode().strip())  # STYLE.md rule 16
    return version.decode()


TLS13_SUITES = [s for s, v in SUITES.items() if v.version == TLS13]


@pytest.mark.interop
@pytest.mark.parametrize("suite", TLS13_SUITES)
def test_key_update_with_openssl_s_client(suite: str, openssl_version: str, tmp_path: Path,
                                          server_ctx: tuple[ssl.SSLContext, KeyLogFile]) -> None:
    """Each TLS 1.3 suite with s_client, and its KeyUpdates: ``k`` (update_not_requested)
    moves only our read key; ``K`` (update_requested) moves it again and our answer
    (``pending()``) moves our write key, which s_client must follow to read on; a layer
    rebuilt from ``state`` after the updates carries on both ways."""
    server = Server(*server_ctx)
    with (tmp_path / "s_client.err").open("wb") as err:
        peer = SClient(server, suite, err)
    try:
        layer, keys = server.take_over()
        assert keys.suite == suite

        def exchange(layer: RecordLayer, line: bytes) -> None:
            peer.type_line(line)
            assert layer.open(peer.record()) == line + b"\n"
            peer.sock.sendall(layer.seal(b"echo " + line + b"\n"))
            assert peer.printed() == b"echo " + line + b"\n"

        exchange(layer, b"before")
        assert layer.state == (0, 1, 0, 1)

        peer.type_line(b"k")
        assert layer.open(peer.record()) == b""  # the KeyUpdate, no data
        assert layer.state == (1, 0, 0, 1) and layer.pending() == b""
        exchange(layer, b"after k")
        assert layer.state == (1, 1, 0, 2)

        peer.type_line(b"K")
        assert layer.open(peer.record()) == b""
        assert layer.state == (2, 0, 1, 0)  # our answer took the old key's seq 2
        answer = layer.pending()
        assert answer[0] == 0x17 and len(answer) == 5 + 5 + 1 + 16  # header, KeyUpdate, type, tag
        assert layer.pending() == b""
        peer.sock.sendall(answer)  # s_client reads on only because it got this
        exchange(layer, b"after K")
        assert layer.state == (2, 1, 1, 1)

        successor = RecordLayer(SessionKeys.from_record_untrusted(keys.to_record()),
                                *layer.state)
        exchange(successor, b"successor")
        assert successor.state == (2, 2, 1, 2)
    finally:
        peer.close()
    assert b"KEYUPDATE" in (tmp_path / "s_client.err").read_bytes()


# --- keys ----------------------------------------------------------------------------------

FIXED = {
    "TLS_AES_128_GCM_SHA256": SessionKeys("TLS_AES_128_GCM_SHA256", bytes(range(32)),
                                          bytes(range(32, 64))),
    "TLS_AES_256_GCM_SHA384": SessionKeys("TLS_AES_256_GCM_SHA384", bytes(range(48)),
                                          bytes(range(48, 96))),
    "ECDHE-ECDSA-CHACHA20-POLY1305": SessionKeys("ECDHE-ECDSA-CHACHA20-POLY1305",
                                                 bytes(range(44)), bytes(range(44, 88))),
    "ECDHE-RSA-AES128-GCM-SHA256": SessionKeys("ECDHE-RSA-AES128-GCM-SHA256",
                                               bytes(range(20)), bytes(range(20, 40))),
}


def mirror(keys: SessionKeys) -> RecordLayer:
    """The peer's record layer: the same keys, read and write swapped (its Finished, in
    TLS 1.2, was its record 0 too)."""
    peer = SessionKeys(keys.suite, keys.write, keys.read)
    return RecordLayer(peer, *((0, 0, 0, 0) if keys.version == TLS13 else (0, 1, 0, 1)))


def key_update(peer: RecordLayer, *, requested: bool) -> bytes:
    """A TLS 1.3 KeyUpdate record from ``peer`` (its write key moves on). RecordLayer only
    ever sends the update_not_requested answer, so the peer's request is sealed through the
    same private path that answer takes."""
    record = peer._seal(HANDSHAKE, bytes((KEY_UPDATE, 0, 0, 1, int(requested))))
    peer._key_update_write()
    return record


def ours(keys: SessionKeys) -> RecordLayer:
    return RecordLayer(keys, *((0, 0, 0, 0) if keys.version == TLS13 else (0, 1, 0, 1)))


def test_keys_record_round_trips_and_repr_hides_them(
        conn: tuple[Client, RecordLayer, SessionKeys]) -> None:
    _, layer, keys = conn
    record = keys.to_record()
    assert SessionKeys.from_record_untrusted(json.loads(json.dumps(record))) == keys
    for shown in (repr(keys), str(keys), repr(layer.keys)):
        assert keys.read.hex() not in shown and keys.write.hex() not in shown
        assert keys.read.hex()[:16] not in shown
    assert keys.suite in repr(keys)


def _good() -> dict[str, object]:
    return FIXED["TLS_AES_128_GCM_SHA256"].to_record()


@pytest.mark.parametrize("record", [
    None, [], "keys", 7, {}, {**_good(), "s": "TLS_NULL_WITH_NULL_NULL"}, {**_good(), "s": 1},
    {**_good(), "r": None}, {**_good(), "w": 5}, {**_good(), "r": "zz" * 32},
    {**_good(), "r": "00" * 31}, {**_good(), "w": "00" * 48}, {**_good(), "r": "0" * 65},
    {**_good(), "r": "00" * 10_000}, {**_good(), "r": "é" * 64},
    {**_good(), "s": "ECDHE-ECDSA-CHACHA20-POLY1305"},  # 1.3-sized keys for a 1.2 suite
], ids=repr)
def test_malformed_keys_records_raise_dtls_error(record: object) -> None:
    with pytest.raises(DtlsError):
        SessionKeys.from_record_untrusted(record)


def test_fixed_keys_round_trip_through_their_mirror() -> None:
    """The fixed keys the properties below use: a peer's layer (keys swapped) and ours
    talk, KeyUpdate included — so the properties work on records that authenticate."""
    for keys in FIXED.values():
        peer, layer = mirror(keys), ours(keys)
        assert open_all(layer, peer.seal(b"a" * 20_000)) == b"a" * 20_000
        assert open_all(peer, layer.seal(b"b")) == b"b"
        if keys.version == TLS13:
            assert open_all(layer, key_update(peer, requested=True)) == b""
            assert layer.rgen == 1 and layer.wgen == 1
            open_all(peer, layer.pending())
            assert peer.rgen == 1
            assert open_all(layer, peer.seal(b"c")) == b"c"
            assert open_all(peer, layer.seal(b"d")) == b"d"


# --- hypothesis ----------------------------------------------------------------------------


def _spans_consistent(data: bytes) -> tuple[list[tuple[int, int]], int, int] | None:
    try:
        spans, end, want = record_spans_untrusted(data)
    except DtlsError:
        return None
    at = 0
    for off, n in spans:  # back to back from 0, each its header's length
        assert off == at and n == 5 + int.from_bytes(data[off + 3 : off + 5], "big")
        at += n
    assert end == at <= len(data)
    if want:
        assert want == 5 + int.from_bytes(data[end + 3 : end + 5], "big") > len(data) - end
    else:
        assert len(data) - end < 5
    return spans, end, want


@given(st.binary(max_size=2000))
def test_fuzz_record_spans_on_any_bytes(data: bytes) -> None:
    _spans_consistent(data)
    # and the same bytes behind a whole record: they start where it ends
    head = b"\x17\x03\x03\x00\x03abc"
    got = _spans_consistent(head + data)
    if got is not None:
        assert got[0][0] == (0, 8)


@given(st.sampled_from(sorted(FIXED)),
       st.lists(st.tuples(st.binary(max_size=400), st.sampled_from([None, False, True])),
                min_size=1, max_size=8),
       st.data())
def test_real_records_split_anywhere_reassemble(suite: str,
                                                sends: list[tuple[bytes, bool | None]],
                                                data: st.DataObject) -> None:
    """A stream of records sealed by the peer (TLS 1.3 KeyUpdates in it, requested or
    not), cut at arbitrary points as TCP reads would: the shell's loop (buffer, span, open,
    keep the tail) gets back exactly those records and their plaintext."""
    keys = FIXED[suite]
    peer, layer = mirror(keys), ours(keys)
    records: list[bytes] = []
    for plain, update in sends:
        records.append(peer.seal(plain) if plain else b"")
        if update is not None and keys.version == TLS13:
            records.append(key_update(peer, requested=update))
    stream = b"".join(records)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    got: list[bytes] = []
    plain_got = b""
    buf = b""
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        buf += stream[a:b]
        spans, end, want = record_spans_untrusted(buf)
        assert want == 0 or want > len(buf) - end
        for at, n in spans:
            got.append(buf[at : at + n])
            plain_got += layer.open(buf[at : at + n])
        buf = buf[end:]
    assert buf == b""
    assert b"".join(got) == stream and got == [r for r in records if r]
    assert plain_got == b"".join(p for p, _ in sends)
    # every KeyUpdate the peer asked for was answered, and the peer can read it
    if keys.version == TLS13:
        assert layer.wgen == sum(1 for _, u in sends if u)
    open_all(peer, layer.pending())
    assert open_all(peer, layer.seal(b"end")) == b"end"


@given(st.sampled_from(sorted(FIXED)), st.binary(max_size=600),
       st.sampled_from([20, 21, 22, 23, 24, 0, 255]), st.sampled_from([1, 3, 4]))
def test_fuzz_open_raises_only_dtls_error(suite: str, body: bytes, ctype: int,
                                          minor: int) -> None:
    layer = ours(FIXED[suite])
    for record in (body, bytes((ctype, 3, minor)) + len(body).to_bytes(2, "big") + body):
        try:
            layer.open(record)
        except DtlsError:
            pass


@given(st.sampled_from(sorted(FIXED)), st.binary(min_size=1, max_size=200),
       st.integers(0, 10_000), st.integers(0, 255))
def test_fuzz_open_real_record_byte_at_a_time(suite: str, plain: bytes, where: int,
                                              value: int) -> None:
    """A real record with one byte changed or removed: only DtlsError, and when it still
    opens it was not changed at all."""
    keys = FIXED[suite]
    record = mirror(keys).seal(plain)
    at = where % len(record)
    changed = bytearray(record)
    changed[at] = value
    for candidate in (bytes(changed), record[:at] + record[at + 1 :]):
        layer = ours(keys)
        try:
            got = layer.open(candidate)
        except DtlsError:
            continue
        assert candidate == record and got == plain


LABELS = ["CLIENT_RANDOM", "CLIENT_TRAFFIC_SECRET_0", "SERVER_TRAFFIC_SECRET_0",
          "CLIENT_HANDSHAKE_TRAFFIC_SECRET", "EXPORTER_SECRET"]
_entries = st.lists(st.tuples(st.sampled_from(LABELS), st.binary(min_size=32, max_size=32),
                              st.binary(min_size=32, max_size=48)), max_size=20)


def _log_text(entries: list[tuple[str, bytes, bytes]]) -> bytes:
    return b"# SSL/TLS secrets log file, generated by OpenSSL\n" + b"".join(
        f"{label} {random.hex()} {secret.hex()}\n".encode() for label, random, secret in entries)


def _expected(entries: list[tuple[str, bytes, bytes]], limit: int
              ) -> list[tuple[bytes, dict[str, bytes]]]:
    model: dict[bytes, dict[str, bytes]] = {}
    for label, random, secret in entries:
        entry = model.pop(random, {})
        entry[label] = secret
        model[random] = entry
        while len(model) > limit:  # evicted as read: a random seen again starts afresh
            del model[next(iter(model))]
    return list(model.items())


@given(_entries, st.lists(st.integers(0, 5000), max_size=10), st.integers(1, 8))
def test_fuzz_keylog_chunks(entries: list[tuple[str, bytes, bytes]], cuts: list[int],
                            limit: int) -> None:
    """A key log read whole, cut anywhere, or a byte at a time gives the same entries (the
    newest ``limit`` client randoms, most recently written last)."""
    text = _log_text(entries)
    want = _expected(entries, limit)
    whole, cut, byte = KeyLog(limit), KeyLog(limit), KeyLog(limit)
    whole.feed(text)
    points = sorted(c % (len(text) + 1) for c in cuts)
    for a, b in zip([0, *points], [*points, len(text)], strict=True):
        cut.feed(text[a:b])
    for i in range(len(text)):
        byte.feed(text[i : i + 1])
    for log in (whole, cut, byte):
        assert list(log.entries.items()) == want
    if want:
        random, entry = want[-1]
        assert whole.take(random) == entry and whole.take(random) == {}


@given(st.lists(st.binary(max_size=300), max_size=10), st.integers(1, 4))
def test_fuzz_keylog_any_bytes(chunks: list[bytes], limit: int) -> None:
    log = KeyLog(limit)
    for chunk in chunks:
        log.feed(chunk)
        assert len(log.entries) <= limit


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner,
                                                                 max_size=4),
    max_leaves=12)
_hexish = st.one_of(st.text(alphabet="0123456789abcdefABCDEF \t", max_size=100),
                    st.binary(max_size=48).map(bytes.hex), _json)
_keys_like = st.fixed_dictionaries(
    {}, optional={"s": st.one_of(st.sampled_from(sorted(SUITES)), _json), "r": _hexish,
                  "w": _hexish})


@given(st.one_of(_json, _keys_like))
def test_fuzz_keys_from_record(obj: object) -> None:
    try:
        keys = SessionKeys.from_record_untrusted(obj)
    except DtlsError:
        return
    assert SessionKeys.from_record_untrusted(keys.to_record()) == keys
    ours(keys).seal(b"usable")


# --- regressions ---------------------------------------------------------------------------


def test_alert_takes_the_pending_key_update_answer() -> None:
    """Bug: ``alert()`` sent the waiting KeyUpdate answer ahead of the alert but left it
    queued, so a shell that answered a peer's close_notify with ``alert(0)`` and then
    flushed ``pending()`` (its usual end of a read) sent the answer a second time, under
    a write key already moved on and after the close_notify. Scenario: the client sends
    KeyUpdate(update_requested), then we close."""
    keys = FIXED["TLS_AES_128_GCM_SHA256"]
    peer, layer = mirror(keys), ours(keys)
    assert open_all(layer, key_update(peer, requested=True)) == b""
    sent = layer.alert(AlertDescription.close_notify)
    assert layer.pending() == b"" and layer.seal(b"") == b""
    assert open_all(peer, sent) == b""  # the answer, then the close_notify
    assert peer.rgen == 1 and peer.closed


@pytest.mark.parametrize("suite", sorted(FIXED))
@pytest.mark.parametrize("state", [(0, -1, 0, 0), (0, 0, 0, -1), (-1, 0, 0, 0), (0, 0, -1, 0),
                                   (0, 1 << 64, 0, 0), (0, 0, 0, 1 << 64)])
def test_a_state_out_of_range_is_refused_when_built(suite: str,
                                                    state: tuple[int, int, int, int]) -> None:
    """Bug: a negative sequence number (a damaged hand-over record) built a layer whose
    ``open()`` raised OverflowError, not the DtlsError it promises, and whose ``seal()``
    did too. Now the constructor refuses the state, as it refused a generation past 64."""
    with pytest.raises(DtlsError):
        RecordLayer(FIXED[suite], *state)


@given(st.sampled_from(sorted(FIXED)), st.tuples(*[st.integers(-3, 1 << 66)] * 4),
       st.binary(max_size=64))
def test_fuzz_any_state_raises_only_dtls_error(suite: str, state: tuple[int, int, int, int],
                                               body: bytes) -> None:
    try:
        layer = RecordLayer(FIXED[suite], *state)
    except DtlsError:
        return
    for record in (b"\x17\x03\x03" + len(body).to_bytes(2, "big") + body,
                   mirror(FIXED[suite]).seal(b"x")):
        try:
            layer.open(record)
        except DtlsError:
            pass
    try:
        layer.seal(b"x")
    except DtlsError:
        pass
