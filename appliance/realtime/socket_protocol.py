"""The seam between the WebSocket shell (ws_session.py) and the protocol object it drives,
stated here, sans-IO, so a protocol core can name it without importing the shell (trio):

    socket text ──handle_message──▶ SocketProtocol ──poll_event──▶ socket text
                                      │  ▲
                       poll_action ───┘  └── handle_delta / handle_response_end (the agent)

The Realtime machine (machine.py) is one such protocol; GPT-Live's
:class:`~appliance.live.connection.LiveConnection` is another. Their actions are the
machine's (StartResponse, CancelResponse, Transcribe, SessionUpdated, ClearAudio) plus
:class:`EndSession`; any other action goes to the shell's ``handle_action``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .interface import Delta


@dataclass(frozen=True, slots=True)
class EndSession:
    """The protocol ends the session (GPT-Live's ``session.closed`` went out): the shell
    reads no more, sends what is queued and returns ``reason``."""

    reason: str


class SocketProtocol(Protocol):
    """What the shell drives: the Realtime machine's surface towards a socket."""

    def handle_open(self) -> None: ...

    def handle_message(self, data: str | bytes) -> None: ...

    def poll_action(self) -> object | None: ...

    def poll_event(self) -> dict[str, Any] | None: ...

    def handle_delta(self, response_id: str, delta: Delta) -> bool: ...

    def handle_response_end(self, response_id: str, error: str | None = None) -> None: ...


class CallProtocol(SocketProtocol, Protocol):
    """What the call shell (agent.py :class:`~appliance.realtime.agent.RealtimeShell`)
    drives: the socket surface plus a media track's — the caller's 20 ms frames in, and the
    report that a response's audio has left the output queue. The Realtime machine is one;
    GPT-Live's WebRTC :class:`~appliance.live.connection.LiveConnection` another."""

    def handle_frame(self, pcm: bytes, speech: bool) -> None: ...

    def handle_output_drained(self, response_id: str) -> None: ...
