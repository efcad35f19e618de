"""Server-Sent Events (the WHATWG event-stream format), sans-IO: the one decoder of the
``text/event-stream`` bodies OpenAI-compatible servers stream — chat completions (the
assistant's LLM client, appliance/speech/llm.py) and the Responses API (GPT-Live's Responses
delegation, appliance/live/backend.py). Fuzzed in tests/proto/test_sse.py."""

from __future__ import annotations

from .errors import RemoteProtocolError

MAX_LINE = 1 << 20  # one line (a whole JSON event: OpenAI sends each on one line)
MAX_EVENT = 4 << 20  # one event's data


class SseError(RemoteProtocolError):
    """The stream broke the format or its bounds (not UTF-8, a line or event too long)."""


class SseDecoder:
    """The WHATWG event-stream format, sans-IO: ``handle_input(bytes)``, then
    ``poll_event()`` until None (``(event name, data)``); ``handle_eof()`` at the end.
    Lines end in CRLF, LF or CR; ``data:`` lines join with LF; a blank line dispatches;
    comments (``:``), ``id`` and ``retry`` are skipped. Bounded by :data:`MAX_LINE` and
    :data:`MAX_EVENT`; raises only :class:`SseError`."""

    def __init__(self) -> None:
        self._buf = b""
        self._cr = False  # the last chunk ended in CR: a LF at the next one's start is its
        self._name = ""
        self._data: list[str] = []
        self._size = 0
        self._ready: list[tuple[str, str]] = []

    def handle_input(self, data: bytes) -> None:
        if self._cr and data.startswith(b"\n"):
            data = data[1:]
        self._cr = False
        buf = self._buf + data
        start = 0
        lf, cr = buf.find(b"\n"), buf.find(b"\r")  # each searched once per line end: linear
        while lf >= 0 or cr >= 0:
            end = lf if cr < 0 or 0 <= lf < cr else cr
            self._line(buf[start:end])
            if end == cr:
                if end + 1 == len(buf):
                    self._cr = True
                elif buf[end + 1 : end + 2] == b"\n":
                    end += 1
            start = end + 1
            if 0 <= lf < start:
                lf = buf.find(b"\n", start)
            if 0 <= cr < start:
                cr = buf.find(b"\r", start)
        self._buf = buf[start:]
        if len(self._buf) > MAX_LINE:
            raise SseError("event stream line over 1 MiB")

    def handle_eof(self) -> None:
        """The stream ended: a last unterminated line counts; an undispatched event
        does not (the format's rule)."""
        if self._buf:
            self._line(self._buf)
            self._buf = b""

    def poll_event(self) -> tuple[str, str] | None:
        return self._ready.pop(0) if self._ready else None

    def _line(self, raw: bytes) -> None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SseError("event stream is not UTF-8") from None
        if not line:
            if self._data:
                self._ready.append((self._name or "message", "\n".join(self._data)))
            self._name, self._data, self._size = "", [], 0
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._size += len(value) + 1
            if self._size > MAX_EVENT:
                raise SseError("event stream event over 4 MiB")
            self._data.append(value)
        elif name == "event":
            self._name = value
