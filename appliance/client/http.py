"""A deliberately small HTTP/1.1 client on trio streams, for the load generator and tests.

One request per connection (``Connection: close``), ``http://`` and ``https://`` (TLS
verification may be turned off for a ``--tls self-signed`` appliance). Response bodies are
capped, so a misbehaving server cannot make the load generator grow without bound.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import trio

from .stamps import ANCILLARY, arrival, enable_rx_timestamps, kernel_stamp

MAX_RESPONSE = 1 << 20


class HttpError(Exception):
    """The server could not be reached or answered with something that is not HTTP/1.1."""


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    #: On trio's clock: when the request's last byte was handed to the kernel, and when the
    #: answer's first bytes arrived (the kernel's stamp over plain HTTP; over HTTPS, when
    #: they were read). ``answered_at - sent_at`` is the server's time to answer on the
    #: caller's clock, without this client's own waits (a load generator busy elsewhere).
    sent_at: float | None = None
    answered_at: float | None = None

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


async def request(
    method: str,
    url: str,
    *,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    verify_tls: bool = True,
) -> Response:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise HttpError(f"unsupported URL scheme in {url!r}")
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    sent_at: float | None = None
    answered_at: float | None = None
    try:
        stream: trio.abc.Stream = await _open_tcp(host, port)
        plain = (stream if parts.scheme == "http" and isinstance(stream, trio.SocketStream)
                 else None)
        stamped = plain is not None and enable_rx_timestamps(plain.socket)
        if parts.scheme == "https":
            ctx = ssl.create_default_context()
            if not verify_tls:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            # Offer http/1.1 as browsers and curl do: on a media port that serves HTTPS
            # beside TURN/TLS (on by default), a hello offering no ALPN is taken for a
            # `turns:` client (docs/turn.md "Over TLS", rule 4).
            ctx.set_alpn_protocols(["http/1.1"])
            stream = trio.SSLStream(stream, ctx, server_hostname=host)
        hdrs = {"Host": parts.netloc, "Connection": "close", "Content-Length": str(len(body))}
        hdrs.update(headers or {})
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
        raw = bytearray()
        async with stream:
            try:
                await stream.send_all(head.encode("latin-1") + b"\r\n" + body)
            except trio.BrokenResourceError as exc:
                # A server may answer early and close (e.g. 413 before reading an oversized
                # body): the answer is already in our receive buffer, so read it.
                send_error: Exception | None = exc
            else:
                send_error = None
            sent_at = trio.current_time()
            while not _complete(raw):
                try:
                    if stamped and plain is not None:
                        chunk, stamp = await _receive_stamped(plain.socket)
                    else:
                        chunk, stamp = bytes(await stream.receive_some(65536)), None
                except (trio.BrokenResourceError, ConnectionError):
                    if send_error is None:
                        raise
                    break
                if not chunk:
                    break
                if answered_at is None:
                    now = trio.current_time()
                    answered_at = arrival(stamp, now, now - time.time(), sent_at)
                raw += chunk
                if len(raw) > MAX_RESPONSE:
                    raise HttpError("response too large")
            if send_error is not None and not raw:
                raise send_error
    except (OSError, trio.BrokenResourceError) as exc:
        raise HttpError(f"{method} {url} failed: {exc!r}") from exc
    response = _parse(bytes(raw))
    response.sent_at, response.answered_at = sent_at, answered_at
    return response


async def _receive_stamped(sock: trio.socket.SocketType) -> tuple[bytes, float | None]:
    """One read of a TCP socket with kernel receive stamps on: the bytes and the stamp
    (wall clock) of the segment they came in, if the kernel gave one."""
    data, ancillary, _flags, _addr = await sock.recvmsg(65536, ANCILLARY)
    return data, kernel_stamp(ancillary)


async def _open_tcp(host: str, port: int) -> trio.SocketStream:
    """A TCP connection; for an IP literal (the load generator's usual ``127.0.0.1``) one
    plain ``connect``: ``trio.open_tcp_stream``'s resolver call and happy-eyeballs nursery
    cost this client as much CPU as the request itself, once per POST and per DELETE."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return await trio.open_tcp_stream(host, port)
    sock = trio.socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET,
                              socket.SOCK_STREAM)
    try:
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


def _complete(raw: bytearray) -> bool:
    """True once a response with a Content-Length is whole. Servers need not close at once
    after ``Connection: close`` (hypercorn waits for the client), so do not wait for EOF."""
    end = raw.find(b"\r\n\r\n")
    if end < 0:
        return False
    for line in bytes(raw[:end]).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            try:
                return len(raw) - end - 4 >= int(value.strip())
            except ValueError:
                return False
    return False


def _parse(raw: bytes) -> Response:
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        raise HttpError("truncated HTTP response")
    lines = head.decode("latin-1").split("\r\n")
    try:
        _version, status, *_ = lines[0].split(" ", 2)
        code = int(status)
    except ValueError:
        raise HttpError(f"bad status line {lines[0]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        rest = _dechunk(rest)
    elif "content-length" in headers:
        rest = rest[: int(headers["content-length"])]
    return Response(code, headers, rest)


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    pos = 0
    while True:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            raise HttpError("truncated chunked body")
        size = int(data[pos:eol].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2
