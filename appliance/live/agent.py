"""The agent behind a GPT-Live session: the configured Realtime agent (``--live-agent
SPEC``, the same spec language and resolver as ``--realtime-agent``:
:func:`appliance.realtime.agent.factory_for_spec`), wrapped in :class:`LiveAgent` for the
one thing GPT-Live asks of a voice model that Realtime does not: **speaking a
commentary** (``session.commentary.append``: "context the model communicates to the user").

A commentary reaches the agent as a response whose ``ResponseRequest.extra`` holds it
(:data:`~appliance.live.connection.SAY`); the wrapper answers that response itself, the
text as the transcript and, when the agent has a voice, its audio:

1. the agent's own ``say(text)`` (an async generator of deltas), if it has one — the
   optional hook for a RealtimeAgent with its own voice;
2. else the TTS engine of the appliance's assistant (``agent.engines.tts``), which speaks
   the text as given (GPT-Live lets the model reword it; the built-in responder has no
   model to reword with);
3. else the transcript alone (the echo agent has no voice).

Every other response, and ``transcribe`` / ``session_updated``, are the agent's own.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from ..realtime.agent import factory_for_spec
from ..realtime.interface import AudioDelta, Delta, RealtimeAgent, ResponseRequest, TranscriptDelta
from .connection import SAY

#: ``--live-agent``'s default: the offline assistant (Whisper, the built-in responder or
#: ``--llm``, espeak-ng), so a fresh ``appliance up`` hears and answers with no key.
DEFAULT_LIVE_AGENT = "assistant"


class LiveAgent:
    def __init__(self, inner: RealtimeAgent) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        # transcribe(), session_updated(): the shell finds them with getattr.
        return getattr(self.inner, name)

    def respond(self, request: ResponseRequest) -> AsyncIterator[Delta]:
        text = request.extra.get(SAY)
        if isinstance(text, str):
            return self._say(text)
        return self.inner.respond(request)

    async def _say(self, text: str) -> AsyncGenerator[Delta, None]:
        own = getattr(self.inner, "say", None)
        if callable(own):
            async with aclosing(own(text)) as deltas:
                async for delta in deltas:
                    yield delta
            return
        yield TranscriptDelta(text)
        tts = getattr(getattr(self.inner, "engines", None), "tts", None)
        if tts is None or not callable(getattr(tts, "synthesize", None)):
            return
        async with aclosing(tts.synthesize(text)) as frames:
            async for frame in frames:
                yield AudioDelta(frame)


def live_factory(spec: str) -> Callable[[], LiveAgent]:
    """``--live-agent`` spec -> a factory of wrapped agents (raises ``AgentError``)."""
    factory = factory_for_spec(spec)
    return lambda: LiveAgent(factory())
