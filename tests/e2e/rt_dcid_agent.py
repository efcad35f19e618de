"""The ``realtime`` agent with per-call params as signaling's ``/v1/realtime/calls?dcid=``
will give them (``ctx.params["realtime"]``): here set in-process, so the pre-negotiated
``oai-events`` channel is tested through real processes without the HTTP route."""

from __future__ import annotations

from dataclasses import replace

from appliance.agents import AgentContext
from appliance.realtime.agent import resolve_spec

DCID = 4
_realtime = resolve_spec("realtime")


async def agent(ctx: AgentContext) -> None:
    # No server VAD: the caller's tone must not start a response of its own that races the
    # test's text one (output_text.done of a VAD turn came first in one CI run).
    session = {"instructions": "pre-negotiated", "audio": {"input": {"turn_detection": None}}}
    params = {"realtime": {"session": session, "dcid": DCID, "call_id": "rtc_test"}}
    await _realtime(AgentContext(ctx._host, replace(ctx.identity, params=params)))
