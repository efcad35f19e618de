"""Fixtures of the reliability tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from reliability.failover import RedisProc


@pytest.fixture
def redis_proc() -> Iterator[RedisProc]:
    """A redis-server of the test's own, SIGKILLed at the end."""
    r = RedisProc()
    r.start()
    try:
        yield r
    finally:
        r.kill9()
