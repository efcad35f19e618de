"""The table of Chromium's ``getStats()`` spellings (tests/peers.py) covers every tested
Chromium version: each observed spelling names exactly its SRTP profile, and the spellings
the interop tests accept are those and no others. Runs without a browser, so the table is
checked for the versions this machine does not have installed."""

from __future__ import annotations

import pytest
from peers import (
    CHROMIUM_MIN,
    CHROMIUM_SRTP_NAMES,
    CHROMIUM_SRTP_SPELLINGS,
    CHROMIUM_TESTED,
    srtp_profile_named,
)

from appliance.proto.srtp import DEFAULT_SRTP_PROFILES, SrtpProfile


def test_every_tested_version_has_a_row() -> None:
    assert sorted(CHROMIUM_SRTP_SPELLINGS) == sorted(CHROMIUM_TESTED)
    assert min(CHROMIUM_TESTED) == CHROMIUM_MIN


@pytest.mark.parametrize("major", CHROMIUM_TESTED)
def test_each_version_names_each_profile(major: int) -> None:
    row = CHROMIUM_SRTP_SPELLINGS[major]
    # Every profile we negotiate with browsers has a spelling in every version.
    assert set(DEFAULT_SRTP_PROFILES) <= set(row)
    for profile, name in row.items():
        assert srtp_profile_named(name) is profile
        assert name in CHROMIUM_SRTP_NAMES[profile]


@pytest.mark.parametrize(("name", "profile"), [
    ("AES_CM_128_HMAC_SHA1_80", SrtpProfile.AES128_CM_HMAC_SHA1_80),  # Chromium 150
    ("AEAD_AES_128_GCM", SrtpProfile.AEAD_AES_128_GCM),  # Chromium 150
    ("SRTP_AES128_CM_HMAC_SHA1_80", SrtpProfile.AES128_CM_HMAC_SHA1_80),  # Chromium 156
    ("SRTP_AEAD_AES_128_GCM", SrtpProfile.AEAD_AES_128_GCM),  # Chromium 156
])
def test_the_spellings_from_the_issue(name: str, profile: SrtpProfile) -> None:
    assert srtp_profile_named(name) is profile


def test_other_names_are_not_accepted() -> None:
    # A profile we did not negotiate, or a misspelling, must not pass the interop assertion.
    for name in ("SRTP_AES128_CM_HMAC_SHA1_32", "AES_CM_128_HMAC_SHA1_32", "", "aead_aes_128_gcm"):
        assert srtp_profile_named(name) is None
    spellings = [n for names in CHROMIUM_SRTP_NAMES.values() for n in names]
    assert len(spellings) == len(set(spellings))  # no spelling names two profiles
