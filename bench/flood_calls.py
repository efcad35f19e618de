"""100 calls under each flood in turn (issue 9, item 4): legitimate loss, memory, drops.

Starts a relay (one worker) and one transceiver (``--agent passthrough``: the transceiver
echoes each caller's RTP after SRTP unprotect/protect, so CPU goes to the floods, not to
Opus) as real processes, sets up ``--calls`` calls (``ClientPeer``, 50 packets/s each, the
relay's public address their only candidate; all in this process), then for each flood
kind: stops the calls' media until every counter holds still, takes a snapshot, restarts
the media, runs ``bench/flood.py`` (its own process, as fast as it can send) for
``--duration`` seconds, stops the media again, waits for the counters to settle and takes
the second snapshot. Per flood it prints:

* legitimate loss, upstream (client ``rtp_sent`` vs. transceiver ``packets_in``) and
  downstream (transceiver ``packets_out`` vs. client ``rtp_received``), over the window;
* relay and transceiver RSS (VmRSS of the process) before and after;
* drops by reason: the relay's counters, the kernel's drops of the public socket
  (``/proc/net/udp``: its BPF filter and buffer overflows), the transceiver's ``drop_*`` and
  DTLS admission counters; flows and budget-table sizes.

Flood kinds: ``stun-random``, ``stun-forged``, ``garbage``, ``dtls-hello`` (ClientHellos from
128 ports that never did ICE), ``dtls-auth`` (ClientHellos from 96 ports that the attacker
ICE-authenticated for 48 sessions of its own), ``oversize``, ``ice-guess`` (the password
storm: one call's real server ufrag, wrong passwords, 512 source addresses).

    flock /tmp/bench.lock .venv/bin/python bench/flood_calls.py --calls 100 --duration 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from reliability.support import Call, Stack, eventually, open_call, opus_frame  # noqa: E402

from appliance.client.peer import ClientPeer  # noqa: E402
from appliance.proto.dtls import Certificate  # noqa: E402

FLOOD = ROOT / "bench" / "flood.py"
KINDS = ("stun-random", "stun-forged", "garbage", "dtls-hello", "dtls-auth", "oversize",
         "ice-guess")


def rss_kib(pid: int) -> int:
    """VmRSS of a process and its children (a relay with workers is a small tree)."""
    total = 0
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            pids += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def kernel_drops(port: int) -> int:
    total = 0
    for name in ("/proc/net/udp", "/proc/net/udp6"):
        for line in Path(name).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                total += int(fields[-1])
    return total


def loadavg() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


async def sessions_by_id(stack: Stack) -> dict[str, dict[str, Any]]:
    listed = (await stack.ctl(0, op="list"))["sessions"]
    return {s["id"]: s for s in listed if "id" in s}


async def quiesce(stack: Stack, calls: list[Call]) -> dict[str, dict[str, Any]]:
    """Stop the media; wait until both directions' counters hold still."""
    for c in calls:
        c.sending = False

    async def key() -> tuple[dict[str, dict[str, Any]], tuple[int, ...]]:
        ss = await sessions_by_id(stack)
        k = tuple(ss[c.sid]["packets_in"] for c in calls) + tuple(c.received for c in calls)
        return ss, k

    ss, last = await key()
    with trio.fail_after(30):
        while True:
            await trio.sleep(0.3)
            ss, k = await key()
            if k == last:
                return ss
            last = k


async def snapshot(stack: Stack, calls: list[Call]) -> dict[str, Any]:
    ss = await quiesce(stack, calls)
    relay = await stack.relay_stats()
    tstats = await stack.ctl(0, op="stats")
    assert stack.relay is not None
    return {
        "sent_up": sum(c.peer.rtp_sent for c in calls),
        "got_up": sum(ss[c.sid]["packets_in"] for c in calls),
        "sent_down": sum(ss[c.sid]["packets_out"] for c in calls),
        "got_down": sum(c.peer.rtp_received for c in calls),
        "relay_rss": rss_kib(stack.relay.popen.pid),
        "t_rss": rss_kib(stack.transceivers[0].popen.pid),
        "relay_drops": dict(relay["counters"]["drops"]),
        "relay_flows": relay["flows"],
        "kernel": kernel_drops(stack.public[1]),
        "t": {k: v for k, v in tstats["counters"].items() if k.startswith(("drop", "dtls"))},
        "admission": tstats.get("dtls_admission"),
        "failed": sum(c.failed is not None for c in calls),
    }


async def attacker_sessions(stack: Stack, n: int) -> list[dict[str, str]]:
    cert = Certificate.generate(time.time())
    out = []
    for i in range(n):
        peer = ClientPeer(cert)
        resp = await stack.ctl(0, op="create", session_id=f"attacker-{i}", offer=peer.offer(),
                               agent=None, candidates=[list(stack.public)])
        assert resp["ok"], resp
        pwd = next(line.split(":", 1)[1].strip() for line in resp["answer"].splitlines()
                   if line.startswith("a=ice-pwd:"))
        out.append({"ufrag": resp["ufrag"], "remote": peer.local_ufrag, "pwd": pwd})
    return out


async def flood(argv: list[str]) -> dict[str, Any]:
    proc = await trio.run_process([sys.executable, str(FLOOD), *argv], capture_stdout=True,
                                  stderr=subprocess.STDOUT)
    out: dict[str, Any] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return out


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack.make(Path(tmp))
        try:
            await stack.start_transceiver(0, "--agent", "passthrough", "--max-sessions", "1000")
            await stack.start_relay()
            payload = opus_frame()
            async with trio.open_nursery() as nursery:
                calls = []
                for i in range(args.calls):
                    calls.append(await open_call(nursery, stack, 0, f"call-{i}", payload))
                    await trio.sleep(1 / args.rate)  # the setup ramp
                await eventually(lambda: all(c.received >= 5 for c in calls), 60,
                                 "media on every call")
                print(f"{len(calls)} calls up; load {' '.join(loadavg())}",
                      file=sys.stderr)
                target = f"{stack.public[0]}:{stack.public[1]}"
                auth_file = Path(tmp) / "auth.json"
                for kind in args.kinds.split(","):
                    argv = ["--target", target, "--duration", str(args.duration)]
                    if kind == "ice-guess":
                        assert calls[0].peer.ice is not None
                        argv += ["--kinds", "ice-guess", "--ufrag", calls[0].peer.ice.remote_ufrag,
                                 "--sockets", "512", "--source-ips", "512"]
                    elif kind == "dtls-auth":
                        if not auth_file.exists():
                            auth_file.write_text(json.dumps(await attacker_sessions(stack, 48)))
                        argv += ["--kinds", "dtls-hello", "--auth", str(auth_file),
                                 "--sockets", "96"]
                    else:
                        argv += ["--kinds", kind, "--sockets", "128", "--source-ips", "128"]
                    before = await snapshot(stack, calls)
                    for c in calls:
                        c.sending = True
                    result = await flood(argv)
                    after = await snapshot(stack, calls)
                    up_sent = after["sent_up"] - before["sent_up"]
                    down_sent = after["sent_down"] - before["sent_down"]
                    row = {
                        "kind": kind,
                        "rate": result["rate"],
                        "sent": sum(result["sent"].values()),
                        "answers": result["answers"],
                        "loss_up": 1 - (after["got_up"] - before["got_up"]) / up_sent,
                        "loss_down": 1 - (after["got_down"] - before["got_down"]) / down_sent,
                        "packets_up": up_sent,
                        "relay_rss_kib": (before["relay_rss"], after["relay_rss"]),
                        "transceiver_rss_kib": (before["t_rss"], after["t_rss"]),
                        "relay_drops": diff(after["relay_drops"], before["relay_drops"]),
                        "kernel_drops": after["kernel"] - before["kernel"],
                        "transceiver": diff(after["t"], before["t"]),
                        "relay_flows": after["relay_flows"],
                        "admission": after["admission"],
                        "calls_failed": after["failed"],
                        "loadavg": loadavg(),
                    }
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    rows.append(row)
                nursery.cancel_scope.cancel()
        finally:
            stack.close()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| flood | rate (datagrams/s) | loss up | loss down | relay RSS MiB before → after "
           "| transceiver RSS MiB before → after | drops by reason (relay; kernel; transceiver) |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        drops = ", ".join(f"{k} {v}" for k, v in sorted(r["relay_drops"].items()))
        tdrops = ", ".join(f"{k} {v}" for k, v in sorted(r["transceiver"].items()))
        rr, tr = r["relay_rss_kib"], r["transceiver_rss_kib"]
        out.append(
            f"| {r['kind']} | {r['rate']:,} | {r['loss_up']:.2%} | {r['loss_down']:.2%} "
            f"| {rr[0] / 1024:.1f} → {rr[1] / 1024:.1f} | {tr[0] / 1024:.1f} → {tr[1] / 1024:.1f} "
            f"| {drops or '-'}; kernel {r['kernel_drops']}; {tdrops or '-'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--rate", type=float, default=20.0, help="new calls per second at set-up")
    p.add_argument("--duration", type=float, default=8.0, help="seconds per flood")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--json", metavar="PATH", help="also write the rows here")
    a = p.parse_args(argv)
    rows = trio.run(run, a)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
