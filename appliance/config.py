"""Configuration: embedded defaults < TOML config file < command-line flags.

A config file is TOML with one table per role plus shared keys::

    secret_file = "/var/lib/appliance/routing.secret"   # shared by every role
    state_dir = "/var/lib/appliance"
    cluster = 0

    [up]
    http = "127.0.0.1:8080"
    udp = "0.0.0.0:3478"
    transceivers = 2
    relay_workers = 1

    opus_complexity = 5          # Opus encoder complexity 0-10 (transceivers; see below)
    dtls_versions = "1.2,1.3"    # DTLS versions the transceivers accept (see below)

    [relay]
    listen = "0.0.0.0:3478"
    transceivers = { 0 = "127.0.0.1:4000", 1 = "127.0.0.1:4001" }

``opus_complexity`` (``--opus-complexity`` of ``up`` and ``transceiver``) trades the
transceivers' CPU for audio quality; its default and the measurements behind it are in
``appliance/transceiver/opus.py`` (``DEFAULT_COMPLEXITY``) and docs/performance.md.

``dtls_versions`` (``--dtls-versions`` of ``up`` and ``transceiver``): the DTLS versions a
transceiver negotiates, a comma list of ``1.2`` and ``1.3`` (or a TOML list of them). The
default ``"1.2,1.3"`` gives DTLS 1.3 (RFC 9147) to clients that offer it and 1.2 to the rest;
docs/dtls13.md and docs/operations.md, "DTLS versions".

Every role's argparse flags default to ``None``; :func:`resolve` fills what the command line
left unset from the file, then from the role's defaults.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ConfigError(Exception):
    """The config file is missing, unreadable or not valid TOML."""


def load_config(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def resolve(
    args: argparse.Namespace, config: Mapping[str, Any], role: str, defaults: Mapping[str, Any]
) -> None:
    """Fill unset (``None``) attributes of ``args`` from ``config[role]``, then shared
    top-level config keys, then ``defaults``. Dashes in flag names are underscores here."""
    table = config.get(role, {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"[{role}] in the config file must be a table")
    for key in set(defaults) | set(vars(args)):
        if getattr(args, key, None) is not None:
            continue
        if key in table:
            setattr(args, key, table[key])
        elif key in config and not isinstance(config[key], Mapping):
            setattr(args, key, config[key])
        elif key in defaults:
            setattr(args, key, defaults[key])


#: ``--headroom`` of ``up`` and ``transceiver`` (transceiver/headroom.py, docs/operations.md
#: "What the headroom counts"): ``core`` what the transceiver's CPUs have left (issue 32, the
#: default), ``own`` only its own CPU use (a dedicated core; before issue 32).
HEADROOM_MODES = ("core", "own")


def parse_headroom(value: object) -> str:
    """``--headroom``: one of :data:`HEADROOM_MODES`."""
    mode = str(value).strip().lower()
    if mode not in HEADROOM_MODES:
        raise ValueError(f"--headroom must be one of {', '.join(HEADROOM_MODES)}, got {value!r}")
    return mode


#: The busy share of a transceiver's core up to which signaling places calls on it
#: (signaling/admission.py). 0.75 rather than 0.85 since 2026-12-06 (docs/performance.md,
#: "At fits measured in the same run"): on placements a and b the calls' p99 grew past the bench's
#: 20 ms while busy was still under 0.85. At 0.75, 16 of 18 overload rows passed, where 12
#: of 18 did at 0.85, and every row still admitted at least 57 calls of a fit of 56 (an
#: hour later, at 0.75: 13 of 18; the bursts at 25/s are still open).
ADMISSION_LIMIT = 0.75


def parse_admission_limit(value: object) -> float:
    """``--admission-limit``: the busy share of a transceiver's core up to which signaling
    places calls on it (signaling/admission.py), 0 < x <= 1."""
    try:
        x = float(str(value))
    except ValueError:
        raise ValueError(f"--admission-limit must be a number in (0, 1], got {value!r}") from None
    if not 0 < x <= 1:
        raise ValueError(f"--admission-limit must be in (0, 1], got {value!r}")
    return x


def parse_opus_complexity(value: object) -> int:
    """An Opus encoder complexity (``OPUS_SET_COMPLEXITY``: an integer 0..10), from a flag or
    the config file; ``ValueError`` naming the option otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"--opus-complexity must be an integer 0..10, got {value!r}")
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"--opus-complexity must be an integer 0..10, got {value!r}") from None
    if not 0 <= n <= 10:
        raise ValueError(f"--opus-complexity must be 0..10, got {n}")
    return n


#: What ``--dtls-versions`` defaults to: 1.3 when the client offers it, 1.2 otherwise.
DEFAULT_DTLS_VERSIONS = "1.2,1.3"


def parse_dtls_versions(value: object) -> frozenset[str]:
    """``--dtls-versions`` / ``dtls_versions``: ``"1.2,1.3"``, ``"1.2"``, ``"1.3"`` (or a TOML
    list such as ``["1.2", "1.3"]``) -> the ``versions=`` set of ``DtlsConnection``;
    ``ValueError`` naming the option otherwise."""
    # Imported here: every role reads this module, and only transceivers need proto.dtls
    # (and its cryptography import) loaded.
    from appliance.proto.dtls import parse_versions

    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        value = ",".join(value)
    if not isinstance(value, str):
        raise ValueError(f"--dtls-versions must be a comma list of 1.2 and 1.3, got {value!r}")
    try:
        return parse_versions(value)
    except ValueError:
        raise ValueError(
            f"--dtls-versions must be a comma list of 1.2 and 1.3, got {value!r}") from None


def format_dtls_versions(versions: frozenset[str]) -> str:
    """The flag spelling of a versions set, oldest first (what ``up`` passes on)."""
    return ",".join(sorted(versions))


def parse_hostport(text: str, *, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """``"1.2.3.4:5"``, ``"[::1]:5"``, ``":5"`` or ``"5"`` → (host, port)."""
    text = str(text).strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"bad address {text!r}: expected [v6]:port")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    elif text.isdigit():
        host, port = "", text
    else:
        raise ValueError(f"bad address {text!r}: expected host:port")
    try:
        portn = int(port)
    except ValueError:
        raise ValueError(f"bad port in {text!r}") from None
    if not 0 <= portn <= 65535:
        raise ValueError(f"port out of range in {text!r}")
    return (host or default_host), portn


def format_hostport(addr: tuple[str, int]) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
