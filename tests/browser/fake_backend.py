"""A stand-in for the signaling app, for testing the web UI on its own.

It serves ``webui/`` the way appliance/signaling/app.py does (``/`` → index.html,
``/demo`` → demo.html, ``/<file>``) and fakes the parts of the HTTP API the pages call, in
the same shapes:

* ``GET /v1/events``: every ``interval`` seconds a ``sessions`` event ``{"sessions": [...]}``
  and a ``health`` event ``{"processes": [...]}``, built from the mutable
  ``sessions``/``processes``;
* ``GET /v1/sessions`` and ``/v1/sessions/{id}``, ``DELETE /v1/sessions/{id}`` (recorded in
  ``deleted``; the session turns ``ended``);
* ``POST /v1/sessions``: a syntactically valid ICE-lite answer whose one candidate is a UDP
  port that never answers, so the browser's connection attempt fails (the pages' failure
  path), or with ``echo=True`` a real answer from an aiortc peer that echoes the audio;
  the request is recorded in ``offers``;
* with ``auth=True``, bearer tokens as appliance/signaling/tokens.py has them: the API token
  (``API_TOKEN``) grants everything, including ``POST /v1/client_tokens``; a client token
  may only create and delete sessions.

A plain ``http.server`` in a thread: the browser tests are synchronous (Playwright's sync
API), so nothing here touches trio.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import socket
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

API_TOKEN = "secret-api-token"
WEBUI = Path(__file__).resolve().parents[2] / "webui"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}


def sample_session(n: int, *, state: str = "connected", age: float = 30.0) -> dict[str, Any]:
    """A session object shaped like docs/control-protocol.md, with plausible numbers."""
    now = time.time()
    connected = state in ("connected", "ended")
    return {
        "id": hashlib.sha256(str(n).encode()).hexdigest()[:22],
        "state": state,
        "end_reason": "deleted" if state == "ended" else None,
        "transceiver": n % 2,
        "agent": "echo" if n % 3 else "examples.weather:agent",
        "client_address": f"192.0.2.{10 + n}:{50000 + n}",
        "relay_flow": {"public": "198.51.100.1:3478", "relay": f"127.0.0.1:{40100 + n}"},
        "codec": "opus/48000/2",
        "srtp_profile": "SRTP_AEAD_AES_128_GCM",
        "cipher_suite": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "created_at": now - age,
        "ended_at": now - 1 if state == "ended" else None,
        "packets_in": int(age * 50) if connected else 0,
        "packets_out": int(age * 50) - 3 if connected else 0,
        "bytes_in": int(age * 50 * 120) if connected else 0,
        "bytes_out": int(age * 50 * 118) if connected else 0,
        "rtt_ms": 2.0 + n if connected else None,
        "jitter_ms": 1.5 + n / 2 if connected else None,
        "loss": 0.004 * n if connected else None,
        # Every other session offered a data channel (appliance/session_info.py's shape).
        "datachannels": None if n % 2 else {
            "sctp": "connected" if connected else "connecting",
            "open": [{"id": 1, "label": "chat", "protocol": "", "ordered": True,
                      "max_retransmits": None, "max_packet_lifetime_ms": None,
                      "negotiated": False}] if connected else [],
            "messages_in": 12 if connected else 0, "bytes_in": 340 if connected else 0,
            "messages_out": 12 if connected else 0, "bytes_out": 340 if connected else 0,
            "messages_dropped": 0,
        },
        "timeline": {
            "offer_received": 0.0,
            "answer_sent": 1.4,
            "first_stun": 9.8 if state != "new" else None,
            "ice_nominated": 10.1 if state != "new" else None,
            "dtls_done": 16.7 if connected else None,
            "first_rtp_in": 31.5 if connected else None,
            "first_rtp_out": 32.2 if connected else None,
        },
    }


def sample_processes() -> list[dict[str, Any]]:
    """Process health as signaling's health view lists it (appliance/signaling/state.py)."""
    return [
        {"role": "signaling", "id": "0", "up": True, "answering": True, "pid": 4240, "uptime_s": 3725.0},
        {
            "role": "relay", "id": "0", "control": "/run/appliance/relay-0.sock", "up": True,
            "answering": True, "last_ok_age_s": 0.4, "error": None, "pid": 4242, "restarts": 0, "flows": 3,
            "counters": {
                "packets_in": 15000, "packets_out": 14900, "bytes_in": 1_800_000,
                "bytes_out": 1_790_000, "flows_created": 5, "flows_evicted": 2,
                "drop_bad_ufrag": 4, "drop_unknown_flow": 12, "drop_rate_limited": 0,
            },
        },
        {
            "role": "transceiver", "id": "0", "control": "/run/appliance/transceiver-0.sock", "up": True,
            "answering": True, "last_ok_age_s": 0.4, "error": None, "pid": 4243, "restarts": 0,
            "counters": {"datagrams_in": 9000, "datagrams_out": 8950, "drop_bad_proxy_header": 0,
                         "drop_unknown_session": 1},
            "sessions_by_state": {"connected": 2, "connecting": 0},
            "load": {"busy": 0.42, "cpu": 0.41, "lag_max_ms": 1.3, "opus_complexity": 5},
            "admission": {"headroom": 0.43, "room": 34, "call_cost": 0.0125},
        },
        {
            "role": "transceiver", "id": "1", "control": "/run/appliance/transceiver-1.sock", "up": True,
            "answering": True, "last_ok_age_s": 0.4, "error": None, "pid": 4244, "restarts": 1,
            "counters": {"datagrams_in": 6000, "datagrams_out": 5990, "drop_bad_proxy_header": 0,
                         "drop_unknown_session": 0},
            "sessions_by_state": {"connected": 1},
            "load": {"busy": 0.9, "cpu": 0.44, "lag_max_ms": 4.0, "opus_complexity": 3,
                     "own": 0.45, "available": 0.5, "core_idle": 0.0, "core_steal": 0.1,
                     "late_p90_ms": 6.2},
            "admission": {"headroom": 0.0, "room": 0, "call_cost": 0.0125, "degraded": True,
                          "limit": 0.5},
        },
    ]


def fake_answer(offer: str, port: int) -> str:
    """An ICE-lite answer accepting the offer's Opus, pointing at a UDP port that never answers."""
    mid = re.search(r"^a=mid:(\S+)", offer, re.M)
    opus = re.search(r"^a=rtpmap:(\d+) opus/48000/2", offer, re.M | re.I)
    mid_v = mid.group(1) if mid else "0"
    pt = opus.group(1) if opus else "111"
    fingerprint = ":".join(f"{b:02X}" for b in range(32))
    return "\r\n".join([
        "v=0", "o=- 1 1 IN IP4 127.0.0.1", "s=-", "t=0 0", "a=ice-lite", f"a=group:BUNDLE {mid_v}",
        f"m=audio {port} UDP/TLS/RTP/SAVPF {pt}", "c=IN IP4 127.0.0.1",
        "a=ice-ufrag:fakeUfragForTests", "a=ice-pwd:fakePasswordForTheBrowserTests",
        f"a=fingerprint:sha-256 {fingerprint}", "a=setup:passive", f"a=mid:{mid_v}", "a=sendrecv",
        "a=rtcp-mux", f"a=rtpmap:{pt} opus/48000/2", f"a=fmtp:{pt} minptime=10;useinbandfec=1",
        f"a=candidate:1 1 udp 2130706431 127.0.0.1 {port} typ host", "a=end-of-candidates",
        *_rejected_sections(offer), "",
    ])


def _rejected_sections(offer: str) -> list[str]:
    """RFC 3264 §6: every m= section after the audio keeps its place, rejected (port 0)."""
    out: list[str] = []
    for section in re.split(r"\r?\n(?=m=)", offer)[2:]:
        m_line = section.splitlines()[0].split()
        out += [f"{m_line[0]} 0 {' '.join(m_line[2:])}", "c=IN IP4 0.0.0.0"]
        if mid := re.search(r"^a=mid:(\S+)", section, re.M):
            out.append(f"a=mid:{mid.group(1)}")
    return out


class FakeBackend:
    def __init__(
        self, *, interval: float = 0.25, auth: bool = False, animate: bool = False, echo: bool = False
    ) -> None:
        self.interval = interval
        # echo=True answers offers with a real aiortc peer that plays the browser's audio back.
        self.echo: Any = None
        if echo:
            from browser.echo_peer import EchoPeers

            self.echo = EchoPeers()
        self.animate = animate  # advance counters and wiggle RTT/jitter like a live call
        self._last_tick = time.monotonic()
        self._ticks = 0
        self.auth = auth
        self.lock = threading.Lock()
        self.sessions: list[dict[str, Any]] = []
        self.processes: list[dict[str, Any]] | dict[str, Any] | None = sample_processes()
        self.deleted: list[str] = []
        self.offers: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Authorization
        self.tokens: set[str] = set()
        self.minted: list[dict[str, Any]] = []  # the bodies of POST /v1/client_tokens
        self.events_status = 200  # e.g. 404 to exercise the polling fallback
        # Set to an unset Event to hold every offer's answer until the test sets it.
        self.answer_gate: threading.Event | None = None
        self._stop = threading.Event()
        # A UDP port that exists but never answers: ICE checks vanish into it.
        self._blackhole = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._blackhole.bind(("127.0.0.1", 0))
        self.blackhole_port = self._blackhole.getsockname()[1]
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> FakeBackend:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving and close the listening socket: the server becomes unreachable."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._blackhole.close()
        if self.echo is not None:
            self.echo.shutdown()

    def _tick(self) -> None:
        now = time.monotonic()
        dt, self._last_tick = now - self._last_tick, now
        self._ticks += 1
        wiggle = math.sin(self._ticks / 2.0)
        for s in self.sessions:
            if s["state"] != "connected":
                continue
            s["packets_in"] += int(50 * dt)
            s["packets_out"] += int(50 * dt)
            s["bytes_in"] += int(50 * dt * 110)
            s["bytes_out"] += int(50 * dt * 104)
            s["rtt_ms"] = round(4.0 + 1.5 * wiggle + (self._ticks % 3) * 0.4, 2)
            s["jitter_ms"] = round(2.0 + 0.8 * math.cos(self._ticks / 3.0), 2)
            s["loss"] = round(max(0.0, 0.01 * math.sin(self._ticks / 4.0)), 4)
        procs = self.processes if isinstance(self.processes, list) else list((self.processes or {}).values())
        for p in procs:
            counters = p.get("counters", {})
            for key in ("packets_in", "packets_out", "datagrams_in", "datagrams_out"):
                if key in counters:
                    counters[key] += int(100 * dt)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            if self.animate:
                self._tick()
            snap: dict[str, Any] = {"sessions": json.loads(json.dumps(self.sessions))}
            if self.processes is not None:
                snap["processes"] = json.loads(json.dumps(self.processes))
        return snap

    def find(self, sid: str) -> dict[str, Any] | None:
        with self.lock:
            return next((s for s in self.sessions if s["id"] == sid), None)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        backend = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "fake-appliance/0"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
                pass  # keep test output clean

            # -- plumbing ----------------------------------------------------------------
            def _send(self, status: int, body: bytes = b"", ctype: str = "text/plain", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
                self._send(status, json.dumps(obj).encode(), "application/json", headers)

            def _problem(self, status: int, code: str, detail: str) -> None:
                body = {"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status, "code": code, "detail": detail}
                self._send(status, json.dumps(body).encode(), "application/problem+json")

            def _authorized(self, *, client_ok: bool) -> bool:
                if not backend.auth:
                    return True
                auth = self.headers.get("Authorization", "")
                token = auth[7:] if auth.startswith("Bearer ") else None
                return token == API_TOKEN or (client_ok and token in backend.tokens)

            def _dispatch(self) -> None:
                try:
                    self._route()
                except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                    pass  # the browser went away mid-answer (SSE tab closed): normal

            def do_GET(self) -> None:
                self._dispatch()

            def do_POST(self) -> None:
                self._dispatch()

            def do_DELETE(self) -> None:
                self._dispatch()

            # -- routes ------------------------------------------------------------------
            def _route(self) -> None:
                parts = urlsplit(self.path)
                path = parts.path
                backend.requests.append((self.command, path, self.headers.get("Authorization")))
                if self.command == "GET" and path in ("/", "/index.html"):
                    return self._file("index.html")
                if self.command == "GET" and path == "/demo":
                    return self._file("demo.html")
                if self.command == "GET" and not path.startswith("/v1/"):
                    return self._file(unquote(path.lstrip("/")))
                if path == "/v1/client_tokens" and self.command == "POST":
                    return self._client_token()
                client_ok = (self.command, path) == ("POST", "/v1/sessions") or (
                    self.command == "DELETE" and path.startswith("/v1/sessions/")
                )
                if not self._authorized(client_ok=client_ok):
                    return self._problem(401, "unauthorized", "a bearer token is required")
                if path == "/v1/events" and self.command == "GET":
                    return self._events()
                if path == "/v1/sessions" and self.command == "GET":
                    return self._json(200, {"sessions": backend.snapshot()["sessions"]})
                if path == "/v1/sessions" and self.command == "POST":
                    return self._create(parse_qs(parts.query))
                m = re.fullmatch(r"/v1/sessions/([^/]+)", path)
                if m:
                    sid = unquote(m.group(1))
                    session = backend.find(sid)
                    if session is None:
                        return self._problem(404, "unknown-session", f"no session {sid}")
                    if self.command == "GET":
                        return self._json(200, session)
                    if self.command == "DELETE":
                        if backend.echo is not None:
                            backend.echo.close(sid)
                        with backend.lock:
                            backend.deleted.append(sid)
                            session["state"] = "ended"
                            session["end_reason"] = "deleted"
                            session["ended_at"] = time.time()
                        return self._send(204)
                return self._problem(405, "method-not-allowed", f"{self.command} {path}")

            def _file(self, name: str) -> None:
                target = (WEBUI / name).resolve()
                if WEBUI.resolve() not in target.parents or not target.is_file():
                    return self._problem(404, "not-found", name)
                self._send(200, target.read_bytes(), CONTENT_TYPES.get(target.suffix, "application/octet-stream"))

            def _client_token(self) -> None:
                if not self._authorized(client_ok=False):
                    return self._problem(401, "unauthorized", "minting client tokens needs the API token")
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                token = "ct1." + uuid.uuid4().hex
                backend.tokens.add(token)
                backend.minted.append(body)
                self._json(201, {"token": token, "expires_at": time.time() + 60})

            def _create(self, query: dict[str, list[str]]) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                offer = self.rfile.read(length).decode()
                if "m=audio" not in offer:
                    return self._problem(400, "bad-sdp", "the offer has no audio section")
                session = sample_session(len(backend.sessions) + 100, state="connecting", age=0)
                session["agent"] = (query.get("agent") or ["echo"])[0]
                with backend.lock:
                    backend.offers.append({"agent": query.get("agent", [None])[0], "sdp": offer})
                    backend.sessions.append(session)
                gate = backend.answer_gate
                if gate is not None:
                    gate.wait(60)
                if backend.echo is not None:
                    answer = backend.echo.answer(session["id"], offer)
                    live = sample_session(len(backend.sessions) + 100, state="connected", age=0)
                    session.update(state="connected", timeline=live["timeline"])
                else:
                    answer = fake_answer(offer, backend.blackhole_port)
                self._send(201, answer.encode(), "application/sdp",
                           {"Location": f"/v1/sessions/{session['id']}", "ETag": '"1"'})

            def _events(self) -> None:
                if backend.events_status != 200:
                    return self._problem(backend.events_status, "no-events", "no event stream here")
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(b": hello\n\n")
                while not backend._stop.is_set():
                    snap = backend.snapshot()
                    sessions = json.dumps({"sessions": snap["sessions"]})
                    self.wfile.write(f"event: sessions\ndata: {sessions}\n\n".encode())
                    if "processes" in snap:
                        health = json.dumps({"processes": snap["processes"]})
                        self.wfile.write(f"event: health\ndata: {health}\n\n".encode())
                    self.wfile.flush()
                    backend._stop.wait(backend.interval)

        return Handler
