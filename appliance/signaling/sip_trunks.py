"""``--sip-trunks FILE``: the SIP trunks outbound calls go through (docs/sip.md "Outbound
calls").

A TOML (``.toml``) or JSON (any other name) file with one table per trunk::

    [trunks.twilio]
    host = "example.pstn.twilio.com"   # name or address of the trunk's SIP edge
    port = 5061                        # default 5060 (udp/tcp) / 5061 (tls)
    transport = "tls"                  # udp | tcp | tls (default udp)
    from_user = "+15551234567"         # our caller id, the From user part
    from_domain = "example.pstn.twilio.com"  # default: host
    username = "appliance"             # digest user (RFC 8760 / 2617), optional
    password_env = "TWILIO_SIP_PASSWORD"  # or password_file = "...", or password = "..."
    realm = "sip.twilio.com"           # answer only this realm's challenges (optional)
    srtp = true                        # offer RTP/SAVP with SDES keys (default false)
    agent = "realtime"                 # default agent for calls through it (optional)
    ring_timeout = 45                  # seconds without an answer before we give up
    tls_verify = true                  # check the trunk's certificate (default true)
    tls_ca = "/etc/ssl/trunk-ca.pem"   # a CA file instead of the system's (optional)

The password never appears in a ``repr``, a log line or an error message: errors name the
trunk and the key, never a value read from the file or the environment.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..proto.sip import Credentials

TRANSPORTS = ("udp", "tcp", "tls")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_HOST = re.compile(r"[A-Za-z0-9.:\[\]-]{1,253}")
_USER = re.compile(r"[A-Za-z0-9+._~!$&'()*,;=%-]{1,64}")
_KEYS = frozenset({"host", "port", "transport", "from_user", "from_domain", "username",
                   "password", "password_env", "password_file", "realm", "srtp", "agent",
                   "ring_timeout", "tls_verify", "tls_ca"})


class TrunkError(ValueError):
    """The trunks file is unusable; the message names the trunk and key, never a secret."""


@dataclass(frozen=True, slots=True)
class Trunk:
    name: str
    host: str
    port: int = 5060
    transport: str = "udp"
    from_user: str = "appliance"
    from_domain: str = ""
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    realm: str | None = None
    srtp: bool = False
    agent: str | None = None
    ring_timeout: float = 60.0
    tls_verify: bool = True
    tls_ca: str | None = None

    def __str__(self) -> str:
        return f"Trunk({self.name!r}, {self.transport}:{self.host}:{self.port})"

    @property
    def credentials(self) -> Credentials | None:
        if self.username is None or self.password is None:
            return None
        return Credentials(self.username, self.password, self.realm)

    @property
    def from_uri(self) -> str:
        return f"sip:{self.from_user}@{self.from_domain or self.host}"

    def target_uri(self, to: str) -> str:
        """``to`` as a Request-URI: a SIP/SIPS/tel URI is kept; a bare number or user
        (``+15551234567``) goes to this trunk's host."""
        if ":" in to.split("@", 1)[0] and to.split(":", 1)[0].lower() in ("sip", "sips", "tel"):
            if to.lower().startswith("tel:"):
                return f"sip:{to[4:]}@{self.host};user=phone"
            return to
        if not _USER.fullmatch(to):
            raise TrunkError("'to' must be a sip:/tel: URI or a number / user part")
        host = self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        default = 5061 if self.transport == "tls" else 5060
        port = f":{self.port}" if self.port != default else ""
        tp = f";transport={self.transport}" if self.transport != "udp" else ""
        return f"sip:{to}@{host}{port}{tp}"


def _str(name: str, d: Mapping[str, Any], key: str, pattern: re.Pattern[str] | None = None
         ) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v or (pattern is not None and not pattern.fullmatch(v)):
        raise TrunkError(f"trunk {name!r}: {key} must be a valid string")
    return v


def _password(name: str, d: Mapping[str, Any], base: Path, env: Mapping[str, str]) -> str | None:
    given = [k for k in ("password", "password_env", "password_file") if k in d]
    if len(given) > 1:
        raise TrunkError(f"trunk {name!r}: give one of password, password_env, password_file")
    if not given:
        return None
    key = given[0]
    v = d[key]
    if not isinstance(v, str) or not v:
        raise TrunkError(f"trunk {name!r}: {key} must be a non-empty string")
    if key == "password":
        return v
    if key == "password_env":
        got = env.get(v)
        if not got:
            raise TrunkError(f"trunk {name!r}: environment variable {v!r} is not set")
        return got
    path = Path(v) if Path(v).is_absolute() else base / v
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        raise TrunkError(f"trunk {name!r}: password_file {str(path)!r} cannot be read") from None
    if not text:
        raise TrunkError(f"trunk {name!r}: password_file {str(path)!r} is empty")
    return text


def parse_trunks(data: Mapping[str, Any], *, base: Path = Path("."),
                 env: Mapping[str, str] | None = None) -> dict[str, Trunk]:
    """The trunks of an already-decoded file (``{"trunks": {name: {...}}}``)."""
    env = os.environ if env is None else env
    table = data.get("trunks")
    if not isinstance(table, Mapping) or not table:
        raise TrunkError("the trunks file needs a 'trunks' table with at least one trunk")
    out: dict[str, Trunk] = {}
    for name, d in table.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise TrunkError("trunk names are 1..64 letters, digits, '_', '.', '-'")
        if not isinstance(d, Mapping):
            raise TrunkError(f"trunk {name!r} must be a table")
        unknown = sorted(set(d) - _KEYS)
        if unknown:
            raise TrunkError(f"trunk {name!r}: unknown keys {', '.join(map(repr, unknown))}")
        host = _str(name, d, "host", _HOST)
        if host is None:
            raise TrunkError(f"trunk {name!r}: host is required")
        transport = (_str(name, d, "transport") or "udp").lower()
        if transport not in TRANSPORTS:
            raise TrunkError(f"trunk {name!r}: transport must be udp, tcp or tls")
        port = d.get("port", 5061 if transport == "tls" else 5060)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise TrunkError(f"trunk {name!r}: port must be 1..65535")
        ring = d.get("ring_timeout", 60.0)
        if isinstance(ring, bool) or not isinstance(ring, int | float) or not 1 <= ring <= 600:
            raise TrunkError(f"trunk {name!r}: ring_timeout must be 1..600 seconds")
        for flag in ("srtp", "tls_verify"):
            if flag in d and not isinstance(d[flag], bool):
                raise TrunkError(f"trunk {name!r}: {flag} must be true or false")
        username = _str(name, d, "username", _USER)
        password = _password(name, d, base, env)
        if (username is None) != (password is None):
            raise TrunkError(f"trunk {name!r}: username and a password go together")
        out[name] = Trunk(
            name=name, host=host, port=port, transport=transport,
            from_user=_str(name, d, "from_user", _USER) or "appliance",
            from_domain=_str(name, d, "from_domain", _HOST) or host,
            username=username, password=password, realm=_str(name, d, "realm"),
            srtp=bool(d.get("srtp", False)), agent=_str(name, d, "agent"),
            ring_timeout=float(ring), tls_verify=bool(d.get("tls_verify", True)),
            tls_ca=_str(name, d, "tls_ca"))
    return out


def load_trunks(path: str | Path, *, env: Mapping[str, str] | None = None) -> dict[str, Trunk]:
    """Read ``--sip-trunks FILE`` (TOML when it ends in ``.toml``, else JSON)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError:
        raise TrunkError(f"--sip-trunks {str(p)!r} cannot be read") from None
    try:
        data = tomllib.loads(raw.decode("utf-8")) if p.suffix == ".toml" else json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        # no detail from the decoder: its message quotes the offending line (a password?)
        raise TrunkError(f"--sip-trunks {str(p)!r} is not valid "
                         f"{'TOML' if p.suffix == '.toml' else 'JSON'}") from None
    if not isinstance(data, Mapping):
        raise TrunkError(f"--sip-trunks {str(p)!r}: the top level must be an object")
    return parse_trunks(data, base=p.parent, env=env)
