"""Speech in the box: voice activity, speech-to-text, text-to-speech, and the assistant.

Everything here is optional: the engines' packages come with the ``speech`` extra
(``pip install 'appliance[speech]'``) and espeak-ng is a Debian package. Importing this
package needs only numpy; an engine whose package is missing raises
:class:`~appliance.speech.vad.SpeechUnavailable` naming the extra when it is built.
See docs/speech.md.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers; at run time they load on first use
    from .endpoint import SmartTurn
    from .listen import (
        HearingEvent,
        TranscriptFailed,
        TranscriptFinal,
        TranscriptPartial,
        UserSpeechStarted,
        UserSpeechStopped,
        transcripts,
    )
    from .stt import (
        HttpStt,
        PocketSphinxStt,
        SttEngine,
        SttError,
        SttStream,
        WhisperStt,
        make_stt,
    )
    from .tts import EspeakTts, HttpTts, TtsEngine, TtsError, make_tts
    from .vad import (
        EndOfTurnQuery,
        SileroVad,
        SpeechUnavailable,
        TurnConfig,
        TurnDetector,
        Vad,
        make_vad,
    )

#: Where each exported name lives. Loaded lazily (PEP 562), so importing one sans-IO piece
#: (``appliance.speech.vad``'s turn engine, which the Realtime machine uses) does not pull
#: the trio shells (listen.py) and engines in with the package.
_WHERE = {
    "SmartTurn": "endpoint",
    **dict.fromkeys(("HearingEvent", "TranscriptFailed", "TranscriptFinal",
                     "TranscriptPartial", "UserSpeechStarted", "UserSpeechStopped",
                     "transcripts"), "listen"),
    **dict.fromkeys(("HttpStt", "PocketSphinxStt", "SttEngine", "SttError", "SttStream",
                     "WhisperStt", "make_stt"), "stt"),
    **dict.fromkeys(("EspeakTts", "HttpTts", "TtsEngine", "TtsError", "make_tts"), "tts"),
    **dict.fromkeys(("EndOfTurnQuery", "SileroVad", "SpeechUnavailable", "TurnConfig",
                     "TurnDetector", "Vad", "make_vad"), "vad"),
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{where}"), name)


__all__ = [
    "EndOfTurnQuery", "EspeakTts", "HearingEvent", "HttpStt", "HttpTts", "PocketSphinxStt",
    "SileroVad", "SmartTurn", "SpeechUnavailable", "SttEngine", "SttError", "SttStream",
    "TranscriptFailed", "TranscriptFinal", "TranscriptPartial", "TtsEngine", "TtsError",
    "TurnConfig", "TurnDetector", "UserSpeechStarted", "UserSpeechStopped", "Vad",
    "WhisperStt", "make_stt", "make_tts", "make_vad", "transcripts",
]
