"""Fixtures for the relay tests: an in-process relay worker and a throwaway redis-server.

``start_relay`` (and ``io``) run every test that uses them twice: over the pure-Python hot
loop (``io="python"``) and over the batched syscalls of the C extension (``io="mmsg"``).
The extension is built by ``pip install -e .``; a missing build fails the mmsg runs (it is
not skipped)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import trio
from relay.support import OPEN_SOCKETS, SECRET, redis_server

from appliance.relay import RelayConfig, RelayHandle, serve_relay
from appliance.relay.io import mmsg_available

StartRelay = Callable[..., Awaitable[RelayHandle]]


@pytest.fixture(params=["python", "mmsg"])
def io(request: pytest.FixtureRequest) -> str:
    """The relay's hot-loop I/O path under test."""
    mode = str(request.param)
    if mode == "mmsg" and not mmsg_available():
        pytest.fail("appliance.netio._mmsg is not built: run .venv/bin/pip install -e .")
    return mode


@pytest.fixture
def start_relay(nursery: trio.Nursery, io: str) -> StartRelay:
    """``await start_relay(transceivers={0: addr}, ...)``: a relay worker on loopback,
    cancelled with the test's nursery, on the ``io`` path of the test's parameter."""

    async def start(**overrides: Any) -> RelayHandle:
        overrides.setdefault("listen", (("127.0.0.1", 0),))
        overrides.setdefault("io", io)
        handle: RelayHandle = await nursery.start(
            serve_relay, RelayConfig(secrets=(SECRET,), **overrides)
        )
        assert handle.io == overrides["io"]
        return handle

    return start


@pytest.fixture
def redis_url() -> Iterator[str]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (make sysdeps installs it)")
    yield from redis_server()


@pytest.fixture
async def close_sockets() -> AsyncIterator[None]:
    yield
    while OPEN_SOCKETS:
        OPEN_SOCKETS.pop().close()
