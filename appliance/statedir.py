"""The state directory and the routing secret in it.

The state directory holds what must survive a restart: the routing secret (so ufrags minted
before a restart stay valid), the control sockets of ``appliance up``, and a self-signed
certificate (``--tls self-signed``, signaling/options.py). Used by the supervisor and by
the signaling options, which is why it is neither's.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from .proto.ufrag import load_secrets

# Only `appliance up` makes the secret: these lines keep the logger name they had when this
# code lived in supervisor.py (log filters key on it).
log = logging.getLogger("appliance.supervisor")

SECRET_NAME = "routing.secret"


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/appliance`` when XDG_STATE_HOME is set, else ``./.appliance-state``."""
    xdg = os.environ.get("XDG_STATE_HOME")
    return Path(xdg) / "appliance" if xdg else Path(".appliance-state")


def ensure_state_dir(path: str | Path) -> Path:
    d = Path(path).resolve()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def ensure_secret(state_dir: str | Path) -> Path:
    """The routing secret file, created on first start (32 random bytes, hex, mode 0600)."""
    d = ensure_state_dir(state_dir)
    path = d / SECRET_NAME
    try:
        # O_EXCL: two supervisors starting at once cannot both write (one reuses the other's).
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            log.warning("routing secret %s was mode %o; tightening to 600", path, mode)
            os.chmod(path, 0o600)
        load_secrets(path.read_bytes())  # raises ValueError on an empty/garbled file
        return path
    with os.fdopen(fd, "w") as f:
        f.write("# appliance routing secret: shared by signaling, relays and transceivers\n")
        f.write(secrets.token_hex(32) + "\n")
    os.chmod(path, 0o600)  # whatever the umask did
    log.info("generated routing secret %s", path)
    return path
