"""Transceiver addresses by pattern/DNS name (issue 10 item 1): ``--transceiver-pattern
'transceiver-{id}.transceiver.ns.svc:4000'`` makes a StatefulSet ordinal the transceiver id.

Real resolution is exercised with ``localhost`` (the pattern ``localhost:{id}`` puts the id
in the port, so a fake transceiver bound to 127.0.0.1:P *is* transceiver P); a name whose
address changes (a pod restarted with a new IP) is simulated with a fake resolver table, the
one thing a test cannot ask real DNS to do.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import trio
from relay.conftest import StartRelay
from relay.support import (
    RTP,
    SECRET,
    Client,
    FakeTransceiver,
    check,
    eventually,
    open_client,
    open_transceiver,
    stats_drops,
    ufrag,
)

from appliance.config import load_config, resolve
from appliance.control import control_request
from appliance.proto.proxy import encode_header
from appliance.relay import cli
from appliance.relay import resolver as relay_resolver
from appliance.relay.core import CoreConfig, Flow, RelayCore, Route
from appliance.relay.resolver import pattern_address

Address = tuple[str, int]
PUB = ("198.51.100.1", 3478)


async def call_until_routed(c: Client, t: FakeTransceiver, k: int, within: float = 5.0) -> None:
    """Send ICE checks the way a client retransmits them until ``t`` has one."""
    marker = check(ufrag(transceiver=k))
    with trio.fail_after(within):
        while marker not in t.payloads():
            await c.send(marker)
            with trio.move_on_after(0.05):
                await c.recv()


async def stats(path: Path) -> dict[str, Any]:
    return await control_request(str(path), {"op": "stats"})


@pytest.mark.usefixtures("close_sockets")
async def test_lazy_pattern_resolves_localhost_on_first_use(
    nursery: trio.Nursery, start_relay: StartRelay, tmp_path: Path
) -> None:
    t = await open_transceiver(nursery)
    k = t.address[1]  # pattern "localhost:{id}": transceiver id P lives at 127.0.0.1:P
    relay = await start_relay(transceiver_pattern="localhost:{id}", control=str(tmp_path / "c"))
    c = await open_client(relay.public[0])
    # The first check finds no address: dropped while the name is looked up off the hot path.
    await c.send(check(ufrag(transceiver=k)))
    await eventually(lambda: stats_drops(relay.stats()).get("transceiver-resolving", 0) == 1)
    await call_until_routed(c, t, k)
    assert relay.core.transceivers[k] == ("127.0.0.1", k)
    # Media both ways; the echo proves return traffic from the resolved address is accepted.
    await c.send(RTP)
    while True:
        data, _ = await c.recv()
        if data == RTP:
            break
    assert (await stats(tmp_path / "c"))["transceivers"] == {str(k): f"127.0.0.1:{k}"}


@pytest.mark.usefixtures("close_sockets")
async def test_unresolvable_ids_are_negatively_cached_and_junk_never_resolves(
    nursery: trio.Nursery, start_relay: StartRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    async def fake_resolve(addr: Address, family: int = 0) -> Address:
        asked.append(addr[0])
        raise OSError("Name or service not known")

    monkeypatch.setattr(relay_resolver, "resolve", fake_resolve)
    relay = await start_relay(transceiver_pattern="transceiver-{id}.t.ns.svc:4000")
    c = await open_client(relay.public[0])
    for _ in range(20):
        await c.send(check(ufrag(transceiver=7)))
        await c.send(check("A" * 20))  # a forged ufrag: fails its MAC, no DNS query
    await eventually(lambda: asked == ["transceiver-7.t.ns.svc"])
    await eventually(lambda: sum(stats_drops(relay.stats()).get(r, 0) for r in
                                 ("transceiver-resolving", "unknown-transceiver")) == 20)
    await trio.sleep(0.2)  # "nothing happens" for a period: no second DNS query
    assert asked == ["transceiver-7.t.ns.svc"]  # one query, then the negative cache


@pytest.mark.usefixtures("close_sockets")
async def test_count_resolves_at_start_tolerates_missing_names_and_bounds_ids(
    nursery: trio.Nursery, start_relay: StartRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0, t1 = await open_transceiver(nursery), await open_transceiver(nursery)
    dns: dict[str, Address] = {"transceiver-0.t.ns.svc": t0.address}  # pod 1 not ready yet

    async def fake_resolve(addr: Address, family: int = 0) -> Address:
        if addr[0] not in dns:
            raise OSError("NXDOMAIN")
        return dns[addr[0]]

    monkeypatch.setattr(relay_resolver, "resolve", fake_resolve)
    relay = await start_relay(transceiver_pattern="transceiver-{id}.t.ns.svc:4000",
                              transceiver_count=2, resolve_interval=0.1)
    assert relay.core.transceivers == {0: t0.address}  # resolved before ready, 1 is not fatal
    c0 = await open_client(relay.public[0])
    marker = check(ufrag(transceiver=0))
    await c0.send(marker)
    await eventually(lambda: marker in t0.payloads())  # no resolving delay for 0..N-1
    dns["transceiver-1.t.ns.svc"] = t1.address  # pod 1 becomes ready: the sweep finds it
    await eventually(lambda: relay.core.transceivers.get(1) == t1.address)
    c1 = await open_client(relay.public[0])
    await c1.send(check(ufrag(transceiver=1)))
    await eventually(lambda: len(t1.got) == 1)
    # Ids beyond --transceivers N are unknown, never looked up.
    await c1.send(check(ufrag(transceiver=2)))
    await eventually(lambda: stats_drops(relay.stats()).get("unknown-transceiver", 0) == 1)


@pytest.mark.usefixtures("close_sockets")
async def test_a_pod_with_a_new_ip_keeps_the_call(
    nursery: trio.Nursery, start_relay: StartRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = await open_transceiver(nursery), await open_transceiver(nursery)
    dns: dict[str, Address] = {"transceiver-0.t.ns.svc": old.address}

    async def fake_resolve(addr: Address, family: int = 0) -> Address:
        return dns[addr[0]]

    monkeypatch.setattr(relay_resolver, "resolve", fake_resolve)
    relay = await start_relay(transceiver_pattern="transceiver-{id}.t.ns.svc:4000",
                              transceiver_count=1, resolve_interval=0.1)
    c = await open_client(relay.public[0])
    await call_until_routed(c, old, 0)
    await c.send(RTP + b"1")
    await eventually(lambda: RTP + b"1" in old.payloads())
    while (await c.recv())[0] != RTP + b"1":
        pass

    # The pod is re-created with another IP; its DNS record changes; the flow follows.
    old.echo = False
    dns["transceiver-0.t.ns.svc"] = new.address
    await eventually(lambda: relay.core.transceivers[0] == new.address)
    flow = relay.core.flows[c.address]
    assert flow.dest == new.address
    await c.send(RTP + b"2")
    await eventually(lambda: RTP + b"2" in new.payloads())
    data, src = await c.recv()  # return traffic from the new address reaches the client
    assert data == RTP + b"2" and src == relay.public[0]
    assert RTP + b"2" not in old.payloads()

    # The old address is no longer a source of return traffic: a frame from it is treated
    # like an upstream relay's datagram for a flow it does not own, and dropped.
    before = stats_drops(relay.stats()).get("no-flow", 0)
    await old.sock.sendto(encode_header(c.address, relay.public[0]) + RTP + b"x", relay.internal)
    await eventually(lambda: stats_drops(relay.stats()).get("no-flow", 0) == before + 1)
    with trio.move_on_after(0.2):
        data, _ = await c.recv()
        raise AssertionError(f"the old pod's datagram reached the client: {data!r}")


# -- the core, without sockets --------------------------------------------------------------


def test_core_set_transceiver_moves_only_that_transceivers_flows() -> None:
    r = RelayCore(CoreConfig(secrets=(SECRET,), transceivers={0: ("10.0.0.1", 4000),
                                                             1: ("10.0.0.2", 4000)}))
    f0 = r.handle_datagram(0.0, ("203.0.113.1", 1), check(ufrag(transceiver=0)), PUB)
    f1 = r.handle_datagram(0.0, ("203.0.113.2", 1), check(ufrag(transceiver=1)), PUB)
    assert isinstance(f0, Flow) and isinstance(f1, Flow)
    assert r.set_transceiver(0, ("10.0.0.9", 4000)) == 1
    assert f0.dest == ("10.0.0.9", 4000) and f1.dest == ("10.0.0.2", 4000)
    assert r.set_transceiver(0, ("10.0.0.9", 4000)) == 0
    assert f0.route == Route("t", 0)


def test_core_resolution_requests_are_capped_and_rest_after_a_miss() -> None:
    r = RelayCore(CoreConfig(secrets=(SECRET,), resolve_transceivers=True,
                             max_pending_resolutions=3, unresolved_ttl=2.0))
    for k in range(10):
        assert r.handle_datagram(0.0, ("203.0.113.1", k), check(ufrag(transceiver=k)), PUB) is None
    assert r.resolutions_pending
    assert r.poll_resolutions(0.0) == [0, 1, 2]
    assert not r.resolutions_pending
    r.handle_datagram(1.0, ("203.0.113.1", 50), check(ufrag(transceiver=1)), PUB)
    assert r.poll_resolutions(1.0) == []  # 1 missed less than unresolved_ttl ago
    r.handle_datagram(2.5, ("203.0.113.1", 51), check(ufrag(transceiver=1)), PUB)
    assert r.poll_resolutions(2.5) == [1]
    r.set_transceiver(1, ("10.0.0.1", 4000))
    flow = r.handle_datagram(2.6, ("203.0.113.1", 52), check(ufrag(transceiver=1)), PUB)
    assert isinstance(flow, Flow) and flow.dest == ("10.0.0.1", 4000)
    # Without a pattern nothing is ever asked for.
    plain = RelayCore(CoreConfig(secrets=(SECRET,)))
    plain.handle_datagram(0.0, ("203.0.113.1", 1), check(ufrag(transceiver=4)), PUB)
    assert not plain.resolutions_pending
    assert plain.counters.drops == {"unknown-transceiver": 1}


def test_redis_recovered_flow_waits_for_its_transceiver_to_resolve() -> None:
    """A restarted relay finds the flow in Redis before it has resolved the transceiver:
    the flow is parked, and installed the moment the name resolves (no second look-up)."""
    r = RelayCore(CoreConfig(secrets=(SECRET,), resolve_transceivers=True, redis=True))
    c1, c2, up = ("203.0.113.1", 1), ("203.0.113.2", 2), ("10.9.0.1", 3479)
    assert r.handle_lookup(0.0, c1, PUB, None, "t3") is None
    assert r.handle_lookup(0.0, c2, PUB, up, "t3") is None
    assert r.poll_resolutions(0.0) == [3]
    r.set_transceiver(3, ("10.0.0.3", 4000), 0.1)
    assert r.flows[c1].dest == ("10.0.0.3", 4000) and r.flows[c1].upstream is None
    assert r.flows[c2].upstream == up
    assert r.counters.flows_recovered == 2
    # Written back at once: a full TTL from now, so the next restart still finds them.
    assert sorted(r.poll_writes(0.2)) == [(c1, "t3"), (c2, "t3")]
    # A transceiver that never resolves: its parked flows are forgotten after the retry time.
    assert r.handle_lookup(1.0, ("203.0.113.3", 3), PUB, None, "t4") is None
    assert r.poll_resolutions(1.0) == [4]
    r.sweep(1.5)
    assert r._parked_count == 1
    r.sweep(3.5)
    assert r._parked_count == 0 and not r._parked


# -- flags and config file ------------------------------------------------------------------


def _args(argv: list[str], config: dict[str, Any] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(argv)
    resolve(args, config or {}, "relay", cli.DEFAULTS)
    return args


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "routing.secret"
    path.write_bytes(SECRET + b"\n")
    return path


def test_pattern_flags_and_toml(tmp_path: Path, secret_file: Path) -> None:
    config = cli.build_config(_args([
        "--secret-file", str(secret_file),
        "--transceiver-pattern", "transceiver-{id}.transceiver.ns.svc:4000",
        "--transceivers", "3", "--resolve-interval", "2.5",
        "--transceiver", "9=10.0.0.9:4000",
    ]))
    assert config.transceiver_pattern == "transceiver-{id}.transceiver.ns.svc:4000"
    assert config.transceiver_count == 3 and config.resolve_interval == 2.5
    assert config.transceivers == {9: ("10.0.0.9", 4000)}  # explicit ids still allowed
    argv = cli._child_argv(_args(["--secret-file", str(secret_file)]), config, 1,
                           [("0.0.0.0", 3478)], "/tmp/c.sock")
    i = argv.index("--transceiver-pattern")
    assert argv[i + 1] == config.transceiver_pattern
    assert argv[argv.index("--transceivers") + 1] == "3"

    conf = tmp_path / "appliance.toml"
    conf.write_text(f'secret_file = "{secret_file}"\n[relay]\n'
                    'transceiver_pattern = "t-{id}.svc:4000"\ntransceiver_count = 2\n')
    config = cli.build_config(_args(["--config", str(conf)], load_config(conf)))
    assert (config.transceiver_pattern, config.transceiver_count) == ("t-{id}.svc:4000", 2)
    assert config.resolve_interval == 5.0
    assert pattern_address("t-{id}.svc:4000", 12) == ("t-12.svc", 4000)
    assert pattern_address("[fd00::{id}]:4000", 5) == ("fd00::5", 4000)


@pytest.mark.parametrize(("argv", "message"), [
    (["--transceiver-pattern", "transceiver.ns.svc:4000"], "no {id}"),
    (["--transceiver-pattern", "transceiver-{id}.ns.svc"], "expected host:port"),
    (["--transceivers", "2"], "needs --transceiver-pattern"),
    (["--transceiver-pattern", "t-{id}:4000", "--transceivers", "0"], "1..65536"),
    (["--transceiver-pattern", "t-{id}:4000", "--resolve-interval", "0"], "must be > 0"),
])
def test_pattern_usage_errors(secret_file: Path, argv: list[str], message: str) -> None:
    with pytest.raises(cli.UsageError, match=message):
        cli.build_config(_args(["--secret-file", str(secret_file), *argv]))
