from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from appliance.control import ControlClient, ControlError, control_request, serve_control


async def echo_handler(req: dict[str, Any]) -> dict[str, Any]:
    if req["op"] == "boom":
        raise RuntimeError("handler bug")
    return {"ok": True, "echo": req}


async def test_unix_round_trip(tmp_path: Path, nursery: trio.Nursery) -> None:
    path = await nursery.start(serve_control, str(tmp_path / "c.sock"), echo_handler)
    assert (tmp_path / "c.sock").stat().st_mode & 0o777 == 0o600
    client = ControlClient(path)
    for i in range(3):  # one connection, several requests
        assert (await client.request({"op": "x", "i": i}))["echo"]["i"] == i
    # A handler exception becomes a 500 answer, and the server keeps serving.
    resp = await client.request({"op": "boom"})
    assert resp["ok"] is False and resp["status"] == 500
    assert (await client.request({"op": "y"}))["ok"] is True
    await client.aclose()


async def test_tcp_and_bad_requests(nursery: trio.Nursery) -> None:
    addr = await nursery.start(serve_control, "127.0.0.1:0", echo_handler)
    assert (await control_request(addr, {"op": "ping"}))["ok"] is True
    stream = await trio.open_tcp_stream("127.0.0.1", int(addr.rsplit(":", 1)[1]))
    await stream.send_all(b"not json\n[1,2]\n")
    data = b""
    while data.count(b"\n") < 2:
        data += await stream.receive_some(4096)
    assert data.count(b'"bad-request"') == 2
    await stream.aclose()


async def test_unreachable_raises_control_error(tmp_path: Path) -> None:
    with pytest.raises(ControlError):
        await control_request(str(tmp_path / "nobody.sock"), {"op": "x"})
