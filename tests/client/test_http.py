"""The load generator's small HTTP client against real sockets."""

from __future__ import annotations

import socket
import threading
import time
from functools import partial

import pytest
import trio

from appliance.client import http
from appliance.client.http import request


async def test_early_answer_before_the_body_is_read_is_returned(nursery: trio.Nursery) -> None:
    """Regression: a server that answers 413 and closes before reading an oversized body made
    send_all fail with EPIPE, and the client reported 'broken pipe' instead of the 413."""

    async def handler(stream: trio.SocketStream) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += await stream.receive_some(4096)
        await stream.send_all(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\n"
                              b"Connection: close\r\n\r\nbig")
        # Close without reading the body: further client writes hit a reset socket.
        stream.socket.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_LINGER,
                                 b"\x01\x00\x00\x00\x00\x00\x00\x00")
        await stream.aclose()

    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    resp = await request("POST", f"http://127.0.0.1:{port}/v1/sessions",
                         body=b"x" * (8 << 20), headers={"Content-Type": "application/sdp"})
    assert resp.status == 413
    assert resp.body == b"big"


async def test_content_length_response_does_not_wait_for_close(nursery: trio.Nursery) -> None:
    """Regression: hypercorn keeps the socket open after Connection: close until the client
    closes; reading to EOF hung every call."""

    async def handler(stream: trio.SocketStream) -> None:
        await stream.receive_some(4096)
        await stream.send_all(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
        await trio.sleep_forever()  # never closes

    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    with trio.fail_after(5):
        resp = await request("GET", f"http://127.0.0.1:{port}/")
    assert (resp.status, resp.body) == (201, b"ok")


def _answer_one_503(listener: socket.socket, running: threading.Event) -> None:
    """A blocking server in a worker thread: it answers while the client's loop is busy."""
    running.set()
    conn, _ = listener.accept()
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(4096)
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\n"
                     b"Content-Length: 0\r\nConnection: close\r\n\r\n")


async def test_the_answer_is_timed_when_it_arrived_not_when_it_was_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41 item 1: a load generator busy with other calls' handshakes reads a 503 late;
    its latency is the server's from the request leaving to the answer arriving (the
    kernel's stamp), not the client's wait. The read here first blocks the loop STALL."""
    stall = 0.5
    read = http._receive_stamped

    async def late(sock: trio.socket.SocketType) -> tuple[bytes, float | None]:
        time.sleep(stall)  # noqa: ASYNC251 (the loop busy elsewhere; the server answers)
        return await read(sock)

    monkeypatch.setattr(http, "_receive_stamped", late)
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        port = listener.getsockname()[1]
        running = threading.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(trio.to_thread.run_sync, _answer_one_503, listener,
                                       running))
            # The server's thread must be up before the loop blocks (else it starts after).
            await trio.to_thread.run_sync(running.wait)
            t0 = trio.current_time()
            resp = await request("POST", f"http://127.0.0.1:{port}/v1/sessions", body=b"v=0")
            took = trio.current_time() - t0
    assert resp.status == 503 and resp.header("retry-after") == "2"
    assert resp.sent_at is not None and resp.answered_at is not None
    assert took >= stall
    assert 0 <= resp.answered_at - resp.sent_at < stall
