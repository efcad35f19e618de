"""The independent peers the suite drives for real — Chromium, OpenSSL, aiortc, redis-server —
found in one place, with the versions the pytest report header prints (tests/conftest.py), so
a red run on another machine says what it ran against.

Chromium: ``$APPLIANCE_CHROMIUM`` if set (any Chromium binary, e.g. an older Debian build
unpacked with ``dpkg-deb -x`` to test against it), else ``chromium`` on ``PATH`` (Debian's
package, ``make sysdeps`` installs it). The suite is known to work with Debian's Chromium
:data:`CHROMIUM_TESTED` majors; where those versions spell a ``getStats()`` value
differently, the interop tests accept every spelling in the tables below.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import shutil
import subprocess

import pytest

from appliance.proto.srtp import SrtpProfile

CHROMIUM_ENV = "APPLIANCE_CHROMIUM"
#: Chromium majors the whole suite has been run against (Debian bookworm's 150 and 156).
CHROMIUM_TESTED = (150, 156)
#: ``make sysdeps`` upgrades an installed Chromium older than this (see the Makefile).
CHROMIUM_MIN = CHROMIUM_TESTED[0]

# RTCTransportStats.srtpCipher (W3C webrtc-stats, RTCTransportStats) is "the descriptive name
# of the protection profile", a name the stats spec leaves to the implementation. RFC 5764
# §4.1.2 and RFC 7714 §14.2 register "SRTP_AES128_CM_HMAC_SHA1_80" / "SRTP_AEAD_AES_128_GCM";
# Chromium 150 reports libsrtp-style names instead. Observed on Debian's 150.0.7871.100 and
# 156.0.8078.114 (every profile x suite of tests/interop/test_dtls_chromium.py); dtlsCipher
# (the IANA suite name) and tlsVersion ("FEFD") are the same in both.
CHROMIUM_SRTP_SPELLINGS: dict[int, dict[SrtpProfile, str]] = {
    150: {
        SrtpProfile.AES128_CM_HMAC_SHA1_80: "AES_CM_128_HMAC_SHA1_80",
        SrtpProfile.AEAD_AES_128_GCM: "AEAD_AES_128_GCM",
        SrtpProfile.AEAD_AES_256_GCM: "AEAD_AES_256_GCM",
    },
    156: {
        SrtpProfile.AES128_CM_HMAC_SHA1_80: "SRTP_AES128_CM_HMAC_SHA1_80",
        SrtpProfile.AEAD_AES_128_GCM: "SRTP_AEAD_AES_128_GCM",
        SrtpProfile.AEAD_AES_256_GCM: "SRTP_AEAD_AES_256_GCM",
    },
}
#: Every spelling any tested Chromium uses for each profile: what the interop tests accept.
CHROMIUM_SRTP_NAMES: dict[SrtpProfile, frozenset[str]] = {
    profile: frozenset(names[profile] for names in CHROMIUM_SRTP_SPELLINGS.values())
    for profile in CHROMIUM_SRTP_SPELLINGS[CHROMIUM_TESTED[-1]]
}


def srtp_profile_named(name: str) -> SrtpProfile | None:
    """The profile a Chromium ``srtpCipher`` value names, in any supported spelling."""
    for profile, names in CHROMIUM_SRTP_NAMES.items():
        if name in names:
            return profile
    return None


def chromium_path() -> str | None:
    """The Chromium binary the browser and interop tests launch, or None if there is none."""
    env = os.environ.get(CHROMIUM_ENV)
    if env:
        return env
    return shutil.which("chromium")


def chromium_executable() -> str:
    """:func:`chromium_path`, or fail the test saying how to get one."""
    path = chromium_path()
    if path is None or not os.access(path, os.X_OK):
        pytest.fail(f"no Chromium ({path or 'chromium not on PATH'}): `make sysdeps` installs "
                    f"Debian's chromium, or set ${CHROMIUM_ENV} to a Chromium binary")
    return path


def _run_version(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # Debian's /usr/bin/chromium wrapper may print shell noise on stderr; stdout has the line.
    text = out.stdout.strip() or out.stderr.strip()
    return text.splitlines()[0].strip() if text else None


@functools.cache
def chromium_version() -> str | None:
    """``"150.0.7871.100"`` for the Chromium :func:`chromium_path` finds, else None."""
    path = chromium_path()
    line = _run_version([path, "--version"]) if path else None
    m = re.search(r"(\d+)\.(\d+)\.(\d+)\.(\d+)", line or "")
    return m.group(0) if m else None


def chromium_major() -> int | None:
    version = chromium_version()
    return int(version.split(".")[0]) if version else None


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def peer_versions() -> dict[str, str]:
    """What each external peer is on this machine (for the report header)."""
    chromium = chromium_version()
    path = chromium_path()
    if chromium is None:
        chromium_text = f"not found ({path or 'chromium not on PATH'})"
    else:
        major = int(chromium.split(".")[0])
        tested = "" if major in CHROMIUM_TESTED else (
            f"; the suite is known to work with {', '.join(map(str, CHROMIUM_TESTED))}")
        chromium_text = f"{chromium} ({path}{tested})"
    try:
        from OpenSSL import SSL

        pyopenssl = SSL.OpenSSL_version(SSL.OPENSSL_VERSION).decode()
    except ImportError:
        pyopenssl = "pyOpenSSL not installed"
    openssl_cli = shutil.which("openssl")
    redis = shutil.which("redis-server")
    redis_line = _run_version([redis, "--version"]) if redis else None
    m = re.search(r"v=(\S+)", redis_line or "")
    return {
        "Chromium": chromium_text,
        "OpenSSL": (f"{pyopenssl} (pyOpenSSL {_dist_version('pyopenssl')}); CLI: "
                    f"{_run_version([openssl_cli, 'version']) if openssl_cli else 'not found'}"),
        "aiortc": f"{_dist_version('aiortc')} (aioice {_dist_version('aioice')})",
        "redis-server": m.group(1) if m else (redis_line or "not found"),
    }
