"""``appliance up --llm URL --llm-model M --llm-key-file F`` (issue 30 item 4): the flags
reach the assistant in the processes that run it. A real ``up`` serves a Realtime WebSocket
session (``GET /v1/realtime``) answered by ``--realtime-agent assistant``, whose LLM is
tests/speech/fake_openai.py (a real model server cannot be installed here): the chat
request carries the model and the key from the file, the reply comes back as Realtime text
events, and the key is in no log line (debug logging on)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from e2e.procs import Proc, free_tcp_port, free_udp_port
from speech.fake_openai import KEY, fake_openai
from speech.speech_support import have_espeak
from trio_websocket import open_websocket_url

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not have_espeak(), reason="espeak-ng is not installed")]


async def test_up_llm_flags_reach_the_realtime_assistant(tmp_path: Path) -> None:
    key_file = tmp_path / "llm.key"
    key_file.write_text(KEY + "\n")
    http, udp = free_tcp_port(), free_udp_port()
    events: list[dict[str, Any]] = []
    async with fake_openai() as api:
        api.replies.append("Hello from the model behind the flag.")
        args = ["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
                "--state-dir", str(tmp_path / "state"), "--transceivers", "1",
                "--log-level", "debug", "--realtime-agent", "assistant",
                "--llm", api.base_url, "--llm-model", "model-from-flag",
                "--llm-key-file", str(key_file)]
        proc = await trio.to_thread.run_sync(
            lambda: Proc(args, "appliance ready", timeout=180,
                         env={"APPLIANCE_LLM_KEY": "", "APPLIANCE_LLM_URL": ""}))
        try:
            with trio.fail_after(120):
                async with open_websocket_url(
                        f"ws://127.0.0.1:{http}/v1/realtime?model=gpt-realtime") as ws:
                    for ev in ({"type": "session.update", "session": {
                                    "type": "realtime", "output_modalities": ["text"]}},
                               {"type": "conversation.item.create", "item": {
                                   "type": "message", "role": "user",
                                   "content": [{"type": "input_text", "text": "hi there"}]}},
                               {"type": "response.create"}):
                        await ws.send_message(json.dumps(ev))
                    while not any(e["type"] == "response.done" for e in events):
                        events.append(json.loads(await ws.get_message()))
        finally:
            await trio.to_thread.run_sync(proc.stop)
    [req] = api.chat_requests
    assert req["model"] == "model-from-flag"
    assert req["messages"][-1] == {"role": "user", "content": "hi there"}
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "Hello from the model behind the flag."
    log = "".join(proc.stdout) + "".join(proc.stderr)
    assert "realtime socket" in log  # the session was logged (at debug level, all of it)
    assert KEY not in log
