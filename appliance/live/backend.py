"""The trio shell of **Responses delegation** (issue 42 item 3): sends a
:class:`~appliance.live.connection.AskBackend` request to the OpenAI-compatible LLM the
assistant uses (``--llm URL``, ``--llm-key-file``: the environment
appliance/supervisor.py ``apply_llm_flags`` sets, read by the assistant's own
:class:`~appliance.speech.assistant.AssistantOptions`) and hands each event of its stream to
the session's core. The translation is responses.py's; this file only moves bytes.

* ``POST {llm}/responses`` with ``stream: true``: the backend's Responses events, as sent;
* a backend that answers that with **404 or 405** has no Responses API (Ollama, llama.cpp,
  older vLLM): this :class:`Backend` (one per session) remembers it and asks
  ``POST {llm}/chat/completions`` (streaming) instead, for the rest of the session; :class:`~appliance.live.responses.ChatSynth` makes the
  Responses events its chunks stand for.

The request is the assistant's own (appliance/speech/llm.py ``post_sse``: httpx, the
key as a Bearer token, the one Server-Sent Events decoder of appliance/proto/sse.py);
the key is never logged.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import trio

from ..speech.llm import LlmError, post_sse
from .connection import AskBackend, LiveConnection
from .responses import (
    ChatSynth,
    ResponsesError,
    chat_body,
    chunk_untrusted,
    event_untrusted,
)

log = logging.getLogger("appliance.live")
TIMEOUT = 120.0  # seconds without progress before a backend request fails
NO_API = (404, 405)  # a chat-completions-only backend's answer to /responses


def _ids(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


@dataclass
class Backend:
    """One OpenAI-compatible endpoint (``…/v1``) and its key; ``chat_only`` once it said
    it has no ``/responses``."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    chat_only: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Backend | None:
        """The assistant's LLM (``--llm``), or None when none is configured. A key file
        that cannot be read is logged (not its contents) and the backend is not used."""
        from ..agents.loader import AgentError
        from ..speech.assistant import AssistantOptions

        try:
            options = AssistantOptions.from_spec("assistant", env)
            if not options.llm:
                return None
            return cls(options.llm.rstrip("/"), options.api_key(env))
        except AgentError as exc:
            log.warning("live: no Responses backend: %s", exc)
            return None

    async def run(self, body: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> None:
        """One response: every Responses stream event to ``emit``, in order. Raises
        :class:`ResponsesError` (unreachable, an error status, an unreadable stream)."""
        from ..speech.stt import _httpx

        httpx = _httpx()
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT) as client:
                if not self.chat_only:
                    try:
                        await self._responses(client, body, emit)
                        return
                    except LlmError as exc:
                        if exc.status not in NO_API:
                            raise
                    self.chat_only = True
                    log.info("live: %s has no /responses: chat completions from now on",
                             self.base_url)
                await self._chat(client, body, emit)
        except LlmError as exc:
            raise ResponsesError(str(exc)) from None
        except httpx.HTTPError as exc:
            raise ResponsesError(f"backend request failed: {type(exc).__name__}") from exc

    async def _responses(self, client: Any, body: dict[str, Any],
                         emit: Callable[[dict[str, Any]], None]) -> None:
        async with aclosing(post_sse(client, f"{self.base_url}/responses", body,
                                     api_key=self.api_key, what="backend")) as events:
            async for data in events:
                emit(event_untrusted(data))

    async def _chat(self, client: Any, body: dict[str, Any],
                    emit: Callable[[dict[str, Any]], None]) -> None:
        """The request as chat completions, its chunks as Responses events; a failure
        after ``response.created`` is a ``response.failed`` (then raised)."""
        from ..speech.stt import _httpx

        synth = ChatSynth(body, _ids, int(time.time()))
        synth.start()
        _drain(synth, emit)
        try:
            async with aclosing(post_sse(client, f"{self.base_url}/chat/completions",
                                         chat_body(body), api_key=self.api_key,
                                         what="backend")) as events:
                async for data in events:
                    if data.strip() != "[DONE]":
                        synth.handle_chunk(chunk_untrusted(data))
                    _drain(synth, emit)
        except (ResponsesError, LlmError, _httpx().HTTPError) as exc:
            synth.fail(f"backend request failed: {type(exc).__name__}"
                       if isinstance(exc, _httpx().HTTPError) else str(exc))
            _drain(synth, emit)
            raise
        synth.finish()
        _drain(synth, emit)


def _drain(synth: ChatSynth, emit: Callable[[dict[str, Any]], None]) -> None:
    while (event := synth.poll_event()) is not None:
        emit(event)


async def serve_request(backend: Backend, live: LiveConnection, action: AskBackend,
                        drain: Callable[[], None]) -> None:
    """One :class:`AskBackend`: the stream into the core (``drain`` after each event, so
    the client sees it at once), then its end."""
    did = action.delegation_id

    def emit(event: dict[str, Any]) -> None:
        live.handle_backend_event(did, event, action.stream)
        drain()

    error = None
    try:
        await backend.run(action.body, emit)
    except ResponsesError as exc:
        error = str(exc)
        log.warning("live session %s: Responses backend failed: %s", live.id, error)
    live.handle_backend_end(did, error, action.stream)
    drain()


def start_request(nursery: trio.Nursery | None, backend: Backend | None, live: LiveConnection,
                  action: object, drain: Callable[[], None]) -> bool:
    """Both shells' one line: True if ``action`` was an :class:`AskBackend` (started)."""
    if not isinstance(action, AskBackend):
        return False
    if nursery is not None and backend is not None:
        nursery.start_soon(serve_request, backend, live, action, drain)
    return True
