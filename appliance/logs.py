"""Structured logging: one event per line, text or JSON, and redaction of secrets.

ufrags, passwords, keys and client addresses go through :func:`redact` (STYLE.md rule 12):
unless debug logging is on, they print as a short stable hash, enough to correlate lines of
one session without revealing the value.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from urllib.parse import urlsplit, urlunsplit

_DEBUG = False


def redact(value: object) -> str:
    if _DEBUG:
        return str(value)
    digest = hashlib.sha256(str(value).encode()).hexdigest()[:8]
    return f"<redacted:{digest}>"


def loggable_url(spec: str) -> str:
    """An agent spec or URL for a log line: no ``user:password@``, query or fragment (where
    tokens live). Names and ``module:attr`` specs come out unchanged."""
    parts = urlsplit(spec)
    if not parts.netloc:
        return spec
    rest = "?…" if parts.query or parts.fragment else ""
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")) + rest


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            out.update(extra)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(*, level: str = "info", fmt: str = "text", role: str = "") -> None:
    """Set up the root logger for a process (call once, from a role's entry point)."""
    global _DEBUG
    _DEBUG = level.lower() == "debug"
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        prefix = f"{role} " if role else ""
        f = logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s")
        f.converter = time.gmtime
        handler.setFormatter(f)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def add_logging_flags(parser: argparse.ArgumentParser) -> None:
    """--log-level / --log-format on an argparse parser."""
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"], help="log verbosity")
    parser.add_argument("--log-format", default="text", choices=["text", "json"],
                        help="one event per line, as text or JSON")
