"""Two byte streams joined both ways until either side is done: the relay's HTTPS splice
from the shared TCP port (relay/tcp.py) and signaling's relay backend (signaling/proxied.py).
"""

from __future__ import annotations

import trio

READ_SIZE = 65536


async def splice(a: trio.abc.Stream, b: trio.abc.Stream) -> None:
    """Copy ``a`` → ``b`` and ``b`` → ``a`` until one side closes or breaks; then stop both
    directions (HTTP/1.1 and h2 need no half-close)."""

    async def pump(src: trio.abc.Stream, dst: trio.abc.Stream,
                   scope: trio.CancelScope) -> None:
        try:
            while data := await src.receive_some(READ_SIZE):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump, a, b, nursery.cancel_scope)
        nursery.start_soon(pump, b, a, nursery.cancel_scope)
