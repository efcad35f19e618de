"""Independent-peer check: aiortc's own SCTP + DCEP (RTCSctpTransport, RTCDataChannel)
against our sans-IO association, through a fake DTLS transport (see aiortc_shim.py).

Asserts what RFC 8831/8832 say: channels opened from either side with DCEP, negotiated
channels, string/binary/empty messages up to 256 KiB both ways, unordered delivery,
closing from either side (both report closed), and an ABORT ending the association.
Runs asyncio inside the (trio-mode) test with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import random
from importlib.metadata import version
from typing import Any

import pytest
from proto.sctp.aiortc_shim import FakeDtlsTransport, OursDriver, wait_until

from appliance.proto.sctp import CloseCause, Closed, Connected
from appliance.proto.sctp.datachannel import (
    ChannelClosed,
    ChannelMessage,
    ChannelOpened,
    DataChannelEndpoint,
)

aiortc = pytest.importorskip("aiortc")
from aiortc.rtcdatachannel import RTCDataChannel, RTCDataChannelParameters  # noqa: E402
from aiortc.rtcsctptransport import RTCSctpCapabilities, RTCSctpTransport  # noqa: E402

pytestmark = pytest.mark.interop

MESSAGES: list[bytes | str] = ["", b"", "x", b"y", "ü" * 5000, bytes(range(256)) * 64,
                               b"\x01" * (64 * 1024), b"\x02" * (256 * 1024)]


async def scenario(aiortc_role: str) -> None:
    print("aiortc", version("aiortc"))
    changed = asyncio.Event()
    ep = DataChannelEndpoint(dtls_client=aiortc_role == "server", rng=random.Random(1))
    ours = OursDriver(ep, changed)
    fake = FakeDtlsTransport(aiortc_role, ours.feed)
    ours.fake = fake
    sctp = RTCSctpTransport(fake)  # type: ignore[arg-type]
    remote_channels: list[Any] = []
    received: dict[str, list[bytes | str]] = {}

    def track(ch: Any) -> None:
        received.setdefault(ch.label, [])

        @ch.on("message")  # type: ignore[misc]
        def _(msg: bytes | str) -> None:
            received[ch.label].append(msg)
            changed.set()

        @ch.on("close")  # type: ignore[misc]
        def _closed() -> None:
            changed.set()

    @sctp.on("datachannel")  # type: ignore[misc]
    def _(ch: Any) -> None:
        remote_channels.append(ch)
        track(ch)
        changed.set()

    driver = asyncio.create_task(ours.run())
    try:
        # Both sides initiate, as browsers do (RFC 8841 §9.3).
        ep.connect(ours.now())
        await sctp.start(RTCSctpCapabilities(maxMessageSize=262144), 5000)
        await ours.flush()
        await wait_until(changed, lambda: ours.of(Connected) and sctp.state == "connected")

        # 1. aiortc opens a channel with DCEP; we see it and talk both ways.
        theirs = RTCDataChannel(sctp, RTCDataChannelParameters(label="from-aiortc",
                                                                protocol="chat"))
        track(theirs)
        await wait_until(changed, lambda: ours.of(ChannelOpened))
        opened = ours.of(ChannelOpened)[0]
        assert (opened.label, opened.protocol, opened.locally_initiated) == \
            ("from-aiortc", "chat", False)
        assert opened.channel_id == theirs.id
        assert theirs.id % 2 == (0 if aiortc_role == "client" else 1), "RFC 8832 §6 parity"
        await wait_until(changed, lambda: theirs.readyState == "open")
        for m in MESSAGES:
            theirs.send(m)
            ep.send(ours.now(), theirs.id, m)
        await ours.flush()
        await wait_until(changed, lambda: len(received["from-aiortc"]) == len(MESSAGES)
                         and len(ours.of(ChannelMessage)) == len(MESSAGES))
        assert received["from-aiortc"] == MESSAGES
        assert [e.data for e in ours.of(ChannelMessage)] == MESSAGES

        # 2. We open an unordered channel; aiortc gets its "datachannel" event.
        ours_id = ep.open_channel(ours.now(), "from-appliance", ordered=False)
        await ours.flush()
        await wait_until(changed, lambda: remote_channels)
        mine = remote_channels[0]
        assert (mine.label, mine.ordered, mine.id) == ("from-appliance", False, ours_id)
        for i in range(100):
            ep.send(ours.now(), ours_id, f"burst {i}")
        await ours.flush()
        await wait_until(changed, lambda: len(received["from-appliance"]) == 100)
        assert sorted(received["from-appliance"], key=lambda s: int(str(s).split()[1])) == \
            [f"burst {i}" for i in range(100)]
        mine.send(b"back")
        await wait_until(changed, lambda: any(e.data == b"back"
                                              for e in ours.of(ChannelMessage)))

        # 3. A negotiated channel: no DCEP on either side.
        neg = RTCDataChannel(sctp, RTCDataChannelParameters(label="neg", negotiated=True,
                                                             id=100))
        track(neg)
        ep.open_channel(ours.now(), "neg", negotiated=True, id=100)
        neg.send("to us")
        ep.send(ours.now(), 100, "to aiortc")
        await ours.flush()
        await wait_until(changed, lambda: received["neg"] == ["to aiortc"] and any(
            e.channel_id == 100 and e.data == "to us" for e in ours.of(ChannelMessage)))

        # 4. Close from our side, then from aiortc's; both ends report closed.
        ep.close_channel(ours.now(), theirs.id)
        await ours.flush()
        await wait_until(changed, lambda: theirs.readyState == "closed"
                         and ChannelClosed(theirs.id) in ours.events)
        mine.close()
        await wait_until(changed, lambda: ChannelClosed(ours_id) in ours.events
                         and mine.readyState == "closed")

        # 5. aiortc stops: ABORT; our association reports it.
        await sctp.stop()
        await wait_until(changed, lambda: ours.of(Closed))
        assert ours.of(Closed)[0].cause is CloseCause.PEER_ABORT
        assert ep.association.stats.drops["checksum"] == 0
    finally:
        driver.cancel()
        try:
            await driver
        except asyncio.CancelledError:
            pass


@pytest.mark.parametrize("aiortc_role", ["client", "server"])
def test_aiortc_interop(aiortc_role: str) -> None:
    asyncio.run(scenario(aiortc_role))
