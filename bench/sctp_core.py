"""SCTP core cost: messages/s, MB/s and CPU µs per message, one way, over one channel.

Run: ``.venv/bin/python bench/sctp_core.py [--seconds-budget small]``

* **ours**: two sans-IO :class:`DataChannelEndpoint` objects moving packets in memory with
  no loss and zero delay (a virtual clock only advances to fire the delayed-SACK timer),
  so the figure is pure protocol CPU: fragmentation, CRC32c, SACKs, reassembly, DCEP.
* **aiortc**: aiortc's own SCTP (``RTCSctpTransport`` + ``RTCDataChannel``) on both ends
  over the same in-memory fake DTLS transport the interop test uses, driven by asyncio.
* the ratio ours/aiortc for each message size, measured in the same run.

No DTLS, no sockets, no relay: the end-to-end figures (issue 16 item 7) are another bench.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from appliance.proto.sctp.crc32c import ACCELERATED  # noqa: E402
from appliance.proto.sctp.datachannel import (  # noqa: E402
    ChannelMessage,
    DataChannelEndpoint,
)

NOW = 1_700_000_000.0


def ours(count: int, size: int) -> tuple[float, float]:
    """Return (wall seconds, CPU seconds) to deliver ``count`` messages of ``size``."""
    a = DataChannelEndpoint(dtls_client=True, rng=random.Random(1))
    b = DataChannelEndpoint(dtls_client=False, rng=random.Random(2))
    now = NOW
    received = 0

    def pump() -> bool:
        nonlocal received
        moved = False
        for src, dst in ((a, b), (b, a)):
            while (p := src.poll_transmit()) is not None:
                dst.handle_input(now, p)
                moved = True
        while (ev := b.poll_event()) is not None:
            if isinstance(ev, ChannelMessage):
                received += 1
        while a.poll_event() is not None:
            pass
        return moved

    def settle(until: Any) -> None:
        nonlocal now
        while not until():
            if pump():
                continue
            t = [x for x in (a.poll_timeout(), b.poll_timeout()) if x is not None]
            if not t:
                raise RuntimeError("stalled")
            now = max(now, min(t))
            a.handle_timeout(now)
            b.handle_timeout(now)

    a.connect(now)
    b.connect(now)
    settle(lambda: a.association.is_established and b.association.is_established)
    cid = a.open_channel(now, "bench")
    settle(lambda: True)
    msg = b"\xab" * size
    wall, cpu = time.perf_counter(), time.process_time()
    sent = 0
    while received < count:
        # Keep ~1 MiB queued, as an application honouring bufferedAmount would.
        while sent < count and a.buffered_amount(cid) < (1 << 20):
            a.send(now, cid, msg)
            sent += 1
        settle(lambda: a.buffered_amount(cid) == 0 or received >= count)
        if sent >= count:
            settle(lambda: received >= count)
    return time.perf_counter() - wall, time.process_time() - cpu


async def _aiortc(count: int, size: int) -> tuple[float, float]:
    from aiortc.rtcdatachannel import RTCDataChannel, RTCDataChannelParameters
    from aiortc.rtcsctptransport import RTCSctpCapabilities, RTCSctpTransport
    from proto.sctp.aiortc_shim import FakeDtlsTransport

    queue: asyncio.Queue[tuple[Any, bytes]] = asyncio.Queue()
    ends: dict[str, Any] = {}
    fa = FakeDtlsTransport("client", lambda d: queue.put_nowait((ends["b"], d)))
    fb = FakeDtlsTransport("server", lambda d: queue.put_nowait((ends["a"], d)))
    ends["a"], ends["b"] = fa, fb

    async def wire() -> None:
        while True:
            dst, data = await queue.get()
            if dst._data_receiver is not None:
                await dst._data_receiver._handle_data(data)

    task = asyncio.create_task(wire())
    sa, sb = RTCSctpTransport(fa), RTCSctpTransport(fb)  # type: ignore[arg-type]
    done = asyncio.Event()
    received = 0

    @sb.on("datachannel")  # type: ignore[misc]
    def _(ch: Any) -> None:
        @ch.on("message")  # type: ignore[misc]
        def _m(_: bytes) -> None:
            nonlocal received
            received += 1
            if received >= count:
                done.set()

    caps = RTCSctpCapabilities(maxMessageSize=262144)
    await asyncio.gather(sa.start(caps, 5000), sb.start(caps, 5000))
    ch = RTCDataChannel(sa, RTCDataChannelParameters(label="bench"))
    opened = asyncio.Event()
    ch.on("open", opened.set)
    await opened.wait()
    msg = b"\xab" * size
    low = asyncio.Event()
    ch.bufferedAmountLowThreshold = 1 << 19
    ch.on("bufferedamountlow", low.set)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        ch.send(msg)
        if ch.bufferedAmount > (1 << 20):
            low.clear()
            await low.wait()
    await done.wait()
    result = time.perf_counter() - wall, time.process_time() - cpu
    task.cancel()
    await sa.stop()
    await sb.stop()
    return result


def aiortc(count: int, size: int) -> tuple[float, float] | None:
    try:
        import aiortc as _  # noqa: F401
    except ImportError:
        return None
    return asyncio.run(_aiortc(count, size))


def memory() -> tuple[float, float]:
    """(KiB per established idle association, KiB per idle open channel), one side."""
    import tracemalloc

    def pair() -> tuple[DataChannelEndpoint, DataChannelEndpoint]:
        a = DataChannelEndpoint(dtls_client=True, rng=random.Random(1))
        b = DataChannelEndpoint(dtls_client=False, rng=random.Random(2))
        a.connect(NOW)
        b.connect(NOW)
        for _ in range(10):
            for src, dst in ((a, b), (b, a)):
                while (p := src.poll_transmit()) is not None:
                    dst.handle_input(NOW, p)
            for ep in (a, b):
                while ep.poll_event() is not None:
                    pass
        return a, b

    pair()  # warm caches (struct formats, enum lookups)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    keep = [pair() for _ in range(20)]
    per_assoc = (tracemalloc.get_traced_memory()[0] - base) / 40 / 1024
    a, b = keep[0]
    before = tracemalloc.get_traced_memory()[0]
    for i in range(100):
        a.open_channel(NOW, f"c{i}")
    for _ in range(10):
        for src, dst in ((a, b), (b, a)):
            while (p := src.poll_transmit()) is not None:
                dst.handle_input(NOW, p)
        for ep in (a, b):
            while ep.poll_event() is not None:
                pass
    per_channel = (tracemalloc.get_traced_memory()[0] - before) / 200 / 1024
    tracemalloc.stop()
    return per_assoc, per_channel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer messages (for CI smoke)")
    ap.add_argument("--no-aiortc", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs (a loaded box)")
    args = ap.parse_args()
    scale = 10 if args.quick else 1
    cases = [(20000 // scale, 100), (10000 // scale, 1024), (2000 // scale, 16 * 1024),
             (200 // scale, 256 * 1024)]
    print(f"crc32c: {'google_crc32c (C)' if ACCELERATED else 'pure Python'}")
    per_assoc, per_channel = memory()
    print(f"memory: {per_assoc:.1f} KiB per idle association, {per_channel:.2f} KiB per idle "
          "channel (each side, tracemalloc)")
    print(f"best of {args.repeat}; µs/msg is CPU for both ends together; ratios ours/aiortc "
          "by wall-clock throughput and by CPU per message")
    print(f"{'size':>8} {'msgs':>6} | {'ours msg/s':>10} {'MB/s':>7} {'µs/msg':>8} |"
          f" {'aiortc msg/s':>12} {'MB/s':>7} {'µs/msg':>8} | {'wall':>6} {'cpu':>6}")

    def best(fn: Any, count: int, size: int) -> tuple[float, float] | None:
        runs = [fn(count, size) for _ in range(args.repeat)]
        if any(r is None for r in runs):
            return None
        return min(r[0] for r in runs), min(r[1] for r in runs)

    for count, size in cases:
        mine = best(ours, count, size)
        assert mine is not None
        w, c = mine
        line = (f"{size:>8} {count:>6} | {count / w:>10.0f} {count * size / w / 1e6:>7.2f} "
                f"{c / count * 1e6:>8.1f} |")
        theirs = None if args.no_aiortc else best(aiortc, count, size)
        if theirs is not None:
            aw, ac = theirs
            line += (f" {count / aw:>12.0f} {count * size / aw / 1e6:>7.2f} "
                     f"{ac / count * 1e6:>8.1f} | {aw / w:>5.1f}x {ac / c:>5.1f}x")
        print(line, flush=True)


if __name__ == "__main__":
    main()
