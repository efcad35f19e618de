"""Stored GPT-Live sessions (``store: true``; issue 42 item 7): the recording and the
conversation a session leaves behind, for ``GET /v1/live/sessions/{id}/content`` and for
forks. Both live in the one recordings directory every call uses (appliance/recordings.py:
its quota, its retention, its pruning), named by the ``live_…`` id::

    <state dir>/recordings/<id>.wav         the stereo recording, 48 kHz (L in, R out):
                                            a WebRTC call's by its transceiver's recorder,
                                            a WebSocket session's by socket.py, with the
                                            same writer (transceiver/recording.py)
    <state dir>/recordings/<id>.live.json   what a fork needs (connection.py ``stored()``):
                                            {"id", "session": the config as given,
                                             "conversation": session.input items}

The ``.live.json`` ends in ``.json``, so retention prunes it with its WAV and the quota
counts it. The content route serves the WAV as GPT-Live's spec says it is: 24 kHz stereo,
resampled here (appliance/audio/resample.py) from the 48 kHz file.

Blocking file I/O: the shells call these through ``trio.to_thread``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from .. import recordings
from ..audio.resample import resample
from ..transceiver.recording import wav_header

SUFFIX = ".live.json"
CONTENT_RATE = 24000  # what GET …/content serves (the spec: 24 kHz stereo)
_WAV_HEADER = 44
#: The SDK's session id pattern (``^live_[A-Za-z0-9_-]{1,128}$``).
_ID = re.compile(r"live_[A-Za-z0-9_-]{1,128}")


class NotStored(LookupError):
    """No stored session (or recording) by that id; ``in_progress``: it is still being
    written (the session has not ended, or its recording is being finalised)."""

    def __init__(self, message: str, *, in_progress: bool = False) -> None:
        super().__init__(message)
        self.in_progress = in_progress


def valid_id(session_id: str) -> bool:
    return _ID.fullmatch(session_id) is not None and recordings.safe_id(session_id)


def conversation_path(directory: Path, session_id: str) -> Path:
    if not valid_id(session_id):
        raise ValueError(f"{session_id!r} is not a Live session id")
    return directory / f"{session_id}{SUFFIX}"


def save(directory: Path, record: dict[str, Any]) -> None:
    """Keep a stored session's ``record`` (connection.py ``stored()``); replaces the file
    whole, so a reader never sees half of it."""
    path = conversation_path(directory, record["id"])
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, separators=(",", ":"))
    os.replace(tmp, path)


def load(directory: Path | None, session_id: str) -> dict[str, Any]:
    """The stored session ``session_id`` (to fork it). Raises :class:`NotStored`."""
    if directory is None or not valid_id(session_id):
        raise NotStored(f"No stored session '{session_id}'.")
    data = recordings.read_meta(conversation_path(directory, session_id))
    if (data is None or not isinstance(data.get("session"), dict)
            or not isinstance(data.get("conversation"), list)):
        raise NotStored(f"No stored session '{session_id}': it did not run with "
                        "store: true, has not ended, or passed the retention period.")
    return data


def content(directory: Path | None, session_id: str) -> bytes:
    """The recording of ``session_id`` as served: a WAV, 24 kHz stereo PCM16, L = input,
    R = output. Raises :class:`NotStored`."""
    if directory is None or not valid_id(session_id):
        raise NotStored(f"No recording of session '{session_id}'.")
    try:
        with recordings.open_finished(directory, session_id) as f:
            raw = f.read()
    except recordings.Unfinished as exc:
        if exc.in_progress:
            raise NotStored(f"The recording of session '{session_id}' is still being "
                            "written.", in_progress=True) from None
        raise NotStored(f"No recording of session '{session_id}': it did not run with "
                        "store: true, or its recording passed the retention period."
                        ) from None
    return to_content(raw)


def to_content(wav: bytes) -> bytes:
    """A recording (our own 48 kHz stereo WAV: a 44-byte header, then samples) as 24 kHz
    stereo: each channel resampled on its own."""
    samples = np.frombuffer(wav[_WAV_HEADER : len(wav) - (len(wav) - _WAV_HEADER) % 4], "<i2")
    stereo = samples.reshape(-1, 2)
    channels = [np.frombuffer(resample(np.ascontiguousarray(stereo[:, c]).tobytes(),
                                       48000, CONTENT_RATE), "<i2") for c in (0, 1)]
    n = min(len(c) for c in channels)
    out = np.empty((n, 2), np.int16)
    out[:, 0], out[:, 1] = channels[0][:n], channels[1][:n]
    data = out.tobytes()
    return wav_header(len(data), CONTENT_RATE) + data
