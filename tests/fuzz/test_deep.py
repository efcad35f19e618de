"""Deep fuzzing inside ``make test``: every ``fuzz/targets.py`` target under hypothesis with
a large example count, seeded from the repo corpus (``fuzz/corpus/<target>/``).

Each target lets only its module's error escape (or none at all, for the state machines),
so a failure here is a finding: fix it, and add a regression test whose docstring names the
bug. The same targets run coverage-guided under atheris in ``make fuzz`` (``fuzz/run.py``).

Budget: about 25 s for the whole file on one core (inputs are made in batches: ``BATCH``). ``HYPOTHESIS_PROFILE=deep`` multiplies
every example count by 10 for a longer session.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "fuzz" / "corpus"
SCALE = 10 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 1


def _load_targets() -> ModuleType:
    # fuzz/ is a directory of scripts, not a package on sys.path: load targets.py by path.
    spec = importlib.util.spec_from_file_location("fuzz_targets", REPO / "fuzz" / "targets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


targets = _load_targets()
TARGETS = targets.TARGETS
SEEDS: dict[str, list[bytes]] = {
    name: [p.read_bytes() for p in sorted((CORPUS / name).iterdir())] for name in TARGETS
}

# Examples per target, sized by what one run of the target costs (the DTLS state machines
# do real ECDHE/ECDSA work per input) so the file stays inside its budget.
EXAMPLES = {
    "stun": 2000,
    "ufrag": 2000,
    "proxy": 2000,
    "proxy_stream": 2000,
    "rtp": 2000,
    "sdp": 1000,
    "dtls_parsers": 2000,
    "dtls_server": 1000,
    "dtls_client": 1000,
    "dtls_handshake": 200,
    "dtls13_parsers": 2000,
    "dtls13_server": 300,
    "dtls13_client": 300,
    "dtls13_handshake": 100,
    "tls_records": 2000,
    "ice": 1000,
    "relay": 1000,
    "sctp": 300,
    "realtime": 500,
    "live": 400,
    "framing": 2000,
    "sse": 2000,
    "vouch": 2000,
    "sip": 1000,
    "sip_stream": 1000,
    "sip_endpoint": 300,
    "sdp_phone": 1000,
    "turn": 500,
    "turn_parsers": 2000,
    "relay_turn": 500,
}

_TOKENS = [b"\r\n", b":", b" ", b"/", b"=", b"\x00", b"\xff", b"999999", b"\x80\x28", b"\xfe\xfd"]
_INTS = [0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0xFFFFFFFF]

#: Inputs per hypothesis example. Drawn from hypothesis one edit at a time, an input cost
#: ~1.3 ms of generation against 15-50 µs in the target (95 % of the file's time was
#: hypothesis, 2026-12-05: the file took ~50 s on a quiet core, twice its budget); drawn
#: from a ``random.Random`` that hypothesis seeds, ~20 µs. Hypothesis then shrinks the
#: seed, not the edits, so a finding is reported with its exact input instead.
BATCH = 50


def mutated(rng: random.Random, pool: list[bytes]) -> bytes:
    """A corpus seed with up to 8 edits: flips, sets, inserts, deletes, splices, duplicates,
    interesting integers."""
    data = bytearray(rng.choice(pool))
    for _ in range(rng.randint(0, 8)):
        op = rng.randint(0, 6)
        i = rng.randint(0, len(data))
        if op == 0 and data:
            data[min(i, len(data) - 1)] ^= 1 << rng.randint(0, 7)
        elif op == 1 and data:
            data[min(i, len(data) - 1)] = rng.randint(0, 255)
        elif op == 2:
            data[i:i] = (rng.choice(_TOKENS) if rng.random() < 0.5
                         else rng.randbytes(rng.randint(1, 8)))
        elif op == 3:
            del data[i : i + rng.randint(1, 32)]
        elif op == 4:
            other = rng.choice(pool)
            a = rng.randint(0, len(other))
            data[i:i] = other[a : a + rng.randint(1, 64)]
        elif op == 5:
            width = rng.choice((1, 2, 4))
            value = rng.choice(_INTS)
            data[i : i + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "big")
        elif data:
            a = rng.randint(0, len(data) - 1)
            data[i:i] = data[a : a + rng.randint(1, 64)]
    return bytes(data)


def _input(rng: random.Random, pool: list[bytes]) -> bytes:
    """Half corpus mutations, half raw bytes (short ones more often, as hypothesis did)."""
    if rng.random() < 0.5:
        return mutated(rng, pool)
    return rng.randbytes(rng.choice((rng.randint(0, 16), rng.randint(0, 600))))


def _deep_test(name: str) -> Callable[..., None]:
    @settings(
        max_examples=max(1, EXAMPLES[name] * SCALE // BATCH),
        deadline=None,
        database=None,  # a finding is reported with its bytes; no cross-run state
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(seed=st.integers(0, 2**64 - 1))
    def test(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(BATCH):
            data = _input(rng, SEEDS[name])
            try:
                TARGETS[name](data)
            except Exception as exc:
                raise AssertionError(f"{name} target failed on {data!r}") from exc

    test.__name__ = f"test_deep_{name}"
    test.__doc__ = f"{EXAMPLES[name]} corpus-seeded mutations of the {name!r} target."
    return test


for _name in TARGETS:
    globals()[f"test_deep_{_name}"] = _deep_test(_name)


def test_every_target_has_seeds() -> None:
    assert set(SEEDS) == set(TARGETS)
    assert all(SEEDS.values()), [n for n, s in SEEDS.items() if not s]


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_seeds_and_every_truncation(name: str) -> None:
    """Every seed whole, then cut byte by byte (STYLE.md rule 10: whole and byte-at-a-time).
    Seeds longer than 1500 bytes are cut at a stride, to keep the budget."""
    if name == "dtls_handshake":
        # Its input is a list of edits, not a message: truncation is just fewer edits.
        for seed in SEEDS[name]:
            TARGETS[name](seed)
        return
    for seed in SEEDS[name]:
        step = 1 if len(seed) <= 1500 else len(seed) // 500
        for n in range(0, len(seed) + 1, step):
            TARGETS[name](seed[:n])
        TARGETS[name](seed)
