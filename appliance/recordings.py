"""The recordings directory, shared by the transceivers that write calls into it and the
signaling process that serves them (``GET /v1/realtime/calls/{call_id}/recording``): file
names, the quota's usage count, retention pruning, and the flags' value parsers. Neither
shell's, so both import it (docs/architecture.md, "Where things go").

Layout (docs/recordings.md)::

    <state dir>/recordings/<call id>.wav.part   being written (served as "in progress")
    <state dir>/recordings/<call id>.wav        complete: stereo PCM16 48 kHz, L caller, R agent
    <state dir>/recordings/<call id>.json       its metadata, written when the WAV completes
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RECORDINGS_DIR = "recordings"
SUFFIX = ".wav"
PART = ".wav.part"
META = ".json"
#: A call id that may name a file: what signaling mints (``rtc_…``, uuids) and nothing with
#: a path separator, a leading dot or anything outside ASCII letters, digits, ``_ - .``.
_SAFE_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")
DEFAULT_QUOTA = 1 << 30  # 1 GiB
DEFAULT_RETENTION = 7 * 86400.0  # a week


def safe_id(call_id: str) -> bool:
    return _SAFE_ID.fullmatch(call_id) is not None and ".." not in call_id


def paths(directory: Path, call_id: str) -> tuple[Path, Path, Path]:
    """(complete WAV, in-progress WAV, metadata) of ``call_id`` (already :func:`safe_id`)."""
    if not safe_id(call_id):
        raise ValueError(f"{call_id!r} cannot name a recording")
    return (directory / f"{call_id}{SUFFIX}", directory / f"{call_id}{PART}",
            directory / f"{call_id}{META}")


class Unfinished(LookupError):
    """No complete recording to serve: ``in_progress`` when its part is still being
    written, else none was made (or retention removed it)."""

    def __init__(self, in_progress: bool) -> None:
        super().__init__("in progress" if in_progress else "no recording")
        self.in_progress = in_progress


def open_finished(directory: Path, call_id: str) -> io.BufferedReader:
    """The complete recording of ``call_id`` (already :func:`safe_id`), opened for reading,
    or :class:`Unfinished`. The writer renames the part to the final name, so a missing
    final file and then a missing part means it finished between the two looks: the
    final name is looked at again (the realtime route and the Live store both serve
    recordings through this)."""
    final, part, _ = paths(directory, call_id)
    try:
        return open(final, "rb")
    except FileNotFoundError:
        if part.exists():
            raise Unfinished(True) from None
    try:
        return open(final, "rb")
    except FileNotFoundError:
        raise Unfinished(False) from None


def usage(directory: Path) -> int:
    """Bytes of every recording file in ``directory`` (complete, in progress, metadata)."""
    total = 0
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.name.endswith((SUFFIX, PART, META)):
                    try:
                        total += entry.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:
                        pass  # pruned or renamed meanwhile
    except FileNotFoundError:
        return 0
    return total


def prune(directory: Path, retention: float, *, now: float | None = None) -> int:
    """Delete the complete recordings (and their metadata) last changed more than
    ``retention`` seconds ago, and in-progress files older than that too (a transceiver
    that died mid-call). Returns how many files went. Several processes may prune at once:
    a file another one removed first is skipped."""
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    for entry in entries:
        if not entry.name.endswith((SUFFIX, PART, META)):
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime <= retention:
                continue
            os.unlink(entry.path)
            removed += 1
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("recordings: could not prune %s: %s", entry.name, exc.strerror)
    if removed:
        log.info("recordings: pruned %d file(s) older than %g s", removed, retention)
    return removed


def read_meta(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
               "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
               "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
_TIME_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0,
               "w": 7 * 86400.0}
_NUM_UNIT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")


def parse_size(text: str) -> int:
    """``--recording-quota``: bytes, or with a unit (``500M``, ``2G``; powers of 1024)."""
    m = _NUM_UNIT.fullmatch(str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _SIZE_UNITS:
        raise ValueError(f"--recording-quota {text!r}: a size such as 500M or 2G")
    value = int(float(m.group(1)) * _SIZE_UNITS[unit])
    if value < 1:
        raise ValueError("--recording-quota must be at least one byte")
    return value


def parse_duration(text: str) -> float:
    """``--recording-retention``: seconds, or with a unit (``90m``, ``12h``, ``7d``, ``2w``)."""
    m = _NUM_UNIT.fullmatch(str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _TIME_UNITS:
        raise ValueError(f"--recording-retention {text!r}: a duration such as 12h or 7d")
    value = float(m.group(1)) * _TIME_UNITS[unit]
    if value <= 0:
        raise ValueError("--recording-retention must be positive")
    return value
