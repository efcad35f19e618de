"""Issue 38 item 8b: an agent's models load off the transceiver's event loop.

The assistant's first ``resolve`` loads Whisper, Silero and the turn model (~1 s). Inside
the ``create`` op it ran on the event loop: the new call's set-up waited for it and every
other call of that transceiver stalled. ``Transceiver.warm`` resolves a spec once in a
worker thread before the op runs, and ``--preload`` does it at start."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from appliance.agents import AgentError
from appliance.netio.sockets import udp_socket
from appliance.transceiver import cli, ops
from appliance.transceiver.server import Transceiver, TransceiverConfig


def _transceiver(**kw: Any) -> Transceiver:
    sock = udp_socket(("127.0.0.1", 0), buffer=0, v6only=None)
    return Transceiver(TransceiverConfig(id=1, secrets=(b"k" * 32,), **kw), sock)


async def test_a_spec_is_resolved_once_off_the_event_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    loop_thread = threading.get_ident()
    threads: list[tuple[str, int]] = []
    real = ops.resolve

    def spy(spec: str | None) -> Any:
        threads.append((str(spec), threading.get_ident()))
        if spec == "bad-agent":
            raise AgentError("unknown agent")
        return real("echo")

    monkeypatch.setattr(ops, "resolve", spy)
    tr = _transceiver(preload=("assistant?x=1",))
    try:
        await tr.preload()
        await tr.warm("assistant?x=1")  # already warm: not resolved again
        await tr.warm("bad-agent")
        await tr.warm("bad-agent")  # a failing spec is not remembered: the op answers it
        # The create op warms the session's agent before its own (on-loop) resolve.
        answer = await tr.handle_control({"op": "create", "session_id": "s1", "offer": 5,
                                          "agent": "echo"})
        assert answer.get("ok") is False  # the offer is bad; the warm ran first anyway
    finally:
        tr.sock.close()
    warmed = [(spec, t) for spec, t in threads if t != loop_thread]
    assert [spec for spec, _ in warmed] == ["assistant?x=1", "bad-agent", "bad-agent", "echo"]


def test_the_preload_default_follows_the_speech_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.parse_preload("none") == ()
    assert cli.parse_preload("assistant, echo") == ("assistant", "echo")
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert cli.parse_preload(None) == ("assistant",)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert cli.parse_preload(None) == ()
