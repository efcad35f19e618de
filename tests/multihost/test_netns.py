"""Multi-host: the roles on separate (namespaced) hosts, media crossing
client → global relay (cluster 0) → regional relay (cluster 1) → transceiver.

Hosts and networks (all made by the test, private 10.77.x addresses, nothing on the host's
own interfaces):

    public   10.77.1.0/24  client .10, global relay .1, signaling .5 (HTTP :8080)
    backbone 10.77.2.0/24  global relay .1, regional relay .2
    cluster  10.77.3.0/24  regional relay .2, transceivers .20/.21, redis .30

The client has no route to the backbone or cluster networks, so it *cannot* reach a
transceiver; the test also checks that the answer advertises only the global relay and that
every datagram the client's ICE agent received came from the global relay's address.
The aiortc client does signaling itself: the transceiver's control channel over a Unix socket
on the shared filesystem (path sockets cross network namespaces), as in
tests/e2e/test_aiortc_relay.py. Our loadgen needs the HTTP API, so `appliance signaling` runs
on its own host on the public network with those same Unix sockets as --transceiver-control
and the global relay as --public-address.

Where network namespaces cannot be created (not root, no iproute2, no CAP_NET_ADMIN) the
module fails loudly with the reason — it does not skip."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.procs import write_secret
from multihost.netns import Net, NetnsUnavailable

pytestmark = [pytest.mark.interop, pytest.mark.slow]

CLIENT_SCRIPT = Path(__file__).with_name("client_call.py")
GLOBAL_PUBLIC = "10.77.1.1:3478"
GLOBAL_INTERNAL = "10.77.2.1:3479"
REGIONAL_INTERNAL = "10.77.2.2:3479"  # bound as 0.0.0.0:3479: also reached from 10.77.3.0/24
TRANSCEIVERS = {0: "10.77.3.20:4000", 1: "10.77.3.21:4000"}
TRANSCEIVER_PATTERN = "10.77.3.2{id}:4000"
REDIS = "10.77.3.30:6379"
SIGNALING = "10.77.1.5:8080"
API_TOKEN = "multihost-test-api-token"


def _regional_args(tmp: Path, secret: Path) -> list[str]:
    return ["-m", "appliance", "relay", "--cluster", "1", "--listen", "10.77.2.2:3478",
            "--internal", "0.0.0.0:3479", "--secret-file", str(secret),
            "--control", str(tmp / "regional.sock"), "--redis", f"redis://{REDIS}/0",
            # Transceiver K by pattern, resolved on first use (as in deploy/kubernetes/ with
            # DNS names; here the id completes an address literal).
            "--transceiver-pattern", TRANSCEIVER_PATTERN]


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0:
        pytest.fail("multi-host test needs root (CAP_NET_ADMIN) to create network namespaces; "
                    f"running as uid {os.geteuid()}", pytrace=False)
    if shutil.which("ip") is None:
        pytest.fail("multi-host test needs iproute2 (`ip`) to create network namespaces",
                    pytrace=False)
    tmp = tmp_path_factory.mktemp("multihost")
    os.chmod(tmp, 0o755)
    secret = write_secret(tmp)
    n: Net | None = None
    try:
        try:
            n = Net(f"apmh{os.getpid() % 100000}")
            n.host("client", {"public": "10.77.1.10/24"})
            n.host("global", {"public": "10.77.1.1/24", "backbone": "10.77.2.1/24"})
            n.host("region", {"backbone": "10.77.2.2/24", "cluster": "10.77.3.2/24"})
            for k, addr in TRANSCEIVERS.items():
                n.host(f"tx{k}", {"cluster": addr.split(":")[0] + "/24"})
            n.host("redis", {"cluster": REDIS.split(":")[0] + "/24"})
            n.host("sig", {"public": SIGNALING.split(":")[0] + "/24"})
        except NetnsUnavailable as exc:
            pytest.fail(f"cannot create network namespaces on this machine: {exc}",
                        pytrace=False)
        redis_bin = shutil.which("redis-server")
        if redis_bin is None:
            pytest.fail("multi-host test needs redis-server for the Redis host", pytrace=False)
        n.run("redis", [redis_bin, "--bind", REDIS.split(":")[0], "--port", REDIS.split(":")[1],
                        "--save", "", "--appendonly", "no", "--protected-mode", "no"],
              "Ready to accept connections", python=False)
        for k, addr in TRANSCEIVERS.items():
            n.run(f"tx{k}", ["-m", "appliance", "transceiver", "--id", str(k), "--cluster", "1",
                             "--listen", addr, "--control", str(tmp / f"t{k}.sock"),
                             "--secret-file", str(secret)], f"transceiver {k} listening")
        regional = n.run("region", _regional_args(tmp, secret), "relay listening")
        glob = n.run("global", ["-m", "appliance", "relay", "--cluster", "0",
                                "--listen", GLOBAL_PUBLIC, "--internal", GLOBAL_INTERNAL,
                                "--next-hop", f"1={REGIONAL_INTERNAL}",
                                "--secret-file", str(secret),
                                "--control", str(tmp / "global.sock")], "relay listening")
        sig = n.run("sig", ["-m", "appliance", "signaling", "--http", SIGNALING,
                            "--api-token", API_TOKEN, "--udp-port", GLOBAL_PUBLIC.split(":")[1],
                            "--public-address", GLOBAL_PUBLIC.split(":")[0],
                            *[a for k in TRANSCEIVERS for a in
                              ("--transceiver-control", f"{k}={tmp / f't{k}.sock'}")],
                            "--relay-control", f"global={tmp / 'global.sock'}",
                            "--relay-control", f"regional={tmp / 'regional.sock'}"],
                    "signaling listening on")
        yield {"net": n, "tmp": tmp, "secret": secret, "regional": regional, "global": glob,
               "signaling": sig}
    finally:
        if n is not None:
            errors = n.close()
            assert not errors, errors


def start_client(net: dict[str, Any], k: int, seconds: float) -> Any:
    n: Net = net["net"]
    return n.run("client", [str(CLIENT_SCRIPT), "--control", str(net["tmp"] / f"t{k}.sock"),
                            "--candidate", GLOBAL_PUBLIC, "--seconds", str(seconds)],
                 '"event": "answered"')


def finish_client(proc: Any, timeout: float) -> dict[str, Any]:
    rc = proc.wait(timeout)
    results = [json.loads(line) for line in proc.stdout if '"event": "result"' in line]
    assert rc == 0 and results, f"client failed ({rc}):\n{''.join(proc.stderr)[-3000:]}"
    out: dict[str, Any] = results[-1]
    return out


def control(path: Path, msg: dict[str, Any]) -> dict[str, Any]:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(json.dumps(msg).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk
            buf += chunk
    out: dict[str, Any] = json.loads(buf)
    return out


def assert_tone(second: dict[str, float]) -> None:
    assert second["rms"] > 500, f"echo is silent: {second}"
    assert abs(second["hz"] - 440) < 15, f"wrong echo frequency: {second}"


def assert_only_global_relay(result: dict[str, Any]) -> None:
    cands = result["answer_candidates"]
    host, port = GLOBAL_PUBLIC.split(":")
    assert cands, "answer has no candidates"
    for line in cands:
        assert f" {host} {port} typ host" in line, f"answer advertises more than the global relay: {line}"
        for t in TRANSCEIVERS.values():
            assert t.split(":")[0] not in line
    assert result["sources"] == [GLOBAL_PUBLIC], (
        f"client received datagrams from {result['sources']}, not only the global relay")


@pytest.mark.parametrize("k", [0, 1])
def test_call_crosses_global_and_regional_relay(net: dict[str, Any], k: int) -> None:
    client = start_client(net, k, seconds=3.0)
    result = finish_client(client, 60)
    assert_tone(result["seconds"][-1])
    assert_only_global_relay(result)
    session = control(net["tmp"] / f"t{k}.sock",
                      {"op": "get", "session_id": result["session_id"]})["session"]
    assert session["transceiver"] == k
    assert session["packets_in"] > 50 and session["packets_out"] > 50
    # The transceiver saw the client's real address and the global relay's public address.
    assert session["client_address"].startswith("10.77.1.10:"), session
    assert GLOBAL_PUBLIC in json.dumps(session["relay_flow"]), session
    for relay in ("global", "regional"):
        stats = control(net["tmp"] / f"{relay}.sock", {"op": "stats"})
        assert stats["flows"] >= 1, (relay, stats)


def test_loadgen_calls_cross_both_relays(net: dict[str, Any]) -> None:
    """Our loadgen in the client host, through `appliance signaling` over HTTP: every
    session completes with its echo measured, on both transceivers, and the transceivers saw
    the client's address through the global relay."""
    n: Net = net["net"]
    sessions = 4

    def listed() -> dict[str, tuple[int, dict[str, Any]]]:
        return {s["id"]: (k, s) for k in TRANSCEIVERS
                for s in control(net["tmp"] / f"t{k}.sock", {"op": "list"})["sessions"]}

    before = listed()
    proc = n.run("client", ["-m", "appliance", "loadgen", "--url", f"http://{SIGNALING}",
                            "--token", API_TOKEN, "-n", str(sessions), "--rate", "4",
                            "--duration", "3", "--json", "-"], None)
    rc = proc.wait(120)
    out = "".join(proc.stdout)
    assert rc == 0, f"loadgen failed ({rc}):\n{''.join(proc.stderr)[-3000:]}"
    report = json.loads(out[out.index("{"):])
    summary = report.get("summary", report)
    assert summary["completed"] == sessions and summary["failed"] == 0, summary
    assert summary["rtt_samples"] > 0 and summary["rtt_p50_ms"] is not None, summary
    assert (summary["loss"] or 0.0) < 0.05, summary
    new = {sid: v for sid, v in listed().items() if sid not in before}
    assert len(new) == sessions, new
    for _, s in new.values():
        # The transceiver saw the client's real address, arriving via the global relay.
        assert str(s["client_address"]).startswith("10.77.1.10:"), s
        assert GLOBAL_PUBLIC in json.dumps(s["relay_flow"]), s
        assert s["packets_in"] > 50 and s["packets_out"] > 50, s
    # Signaling placed them least-loaded first: both transceivers took some.
    assert {k for k, _ in new.values()} == set(TRANSCEIVERS), new


def test_regional_relay_restart_keeps_the_call(net: dict[str, Any]) -> None:
    """SIGKILL the regional relay mid-call and start it again with the same Redis: the call's
    media resumes (flows are looked up in Redis) and the tone is still echoed at the end."""
    n: Net = net["net"]
    client = start_client(net, 0, seconds=9.0)
    time.sleep(3.0)  # a real call in progress for a while before the failure
    old = net["regional"]
    old.stop(signal.SIGKILL)
    net["regional"] = n.run("region", _regional_args(net["tmp"], net["secret"]),
                            "relay listening")
    result = finish_client(client, 60)
    seconds = result["seconds"]
    assert len(seconds) >= 8, seconds
    assert_tone(seconds[2])  # before the kill
    for s in seconds[-2:]:  # well after the restart
        assert_tone(s)
    assert_only_global_relay(result)
    stats = control(net["tmp"] / "regional.sock", {"op": "stats"})
    assert stats["flows"] >= 1, stats
    # The restarted relay recovered the flow from Redis (not only from a later consent check).
    assert stats["counters"]["flows_recovered"] >= 1, stats
