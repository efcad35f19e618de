"""/metrics counts data channels from the sessions' ``datachannels`` objects (the shape in
appliance/session_info.py): open channels and associations as gauges over live sessions,
messages and bytes as counters that never fall, even when a session ends and is purged."""

from __future__ import annotations

from typing import Any

from signaling.fakes import OFFER
from signaling.test_metrics_events import SDP, parse_exposition

from appliance.signaling.metrics import ChannelTotals


def channels(sctp: str, labels: list[str], *, msgs: int, nbytes: int, dropped: int = 0) -> dict[str, Any]:
    return {"sctp": sctp, "open": [{"id": i, "label": lb} for i, lb in enumerate(labels)],
            "messages_in": msgs, "messages_out": msgs + 1, "bytes_in": nbytes,
            "bytes_out": nbytes * 2, "messages_dropped": dropped}


async def scrape(c: Any) -> dict[str, float]:
    resp = await c.get("/metrics")
    assert resp.status_code == 200
    return parse_exposition((await resp.get_data()).decode())


async def test_metrics_count_data_channels(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    sids = []
    for _ in range(3):
        resp = await c.post("/v1/sessions", data=OFFER, headers=SDP)
        assert resp.status_code == 201
        sids.append(resp.headers["Location"].rsplit("/", 1)[1])
    by_sid = {sid: fake for fake in env.fakes.values() for sid in fake.sessions}
    a, b, _no_channels = sids
    by_sid[a].sessions[a]["datachannels"] = channels("connected", ["chat", "events"], msgs=10, nbytes=100)
    by_sid[b].sessions[b]["datachannels"] = channels("connecting", [], msgs=0, nbytes=0)

    m = await scrape(c)  # no GET /v1/sessions first: /metrics asks the transceivers itself
    assert m["appliance_datachannels_open"] == 2
    assert m['appliance_datachannel_associations{sctp="connected"}'] == 1
    assert m['appliance_datachannel_associations{sctp="connecting"}'] == 1
    assert m['appliance_datachannel_messages_total{direction="in"}'] == 10
    assert m['appliance_datachannel_messages_total{direction="out"}'] == 11 + 1
    assert m['appliance_datachannel_bytes_total{direction="in"}'] == 100
    assert m['appliance_datachannel_bytes_total{direction="out"}'] == 200
    assert m["appliance_datachannel_messages_dropped_total"] == 0

    by_sid[a].sessions[a]["datachannels"] = channels("connected", ["chat"], msgs=15, nbytes=150, dropped=2)
    by_sid[b].sessions[b]["datachannels"] = channels("connected", ["x"], msgs=1, nbytes=5)
    m = await scrape(c)
    assert m["appliance_datachannels_open"] == 2
    assert m['appliance_datachannel_associations{sctp="connected"}'] == 2
    assert m['appliance_datachannel_messages_total{direction="in"}'] == 16
    assert m['appliance_datachannel_bytes_total{direction="out"}'] == 310
    assert m["appliance_datachannel_messages_dropped_total"] == 2

    # The session ends, and then its transceiver forgets it: the counters keep its share,
    # the gauges drop it.
    assert (await c.delete(f"/v1/sessions/{a}")).status_code in (200, 204)
    m = await scrape(c)
    assert m["appliance_datachannels_open"] == 1
    assert m['appliance_datachannel_messages_total{direction="in"}'] == 16
    del by_sid[a].sessions[a]
    env.state.registry.purge()
    m = await scrape(c)
    assert m['appliance_datachannel_messages_total{direction="in"}'] == 16
    assert m['appliance_datachannel_associations{sctp="connected"}'] == 1


def test_channel_totals_never_fall() -> None:
    """A counter that went backwards (a view from before a newer one, or a session id
    reused) must not make the Prometheus counter fall."""
    t = ChannelTotals()
    view = {"id": "s1", "state": "connected", "datachannels": channels("connected", ["a"], msgs=5, nbytes=50)}
    assert t.update([view]) == (1, {"connecting": 0, "connected": 1})
    older = {"id": "s1", "state": "connected", "datachannels": channels("SHUTDOWN: bye", [], msgs=3, nbytes=30)}
    assert t.update([older]) == (0, {"connecting": 0, "connected": 0, "closed": 1})
    assert t.totals["messages_in"] == 5 and t.totals["bytes_in"] == 50
    assert t.update([{"id": "s2", "state": "connected", "datachannels": None}, {"state": "x"}]) == (
        0, {"connecting": 0, "connected": 0})
    assert t.totals["messages_in"] == 5
