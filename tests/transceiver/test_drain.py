"""Drain (issue 10, rolling upgrades without dropping calls): a draining transceiver takes no
new session, keeps its calls, and — with ``--exit-when-drained`` — exits 0 when the last one
ends; ``--drain-on-sigterm`` turns SIGTERM into that drain, bounded by ``--drain-grace``."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from transceiver.support import Client, make_offer, sine

from appliance.control import ControlError, control_request
from appliance.proto.dtls import Certificate
from appliance.transceiver.opus import OpusEncoder
from appliance.transceiver.server import TransceiverAddresses, TransceiverConfig, serve_transceiver

SECRETS = (b"routing-secret-for-tests-0123456",)
CANDIDATES = [["198.51.100.1", 3478]]
RUN = ("import argparse, sys; from appliance.transceiver import cli; p = argparse.ArgumentParser();"
       " cli.add_arguments(p); sys.exit(cli.run(p.parse_args(sys.argv[1:])))")


async def ctl(control: str, **req: Any) -> dict[str, Any]:
    return await control_request(control, req)


CERT = Certificate.generate(time.time())


def offer() -> str:
    return make_offer("Clnt", "clientpasswordclientpass", CERT.fingerprint)


async def create(control: str, sid: str) -> dict[str, Any]:
    return await ctl(control, op="create", session_id=sid, offer=offer(), candidates=CANDIDATES)


# -- in process -----------------------------------------------------------------------------


class Running:
    """serve_transceiver in a nursery, remembering whether it has returned by itself."""

    def __init__(self) -> None:
        self.returned = trio.Event()
        self.addrs: TransceiverAddresses | None = None

    async def run(self, config: TransceiverConfig, *,
                  task_status: trio.TaskStatus[TransceiverAddresses] = trio.TASK_STATUS_IGNORED,
                  ) -> None:
        await serve_transceiver(config, task_status=task_status)
        self.returned.set()


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[Running, TransceiverAddresses]]:
    config = TransceiverConfig(id=3, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp_path / "t3.sock"), exit_when_drained=True)
    r = Running()
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(r.run, config)
        yield r, addrs
        nursery.cancel_scope.cancel()


async def connect(addrs: TransceiverAddresses, sock: socket.socket, sid: str) -> Client:
    assert addrs.control is not None
    client = Client(sock, addrs.udp)
    resp = await ctl(addrs.control, op="create", session_id=sid, offer=client.offer(),
                     candidates=CANDIDATES)
    assert resp["ok"], resp
    client.start(resp["answer"], trio.current_time())
    with trio.fail_after(5):
        while client.srtp is None:
            await client.pump(trio.current_time())
            await trio.sleep(0.005)
    return client


async def talk(client: Client, frames: int, want: int) -> int:
    """Send ``frames`` 20 ms frames, then wait until ``want`` RTP packets have come back
    (a hang guard of 10 s, not a fixed tail a loaded box could overrun); return how many."""
    before = len(client.received_rtp)
    enc = OpusEncoder()
    for pcm in sine(440, frames):
        await client.send_audio(pcm, enc)
        await client.pump(trio.current_time())
        await trio.sleep(0.02)  # real-time pacing of a media source, not test sync
    with trio.move_on_after(10):
        while len(client.received_rtp) - before < want:
            await client.pump(trio.current_time())
            await trio.sleep(0.005)  # a poll interval: the loop checks the count
    return len(client.received_rtp) - before


async def test_drain_keeps_the_call_refuses_new_ones_and_returns_after_the_last(
    running: tuple[Running, TransceiverAddresses],
) -> None:
    r, addrs = running
    assert addrs.control is not None and addrs.transceiver is not None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        call = await connect(addrs, sock, "call")
        assert (await create(addrs.control, "waiting"))["ok"]  # a second, still "new"
        assert await talk(call, 10, 1) > 0

        resp = await ctl(addrs.control, op="drain")
        assert resp == {"ok": True, "sessions": 2, "exit_when_drained": True}
        r2 = await create(addrs.control, "late")
        assert (r2["status"], r2["code"]) == (503, "draining")
        stats = await ctl(addrs.control, op="stats")
        assert stats["draining"] is True
        # The established call carries on while draining.
        assert await talk(call, 25, 15) >= 15
        assert not r.returned.is_set()

        assert (await ctl(addrs.control, op="delete", session_id="waiting"))["ok"]
        # "Nothing happens during a period": with one call left, the drain must not return.
        await trio.sleep(0.1)
        assert not r.returned.is_set()  # one call left
        assert (await ctl(addrs.control, op="delete", session_id="call"))["ok"]
        with trio.fail_after(5):
            await r.returned.wait()
    with pytest.raises(ControlError):
        await ctl(addrs.control, op="stats")  # the control channel went with it


async def test_without_exit_when_drained_a_drained_transceiver_stays_up(tmp_path: Path) -> None:
    config = TransceiverConfig(id=1, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp_path / "t1.sock"))
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)
        assert addrs.control is not None and addrs.transceiver is not None
        assert (await ctl(addrs.control, op="drain"))["ok"]
        await addrs.transceiver.drained.wait()  # idle at once
        await trio.sleep(0.1)  # the period under test: drained, it stays up and refuses
        r = await create(addrs.control, "x")
        assert (r["status"], r["code"]) == (503, "draining")
        nursery.cancel_scope.cancel()


# -- the process ------------------------------------------------------------------------------


class Proc:
    def __init__(self, proc: trio.Process, control: str) -> None:
        self.proc = proc
        self.control = control

    async def wait(self, within: float) -> int:
        with trio.fail_after(within):
            return await self.proc.wait()

    async def alive_after(self, seconds: float) -> bool:
        with trio.move_on_after(seconds):
            await self.proc.wait()
        return self.proc.returncode is None

    async def stderr(self) -> str:
        assert self.proc.stderr is not None
        out = b""
        while chunk := await self.proc.stderr.receive_some(65536):
            out += chunk
        return out.decode(errors="replace")


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Any]:
    secret = tmp_path / "secret"
    secret.write_text("a" * 32 + "\n")
    procs: list[trio.Process] = []

    async def go(*flags: str) -> Proc:
        control = str(tmp_path / f"t{len(procs)}.sock")
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", RUN, "--id", "2", "--listen", "127.0.0.1:0",
             "--control", control, "--secret-file", str(secret), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        procs.append(proc)
        assert proc.stdout is not None
        with trio.fail_after(20):
            line = b""
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                assert chunk, "process exited before it was ready"
                line += chunk
        assert line.startswith(b"transceiver 2 listening on")
        return Proc(proc, control)

    yield go
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                await stream.aclose()


async def test_exit_when_drained_process_exits_0_after_its_last_call(start: Any) -> None:
    p = await start("--exit-when-drained")
    assert (await create(p.control, "a"))["ok"]
    assert (await ctl(p.control, op="drain"))["ok"]
    assert await p.alive_after(0.5)  # a call is still up
    assert (await ctl(p.control, op="delete", session_id="a"))["ok"]
    assert await p.wait(10) == 0


async def test_sigterm_drains_with_drain_on_sigterm(start: Any) -> None:
    p = await start("--drain-on-sigterm", "--drain-grace", "60")
    assert (await create(p.control, "a"))["ok"]
    p.proc.send_signal(signal.SIGTERM)
    assert await p.alive_after(0.5)
    r = await create(p.control, "b")
    assert (r["status"], r["code"]) == (503, "draining")
    listed = await ctl(p.control, op="list")
    assert [s["id"] for s in listed["sessions"] if s["state"] != "ended"] == ["a"]
    assert (await ctl(p.control, op="delete", session_id="a"))["ok"]
    assert await p.wait(10) == 0


async def test_drain_grace_ends_the_remaining_calls(start: Any) -> None:
    p = await start("--drain-on-sigterm", "--drain-grace", "0.5")
    assert (await create(p.control, "a"))["ok"]
    t0 = trio.current_time()
    p.proc.send_signal(signal.SIGTERM)
    assert await p.wait(10) == 0
    assert trio.current_time() - t0 >= 0.4  # a lower bound: load can only lengthen it
    assert "drain grace of 0.5 s is over" in await p.stderr()


async def test_second_sigterm_ends_calls_at_once(start: Any) -> None:
    p = await start("--drain-on-sigterm")
    assert (await create(p.control, "a"))["ok"]
    p.proc.send_signal(signal.SIGTERM)
    assert await p.alive_after(0.3)
    p.proc.send_signal(signal.SIGTERM)
    assert await p.wait(5) == 0


async def test_without_the_flag_sigterm_ends_calls_at_once(start: Any) -> None:
    p = await start()
    assert (await create(p.control, "a"))["ok"]
    p.proc.send_signal(signal.SIGTERM)
    assert await p.wait(5) == 0


def test_flags_and_config_file(tmp_path: Path) -> None:
    import argparse

    from appliance.config import load_config, resolve
    from appliance.transceiver import cli

    conf = tmp_path / "a.toml"
    conf.write_text("[transceiver]\nexit_when_drained = true\ndrain_on_sigterm = true\n"
                    "drain_grace = 120\n")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--config", str(conf), "--drain-grace", "30"])
    resolve(args, load_config(conf), "transceiver", cli.DEFAULTS)
    assert (args.exit_when_drained, args.drain_on_sigterm, args.drain_grace) == (True, True, 30.0)
    args = parser.parse_args([])
    resolve(args, {}, "transceiver", cli.DEFAULTS)
    assert (args.exit_when_drained, args.drain_on_sigterm, args.drain_grace) == (False, False, 3600.0)
