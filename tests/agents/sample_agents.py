"""Agents for the registry tests, importable as ``agents.sample_agents`` (tests/ is on
sys.path)."""

from __future__ import annotations

from appliance.agents import FRAME_BYTES, AgentContext


class ClassAgent:
    async def run(self, ctx: AgentContext) -> None:
        await ctx.send(bytes(FRAME_BYTES))


async def fn_agent(ctx: AgentContext) -> None:
    await ctx.send(bytes(FRAME_BYTES))


def not_an_agent(ctx: AgentContext) -> None:
    pass
