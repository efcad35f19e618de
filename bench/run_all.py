"""Run every benchmark under bench/ in turn (``make bench``). Each prints its own figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    rc = 0
    for script in sorted(HERE.glob("*_bench.py")):
        print(f"== {script.name}", flush=True)
        rc |= subprocess.call([sys.executable, str(script)])
    return rc


if __name__ == "__main__":
    sys.exit(main())
