"""The control channel's request ids: several requests in flight on one connection.

A scripted raw server (not ``serve_control``) reads requests and answers them in the order
the test chooses, so each test pins one property of :class:`ControlClient`: it sends without
waiting for earlier answers, it matches answers by ``id`` (not by order), a waiter that gives
up does not steal or shift anyone's answer, and a broken connection fails every request in
flight and is replaced by the next request.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from appliance.control import ControlClient, ControlError, serve_control

Script = Callable[[trio.SocketStream, "Lines"], Awaitable[None]]


class Lines:
    """Reads whole JSON lines from a raw server-side stream."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = b""

    async def next(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            chunk = await self.stream.receive_some(4096)
            assert chunk, "client closed early"
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        obj = json.loads(line)
        assert isinstance(obj, dict)
        return obj


async def _answer(stream: trio.SocketStream, req: dict[str, Any], **extra: Any) -> None:
    resp = {"ok": True, "op": req["op"], "id": req["id"], **extra}
    await stream.send_all(json.dumps(resp).encode() + b"\n")


async def _raw_server(nursery: trio.Nursery, path: Path, script: Script) -> list[int]:
    """Serve ``script`` once per connection on a Unix socket; returns a list that counts
    connections as they are accepted."""
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(8)
    listener = trio.SocketListener(sock)
    accepted: list[int] = []

    async def on_conn(stream: trio.SocketStream) -> None:
        accepted.append(len(accepted))
        async with stream:
            await script(stream, Lines(stream))

    nursery.start_soon(trio.serve_listeners, on_conn, [listener])
    return accepted


async def test_requests_are_pipelined_and_matched_by_id(tmp_path: Path,
                                                        nursery: trio.Nursery) -> None:
    """The server reads three requests before it answers any (a client that waited for
    each answer would deadlock here), then answers them in reverse order."""

    async def script(stream: trio.SocketStream, lines: Lines) -> None:
        reqs = [await lines.next() for _ in range(3)]
        assert len({r["id"] for r in reqs}) == 3
        for req in reversed(reqs):
            await _answer(stream, req, n=req["n"])

    accepted = await _raw_server(nursery, tmp_path / "c.sock", script)
    client = ControlClient(str(tmp_path / "c.sock"), timeout=5)
    got: dict[int, dict[str, Any]] = {}

    async def one(n: int) -> None:
        got[n] = await client.request({"op": f"op{n}", "n": n})

    async with trio.open_nursery() as inner:
        for n in range(3):
            inner.start_soon(one, n)
    assert {n: (r["op"], r["n"]) for n, r in got.items()} == {n: (f"op{n}", n) for n in range(3)}
    assert all("id" not in r for r in got.values())  # the id is the client's business
    assert accepted == [0]  # one connection for all three
    await client.aclose()


async def test_a_waiter_that_gives_up_does_not_shift_the_answers(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    """A request cancelled while waiting (a poll's move_on_after) leaves the connection
    usable; its late answer is dropped instead of being handed to the next request."""
    first_read = trio.Event()

    async def script(stream: trio.SocketStream, lines: Lines) -> None:
        slow = await lines.next()
        first_read.set()
        second = await lines.next()
        await _answer(stream, slow, who="slow")
        await _answer(stream, second, who="second")

    accepted = await _raw_server(nursery, tmp_path / "c.sock", script)
    client = ControlClient(str(tmp_path / "c.sock"), timeout=5)
    with trio.CancelScope() as scope:

        async def cancel_when_read() -> None:
            await first_read.wait()
            scope.cancel()

        nursery.start_soon(cancel_when_read)
        await client.request({"op": "slow"})
    assert scope.cancelled_caught
    resp = await client.request({"op": "second"})
    assert resp["who"] == "second"
    assert accepted == [0]  # the cancelled wait did not cost the connection
    await client.aclose()


async def test_a_broken_connection_fails_every_request_in_flight(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    """Garbage on the wire fails all requests waiting on that connection with
    ControlError; the next request opens a new connection and works."""

    async def script(stream: trio.SocketStream, lines: Lines) -> None:
        first = await lines.next()
        if first["op"] == "after":
            await _answer(stream, first)
            return
        await lines.next()
        await stream.send_all(b"this is not json\n")

    accepted = await _raw_server(nursery, tmp_path / "c.sock", script)
    client = ControlClient(str(tmp_path / "c.sock"), timeout=5)
    errors: list[str] = []

    async def one(op: str) -> None:
        try:
            await client.request({"op": op})
        except ControlError as exc:
            errors.append(str(exc))

    async with trio.open_nursery() as inner:
        inner.start_soon(one, "a")
        inner.start_soon(one, "b")
    assert len(errors) == 2
    assert (await client.request({"op": "after"}))["ok"] is True
    assert accepted == [0, 1]
    await client.aclose()


async def test_serve_control_echoes_the_id_and_hides_it_from_the_handler(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    seen: list[dict[str, Any]] = []

    async def handler(req: dict[str, Any]) -> dict[str, Any]:
        seen.append(dict(req))
        return {"ok": True}

    path = await nursery.start(serve_control, str(tmp_path / "c.sock"), handler)
    stream = await trio.open_unix_socket(path)
    lines = Lines(stream)
    # Two requests in one write; a request without an id gets an answer without one.
    await stream.send_all(b'{"op":"a","id":"x-1"}\n{"op":"b"}\n{"op":7,"id":9}\n')
    answers = [await lines.next() for _ in range(3)]
    assert answers[0] == {"ok": True, "id": "x-1"}
    assert answers[1] == {"ok": True}
    assert answers[2]["code"] == "bad-request" and answers[2]["id"] == 9
    assert seen == [{"op": "a"}, {"op": "b"}]
    await stream.aclose()


async def test_many_concurrent_requests_through_serve_control(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    """The signaling case: 20 creates at once on one client, each gets its own answer."""
    n = 20

    async def handler(req: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return {"ok": True, "k": req["k"]}

    path = await nursery.start(serve_control, str(tmp_path / "c.sock"), handler)
    client = ControlClient(path)
    got: list[tuple[int, int]] = []

    async def one(k: int) -> None:
        got.append((k, (await client.request({"op": "create", "k": k}))["k"]))

    async with trio.open_nursery() as inner:
        for k in range(n):
            inner.start_soon(one, k)
    assert sorted(got) == [(k, k) for k in range(n)]
    await client.aclose()
