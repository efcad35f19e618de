"""coturn's ``turnutils_uclient`` (Debian ``coturn``), an independent TURN client, against
the relay's TURN over UDP, over TCP (the media port's TCP listener, ``-t``) and over TLS on
that same listener (``-t -S``: TLS 1.3 with signaling's self-signed certificate; uclient
offers no ALPN, so the split's "no ALPN → TURN" rule routes it) (issue 40 items 1, 4 and 6).

A relay worker runs here with ``--turn``, a REST API shared secret and ``--turn-peer
127.0.0.1/32`` (the peers are coturn's echo server ``turnutils_peer`` and, with ``-y``, the
other client's relayed address: loopback only). uclient allocates, binds channels (or uses
Send indications with ``-s``), sends its messages through the relay to the echo peer and
judges the echoes itself: exit status 0 and "Total lost packets 0". It also exercises the
challenge (401 → REALM/NONCE), REST credentials (``-W``: ``expiry:user`` + HMAC-SHA1),
Refresh, CreatePermission, RFC 5766 channel numbers (0x4000-0x7FFF, at random) and
EVEN-PORT (sent at random). The relay's own counters confirm the data went both ways
through relayed sockets.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from functools import partial
from pathlib import Path

import pytest
import trio
from ports import UDP, free_port

from appliance.relay import RelayConfig, RelayHandle, serve_relay
from appliance.relay.tls import TurnTls
from appliance.relay.turn import TurnSettings
from appliance.signaling.tls import ensure_self_signed

UCLIENT = shutil.which("turnutils_uclient")
PEER = shutil.which("turnutils_peer")
pytestmark = pytest.mark.skipif(UCLIENT is None or PEER is None,
                                reason="coturn missing: `make sysdeps` installs it")
SECRET = "uclient-shared-secret"
MESSAGES = 30


def _coturn_version() -> str:
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", "coturn"],
                              capture_output=True, text=True, check=False).stdout or "?"
    except OSError:
        return "?"


async def _echo_peer(nursery: trio.Nursery) -> int:
    """turnutils_peer on a free loopback port, once it echoes (probed, not slept on)."""
    port = free_port(UDP)
    assert PEER is not None
    nursery.start_soon(partial(trio.run_process, [PEER, "-L", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               check=False))
    probe = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    with probe, trio.fail_after(10):
        await probe.bind(("127.0.0.1", 0))
        while True:
            await probe.sendto(b"ping", ("127.0.0.1", port))
            with trio.move_on_after(0.2):  # a probe interval; the deadline is the guard
                try:
                    if await probe.recv(64) == b"ping":
                        return port
                except ConnectionRefusedError:
                    await trio.sleep(0.05)  # not bound yet: ICMP came back at once


@pytest.mark.parametrize("flags", [[], ["-s"], ["-y", "-m", "2"], ["-g", "-m", "3"],
                                   ["-t"], ["-t", "-s"], ["-t", "-S"], ["-t", "-S", "-s"]],
                         ids=["channel-data", "send-indications", "client-to-client",
                              "dont-fragment-3-clients", "tcp-channel-data",
                              "tcp-send-indications", "tls-channel-data",
                              "tls-send-indications"])
async def test_uclient_relays_through_our_turn_with_no_loss(
        nursery: trio.Nursery, flags: list[str], tmp_path: Path) -> None:
    print(f"coturn {_coturn_version()}")
    tls = None
    if "-S" in flags:  # the certificate signaling makes for itself when it has none
        cert, key, _ = ensure_self_signed(tmp_path, ["127.0.0.1"])
        tls = TurnTls(cert=cert, key=key)
    relay: RelayHandle = await nursery.start(serve_relay, RelayConfig(
        secrets=(b"routing-secret-for-the-uclient-test",), listen=(("127.0.0.1", 0),),
        tcp=(("127.0.0.1", 0),), turn=TurnSettings(secrets=(SECRET.encode(),),
                          peers=(ipaddress.ip_network("127.0.0.1/32"),)), turn_tls=tls))
    peer_port = await _echo_peer(nursery)
    assert UCLIENT is not None
    port = relay.tcp[0][1] if "-t" in flags else relay.public[0][1]
    argv = [UCLIENT, *flags, "-p", str(port), "-W", SECRET, "-u", "uclient",
            "-e", "127.0.0.1", "-r", str(peer_port), "-n", str(MESSAGES), "-l", "172", "-c",
            "-X", "127.0.0.1"]
    with trio.fail_after(90):
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True,
                                      check=False)
    out = (done.stdout + done.stderr).decode(errors="replace")
    print(out[-2000:])
    assert done.returncode == 0, out[-2000:]
    assert "Total lost packets 0 (0.000000%)" in out
    counters = relay.stats()["counters"]
    print({k: v for k, v in counters.items() if "turn" in str(k)})
    assert counters["turn_allocations_created"] >= 1
    assert counters["turn_challenges"] >= 1  # the first Allocate of each client
    assert counters["turn_peer_sends"] >= MESSAGES
    assert counters["turn_packets_from_peer"] >= MESSAGES
    assert "turn-integrity" not in counters["drops"]
    if "-t" in flags:
        assert counters["tcp_established"] >= 1
    if "-S" in flags:
        assert counters["tcp_turn_tls"] >= 1
        # uclient probes TLS versions, oldest first: our TLS 1.2 floor refuses those
        # (tcp-tls-handshake); the hello itself is always parsed and routed.
        print(counters["drops"])
        assert not {"tcp-tls-hello", "tcp-tls-alpn", "tcp-tls-write"} & set(counters["drops"])
