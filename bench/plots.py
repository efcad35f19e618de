"""The capacity figures as PNGs (issue 8): sessions vs server CPU, vs loss and round trip,
and the distribution of setup times.

    .venv/bin/pip install matplotlib        # plotting only: not a dependency of the appliance
    .venv/bin/python bench/capacity.py --json /tmp/capacity.json
    .venv/bin/python bench/plots.py /tmp/capacity.json --out docs/img

Writes ``capacity-cpu.png``, ``capacity-rtt-loss.png`` and ``setup-time.png``. Input is the
JSON of ``bench/capacity.py --json``; several files may be given (e.g. one run per server),
later ones override earlier ones for the same server. Setup times come from the steps'
per-session ``setup_first_echo_ms`` (POST → first echoed packet), recorded since the
capacity script keeps them; a step without them is left out of that plot.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

LABELS = {"aiortc": "aiortc (PyAV re-encode)", "pcm": "appliance, PCM agent (echo)",
          "passthrough": "appliance, passthrough"}


def load(paths: list[str]) -> tuple[dict[str, Any], str]:
    results: dict[str, Any] = {}
    machine = ""
    for p in paths:
        data = json.loads(Path(p).read_text())
        results.update(data["results"])
        machine = data.get("machine", machine)
    return results, machine


def steps(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One point per N (the last measurement of an N wins), sorted by N."""
    by_n = {st["n"]: st for st in result["steps"]}
    return [by_n[n] for n in sorted(by_n)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("json", nargs="+", help="bench/capacity.py --json output(s)")
    p.add_argument("--out", default="docs/img", help="directory for the PNGs")
    p.add_argument("--note", default="", help="extra text for the titles (e.g. load average)")
    args = p.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results, machine = load(args.json)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sub = machine + (f"; {args.note}" if args.note else "")

    # 1. Sessions vs server CPU (the measured process: one transceiver, or the aiortc server).
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in results.items():
        pts = steps(r)
        ax.plot([s["n"] for s in pts], [100 * s["server_cpu"] for s in pts], "o-",
                label=LABELS.get(name, name))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent sessions (50 packets/s each way)")
    ax.set_ylabel("server CPU, % of one core")
    ax.set_title("Sessions vs CPU", fontsize=11)
    fig.text(0.01, 0.01, sub, fontsize=7, color="grey")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out / "capacity-cpu.png", dpi=110)
    plt.close(fig)

    # 2. Sessions vs loss and round trip.
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.5))
    for name, r in results.items():
        pts = steps(r)
        ns = [s["n"] for s in pts]
        label = LABELS.get(name, name)
        line = a1.plot(ns, [s["summary"]["rtt_p50_ms"] for s in pts], "o-", label=f"{label} p50")
        a1.plot(ns, [s["summary"]["rtt_p99_ms"] for s in pts], "s--", color=line[0].get_color(),
                label=f"{label} p99")
        a2.plot(ns, [100 * (s["summary"]["loss"] or 0) for s in pts], "o-", label=label)
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent sessions")
        ax.grid(True, alpha=0.3)
    a1.set_ylabel("echo round trip, ms")
    a1.set_title("Round trip (tag: exact; onset: incl. codec delay)", fontsize=10)
    a2.set_ylabel("loss, %")
    a2.axhline(1.0, color="red", lw=0.8, ls=":")
    a2.set_title("End-to-end loss (pass: < 1 %)", fontsize=10)
    a1.legend(fontsize=7)
    a2.legend(fontsize=7)
    fig.text(0.01, 0.01, sub, fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out / "capacity-rtt-loss.png", dpi=110)
    plt.close(fig)

    # 3. Setup time (POST → first echoed packet), every session of every passing step.
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plotted = False
    for name, r in results.items():
        times = [t for s in steps(r) if s["passed"]
                 for t in s["summary"].get("setup_first_echo_ms", [])]
        if times:
            ax.hist(times, bins=40, alpha=0.6, label=f"{LABELS.get(name, name)} (n={len(times)})")
            plotted = True
    ax.set_xlabel("POST → first echoed packet, ms")
    ax.set_ylabel("sessions")
    ax.set_title("Setup time distribution (sessions ramping at --rate)", fontsize=11)
    if plotted:
        ax.legend()
    fig.text(0.01, 0.01, sub, fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out / "setup-time.png", dpi=110)
    plt.close(fig)
    for f in ("capacity-cpu.png", "capacity-rtt-loss.png", "setup-time.png"):
        print(out / f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
