"""Input audio transcription for the Realtime surface: what answers the machine's
:class:`~appliance.realtime.machine.Transcribe` action, shared by both shells (the
``oai-events`` channel, appliance/realtime/agent.py, and the WebSocket,
appliance/realtime/ws_session.py), so the events are made once, by the machine.

When the session sets ``audio.input.transcription`` (``{"model": ...}``), every committed
user audio item is transcribed and the client gets
``conversation.item.input_audio_transcription.delta`` (zero or more), then ``.completed``,
or ``.failed`` if the engine failed (the call goes on, as OpenAI's does).

Who transcribes:

1. the agent, if it has ``async def transcribe(turn) -> str | None`` (the assistant does:
   it needs the words to answer, and shares one transcription between both uses);
2. else a speech engine (appliance/speech/stt.py) chosen by ``model``:
   ``whisper-tiny.en`` (or ``whisper``), ``pocketsphinx``, ``http`` (the OpenAI-compatible
   endpoint of ``APPLIANCE_STT_URL``). Any other name — ``whisper-1``,
   ``gpt-4o-transcribe`` — selects the configured default, so OpenAI clients work
   unchanged: ``APPLIANCE_STT_URL`` if set, else Whisper tiny.en, else PocketSphinx
   (whichever the installed ``speech`` extra provides).

Engines are built once per process (their models load once: Whisper in its first worker
thread, PocketSphinx decoders pooled), and decoding runs in worker threads
(``trio.to_thread``, inside the engines), never on the event loop. PocketSphinx streams:
its growing hypothesis, less its last word, becomes deltas while it still extends the text
sent so far. A decoder may still revise a word it has shown: ``.completed`` is the
transcript (as OpenAI's docs say of theirs), the deltas are the live view. Whisper and HTTP
give one delta with the whole text (OpenAI's ``whisper-1`` does the same).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from .machine import RealtimeConnection, Transcribe

log = logging.getLogger("appliance.realtime.transcription")
FEED_BYTES = 9_600 * 2  # 200 ms of 48 kHz PCM16 per feed (PocketSphinx batches as much)
WHISPER_NAMES = ("whisper-tiny.en", "whisper")
ENGINE_NAMES = (*WHISPER_NAMES, "pocketsphinx", "http")

_engines: dict[str, Any] = {}
_lock = threading.Lock()


class TranscriptionUnavailable(RuntimeError):
    """No speech engine can be built (the ``speech`` extra is not installed)."""


def _build(name: str, env: dict[str, str]) -> Any:
    from ..speech import stt  # the speech package imports numpy only; engines load lazily

    if name in WHISPER_NAMES:
        return stt.make_stt("whisper")
    if name == "pocketsphinx":
        return stt.make_stt("pocketsphinx")
    url = env.get("APPLIANCE_STT_URL", "")
    if not url.startswith(("http://", "https://")):
        raise TranscriptionUnavailable("the http transcription engine needs APPLIANCE_STT_URL")
    key = env.get("APPLIANCE_SPEECH_KEY") or env.get("APPLIANCE_LLM_KEY") or None
    return stt.make_stt("http", base_url=url, api_key=key,
                        model=env.get("APPLIANCE_STT_MODEL") or "whisper-1")


def engine_name(model: str | None, env: dict[str, str] | None = None) -> str:
    """The engine a ``transcription.model`` names: itself if known, else the default."""
    env = dict(os.environ) if env is None else env
    if model in ENGINE_NAMES:
        return "whisper-tiny.en" if model == "whisper" else str(model)
    if env.get("APPLIANCE_STT_URL", "").startswith(("http://", "https://")):
        return "http"
    return "whisper-tiny.en"


def engine_for(model: str | None, env: dict[str, str] | None = None) -> Any:
    """The process-wide engine for ``model`` (built on first use). Falls back from Whisper
    to PocketSphinx when faster-whisper is missing; raises
    :class:`TranscriptionUnavailable` when neither is installed."""
    env = dict(os.environ) if env is None else env
    name = engine_name(model, env)
    from ..speech.vad import SpeechUnavailable

    last: Exception | None = None
    with _lock:
        for candidate in (name, "pocketsphinx") if name in WHISPER_NAMES else (name,):
            found = _engines.get(candidate)
            if found is not None:
                return found
            try:
                found = _engines[candidate] = _build(candidate, env)
            except SpeechUnavailable as exc:
                last = exc
                continue
            return found
    raise TranscriptionUnavailable(f"no speech-to-text engine: {last}")


def _stable(partial: str) -> str:
    """A partial hypothesis without its last word (the one most likely to change)."""
    words = partial.split()
    return " ".join(words[:-1])


def _extends(sent: str, text: str) -> str | None:
    """What ``text`` adds to ``sent``, or None when it revises it (no delta then)."""
    if text.startswith(sent):
        return text[len(sent):]
    return None


MAX_PROMPT = 2000  # characters of ``prompt`` passed on (OpenAI's is a short text too)


def hints(config: dict[str, Any]) -> dict[str, str | None]:
    """The ``language`` and ``prompt`` of ``audio.input.transcription`` for the engine
    (client data: kept only when they are short strings)."""
    language = config.get("language")
    prompt = config.get("prompt")
    ok = isinstance(language, str) and 0 < len(language) <= 16 and language.replace(
        "-", "").isalnum()
    return {"language": language if ok else None,
            "prompt": prompt[:MAX_PROMPT] if isinstance(prompt, str) and prompt else None}


async def transcribe_item(action: Transcribe, agent: Any, machine: RealtimeConnection,
                          drain: Callable[[], None]) -> None:
    """Transcribe one committed item and report it to ``machine`` (``drain`` after each
    report: the shell sends the events). Never raises for an engine's failure."""
    item_id = action.item_id
    fn = getattr(agent, "transcribe", None)
    try:
        if callable(fn):
            text = await fn(action.turn)
            if not isinstance(text, str):
                raise TypeError("the agent's transcribe() gave no text")
            text = text.strip()
            if text:
                machine.handle_transcript_delta(item_id, text)
            machine.handle_transcript(item_id, text)
            drain()
            return
        model = action.config.get("model")
        engine = engine_for(model if isinstance(model, str) else None)
        stream = engine.stream(**hints(action.config))
        sent = ""
        try:
            pcm = action.turn.audio
            for i in range(0, len(pcm), FEED_BYTES):
                partial = await stream.feed(pcm[i : i + FEED_BYTES])
                more = _extends(sent, _stable(partial)) if partial else None
                if more and more.strip():
                    machine.handle_transcript_delta(item_id, more)
                    sent += more
                    drain()
            text = (await stream.finish()).strip()
        finally:
            await stream.aclose()
        rest = _extends(sent, text)
        if rest:
            machine.handle_transcript_delta(item_id, rest)
        machine.handle_transcript(item_id, text)
        drain()
    except Exception as exc:  # noqa: BLE001 (any engine's failure is the item's, not the call's)
        log.info("transcription of %s failed: %s", item_id, exc)
        machine.handle_transcript_failed(item_id, str(exc) or type(exc).__name__)
        drain()
