"""The local control channel between the supervisor/signaling and the other roles.

Newline-delimited JSON over a Unix stream socket (``/path/to.sock``) or loopback TCP
(``host:port``, for roles on separate hosts behind a private network). One request, one
response per line; a connection may carry many requests in sequence.

Requests are objects with an ``op`` field. Responses are ``{"ok": true, ...}`` or
``{"ok": false, "status": <HTTP-ish status>, "code": "<machine code>", "detail": "..."}``.
The operations each role serves are documented in docs/architecture.md.
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
            try:
                req = json.loads(line)
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


class ControlClient:
    """A persistent connection to a control server; requests are serialised by a lock and
    the connection is re-opened after an error."""

    def __init__(self, address: str, *, timeout: float = 5.0) -> None:
        self.address = address
        self.timeout = timeout
        self._stream: trio.SocketStream | None = None
        self._reader: _LineReader | None = None
        self._lock = trio.Lock()

    async def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            try:
                with trio.fail_after(self.timeout):
                    if self._stream is None:
                        self._stream = await _open(self.address)
                        self._reader = _LineReader(self._stream)
                    assert self._reader is not None
                    await self._stream.send_all(_encode(msg))
                    line = await self._reader.readline()
                if line is None:
                    raise ControlError(f"{self.address} closed the control connection")
                resp = json.loads(line)
                if not isinstance(resp, dict):
                    raise ControlError("control response is not an object")
                return resp
            except (OSError, trio.BrokenResourceError, trio.TooSlowError, ValueError) as exc:
                await self.aclose()
                raise ControlError(f"control request to {self.address} failed: {exc!r}") from exc
            except BaseException:
                await self.aclose()
                raise

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream, self._reader = self._stream, None, None
            with trio.CancelScope(shield=True):
                await stream.aclose()


async def control_request(address: str, msg: dict[str, Any]) -> dict[str, Any]:
    """One request on a fresh connection (for CLIs and tests); 5 s deadline."""
    client = ControlClient(address)
    try:
        return await client.request(msg)
    finally:
        await client.aclose()
