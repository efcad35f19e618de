"""``appliance up`` with fake child programs (tests/supervisor/fake_child.py): children start
and are restarted with backoff, a dead transceiver's sessions end, SIGINT/SIGTERM stop
everything within 5 s with no orphans, the routing secret is private."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from appliance.config import resolve
from appliance.supervisor import (
    DEFAULTS,
    ChildSpec,
    StartupError,
    Supervisor,
    UpConfig,
    add_arguments,
    build_up_config,
    check_media_port,
    default_state_dir,
    ensure_secret,
    exception_leaves,
    main,
    up,
)

FAKE = Path(__file__).with_name("fake_child.py")
OFFER = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"


def parse(argv: list[str], config: dict[str, Any] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv)
    resolve(args, config or {}, "up", DEFAULTS)
    return args


def make_cfg(tmp_path: Path, *extra: str) -> UpConfig:
    args = parse([
        "--state-dir", str(tmp_path / "state"), "--http", "127.0.0.1:0", "--udp", "127.0.0.1:0",
        "--child-command", f"{sys.executable} {FAKE}", "--webui-dir", str(tmp_path / "webui"),
        *extra,
    ])
    cfg = build_up_config(args)
    cfg.backoff_initial = 0.05
    return cfg


def records(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that is not us counts as dead)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return text.rpartition(")")[2].split()[0] != "Z"


async def http(base: str, method: str, path: str, body: str = "", ctype: str = "application/sdp") -> tuple[int, dict[str, str], bytes]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            data = body.encode()
            await stream.send_all(
                f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data
            )
            raw = b""
            while b"\r\n\r\n" not in raw:
                raw += await stream.receive_some(65536)
            head, _, payload = raw.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
            while len(payload) < int(headers.get("content-length", "0")):
                payload += await stream.receive_some(65536)
    return int(lines[0].split()[1]), headers, payload


@pytest.fixture
def pids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "pids"
    d.mkdir()
    monkeypatch.setenv("FAKE_CHILD_DIR", str(d))
    monkeypatch.delenv("FAKE_CHILD_MODE", raising=False)
    return d


async def test_up_starts_every_child_and_prints_the_urls(
    nursery: trio.Nursery, tmp_path: Path, pids: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = make_cfg(tmp_path)
    base, sup, _ = await nursery.start(up, cfg)
    out = capsys.readouterr().out
    assert f"appliance ready: web UI {base}/  demo {base}/demo  API {base}/v1/sessions" in out
    recs = {(r["role"], r["id"]): r for r in records(pids)}
    assert sorted(recs) == [("relay", "0"), ("transceiver", "0"), ("transceiver", "1")]
    # The relay routes to exactly the transceivers' internal addresses.
    t_listen = {k: recs[("transceiver", k)]["argv"][recs[("transceiver", k)]["argv"].index("--listen") + 1]
                for k in ("0", "1")}
    relay_argv = recs[("relay", "0")]["argv"]
    routes = [relay_argv[i + 1] for i, a in enumerate(relay_argv) if a == "--transceiver"]
    assert routes == [f"0={t_listen['0']}", f"1={t_listen['1']}"]
    assert relay_argv[relay_argv.index("--listen") + 1] == f"127.0.0.1:{cfg.udp[1]}"
    assert relay_argv[relay_argv.index("--workers") + 1] == "1"
    secret = tmp_path / "state" / "routing.secret"
    assert relay_argv[relay_argv.index("--secret-file") + 1] == str(secret)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert "--agent" in recs[("transceiver", "0")]["argv"]
    status, _, body = await http(base, "GET", "/readyz")
    assert status == 200, body
    ready = json.loads(body)
    # The headroom admission decides on (issue 32) rides along, one entry per transceiver.
    headroom = ready.pop("headroom")
    assert ready == {"ready": True, "transceivers": ["0", "1"], "relays": ["0"]}
    assert sorted(headroom) == ["0", "1"]
    assert all(0.0 <= h["busy"] <= 1.0 and h["available"] > 0 for h in headroom.values())
    assert all(s.state == "ready" for s in sup.status.values())


async def test_killed_transceiver_is_restarted_and_only_its_sessions_end(
    nursery: trio.Nursery, tmp_path: Path, pids: Path
) -> None:
    cfg = make_cfg(tmp_path)
    base, sup, state = await nursery.start(up, cfg)
    sids = []
    for _ in range(2):
        status, headers, _ = await http(base, "POST", "/v1/sessions", OFFER)
        assert status == 201
        sids.append(headers["location"].rsplit("/", 1)[1])
    owner = {sid: state.sessions[sid].transceiver for sid in sids}
    assert sorted(owner.values()) == [0, 1]
    victim = next(sid for sid in sids if owner[sid] == 0)
    survivor = next(sid for sid in sids if owner[sid] == 1)
    st = sup.status["transceiver 0"]
    old_pid = st.pid
    assert old_pid is not None
    os.kill(old_pid, signal.SIGKILL)
    with trio.fail_after(10):
        await sup.wait_until(lambda: st.restarts == 1 and st.state == "ready")
    assert st.pid != old_pid
    assert st.last_exit == -signal.SIGKILL
    assert st.delays == [cfg.backoff_initial]
    _, _, body = await http(base, "GET", f"/v1/sessions/{victim}")
    detail = json.loads(body)
    assert (detail["state"], detail["end_reason"]) == ("ended", "transceiver lost")
    _, _, body = await http(base, "GET", f"/v1/sessions/{survivor}")
    assert json.loads(body)["state"] == "connected"
    # The restarted transceiver takes new sessions (it is now the least loaded).
    status, headers, _ = await http(base, "POST", "/v1/sessions", OFFER)
    assert status == 201
    assert state.sessions[headers["location"].rsplit("/", 1)[1]].transceiver == 0
    _, _, health = await http(base, "GET", "/metrics")
    assert b'appliance_process_restarts_total{role="transceiver",id="0"} 1' in health


async def test_backoff_doubles_up_to_the_cap(
    nursery: trio.Nursery, tmp_path: Path, pids: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CHILD_MODE", "exit-after-ready")
    control = str(tmp_path / "t.sock")
    spec = ChildSpec("transceiver", "0", [sys.executable, str(FAKE), "transceiver", "--id", "0",
                                          "--listen", "127.0.0.1:9", "--control", control], control)
    sup = Supervisor([spec], backoff_initial=0.01, backoff_max=0.04)
    nursery.start_soon(sup.supervise, spec)
    st = sup.status[spec.name]
    with trio.fail_after(20):
        await sup.wait_until(lambda: st.restarts >= 4)
    assert st.delays[:4] == [0.01, 0.02, 0.04, 0.04]
    assert st.last_exit == 4


async def test_a_child_that_cannot_start_aborts_up(
    tmp_path: Path, pids: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CHILD_MODE", "never-ready:relay")
    cfg = make_cfg(tmp_path)
    with pytest.raises(BaseExceptionGroup) as info:  # noqa: PT012
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                await nursery.start(up, cfg)
    matched, rest = info.value.split(StartupError)
    assert matched is not None and rest is None
    leaves = [str(e) for e in exception_leaves(matched)]
    assert len(leaves) == 1
    assert leaves[0].startswith("relay 0 exited with status 3 before it was ready, 3 times")
    # The transceivers that did start were stopped and reaped.
    assert not any(alive(r["pid"]) for r in records(pids))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_signal_stops_everything_within_5s_without_orphans(
    tmp_path: Path, pids: Path, monkeypatch: pytest.MonkeyPatch, signum: int
) -> None:
    # A relay that ignores SIGTERM (so the kill after the grace period is exercised) and
    # children with grandchildren in their process group.
    monkeypatch.setenv("FAKE_CHILD_MODE", "ignore-term:relay,grandchild")
    argv = [sys.executable, "-m", "appliance.supervisor", "--state-dir", str(tmp_path / "state"),
            "--http", "127.0.0.1:0", "--udp", "127.0.0.1:0",
            "--child-command", f"{sys.executable} {FAKE}"]
    proc = await trio.lowlevel.open_process(argv, stdout=-1, stderr=-1)
    assert proc.stdout is not None and proc.stderr is not None
    out = b""
    try:
        with trio.fail_after(30):
            while b"appliance ready:" not in out:
                chunk = await proc.stdout.receive_some(65536)
                assert chunk, (out, await proc.stderr.receive_some(65536))
                out += chunk
        recs = records(pids)
        assert len(recs) == 3
        all_pids = [r["pid"] for r in recs] + [r["grandchild"] for r in recs]
        assert all(alive(p) for p in all_pids)
        proc.send_signal(signum)
        with trio.fail_after(5):
            rc = await proc.wait()
        assert rc == 0
        assert [p for p in all_pids if alive(p)] == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.stdout.aclose()
        await proc.stderr.aclose()


def test_secret_is_created_private_and_reused(tmp_path: Path) -> None:
    d = tmp_path / "state"
    path = ensure_secret(d)
    assert path == d.resolve() / "routing.secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    first = path.read_bytes()
    assert ensure_secret(d).read_bytes() == first
    os.chmod(path, 0o644)
    ensure_secret(d)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() == first


def test_flags_override_the_config_file_which_overrides_defaults(tmp_path: Path) -> None:
    toml = {"up": {"transceivers": 3, "relay_workers": 2, "agent": "ws://agent:9000/",
                   "http": "127.0.0.1:9090", "public_address": ["192.0.2.7"]}}
    base = ["--state-dir", str(tmp_path / "s")]
    cfg = build_up_config(parse(base, toml))
    assert (cfg.transceivers, cfg.relay_workers, cfg.agent) == (3, 2, "ws://agent:9000/")
    assert cfg.http == ("127.0.0.1", 9090)
    assert cfg.udp == ("0.0.0.0", 3478)
    assert cfg.public_addresses == ["192.0.2.7"]
    cfg = build_up_config(parse([*base, "--transceivers", "1", "--public-address", "2001:db8::1"], toml))
    assert cfg.transceivers == 1
    assert cfg.public_addresses == ["2001:db8::1"]
    # A specific UDP bind address is what gets advertised by default.
    cfg = build_up_config(parse([*base, "--udp", "192.0.2.44:3478"]))
    assert cfg.public_addresses == ["192.0.2.44"]


def test_default_state_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "/var/tmp/xdg")
    assert default_state_dir() == Path("/var/tmp/xdg/appliance")
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_state_dir() == Path(".appliance-state")


@pytest.mark.parametrize("bad", [["--transceivers", "0"], ["--http", "nope"],
                                 ["--public-address", "example.com"], ["--tls-cert", "/nonexistent"]])
def test_bad_flags_exit_2(tmp_path: Path, bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--state-dir", str(tmp_path / "s"), *bad]) == 2
    assert capsys.readouterr().err.startswith("appliance up: ")


async def test_http_port_in_use_aborts_up_and_stops_the_children(tmp_path: Path, pids: Path) -> None:
    with trio.socket.socket() as busy:
        await busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        cfg = make_cfg(tmp_path, "--http", f"127.0.0.1:{port}")
        with pytest.raises(BaseExceptionGroup) as info:  # noqa: PT012
            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    await nursery.start(up, cfg)
    assert all(isinstance(e, OSError) for e in exception_leaves(info.value))
    recs = records(pids)
    assert len(recs) == 3
    assert not any(alive(r["pid"]) for r in recs)


async def test_signaling_runs_alone(tmp_path: Path) -> None:
    """``appliance signaling`` (its run()) serves, prints where, and stops on SIGINT."""
    code = ("import argparse, sys; from appliance.signaling.cli import add_arguments, run; "
            "p = argparse.ArgumentParser(); add_arguments(p); sys.exit(run(p.parse_args(sys.argv[1:])))")
    argv = [sys.executable, "-c", code, "--http", "127.0.0.1:0", "--public-address", "192.0.2.1",
            "--transceiver-control", f"0={tmp_path}/none.sock", "--webui-dir", str(tmp_path)]
    proc = await trio.lowlevel.open_process(argv, stdout=-1)
    assert proc.stdout is not None
    try:
        out = b""
        with trio.fail_after(20):
            while b"\n" not in out:
                chunk = await proc.stdout.receive_some(4096)
                assert chunk, out
                out += chunk
        line = out.decode().splitlines()[0]
        assert line.startswith("signaling listening on http://127.0.0.1:")
        base = line.split()[3]
        status, _, body = await http(base, "GET", "/readyz")
        assert status == 503  # its transceiver does not exist: not ready, but serving
        status, _, _ = await http(base, "GET", "/healthz")
        assert status == 200
        proc.send_signal(signal.SIGINT)
        with trio.fail_after(5):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.stdout.aclose()


@pytest.mark.parametrize(("agent", "says"), [
    ("nosuch", "unknown agent 'nosuch'"),
    ("no_such_module_xyz:agent", "cannot import 'no_such_module_xyz'"),
    ("examples/tone.py:nope", "has no 'nope'"),
    ("missing/file.py:agent", "no such file"),
    ("{broken}:agent", "failed to load: RuntimeError('broken at import')"),
    ("gopher://host/agent", "no bridge for gopher:// agents"),
])
def test_an_agent_that_cannot_load_fails_up_at_start(tmp_path: Path, agent: str, says: str) -> None:
    """Regression (issue 22): `up --agent nosuch` started every transceiver, each exited on
    the bad spec, and `up` restarted them three times before giving up with a transceiver's
    exit status. Now the spec is loaded once, before any child starts: one line, status 2."""
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('broken at import')\n")
    agent = agent.replace("{broken}", str(broken))
    r = subprocess.run(
        [sys.executable, "-m", "appliance", "up", "--agent", agent, "--state-dir",
         str(tmp_path / "state"), "--http", "127.0.0.1:0", "--udp", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("appliance up: ") and says in lines[0], lines[0]
    assert "transceiver" not in r.stdout + r.stderr  # no child was started


def _bind_where_udp_is_free(sock: socket.socket) -> int:
    """Bind a TCP ``sock`` on a port whose UDP twin is free, below the kernel's ephemeral
    range: there no other test's port 0 lands (stress 37: the TCP port the kernel gave
    this test was another test's UDP port at that moment, and `up` named UDP)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.Random().sample(range(max(1024, low - 8192), low), 256):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return port
    raise AssertionError("no port below the ephemeral range is free for TCP and UDP")


@pytest.mark.parametrize("kind", ["udp", "tcp"])
def test_a_media_port_in_use_fails_up_at_once_naming_it(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`up` checks its --udp port for UDP and (ICE-TCP is on by default, on the same number)
    TCP before it starts a child: exit 2 and one line that says what to do, rather than a
    relay worker's traceback three times over; --no-ice-tcp leaves TCP unchecked."""
    sock_kind = socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, sock_kind) as busy:
        if kind == "tcp":
            port = _bind_where_udp_is_free(busy)
            busy.listen(1)
        else:
            busy.bind(("127.0.0.1", 0))
            port = busy.getsockname()[1]
        argv = ["--state-dir", str(tmp_path / "s"), "--http", "127.0.0.1:0",
                "--udp", f"127.0.0.1:{port}"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"appliance up: --udp 127.0.0.1:{port}: {kind.upper()} port {port} "
                              "is not free"), err
        assert len(err.strip().splitlines()) == 1, err
        if kind == "tcp":
            assert "--no-ice-tcp" in err
            cfg = make_cfg(tmp_path, "--udp", f"127.0.0.1:{port}", "--no-ice-tcp")
            check_media_port(cfg)  # TCP is not ours to need: no error


def test_an_ipv4_listener_does_not_block_an_ipv6_media_port(tmp_path: Path) -> None:
    """The relay binds IPv6 sockets v6-only, so the check does too."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as v4:
        v4.bind(("0.0.0.0", 0))
        v4.listen(1)
        port = v4.getsockname()[1]
        cfg = make_cfg(tmp_path, "--udp", f"[::]:{port}")
        check_media_port(cfg)
