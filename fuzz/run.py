#!/usr/bin/env python3
"""Run every fuzz target for a fixed budget: ``make fuzz`` (``fuzz/run.py --seconds N``).

Engines:

* ``atheris`` (default when installed): coverage-guided libFuzzer, one child process per
  target, seeded from ``fuzz/corpus/<target>/``. New inputs go to a scratch directory under
  ``test-artifacts/fuzz/`` (the repo corpus only changes when someone copies a useful input
  in on purpose); crashes are written there as ``<target>-crash-<sha1>``.
* ``random``: corpus-seeded random mutation (bit flips, byte sets, inserts, deletes, splices,
  interesting integers), pure Python, no extra dependency. Same targets, same crash files.

Usage::

    fuzz/run.py --seconds 60                  # every target, 60 s each
    fuzz/run.py --seconds 30 stun sdp         # some targets
    fuzz/run.py --engine random --seconds 10
    fuzz/run.py --replay stun FILE...         # re-run saved inputs (prints the traceback)
    fuzz/run.py --list

Exit status 1 if any target found a crash, 0 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CORPUS = HERE / "corpus"
ARTIFACTS = REPO / "test-artifacts" / "fuzz"

# targets.py's names, without importing it (the atheris child must import it instrumented).
TARGET_NAMES = (
    "stun",
    "ufrag",
    "proxy",
    "rtp",
    "sdp",
    "dtls_parsers",
    "tls_records",
    "dtls_server",
    "dtls_client",
    "dtls_handshake",
    "ice",
    "relay",
    "turn",
    "turn_parsers",
    "relay_turn",
)


def seeds(target: str) -> list[bytes]:
    directory = CORPUS / target
    return [p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()]


def have_atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


# --- atheris ----------------------------------------------------------------------------


def atheris_child(target: str, libfuzzer_args: list[str]) -> None:
    """Runs inside the child process: instrument the product code, then hand over."""
    import atheris

    sys.path.insert(0, str(HERE))
    with atheris.instrument_imports(include=["appliance", "targets"]):
        import targets
    fn = targets.TARGETS[target]
    atheris.Setup([sys.argv[0], *libfuzzer_args], fn)
    atheris.Fuzz()


def run_atheris(target: str, seconds: int) -> tuple[bool, str]:
    scratch = ARTIFACTS / "work" / target
    scratch.mkdir(parents=True, exist_ok=True)
    args = [
        str(scratch),  # libFuzzer writes new inputs to the first directory only
        str(CORPUS / target),
        f"-max_total_time={seconds}",
        f"-artifact_prefix={ARTIFACTS}/{target}-",
        "-timeout=10",  # a single input that takes 10 s is a finding (algorithmic DoS)
        "-rss_limit_mb=2048",
        "-max_len=4096",
        "-print_final_stats=1",
    ]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", target, "--", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log = proc.stdout + proc.stderr
    (ARTIFACTS / f"{target}.log").write_text(log)
    stats = dict(
        ln[len("stat::") :].split(":", 1) for ln in log.splitlines() if ln.startswith("stat::")
    )
    summary = f"{stats.get('number_of_executed_units', '?').strip()} execs"
    summary += f", peak rss {stats.get('peak_rss_mb', '?').strip()} MB"
    done = [ln for ln in log.splitlines() if " cov: " in ln]
    if done:
        words = done[-1].split()
        for key in ("cov:", "ft:", "corp:"):
            if key in words:
                summary += f", {key} {words[words.index(key) + 1]}"
    return proc.returncode == 0, summary


# --- random mutation ----------------------------------------------------------------------

_INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0xFFFFFFFF]


def mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(7)
        i = rng.randint(0, len(buf))
        if op == 0 and buf:  # flip a bit
            j = min(i, len(buf) - 1)
            buf[j] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:  # set a byte
            buf[min(i, len(buf) - 1)] = rng.randrange(256)
        elif op == 2:  # insert random bytes
            buf[i:i] = rng.randbytes(rng.randint(1, 16))
        elif op == 3 and buf:  # delete a range
            del buf[i : i + rng.randint(1, 32)]
        elif op == 4 and pool:  # splice in part of another input
            other = rng.choice(pool)
            a = rng.randint(0, len(other))
            buf[i:i] = other[a : a + rng.randint(1, 64)]
        elif op == 5:  # an interesting integer, big-endian, 1/2/4 bytes wide
            width = rng.choice((1, 2, 4))
            value = rng.choice(_INTERESTING) & ((1 << (8 * width)) - 1)
            buf[i : i + width] = value.to_bytes(width, "big")
        elif op == 6 and buf:  # duplicate a chunk (repeated attributes, lines, records)
            a = rng.randint(0, len(buf) - 1)
            buf[i:i] = buf[a : a + rng.randint(1, 64)]
    return bytes(buf[:4096])


def run_random(target: str, seconds: float, seed: int) -> tuple[bool, str]:
    sys.path.insert(0, str(HERE))
    import targets

    fn = targets.TARGETS[target]
    rng = random.Random(seed)
    pool = seeds(target) or [b""]
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        data = mutate(rng, rng.choice(pool), pool) if n >= len(pool) else pool[n]
        n += 1
        try:
            fn(data)
        except Exception:  # noqa: BLE001 - any escape is the finding we are looking for
            path = save_crash(target, data)
            return False, f"{n} execs; CRASH saved to {path}\n{traceback.format_exc()}"
        if n % 64 == 0 and len(pool) < 512:
            pool.append(data)  # keep some variety (no coverage signal in this engine)
    return True, f"{n} execs"


def save_crash(target: str, data: bytes) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{target}-crash-{hashlib.sha1(data).hexdigest()}"
    path.write_bytes(data)
    return path


def replay(target: str, files: list[str]) -> int:
    sys.path.insert(0, str(HERE))
    import targets

    status = 0
    for f in files:
        try:
            targets.TARGETS[target](Path(f).read_bytes())
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            status = 1
        else:
            print(f"{f}: ok")
    return status


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        atheris_child(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("targets", nargs="*", help="targets to run (default: all)")
    p.add_argument("--seconds", type=int, default=60, help="budget per target (default 60)")
    p.add_argument("--engine", choices=("auto", "atheris", "random"), default="auto")
    p.add_argument("--seed", type=int, default=int(os.environ.get("FUZZ_SEED", "0")))
    p.add_argument("--replay", metavar="TARGET", help="re-run the given input files")
    p.add_argument("--list", action="store_true", help="list targets and seed counts")
    args = p.parse_args(argv)
    if args.list:
        for t in TARGET_NAMES:
            print(f"{t:16} {len(seeds(t))} seeds")
        return 0
    if args.replay:
        return replay(args.replay, args.targets)
    chosen = args.targets or list(TARGET_NAMES)
    unknown = set(chosen) - set(TARGET_NAMES)
    if unknown:
        p.error(f"unknown targets: {', '.join(sorted(unknown))}")
    engine = args.engine
    if engine == "auto":
        engine = "atheris" if have_atheris() else "random"
    if engine == "atheris" and not have_atheris():
        p.error("atheris is not installed (.venv/bin/pip install atheris), or use --engine random")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"engine {engine}, {args.seconds} s per target, artifacts in {ARTIFACTS}", flush=True)
    failed = []
    for target in chosen:
        start = time.monotonic()
        if engine == "atheris":
            ok, summary = run_atheris(target, args.seconds)
        else:
            ok, summary = run_random(target, args.seconds, args.seed)
        took = time.monotonic() - start
        print(f"{'ok   ' if ok else 'CRASH'} {target:16} {took:5.0f} s  {summary}", flush=True)
        if not ok:
            failed.append(target)
    if failed:
        print(f"crashes in: {', '.join(failed)} (see {ARTIFACTS})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
