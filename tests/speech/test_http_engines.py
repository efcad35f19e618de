"""The OpenAI-compatible HTTP engines against a local server speaking OpenAI's wire formats
(tests/speech/fake_openai.py). A real Whisper, TTS or LLM server cannot run on this machine
(no model weights may be downloaded), so the fake's answers are built from the official
``openai`` SDK's types, and the SDK's own client reads them back here as the check that
they are OpenAI's format."""

from __future__ import annotations

from contextlib import aclosing

import numpy as np
import pytest
import trio
from sdk_clients import sdk
from speech.fake_openai import KEY, fake_openai

from appliance.speech.audio import band_energy_ratio, read_wav
from appliance.speech.llm import ChatCompletions, LlmError, SentenceSplitter, sentences
from appliance.speech.stt import HttpStt, SttError
from appliance.speech.tts import HttpTts, TtsError
from appliance.speech.vad import FRAME_BYTES


async def test_the_fake_speaks_openai_as_the_sdk_reads_it() -> None:
    async with fake_openai() as srv:
        srv.transcripts.append("hello there")
        srv.replies.append("Hi. How can I help?")

        def with_sdk() -> tuple[str, str, int]:
            client = sdk(srv.base_url, api_key=KEY, max_retries=0)
            from appliance.speech.audio import wav_bytes
            t = client.audio.transcriptions.create(
                model="whisper-1", file=("a.wav", wav_bytes(bytes(3200), 16_000), "audio/wav"))
            stream = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            speech = client.audio.speech.create(model="tts-1", voice="alloy", input="abc",
                                                response_format="pcm")
            return t.text, text, len(speech.content)

        heard, said, nbytes = await trio.to_thread.run_sync(with_sdk)
    assert (heard, said) == ("hello there", "Hi. How can I help?")
    assert nbytes == 2 * round(24_000 * 0.04 * 3)


async def test_http_stt_uploads_a_wav_and_reads_the_text() -> None:
    async with fake_openai() as srv:
        srv.transcripts.append(" what time is it ")
        engine = HttpStt(srv.base_url, api_key=KEY, model="whisper-1", language="en")
        stream = engine.stream()
        tone = (8000 * np.sin(2 * np.pi * 500 * np.arange(48_000) / 48_000)).astype("<i2")
        for i in range(0, len(tone), 960):
            assert await stream.feed(tone[i : i + 960].tobytes()) is None  # no partials
        assert await stream.finish() == "what time is it"
        up = srv.uploads[0]
        assert up.fields == {"model": "whisper-1", "response_format": "json", "language": "en"}
        assert up.content_type == "audio/wav" and up.filename.endswith(".wav")
        pcm, rate = read_wav(up.data)
        assert rate == 16_000 and abs(len(pcm) // 2 - 16_000) < 200
        assert band_energy_ratio(pcm, 16_000, 400, 600) > 0.95  # the tone, resampled

        hinted = engine.stream(language="nb", prompt="Oslo, Bergen")  # the session's hints
        await hinted.feed(tone[:9600].tobytes())
        await hinted.finish()
        assert srv.uploads[1].fields == {"model": "whisper-1", "response_format": "json",
                                         "language": "nb", "prompt": "Oslo, Bergen"}

        bad = HttpStt(srv.base_url, api_key="sk-wrong")
        with pytest.raises(SttError, match="401"):
            await bad.transcribe(bytes(3200))
        assert "sk-wrong" not in repr(bad)
    with pytest.raises(SttError, match="failed"):
        await HttpStt(srv.base_url, api_key=KEY, timeout=5).transcribe(bytes(3200))


async def test_http_tts_streams_24k_pcm_as_48k_frames() -> None:
    async with fake_openai() as srv:
        engine = HttpTts(srv.base_url, api_key=KEY, voice="nova")
        frames = [f async for f in engine.synthesize("hello world")]  # 11 chars: 440 ms
        assert srv.speech_requests == [{"model": "tts-1", "input": "hello world",
                                         "voice": "nova", "response_format": "pcm"}]
        assert all(len(f) == FRAME_BYTES for f in frames)
        pcm = b"".join(frames)
        assert abs(len(pcm) / 96_000 - 0.44) < 0.03
        assert band_energy_ratio(pcm, 48_000, 900, 1100) > 0.95  # odd chunk splits kept
        with pytest.raises(TtsError, match="401"):
            _ = [f async for f in HttpTts(srv.base_url, api_key="nope").synthesize("x")]


async def test_chat_completions_streams_sentences() -> None:
    async with fake_openai() as srv:
        srv.replies.append("Sure thing, it is noon. Anything else I can do? Bye now.")
        llm = ChatCompletions(srv.base_url, model="llama3.2", api_key=KEY)
        send, receive = trio.open_memory_channel[str](100)
        async with send:
            await llm.reply([{"role": "user", "content": "time?"}], send.send_nowait)
        got = [s async for s in sentences(receive)]
        assert got == ["Sure thing, it is noon.", "Anything else I can do?", "Bye now."]
        req = srv.chat_requests[0]
        assert req["model"] == "llama3.2" and req["stream"] is True
        assert req["messages"][0]["role"] == "system"
        assert req["messages"][1:] == [{"role": "user", "content": "time?"}]
        with pytest.raises(LlmError, match="401"):
            await ChatCompletions(srv.base_url).reply([], print)


def test_sentence_splitter_gives_sentences_as_they_complete() -> None:
    """One splitter for both assistants: a sentence comes out when the text after its end
    mark arrives, a short one waits for the next, the last one at finish()."""
    splitter = SentenceSplitter()
    assert splitter.feed("Hi. I am a") == []  # "Hi." is too short to go alone
    assert splitter.feed(" voice assistant.") == []  # its end needs the white space after
    assert splitter.feed(" What now?") == ["Hi. I am a voice assistant."]
    assert splitter.feed(" Bye for now.") == []  # "What now?" is short: it waits too
    assert splitter.feed(" See you") == ["What now? Bye for now."]
    assert splitter.finish() == ["See you"]
    assert splitter.finish() == []


async def test_chat_stream_closed_early_closes_the_request() -> None:
    """The pull form: text pieces as they arrive; closed part-way, the server sees the
    client go (and httpx's generator chain ends now: trio would warn otherwise)."""
    async with fake_openai() as srv:
        srv.replies.append("One sentence here. Another sentence there. The last one.")
        srv.release = trio.Event()  # never set
        llm = ChatCompletions(srv.base_url, api_key=KEY)
        got = ""
        with trio.fail_after(30):
            async with aclosing(llm.stream([{"role": "user", "content": "go"}])) as stream:
                async for piece in stream:
                    assert isinstance(piece, str)
                    got += piece
                    if "there." in got:
                        break
            await srv.disconnected.wait()
        assert got.startswith("One sentence here. Another sentence there.")


async def test_transcription_passes_the_sessions_language_and_prompt(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``audio.input.transcription.language`` / ``.prompt`` reach the engine's stream (bad
    values are dropped, a long prompt is cut)."""
    from appliance.realtime import transcription
    from appliance.realtime.interface import UserTurn
    from appliance.realtime.machine import Transcribe

    asked: list[dict[str, object]] = []

    class Stream:
        async def feed(self, pcm: bytes) -> None:
            return None

        async def finish(self) -> str:
            return "hei"

        async def aclose(self) -> None:
            pass

    class Engine:
        name = "recording"

        def stream(self, **kw: object) -> Stream:
            asked.append(kw)
            return Stream()

    class Machine:
        def __init__(self) -> None:
            self.texts: list[str] = []

        def handle_transcript_delta(self, item_id: str, text: str) -> None:
            pass

        def handle_transcript(self, item_id: str, text: str) -> None:
            self.texts.append(text)

    monkeypatch.setattr(transcription, "engine_for", lambda model, env=None: Engine())
    machine = Machine()
    turn = UserTurn("item_1", bytes(9600))
    for config in ({"model": "whisper-1", "language": "nb", "prompt": "Oslo"},
                   {"language": "no; rm -rf", "prompt": 7},
                   {"prompt": "x" * 5000}):
        await transcription.transcribe_item(Transcribe("item_1", turn, config), object(),
                                            machine, lambda: None)  # type: ignore[arg-type]
    assert machine.texts == ["hei", "hei", "hei"]
    assert asked[0] == {"language": "nb", "prompt": "Oslo"}
    assert asked[1] == {"language": None, "prompt": None}
    assert asked[2] == {"language": None, "prompt": "x" * transcription.MAX_PROMPT}
