"""Fixtures for the signaling tests: an app wired to fake transceivers and relay workers
served over real Unix sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from signaling.fakes import FakeClock, FakeRelay, FakeTransceiver

from appliance.control import serve_control
from appliance.signaling import SignalingConfig, SignalingState, create_app


@dataclass
class Env:
    state: SignalingState
    app: Any
    fakes: dict[int, FakeTransceiver]
    clock: FakeClock
    cancel: dict[int, trio.CancelScope] = field(default_factory=dict)

    def client(self) -> Any:
        return self.app.test_client()


MakeEnv = Callable[..., Any]


@pytest.fixture
async def make_env(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[MakeEnv]:
    """``await make_env(**config overrides)``: fake transceivers 0 and 1, one relay worker."""
    states: list[SignalingState] = []

    async def make(n: int = 2, relays: int = 1, **overrides: Any) -> Env:
        tag = len(states)
        fakes = {k: FakeTransceiver(k) for k in range(n)}
        addrs: dict[int, str] = {}
        scopes: dict[int, trio.CancelScope] = {}

        async def serve_one(k: int, *, task_status: trio.TaskStatus[str]) -> None:
            with trio.CancelScope() as scope:
                scopes[k] = scope
                await serve_control(str(tmp_path / f"t{tag}-{k}.sock"), fakes[k].handle,
                                    task_status=task_status)

        for k in fakes:
            addrs[k] = await nursery.start(serve_one, k)
        relay_addrs = {}
        for w in range(relays):
            relay_addrs[str(w)] = await nursery.start(
                serve_control, str(tmp_path / f"r{tag}-{w}.sock"), FakeRelay().handle)
        cfg = SignalingConfig(
            transceivers=addrs,
            relays=relay_addrs,
            public_addresses=["198.51.100.1", "2001:db8::5"],
            udp_port=3478,
            webui_dir=tmp_path / "webui",
            events_interval=0.05,
        )
        for key, value in overrides.items():
            setattr(cfg, key, value)
        clock = FakeClock()
        state = SignalingState(cfg, clock=clock)
        states.append(state)
        return Env(state=state, app=create_app(state), fakes=fakes, clock=clock, cancel=scopes)

    yield make
    for state in states:
        await state.aclose()
