"""The one connection's verb shape (docs/style.md rule 18): ``handle_input`` /
``poll_output`` drive a whole association in either version, and the older spellings are
the same verbs."""

from __future__ import annotations

import pytest
from proto.dtls.dtls_pair import NOW, cert

from appliance.proto.dtls import (
    ApplicationData,
    Connection,
    ConnectionClosed,
    DtlsConnection,
    Event,
    HandshakeComplete,
    Role,
    Transmit,
)
from appliance.proto.dtls.engine12 import Engine12
from appliance.proto.dtls.engine13 import Engine13


def _drain(conn: DtlsConnection) -> tuple[list[bytes], list[Event]]:
    datagrams: list[bytes] = []
    events: list[Event] = []
    while (out := conn.poll_output()) is not None:
        if isinstance(out, Transmit):
            assert not events, "datagrams come out before events"
            datagrams.append(out.data)
        else:
            events.append(out)
    return datagrams, events


@pytest.mark.parametrize("versions", [{"1.2"}, {"1.3"}, {"1.2", "1.3"}])
def test_handle_input_and_poll_output_drive_an_association(versions: set[str]) -> None:
    vs = frozenset(versions)
    client = DtlsConnection(Role.CLIENT, cert("client"), versions=vs,
                            remote_fingerprints=[cert("server").fingerprint])
    server = Connection(Role.SERVER, cert("server"), versions=vs,
                        remote_fingerprints=[cert("client").fingerprint])
    client.start(NOW)
    seen: dict[str, list[Event]] = {"client": [], "server": []}
    for _ in range(8):
        moved = False
        for name, src, dst in (("client", client, server), ("server", server, client)):
            datagrams, events = _drain(src)
            seen[name] += events
            for d in datagrams:
                dst.handle_input(NOW, d)
                moved = True
        if not moved:
            break
    for name, conn in (("client", client), ("server", server)):
        done = [e for e in seen[name] if isinstance(e, HandshakeComplete)]
        assert len(done) == 1 and done[0].version == conn.version
    want = Engine13 if "1.3" in versions else Engine12
    assert isinstance(client.engine, want) and isinstance(server.engine, want)

    client.send_application_data(b"hello")
    [datagram], [] = _drain(client)
    server.handle_input(NOW, datagram)
    assert _drain(server) == ([], [ApplicationData(b"hello")])

    server.close()
    datagrams, events = _drain(server)
    assert len(datagrams) == 1 and isinstance(events[0], ConnectionClosed)
    client.handle_input(NOW, datagrams[0])
    _, events = _drain(client)
    assert isinstance(events[0], ConnectionClosed) and events[0].by_peer


def test_older_spellings_are_the_same_verbs() -> None:
    assert DtlsConnection.handle_datagram is DtlsConnection.handle_input
    assert Connection is DtlsConnection
