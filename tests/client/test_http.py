"""The load generator's small HTTP client against real sockets."""

from __future__ import annotations

from functools import partial

import trio

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
