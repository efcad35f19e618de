"""Speech in the box: voice activity, speech-to-text, text-to-speech, and the assistant.

Everything here is optional: the engines' packages come with the ``speech`` extra
(``pip install 'appliance[speech]'``) and espeak-ng is a Debian package. Importing this
package needs only numpy; an engine whose package is missing raises
:class:`~appliance.speech.vad.SpeechUnavailable` naming the extra when it is built.
See docs/speech.md.
"""

from __future__ import annotations

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

__all__ = [
    "EndOfTurnQuery", "EspeakTts", "HearingEvent", "HttpStt", "HttpTts", "PocketSphinxStt", "SileroVad",
    "SmartTurn", "SpeechUnavailable", "SttEngine", "SttError", "SttStream", "TranscriptFailed",
    "TranscriptFinal", "TranscriptPartial", "TtsEngine", "TtsError", "TurnConfig",
    "TurnDetector", "UserSpeechStarted", "UserSpeechStopped", "Vad", "WhisperStt", "make_stt", "make_tts",
    "make_vad", "transcripts",
]
