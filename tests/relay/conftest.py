"""Fixtures for the relay tests: an in-process relay worker and a throwaway redis-server."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import trio
from relay.support import OPEN_SOCKETS, SECRET, redis_server

from appliance.relay import RelayConfig, RelayHandle, serve_relay

StartRelay = Callable[..., Awaitable[RelayHandle]]


@pytest.fixture
def start_relay(nursery: trio.Nursery) -> StartRelay:
    """``await start_relay(transceivers={0: addr}, ...)``: a relay worker on loopback,
    cancelled with the test's nursery."""

    async def start(**overrides: Any) -> RelayHandle:
        overrides.setdefault("listen", (("127.0.0.1", 0),))
        handle: RelayHandle = await nursery.start(
            serve_relay, RelayConfig(secrets=(SECRET,), **overrides)
        )
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
