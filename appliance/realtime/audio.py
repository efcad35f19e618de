"""Audio conversions between the appliance (48 kHz mono PCM16) and the Realtime and
GPT-Live APIs' formats (``audio/pcm`` at 24 kHz — and 16 kHz on GPT-Live —, ``audio/pcmu``,
``audio/pcma`` at 8 kHz, ITU-T G.711), on the appliance's one resampler and G.711 tables
(appliance/audio/).

Only the paths the event protocols need: ``input_audio_buffer.append`` and
``session.input_audio.append`` (and an item's ``input_audio``) decode into the appliance's
rate; ``conversation.item.retrieve`` and the WebSocket sessions' output audio encode from
it. Each event's audio is converted whole, with no filter state
kept between events (a 20 ms piece meets silence at its ends): delay-compensated, exactly
``n·dst/src`` samples long, the 8 kHz formats through the telephone low-pass the G.711 legs
use. Against a stream resampled in one piece, 20 ms pieces converted one by one come out
at 49 dB SNR for 24 -> 48 kHz and 45 dB for 48 -> 8 kHz (the linear interpolation and
6-sample mean this replaced: 25 and 14 dB).
"""

from __future__ import annotations

import numpy as np

from ..audio import g711
from ..audio.resample import TELEPHONE, resample

RATE = 48_000
PCM_RATE = 24_000  # audio/pcm
LIVE_PCM_RATE = 16_000  # GPT-Live's audio/pcm may also be 16 kHz
_G711 = {"audio/pcmu": "pcmu", "audio/pcma": "pcma"}


def _even(pcm: bytes) -> bytes:
    return pcm[: len(pcm) & ~1]


def pcm24k_to_48k(pcm: bytes) -> bytes:
    return resample(_even(pcm), PCM_RATE, RATE)


def pcm48k_to_24k(pcm: bytes) -> bytes:
    return resample(_even(pcm), RATE, PCM_RATE)


def pcm16k_to_48k(pcm: bytes) -> bytes:
    """GPT-Live's ``audio/pcm`` at 16 kHz (its WebSocket takes 16 or 24 kHz)."""
    return resample(_even(pcm), LIVE_PCM_RATE, RATE)


def pcm48k_to_16k(pcm: bytes) -> bytes:
    """48 kHz PCM16 -> 16 kHz (a trailing part of an output sample is dropped)."""
    return resample(_even(pcm), RATE, LIVE_PCM_RATE)


def g711_to_48k(data: bytes, *, alaw: bool) -> bytes:
    pcm8k = g711.decode("pcma" if alaw else "pcmu", data).astype("<i2").tobytes()
    return resample(pcm8k, g711.RATE, RATE, TELEPHONE)


def g711_from_48k(pcm: bytes, *, alaw: bool) -> bytes:
    pcm8k = np.frombuffer(resample(_even(pcm), RATE, g711.RATE, TELEPHONE), "<i2")
    return g711.encode("pcma" if alaw else "pcmu", pcm8k)


def to_48k(data: bytes, fmt: str) -> bytes:
    """Decode appended audio in the session's input format to the appliance's PCM."""
    law = _G711.get(fmt)
    if law is not None:
        return g711_to_48k(data, alaw=law == "pcma")
    return pcm24k_to_48k(data)


def from_48k(pcm: bytes, fmt: str) -> bytes:
    """Encode the appliance's PCM in the session's output format (``response.output_audio
    .delta`` on a WebSocket session)."""
    law = _G711.get(fmt)
    if law is not None:
        return g711_from_48k(pcm, alaw=law == "pcma")
    return pcm48k_to_24k(pcm)


def seconds(pcm48k: bytes | int) -> float:
    n = pcm48k if isinstance(pcm48k, int) else len(pcm48k)
    return n / 2 / RATE
