"""GPT-Live's official client against one real ``appliance up`` (issue 42 item 8): every
helper of the ``openai`` SDK's ``resources/live/`` that does not need a browser, and the
negative cases of the spec's §5.2 (../shared/research/gpt-live.md), each event checked
against the SDK's own types (tests/live/live_shapes.py through ``Reader``) and parsed by the
SDK; a call from baresip, a real softphone, is accepted, watched and ended through the
same surface. The WebRTC helpers (``client.live.create``, ``client.live.sessions.fork``, the
sideband and content of a WebRTC session) run against ``appliance up`` with aiortc as the
browser in tests/e2e/test_live_aiortc.py; the same helpers against an in-process server,
with more edge cases, in tests/live/ and tests/sip/test_live_sip.py.

``up`` runs with ``--sip`` (SIPp is the caller: it fails on any unexpected or missing SIP
message) and ``--webhook-url`` (a receiver thread here; each webhook is checked by the SDK's
``client.webhooks.unwrap``). No sleeps: every wait is on an event, a process exit or the
SDK's own blocking read; ``TIMEOUT`` only bounds a hang.
"""

from __future__ import annotations

import base64
import http.server
import io
import json
import socket
import subprocess
import threading
import time
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from e2e.procs import Proc, free_tcp_port, free_udp_port
from live.test_sideband import Reader
from ports import BOTH, free_port
from sdk_clients import sdk
from sip.support import (
    BARESIP,
    SCENARIOS,
    SECRET,
    SIPP,
    TIMEOUT,
    Baresip,
    free_media_ports,
    unwrap,
    write_tone_wav,
)

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.interop, pytest.mark.slow,
              pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")]
FRAME = 4800  # 100 ms of 24 kHz PCM16
SESSION: Any = {"model": "gpt-live-1", "instructions": "You answer the phone."}
PHONE: Any = {"type": "live", **SESSION}  # accept's body (a SIP call's session)


class Hooks(http.server.ThreadingHTTPServer):
    """``--webhook-url`` on loopback: every delivery kept (headers, body), answered 204."""

    daemon_threads = True

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.changed = threading.Condition()
        hooks = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(204)
                self.end_headers()
                with hooks.changed:
                    hooks.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    hooks.changed.notify_all()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def wait_for(self, kind: str, after: int, within: float = TIMEOUT) -> Any:
        """The first ``kind`` webhook delivered after the first ``after`` ones, unwrapped
        (its signature checked) by the SDK; None if none came ``within`` seconds."""
        with self.changed:
            def found() -> tuple[dict[str, str], bytes] | None:
                for headers, body in self.got[after:]:
                    if json.loads(body)["type"] == kind:
                        return headers, body
                return None
            if not self.changed.wait_for(lambda: found() is not None, within):
                return None
            headers, body = found()  # type: ignore[misc]
        return unwrap(body, headers)


@dataclass
class Up:
    base: str
    sip: int
    hooks: Hooks
    proc: Proc
    sipps: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def client(self) -> Any:
        return sdk(self.base + "/v1",
                             max_retries=0, timeout=TIMEOUT)

    def sipp(self, scenario: str, cwd: Path) -> subprocess.Popen[bytes]:
        """SIPp placing one call of ``scenario`` to ``up``'s SIP port."""
        assert SIPP is not None
        run = subprocess.Popen(
            [SIPP, f"127.0.0.1:{self.sip}", "-sf", str(SCENARIOS / scenario), "-t", "u1",
             "-i", "127.0.0.1", "-p", str(free_port(socket.SOCK_DGRAM)),
             "-mp", str(free_media_ports()), "-m", "1", "-nostdin",
             "-timeout", str(int(TIMEOUT)), "-timeout_error", "-max_recv_loops", "100"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd)
        self.sipps.append(run)
        return run


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("live-sweep")
    hooks = Hooks()
    server = threading.Thread(target=hooks.serve_forever, daemon=True)
    server.start()
    http, udp, sip = free_tcp_port(), free_udp_port(), free_port(BOTH)
    proc = Proc(["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
                 "--public-address", "127.0.0.1", "--state-dir", str(tmp / "state"),
                 "--transceivers", "1", "--sip", f"127.0.0.1:{sip}",
                 "--webhook-url",
                 f"http://127.0.0.1:{hooks.server_address[1]}/hook,secret-env=SWEEP_SECRET"],
                "appliance ready", timeout=120,
                env={"SWEEP_SECRET": SECRET, "APPLIANCE_LLM_KEY": "", "APPLIANCE_LLM_URL": "",
                     "OPENAI_API_KEY": ""})
    it = Up(f"http://127.0.0.1:{http}", sip, hooks, proc)
    try:
        yield it
    finally:
        for run in it.sipps:
            if run.poll() is None:
                run.kill()
            run.wait()
        rc = proc.stop()
        hooks.shutdown()
        server.join()
        hooks.server_close()
    assert rc == 0, "".join(proc.stderr)[-3000:]


def tone24(seconds: float) -> bytes:
    import numpy as np

    t = np.arange(int(24_000 * seconds)) / 24_000
    return (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()


def error_of(reader: Reader, event_id: str) -> dict[str, Any]:
    return reader.until("error", client_event_id=event_id)["error"]


def test_the_websocket_helpers_and_the_negative_cases(up: Up) -> None:
    """``client.live.connect`` (``session.start`` … ``session.close``), the sideband of
    that session, its recording, a WebSocket fork of it, and §5.2's refusals — each an
    ``error`` naming what was wrong, on a socket that stays open."""
    c = up.client()
    with c.live.connect(extra_headers={"X-Agent": "realtime"}) as conn:
        ws = Reader(conn, sideband=False)
        conn.send({"type": "session.start", "event_id": "bad",
                   "session": {**SESSION, "colour": "blue"}})
        bad = error_of(ws, "bad")
        assert bad["param"] == "session.colour", bad
        conn.session.start(session={**SESSION, "store": True,
                                    "delegation": {"type": "client"}}, event_id="s1")
        started = ws.until("session.started")
        assert started["client_event_id"] == "s1"
        sid = started["session"]["id"]
        assert sid.startswith("live_") and started["session"]["status"] == "active"
        conn.session.start(session=SESSION, event_id="again")
        assert error_of(ws, "again")["code"] == "session_already_started"
        conn.send({"type": "session.update", "event_id": "u1",
                   "session": {"instructions": "other"}})
        assert error_of(ws, "u1")["code"] == "immutable_field_update"
        conn.response.create(event_id="r1")  # under client delegation
        assert "Responses delegation" in error_of(ws, "r1")["message"]
        conn.send({"type": "decision.create", "event_id": "d1"})
        assert error_of(ws, "d1")["param"]
        conn.send({"type": "session.input_audio.commit", "event_id": "c1"})
        assert error_of(ws, "c1")["code"]
        with c.live.sideband.connect(session_id=sid, graceful_close=True) as sb:
            side = Reader(sb, sideband=True)
            assert side.until("session.started")["session"]["id"] == sid  # the replay
            sb.session.instructions.append(content="Be brief.", delegation_id=None,
                                           event_id="i1")
            side.until("session.instructions.appended", client_event_id="i1")
            ws.until("session.instructions.appended", client_event_id="i1")
        pcm = bytes(4800) + tone24(1.0) + bytes(24_000)
        for i in range(0, len(pcm), FRAME):
            conn.session.input_audio.append(audio=base64.b64encode(pcm[i : i + FRAME]).decode())
        conn.session.input_audio.mute(event_id="m")
        ws.until("session.input_audio.muted", client_event_id="m")
        conn.session.input_audio.unmute(event_id="u")
        ws.until("session.input_audio.unmuted", client_event_id="u")
        conn.session.close(event_id="bye")
        closed = ws.until("session.closed")
        assert closed["reason"] == "close_requested" and closed["client_event_id"] == "bye"
        assert closed["usage"]["seconds"] >= 1.0  # the audio above was the session's
        assert list(conn) == []  # then the socket ends (close code 1000)
    wav = c.live.sessions.download_recording(sid).content
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getnchannels(), w.getframerate()) == (2, 24_000)
        assert w.getnframes() >= 24_000  # the caller's second of tone, at least
    with c.live.forks.connect(session_id=sid) as fork:
        fk = Reader(fork, sideband=False)
        fork.session.start(session={"store": False}, event_id="f1")
        forked = fk.until("session.started")
        assert forked["session"]["id"] != sid and forked["session"]["id"].startswith("live_")
        assert forked["session"]["instructions"] == SESSION["instructions"]
        fork.session.close()
        fk.until("session.closed")
    for call in (lambda: c.live.sessions.download_recording("live_nothingHere"),
                 lambda: c.live.sideband.connect(session_id="live_nothingHere").__enter__(),
                 lambda: c.live.forks.connect(session_id="live_nothingHere").__enter__()):
        with pytest.raises(Exception, match="404"):  # noqa: PT011 (HTTP's or the WebSocket's)
            call()


def sipp_result(run: subprocess.Popen[bytes]) -> tuple[int, str]:
    out, _ = run.communicate(timeout=TIMEOUT)
    return run.returncode, out.decode(errors="replace")[-3000:]


def incoming(up: Up, before: int, run: subprocess.Popen[bytes]) -> Any:
    """The call's ``live.transport.incoming`` (beside ``realtime.call.incoming``)."""
    ev = up.hooks.wait_for("live.transport.incoming", before)
    assert ev is not None, f"no webhook; SIPp: {sipp_result(run)}"
    return ev


def test_the_sip_helpers(up: Up, tmp_path: Path) -> None:
    """``client.live.sessions.accept / reject / refer / hangup`` on phone calls that SIPp
    places, and the sideband of an accepted one (replay, ``transport.dtmf.send``)."""
    c = up.client()
    sessions = c.live.sessions
    # accept, watch, press a key, hang up: SIPp's scenario fails unless our BYE arrives
    before = len(up.hooks.got)
    run = up.sipp("accept_callee_bye.xml", tmp_path)
    sid = incoming(up, before, run).data.session_id
    assert sid.startswith("live_sip_")
    sessions.accept(sid, session=PHONE, extra_headers={"X-Agent": "realtime"})
    with c.live.sideband.connect(session_id=sid) as sb:
        side = Reader(sb, sideband=True)
        assert side.until("session.started")["session"]["id"] == sid
        sb.transport.dtmf.send(event="5", event_id="k1")
        side.until("transport.dtmf.sent", client_event_id="k1")
        sessions.hangup(sid)
        side.until("session.closed")
    code, out = sipp_result(run)
    assert code == 0, out
    # reject with a status: SIPp's scenario fails unless the 486 arrives
    before = len(up.hooks.got)
    run = up.sipp("reject_486.xml", tmp_path)
    sessions.reject(incoming(up, before, run).data.session_id, status_code=486)
    code, out = sipp_result(run)
    assert code == 0, out
    # accept, then transfer: REFER, 202, NOTIFY, our BYE
    before = len(up.hooks.got)
    run = up.sipp("refer.xml", tmp_path)
    sid = incoming(up, before, run).data.session_id
    call_id = up.hooks.wait_for("realtime.call.incoming", before).data.call_id  # type: ignore[union-attr]
    sessions.accept(sid, session=PHONE, extra_headers={"X-Agent": "realtime"})
    deadline = time.monotonic() + TIMEOUT
    while c.get(f"/realtime/calls/{call_id}", cast_to=object)["status"] != "active":
        assert time.monotonic() < deadline, "the accepted call never became active"
        time.sleep(0.05)  # polling an HTTP view: REFER needs the ACKed dialog
    sessions.refer(sid, target_uri="sip:desk@example.com")
    code, out = sipp_result(run)
    assert code == 0, out
    with pytest.raises(openai.APIStatusError) as err:
        sessions.accept("live_sip_nothingHere", session=PHONE)
    assert err.value.status_code == 404


@pytest.mark.skipif(BARESIP is None, reason="baresip missing: `make sysdeps`")
async def test_a_softphone_call_accepted_watched_and_ended_by_the_sideband(
        up: Up, tmp_path: Path, nursery: trio.Nursery) -> None:
    """baresip, a real softphone, calls ``up``: the Live webhook, ``live.sessions.accept``,
    a sideband that hears the caller (its reflected input audio) and the key it presses
    (``transport.dtmf.received``, RFC 4733), then ``session.close`` on the sideband ends
    the call for everyone (``session.closed``; signaling's ``realtime.call.ended``)."""
    tone = tmp_path / "tone.wav"
    write_tone_wav(tone, freq=700.0, seconds=30.0)
    phone = Baresip(tmp_path / "baresip", tone)
    c = up.client()
    before = len(up.hooks.got)
    try:
        await phone.start(nursery)
        with trio.fail_after(TIMEOUT):
            ev = None
            while ev is None:  # the cons socket may not be up yet: redial is harmless
                await phone.keys(f"/dial sip:agent@127.0.0.1:{up.sip}\n")
                ev = await trio.to_thread.run_sync(
                    up.hooks.wait_for, "live.transport.incoming", before, 2.0)
            sid = ev.data.session_id
            await trio.to_thread.run_sync(lambda: c.live.sessions.accept(
                sid, session=PHONE, extra_headers={"X-Agent": "realtime"}))
            manager = c.live.sideband.connect(session_id=sid, graceful_close=True)
            sb = await trio.to_thread.run_sync(manager.__enter__)
            try:
                side = Reader(sb, sideband=True)
                await trio.to_thread.run_sync(side.until, "session.started")
                await trio.to_thread.run_sync(side.until, "session.input_audio.append")
                # a key's RFC 4733 end goes out when the next key is pressed: "5" is heard
                await phone.keys("56")
                dtmf = await trio.to_thread.run_sync(side.until, "transport.dtmf.received")
                await trio.to_thread.run_sync(lambda: sb.session.close(event_id="bye"))
                closed = await trio.to_thread.run_sync(side.until, "session.closed")
            finally:
                await trio.to_thread.run_sync(manager.__exit__, None, None, None)
            ended = await trio.to_thread.run_sync(up.hooks.wait_for, "realtime.call.ended",
                                                  before)
    except BaseException:
        print(phone.text)
        raise
    finally:
        await phone.stop()
    assert dtmf["event"] == "5"
    assert closed["client_event_id"] == "bye"
    assert ended is not None and ended.data.call_id
