"""A fresh ``appliance up`` (no flags beyond its addresses, no key, no network) serves
GPT-Live: the official SDK's ``client.live.connect()`` with only the base URL changed is
heard by the default agent — the offline assistant — and answered in speech. Issue 42
item 2: "a fresh appliance up hears and answers words with no key"."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import trio
from e2e.procs import Proc, free_tcp_port, free_udp_port
from sdk_clients import sdk
from speech.speech_support import espeak_pcm48, have_espeak, silence

from appliance.realtime.audio import pcm48k_to_24k

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not have_espeak(), reason="espeak-ng is not installed")]


def ask_the_time(base: str) -> tuple[str, str, int]:
    client = sdk(base + "/v1")
    pcm = pcm48k_to_24k(silence(0.3) + espeak_pcm48("what time is it") + silence(1.5))
    heard, said, audio = "", "", 0
    with client.live.connect() as conn:
        conn.session.start(session={"model": "gpt-live-1"})
        assert conn.recv().type == "session.started"
        for i in range(0, len(pcm), 2400):
            conn.session.input_audio.append(audio=base64.b64encode(pcm[i : i + 2400]).decode())
        for event in conn:
            if event.type == "session.input_transcript.delta":
                heard += event.delta
            elif event.type == "session.output_audio.delta":
                audio += len(base64.b64decode(event.delta))
            elif event.type == "session.output_transcript.delta":
                said += event.delta
                conn.session.close()
            elif event.type == "session.closed":
                break
    return heard, said, audio


async def test_a_fresh_up_hears_and_answers_with_no_key(tmp_path: Path) -> None:
    http, udp = free_tcp_port(), free_udp_port()
    args = ["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
            "--state-dir", str(tmp_path / "state"), "--transceivers", "1"]
    proc = await trio.to_thread.run_sync(
        lambda: Proc(args, "appliance ready", timeout=180,
                     env={"APPLIANCE_LLM_KEY": "", "APPLIANCE_LLM_URL": "",
                          "OPENAI_API_KEY": ""}))
    try:
        with trio.fail_after(180):  # a hang guard: Whisper loads at the first session
            heard, said, audio = await trio.to_thread.run_sync(
                ask_the_time, f"http://127.0.0.1:{http}")
    finally:
        await trio.to_thread.run_sync(proc.stop)
    assert "time" in heard.lower()
    assert said.startswith("It is ")  # the built-in responder, no model, no key
    assert audio > 24_000  # over half a second of 24 kHz PCM16 speech
