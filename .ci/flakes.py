"""Hunt flaky tests (issue 33): run a selection of tests RUNS times and tabulate every test
that failed at least once, with its first failure's message.

    python .ci/flakes.py [--runs 20] [PYTEST_ARGS...]

`make flakes` runs it under .ci/hog.py on the timing-sensitive tests (browser, e2e,
reliability, the transceiver loop). Each run writes JUnit XML under .ci/artifacts/flakes/;
the exit status is 1 if any run failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parent / "artifacts" / "flakes"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    args, pytest_args = ap.parse_known_args()
    OUT.mkdir(parents=True, exist_ok=True)
    failures: Counter[str] = Counter()
    first: dict[str, str] = {}
    total = 0
    for run in range(1, args.runs + 1):
        xml = OUT / f"run-{run}.xml"
        subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         f"--junitxml={xml}", *pytest_args])
        if not xml.exists():
            failures["<pytest did not finish>"] += 1
            continue
        for case in ET.parse(xml).getroot().iter("testcase"):
            total += 1
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            if bad is None:
                continue
            name = f"{case.get('classname')}::{case.get('name')}"
            failures[name] += 1
            first.setdefault(name, (bad.get("message") or "")[:200])
        print(f"flakes: run {run}/{args.runs}: {sum(failures.values())} failures so far",
              flush=True)
    print(f"\nflakes: {total} test runs over {args.runs} rounds")
    for name, n in failures.most_common():
        print(f"  {n:3d}/{args.runs}  {name}\n         {first.get(name, '')}")
    if not failures:
        print("  no test failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
