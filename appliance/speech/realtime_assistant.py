"""The assistant as a Realtime agent: ``--realtime-agent assistant`` (WebRTC calls of
``/v1/realtime/calls``, agents-js pages, the sideband) and ``GET /v1/realtime`` with
``?agent=assistant`` (the WebSocket).

The Realtime machine (appliance/realtime/machine.py) owns the turns, items, barge-in and
truncation; this agent gives each response its content::

    user audio item --STT--> text --LLM (the conversation as chat messages)--> reply text
        --sentences--> TranscriptDelta + TTS AudioDelta (audio responses) | TextDelta (text)

* **Hearing**: :meth:`AssistantRealtime.transcribe` transcribes a user audio item once
  (the engine of the assistant's options; decoding in worker threads) and remembers it:
  the response that answers the item and the ``input_audio_transcription`` events (when the
  session asks for them, appliance/realtime/transcription.py) share that one run. The
  machine's turns come from the shared turn engine (appliance/realtime/turns.py): at each
  pause inside a turn :meth:`AssistantRealtime.speculate` decodes the audio so far
  (engines with ``stream.speculate()``: Whisper); when the turn ends in that pause
  (``turn.pause``) that decode is the item's transcript, ready when the turn ends instead
  of starting then (counted in ``appliance.speech.listen.speculation``, as the ctx loop's).
* **The conversation**: the session's ``instructions`` are the system prompt (the
  assistant's default when empty); user items become ``user`` messages (their transcript),
  assistant items ``assistant`` messages, ``function_call`` items assistant ``tool_calls``
  and ``function_call_output`` items ``tool`` messages.
* **Tools**: the session's ``tools`` (Realtime's flat ``{"type": "function", "name",
  "description", "parameters"}``) go to the LLM in chat-completions form, with
  ``tool_choice``; a tool call the LLM streams becomes a :class:`FunctionCall` (a
  ``function_call`` output item with the model's ``call_id``); the client runs it, adds a
  ``function_call_output`` item and sends ``response.create``, and the next request
  carries the output back to the LLM. The built-in responder has no tools.
* **Speaking**: the LLM's stream is read inside the response's generator, with no
  background task: each time a sentence completes (:class:`~.llm.SentenceSplitter`, the
  one the ctx voice loop uses) its transcript delta (text delta for a text response) and
  its TTS audio are yielded, then the stream is read on, so the first sentence plays while
  the model is still writing. Tool calls come whole at the stream's end and become
  ``function_call`` items after the text. Cancelled (``response.cancel``, barge-in), the
  generator is closed at its ``yield`` or cancelled at its ``await``; either way the
  ``aclosing`` blocks close the TTS generator and the LLM stream (its HTTP response:
  the endpoint sees the client go) at once. A stream that fails before a word was said
  says :data:`FAILED`; after, the words stand and the rest is lost.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, Protocol

import trio

from ..realtime.interface import (
    AudioDelta,
    Delta,
    FunctionCall,
    ResponseRequest,
    TextDelta,
    TranscriptDelta,
    UserTurn,
)
from .listen import speculation
from .llm import SYSTEM_PROMPT, LlmError, Message, Responder, SentenceSplitter, ToolCall
from .stt import SttEngine, SttError
from .tts import TtsEngine, TtsError


class Engines(Protocol):
    """What the agent uses of :class:`appliance.speech.assistant.Engines` (a Protocol: that
    module imports this one)."""

    @property
    def stt(self) -> SttEngine: ...

    @property
    def tts(self) -> TtsEngine: ...

    @property
    def responder(self) -> Responder: ...

FEED_BYTES = 19_200  # 200 ms of 48 kHz PCM16 per STT feed
MAX_REMEMBERED = 64  # transcripts kept per call (older items fall out of the context anyway)
NOT_HEARD = "I did not catch that. Could you say it again?"
FAILED = "Sorry, my answering service failed."


def chat_tools(session: dict[str, Any]) -> list[dict[str, Any]]:
    """Realtime ``session.tools`` -> chat-completions ``tools`` (functions only)."""
    out = []
    for tool in session.get("tools") or ():
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            continue
        fn: dict[str, Any] = {"name": name}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        if isinstance(tool.get("parameters"), dict):
            fn["parameters"] = tool["parameters"]
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(session: dict[str, Any]) -> Any:
    choice = session.get("tool_choice")
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return None


class _Guess:
    """A speculative transcript of one item at one pause (``text`` None while decoding,
    or if it failed)."""

    __slots__ = ("pause", "text", "done")

    def __init__(self, pause: int) -> None:
        self.pause = pause
        self.text: str | None = None
        self.done = trio.Event()


class AssistantRealtime:
    """One call's (one session's) Realtime assistant."""

    def __init__(self, engines: Engines) -> None:
        self.engines = engines
        self._heard: OrderedDict[str, str] = OrderedDict()
        self._busy: dict[str, trio.Event] = {}
        self._guesses: dict[str, _Guess] = {}  # item -> its latest pause's transcript
        # The turn waterfall's marks only the agent sees (issue 38 item 5; the shell asks
        # with turn_marks): when each item's transcript was in hand and what the STT took
        # of it, and per response its LLM's first text. Trio clock.
        self._heard_at: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._marks: OrderedDict[str, dict[str, float]] = OrderedDict()

    def turn_marks(self, response_id: str) -> dict[str, float] | None:
        """The response's ``transcript``, ``stt_seconds`` and ``first_token`` marks (the
        shell's waterfall, appliance/realtime/waterfall.py), once: forgotten after."""
        return self._marks.pop(response_id, None)

    def _marks_of(self, response_id: str) -> dict[str, float]:
        marks = self._marks.get(response_id)
        if marks is None:
            marks = self._marks[response_id] = {}
            while len(self._marks) > MAX_REMEMBERED:
                self._marks.popitem(last=False)
        return marks

    async def speculate(self, item_id: str, pause: int, audio: bytes) -> None:
        """The caller paused inside the turn that will be ``item_id``: decode its audio so
        far now (see the module docstring). A newer pause's guess replaces this one."""
        probe = self.engines.stt.stream()
        if not hasattr(probe, "speculate"):
            await probe.aclose()
            return  # this engine decodes only at the end (or costs money per request)
        old = self._guesses.pop(item_id, None)
        if old is not None:
            speculation.wasted += 1
        while len(self._guesses) >= MAX_REMEMBERED:
            self._guesses.pop(next(iter(self._guesses)))
        guess = self._guesses[item_id] = _Guess(pause)
        speculation.started += 1
        stream: Any = probe
        try:
            for i in range(0, len(audio), FEED_BYTES):
                await stream.feed(audio[i : i + FEED_BYTES])
            before = stream.cpu_seconds
            try:
                guess.text = (await stream.speculate()).strip()
            finally:
                speculation.cpu_seconds += stream.cpu_seconds - before
        except SttError:
            pass  # transcribe() decodes the item itself
        finally:
            guess.done.set()
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def pause_words(self, item_id: str, pause: int) -> str | None:
        """The transcript :meth:`speculate` makes of ``item_id``'s pause ``pause`` (waiting
        for it), for the end-of-turn verdict of that pause (appliance/realtime/turns.py):
        None when there is none (the engine decodes only at the end, or the shell skipped
        this pause's decode) or it failed."""
        guess = self._guesses.get(item_id)
        if guess is None or guess.pause != pause:
            return None
        await guess.done.wait()
        return guess.text

    async def _speculated(self, turn: UserTurn) -> str | None:
        """The guess made at the pause the turn ended in, if any (waiting for it)."""
        guess = self._guesses.pop(turn.item_id, None)
        if guess is None:
            return None
        if turn.pause is None or guess.pause != turn.pause:
            speculation.wasted += 1  # the caller went on after that pause
            return None
        await guess.done.wait()
        if guess.text is None:
            speculation.wasted += 1
            return None
        speculation.used += 1
        return guess.text

    def _remember(self, item_id: str, text: str, began: float) -> None:
        self._heard[item_id] = text
        now = trio.current_time()
        self._heard_at[item_id] = (now, now - began)
        while len(self._heard) > MAX_REMEMBERED:
            self._heard.popitem(last=False)
        while len(self._heard_at) > MAX_REMEMBERED:
            self._heard_at.popitem(last=False)

    async def transcribe(self, turn: UserTurn) -> str:
        """The item's words (transcribed once; a second caller waits for the first)."""
        if turn.text is not None and not turn.audio:
            return turn.text
        while turn.item_id not in self._heard:
            busy = self._busy.get(turn.item_id)
            if busy is None:
                break
            await busy.wait()  # the other run ended: its text, or (failed, cancelled) ours
        else:
            return self._heard[turn.item_id]
        done = self._busy[turn.item_id] = trio.Event()
        began = trio.current_time()
        try:
            guessed = await self._speculated(turn)
            if guessed is not None:
                self._remember(turn.item_id, guessed, began)
                return guessed
            stream = self.engines.stt.stream()
            try:
                for i in range(0, len(turn.audio), FEED_BYTES):
                    await stream.feed(turn.audio[i : i + FEED_BYTES])
                text = (await stream.finish()).strip()
            finally:
                with trio.CancelScope(shield=True):
                    await stream.aclose()
            self._remember(turn.item_id, text, began)
            return text
        finally:
            del self._busy[turn.item_id]
            done.set()

    async def _messages(self, request: ResponseRequest) -> list[Message]:
        turn = request.turn
        items = list(request.conversation)
        if turn is not None and not any(i.get("id") == turn.item_id for i in items):
            items.append({"id": turn.item_id, "type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": turn.text or ""}]
                          if turn.text is not None else [{"type": "input_audio"}]})
        messages: list[Message] = []
        for item in items:
            kind = item.get("type")
            if kind == "function_call":
                messages.append({"role": "assistant", "content": None, "tool_calls": [{
                    "id": item.get("call_id"), "type": "function", "function": {
                        "name": item.get("name"), "arguments": item.get("arguments") or "{}"}}]})
            elif kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                                 "content": str(item.get("output", ""))})
            elif kind == "message" and item.get("role") in ("user", "assistant", "system"):
                text = await self._item_text(item, turn)
                if text:
                    messages.append({"role": item["role"], "content": text})
        return messages

    async def _item_text(self, item: dict[str, Any], turn: UserTurn | None) -> str:
        parts = []
        for part in item.get("content") or ():
            ptype = part.get("type")
            if ptype in ("input_text", "output_text"):
                parts.append(part.get("text") or "")
            elif ptype == "output_audio":
                parts.append(part.get("transcript") or "")
            elif ptype == "input_audio":
                said = part.get("transcript") or self._heard.get(item.get("id", ""))
                if said is None and turn is not None and turn.item_id == item.get("id"):
                    said = await self.transcribe(turn)
                parts.append(said or "")
        return " ".join(p for p in parts if p).strip()

    async def respond(self, request: ResponseRequest) -> AsyncIterator[Delta]:
        audio = "audio" in request.output_modalities
        answered_tool = bool(request.conversation) and request.conversation[-1].get(
            "type") == "function_call_output"
        try:
            messages = await self._messages(request)
        except SttError:
            messages = []
        heard = self._heard_at.get(request.turn.item_id) if request.turn is not None else None
        if heard is not None:
            self._marks_of(request.response_id).update(
                transcript=heard[0], stt_seconds=heard[1])
        last_user = next((m for m in reversed(messages) if m["role"] == "user"), None)
        try:
            if not answered_tool and (last_user is None or not last_user.get("content")):
                if request.turn is None:
                    return  # a response.create with nothing to answer: stay silent
                async with aclosing(self._say([NOT_HEARD], audio, first=True)) as deltas:
                    async for delta in deltas:
                        yield delta
                return
            async with aclosing(self._answer(request, messages, audio)) as deltas:
                async for delta in deltas:
                    yield delta
        except TtsError:
            return  # the transcript stands; the audio of the rest is lost

    async def _answer(self, request: ResponseRequest, messages: list[Message], audio: bool
                      ) -> AsyncGenerator[Delta, None]:
        """The LLM's stream, spoken sentence by sentence as it arrives; then its calls."""
        s = request.session
        splitter = SentenceSplitter()
        calls: list[ToolCall] = []
        said = False
        try:
            async with aclosing(self.engines.responder.stream(
                    messages, system=request.instructions or SYSTEM_PROMPT,
                    tools=chat_tools(s), tool_choice=chat_tool_choice(s))) as stream:
                async for piece in stream:
                    if isinstance(piece, ToolCall):
                        calls.append(piece)
                        continue
                    marks = self._marks_of(request.response_id)
                    if "first_token" not in marks:
                        marks["first_token"] = trio.current_time()
                    if done := splitter.feed(piece):
                        async with aclosing(self._say(done, audio, first=not said)) as deltas:
                            async for delta in deltas:
                                yield delta
                        said = True
        except LlmError:
            if not said:  # else the words stand; the calls of a broken stream are not trusted
                async with aclosing(self._say([FAILED], audio, first=True)) as deltas:
                    async for delta in deltas:
                        yield delta
            return
        async with aclosing(self._say(splitter.finish(), audio, first=not said)) as deltas:
            async for delta in deltas:
                yield delta
        for call in calls:
            try:
                json.loads(call.arguments)
                arguments = call.arguments
            except ValueError:
                arguments = json.dumps({"_unparsed": call.arguments})
            yield FunctionCall(call.name, arguments, call.call_id or None)

    async def _say(self, sentences: list[str], audio: bool, *, first: bool
                   ) -> AsyncGenerator[Delta, None]:
        """Sentences as deltas: text, or each one's transcript then its TTS audio (a space
        before all but the response's first, so the deltas join into the reply)."""
        for n, sentence in enumerate(sentences):
            text = sentence if first and n == 0 else " " + sentence
            if not audio:
                yield TextDelta(text)
                continue
            yield TranscriptDelta(text)
            async with aclosing(self.engines.tts.synthesize(sentence)) as frames:
                async for frame in frames:
                    yield AudioDelta(frame)
