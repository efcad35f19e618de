"""The local control channel between the supervisor/signaling and the other roles.

Newline-delimited JSON over a Unix stream socket (``/path/to.sock``) or loopback TCP
(``host:port``, for roles on separate hosts behind a private network). One request, one
response per line; a connection may carry many requests, several of them in flight at once.

Requests are objects with an ``op`` field and, optionally, an ``id`` (any JSON scalar the
client picks); the response to a request with an ``id`` carries the same ``id``, so a client
may send the next request before the previous answer came back and match answers by id
(:class:`ControlClient` does: 20 concurrent ``POST /v1/sessions`` no longer queue a whole
round trip each behind a lock). The server strips ``id`` before its handler sees the
request, and today answers one connection's requests in order. Responses are
``{"ok": true, ...}`` or
``{"ok": false, "status": <HTTP-ish status>, "code": "<machine code>", "detail": "..."}``.
The operations each role serves are documented in docs/control-protocol.md.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import trio

log = logging.getLogger(__name__)

MAX_LINE = 1 << 20  # 1 MiB: an SDP offer is far smaller; anything bigger is hostile.
Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
#: The largest ``params`` object a ``create`` may carry (its compact JSON): per-call
#: parameters for the agent (e.g. a Realtime session config with long instructions), far
#: below MAX_LINE so an offer always fits beside it. Signaling and transceivers both check it.
MAX_PARAMS_BYTES = 64 * 1024


def check_params(value: object) -> dict[str, Any]:
    """A ``create`` request's ``params`` (absent/None: ``{}``); raises ValueError saying why
    it is refused: not a JSON object, or bigger than :data:`MAX_PARAMS_BYTES`."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError("params must be a JSON object")
    try:
        size = len(json.dumps(value, separators=(",", ":"), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"params is not JSON-safe: {exc}") from None
    if size > MAX_PARAMS_BYTES:
        raise ValueError(f"params is {size} bytes of JSON; at most {MAX_PARAMS_BYTES}")
    return value


class ControlError(Exception):
    """The peer could not be reached or answered with something that is not JSON."""


def _is_unix(address: str) -> bool:
    return address.startswith(("/", "./", "unix:"))


def _unix_path(address: str) -> str:
    return address[5:] if address.startswith("unix:") else address


async def _open(address: str) -> trio.SocketStream:
    if _is_unix(address):
        return await trio.open_unix_socket(_unix_path(address))
    host, _, port = address.rpartition(":")
    return await trio.open_tcp_stream(host.strip("[]"), int(port))


class _LineReader:
    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buf = bytearray()

    async def readline(self) -> bytes | None:
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[: i + 1]
                return line
            if len(self._buf) > MAX_LINE:
                raise ControlError("control message too large")
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                return None
            self._buf += chunk


def _encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


async def _serve_connection(stream: trio.SocketStream, handler: Handler) -> None:
    reader = _LineReader(stream)
    async with stream:
        while True:
            try:
                line = await reader.readline()
            except (ControlError, trio.BrokenResourceError):
                return
            if line is None:
                return
            rid: Any = None
            try:
                req = json.loads(line)
                if isinstance(req, dict):
                    rid = req.pop("id", None)
                if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                    raise ValueError("request must be an object with an 'op'")
            except ValueError as exc:
                resp: dict[str, Any] = {
                    "ok": False, "status": 400, "code": "bad-request", "detail": str(exc)
                }
            else:
                try:
                    resp = await handler(req)
                except Exception as exc:  # a handler bug must not kill the control server
                    log.exception("control handler failed for op=%s", req.get("op"))
                    resp = {"ok": False, "status": 500, "code": "internal", "detail": str(exc)}
            if rid is not None:
                resp = {**resp, "id": rid}  # a copy: the handler may keep its dict
            try:
                await stream.send_all(_encode(resp))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return


async def serve_control(
    address: str,
    handler: Handler,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``handler`` on ``address`` until cancelled; reports the bound address."""
    if _is_unix(address):
        path = _unix_path(address)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(128)
        listeners: list[trio.SocketListener] = [trio.SocketListener(sock)]
        bound = path
    else:
        host, _, port = address.rpartition(":")
        listeners = await trio.open_tcp_listeners(int(port), host=host.strip("[]") or None)
        sockname = listeners[0].socket.getsockname()
        bound = f"{host}:{sockname[1]}"

    async def on_conn(stream: trio.SocketStream) -> None:
        await _serve_connection(stream, handler)

    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(trio.serve_listeners, on_conn, [listener])
        task_status.started(bound)


class _Connection:
    """One open control connection and the requests in flight on it."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reader = _LineReader(stream)
        self.send_lock = trio.Lock()  # one line at a time on the wire
        self.read_lock = trio.Lock()  # one task reads (for everyone) at a time
        self.answers: dict[int, dict[str, Any]] = {}  # id -> answer not yet collected
        self.waiting: set[int] = set()  # ids sent and not yet answered
        self.broken: str | None = None  # why the connection can no longer be used


class ControlClient:
    """A persistent connection to a control server, re-opened after an error.

    Requests are pipelined: each goes out with its own ``id`` as soon as the line before it
    has been written, without waiting for earlier answers. Whoever is waiting takes the read
    lock and reads lines, filing each answer under its id, until its own has come; the
    others find theirs filed when they get the lock. No task outlives a request, so the
    client needs no nursery.

    A request cancelled while it waits (a caller's ``move_on_after``) just stops waiting:
    its late answer is dropped. A request cancelled while *writing* its line, a timeout, or
    a broken or garbled stream closes the connection; the other requests in flight on it
    then fail with :class:`ControlError`, and the next request opens a new connection.
    """

    def __init__(self, address: str, *, timeout: float = 5.0) -> None:
        self.address = address
        self.timeout = timeout
        self._conn: _Connection | None = None
        self._open_lock = trio.Lock()
        self._next_id = 0

    async def _connection(self) -> _Connection:
        async with self._open_lock:
            if self._conn is None or self._conn.broken is not None:
                self._conn = _Connection(await _open(self.address))
            return self._conn

    async def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        conn: _Connection | None = None
        rid = self._next_id = self._next_id + 1
        try:
            with trio.fail_after(self.timeout):
                conn = await self._connection()
                line = _encode({**msg, "id": rid})
                conn.waiting.add(rid)
                try:
                    async with conn.send_lock:
                        if conn.broken is not None:
                            raise ControlError(conn.broken)
                        try:
                            await conn.stream.send_all(line)
                        except BaseException:
                            # A line cut short leaves the stream unusable for everyone.
                            conn.broken = "a request was cut short while being written"
                            raise
                    return await self._answer(conn, rid)
                finally:
                    conn.waiting.discard(rid)
                    conn.answers.pop(rid, None)  # cancelled: the late answer is dropped
        except ControlError as exc:
            await self._close(conn)
            raise ControlError(f"control request to {self.address} failed: {exc}") from exc
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                ValueError) as exc:
            await self._close(conn)
            raise ControlError(f"control request to {self.address} failed: {exc!r}") from exc
        except BaseException:
            if conn is not None and conn.broken is not None:
                await self._close(conn)
            raise

    async def _answer(self, conn: _Connection, rid: int) -> dict[str, Any]:
        while True:
            if rid in conn.answers:
                return conn.answers.pop(rid)
            async with conn.read_lock:
                while rid not in conn.answers:
                    if conn.broken is not None:
                        raise ControlError(conn.broken)
                    try:
                        # Cancelled here, receive_some consumed nothing: the buffer and the
                        # stream stay whole for the next reader.
                        raw = await conn.reader.readline()
                    except ControlError as exc:
                        conn.broken = str(exc)
                        raise
                    if raw is None:
                        conn.broken = f"{self.address} closed the control connection"
                        raise ControlError(conn.broken)
                    try:
                        resp = json.loads(raw)
                        if not isinstance(resp, dict):
                            raise ValueError("control response is not an object")
                    except ValueError:
                        conn.broken = "control response is not a JSON object"
                        raise
                    got = resp.pop("id", None)
                    if isinstance(got, int) and got in conn.waiting:
                        conn.answers[got] = resp
                    # else: the answer to a request that stopped waiting; dropped

    async def _close(self, conn: _Connection | None) -> None:
        if conn is None:
            return
        if conn.broken is None:
            conn.broken = "the connection was closed after an error"
        if self._conn is conn:
            self._conn = None
        with trio.CancelScope(shield=True):
            await conn.stream.aclose()

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.broken = "the client was closed"
            with trio.CancelScope(shield=True):
                await conn.stream.aclose()


async def control_request(address: str, msg: dict[str, Any]) -> dict[str, Any]:
    """One request on a fresh connection (for CLIs and tests); 5 s deadline."""
    client = ControlClient(address)
    try:
        return await client.request(msg)
    finally:
        await client.aclose()
