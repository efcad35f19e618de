"""Run a command with a CPU hog busy on one core for the whole run (issue 33): the suite must
pass on a machine that is doing something else too.

    python .ci/hog.py [--cpu N] -- COMMAND...

The hog is a busy loop pinned to one CPU of this process's affinity set (the last, unless
--cpu says otherwise); the command keeps the whole set. The command's exit status is ours.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given")
    hog = subprocess.Popen([sys.executable, "-c", SPIN, str(args.cpu)])
    started = time.monotonic()
    print(f"hog: pid {hog.pid} busy on cpu {args.cpu}", flush=True)
    try:
        status = subprocess.call(command)
    finally:
        hog.kill()
        hog.wait()
    print(f"hog: {' '.join(command)} exited {status} after {time.monotonic() - started:.0f} s "
          f"with cpu {args.cpu} busy throughout", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
