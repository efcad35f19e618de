"""docs/live.md's event tables are the code's (appliance/live/protocol.py CLIENT_EVENTS,
appliance/live/events.py SERVER_EVENTS): what the page says is served is what is."""

from __future__ import annotations

import re
from pathlib import Path

from appliance.live.events import DATA_CHANNEL_EVENTS, SERVER_EVENTS
from appliance.live.protocol import CLIENT_EVENTS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "live.md"


def _table(section: str) -> dict[str, str]:
    page = DOCS.read_text()
    part = page.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([a-z_.]+)` \| ([a-z ]+) \|", part, re.M))


def test_the_docs_tables_are_the_code_tables() -> None:
    assert _table("Client events") == {k: v[0].value for k, v in CLIENT_EVENTS.items()}
    assert _table("Server events") == {k: v[0].value for k, v in SERVER_EVENTS.items()}
    assert _table("Data channel events") == {k: v[0].value
                                             for k, v in DATA_CHANNEL_EVENTS.items()}
