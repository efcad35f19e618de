"""Per-session results and their aggregate (p50/p99), as plain data ready for JSON."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100) of unsorted ``values``."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 3)


@dataclass
class TurnResult:
    """One talk-then-listen turn (``--pattern turns``), as the caller heard it. "Loud" is a
    returned packet whose decoded audio rises above the loud threshold (media.LOUD): the
    far end said something. Times are seconds from the moment the caller stopped talking."""

    loud_while_talking: int = 0  # loud packets that arrived while the caller talked
    loud_while_listening: int = 0  # ... and after it stopped (the answer, or an echo's tail)
    reply_after: float | None = None  # first loud packet of the listening part
    reply_end: float | None = None  # last loud packet of the listening part

    def to_json(self) -> dict[str, Any]:
        return {"loud_while_talking": self.loud_while_talking,
                "loud_while_listening": self.loud_while_listening,
                "reply_after_ms": _ms(self.reply_after), "reply_end_ms": _ms(self.reply_end)}


@dataclass
class SessionResult:
    """What one session saw. Times are seconds; ``setup_*`` count from the POST."""

    index: int
    failure: str | None = None
    setup_answer: float | None = None  # POST → the 201 and its SDP answer read
    setup_connected: float | None = None  # POST → ICE + DTLS up (SRTP keyed)
    setup_first_echo: float | None = None  # POST → first echoed RTP packet
    sent: int = 0
    received: int = 0  # RTP packets that came back (any content)
    echoed: int = 0  # tag mode: distinct tagged packets of ours that came back
    duplicates: int = 0
    return_lost: int = 0  # sequence-number gaps in the server's stream
    rtt_method: str | None = None  # "tag" or "onset"
    rtts: list[float] = field(default_factory=list)
    onsets_missed: int = 0
    jitter: float = 0.0  # RFC 3550 §6.4.1 interarrival jitter of the echo, seconds
    srtp_errors: int = 0
    echo_span: float = 0.0  # seconds from the first to the last packet that came back
    turns: list[TurnResult] = field(default_factory=list)  # --pattern turns only
    turn_taking: bool = False  # --pattern turns: the server talks in turns, not 50 packets/s
    refused: float | None = None  # POST → its 503 (admission refused the call), seconds
    refused_code: str | None = None  # the 503's problem code ("overloaded", ...)
    refused_retry_after: str | None = None  # the 503's Retry-After header, as sent

    @property
    def loss(self) -> float | None:
        """Tag mode: the share of our packets that never came back (exact). Otherwise (a
        re-encoding server makes packets of its own, so ours cannot be matched): the gaps
        in the echo stream, packets received against 50/s over its span, but never more
        than we sent. That leaves out the server's start-up (aiortc drops its first few
        packets while its jitter buffer fills), which is setup time, not loss. The cap
        matters: an echo whose timing stretched under load (all packets back, but spread
        over a few ms more than they were sent in) read as 0.5-1 % "loss" without it."""
        if self.rtt_method == "tag":
            return max(0.0, 1 - self.echoed / self.sent) if self.sent else None
        if self.turn_taking:
            # An agent that answers in turns is silent between them: only the sequence gaps
            # in what it did send are loss.
            total = self.received + self.return_lost
            return self.return_lost / total if total else None
        if self.received < 2:
            return None if self.sent == 0 else 1.0
        expected = min(round(self.echo_span / 0.020) + 1, self.sent)
        return max(0.0, 1 - self.received / expected)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        rtts = d.pop("rtts")
        d["turns"] = [t.to_json() for t in self.turns]
        d["loss"] = self.loss
        d["rtt_p50_ms"] = _ms(percentile(rtts, 50))
        d["rtt_p99_ms"] = _ms(percentile(rtts, 99))
        d["rtt_samples"] = len(rtts)
        d["jitter_ms"] = _ms(d.pop("jitter"))
        d["echo_span_s"] = round(d.pop("echo_span"), 3)
        d["setup_answer_ms"] = _ms(d.pop("setup_answer"))
        d["setup_connected_ms"] = _ms(d.pop("setup_connected"))
        d["setup_first_echo_ms"] = _ms(d.pop("setup_first_echo"))
        return d


@dataclass
class Report:
    """The whole run: the sessions, and facts about the load generator itself (so a reader
    can tell a saturated server from a saturated load generator)."""

    url: str
    sessions: list[SessionResult]
    wall: float
    cpu: float  # load generator process CPU seconds (user + system) during the run
    max_concurrent: int
    pacer_late: list[float] = field(default_factory=list)  # per tick, seconds behind schedule

    def summary(self) -> dict[str, Any]:
        ok = [s for s in self.sessions if s.failure is None]
        rtts = [r for s in ok for r in s.rtts]
        sent = sum(s.sent for s in ok)
        lost = sum(s.sent * (s.loss or 0.0) for s in ok)  # weighted by packets sent
        methods = Counter(s.rtt_method for s in ok if s.rtt_method)
        return {
            "url": self.url,
            "requested": len(self.sessions),
            "completed": len(ok),
            "failed": len(self.sessions) - len(ok),
            "failures": dict(Counter(s.failure for s in self.sessions if s.failure)),
            "refused": sum(1 for s in self.sessions if s.refused is not None),
            "refused_codes": dict(Counter(s.refused_code for s in self.sessions
                                          if s.refused is not None)),
            "refused_with_retry_after": sum(1 for s in self.sessions if s.refused is not None
                                            and s.refused_retry_after),
            "refused_p50_ms": _ms(percentile(
                [s.refused for s in self.sessions if s.refused is not None], 50)),
            "refused_p99_ms": _ms(percentile(
                [s.refused for s in self.sessions if s.refused is not None], 99)),
            "max_concurrent": self.max_concurrent,
            "setup_connected_p50_ms": _ms(percentile(
                [s.setup_connected for s in ok if s.setup_connected is not None], 50)),
            "setup_connected_p99_ms": _ms(percentile(
                [s.setup_connected for s in ok if s.setup_connected is not None], 99)),
            "setup_first_echo_p50_ms": _ms(percentile(
                [s.setup_first_echo for s in ok if s.setup_first_echo is not None], 50)),
            "setup_first_echo_p99_ms": _ms(percentile(
                [s.setup_first_echo for s in ok if s.setup_first_echo is not None], 99)),
            "rtt_method": "/".join(sorted(methods)) or None,
            "rtt_samples": len(rtts),
            "rtt_p50_ms": _ms(percentile(rtts, 50)),
            "rtt_p99_ms": _ms(percentile(rtts, 99)),
            "packets_sent": sent,
            "loss": (lost / sent) if sent else None,
            "loss_worst_session": max((s.loss or 0.0 for s in ok), default=None),
            "return_lost": sum(s.return_lost for s in ok),
            "jitter_p50_ms": _ms(percentile([s.jitter for s in ok], 50)),
            "jitter_p99_ms": _ms(percentile([s.jitter for s in ok], 99)),
            "onsets_missed": sum(s.onsets_missed for s in ok),
            **_turn_summary([t for s in ok for t in s.turns]),
            "wall_s": round(self.wall, 3),
            "loadgen_cpu_s": round(self.cpu, 3),
            "pacer_late_p99_ms": _ms(percentile(self.pacer_late, 99)),
        }

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary(), "sessions": [s.to_json() for s in self.sessions]}


def _turn_summary(turns: list[TurnResult]) -> dict[str, Any]:
    replies = [t.reply_after for t in turns if t.reply_after is not None]
    return {
        "turns": len(turns),
        "turns_answered": len(replies),  # something loud came back after the caller stopped
        "turns_overlapped": sum(1 for t in turns if t.loud_while_talking),
        "reply_after_p50_ms": _ms(percentile(replies, 50)),
        "reply_after_p99_ms": _ms(percentile(replies, 99)),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """A small two-column table for humans."""

    def f(v: Any, unit: str = "") -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.1f}{unit}" if unit == " ms" else f"{v:.4g}{unit}"
        return f"{v}{unit}"

    loss = summary["loss"]
    rows = [
        ("endpoint", summary["url"]),
        ("sessions", f"{summary['completed']}/{summary['requested']} completed, "
                     f"{summary['failed']} failed, max {summary['max_concurrent']} concurrent"),
        ("setup POST→connected p50/p99",
         f"{f(summary['setup_connected_p50_ms'], ' ms')} / "
         f"{f(summary['setup_connected_p99_ms'], ' ms')}"),
        ("setup POST→first echo p50/p99",
         f"{f(summary['setup_first_echo_p50_ms'], ' ms')} / "
         f"{f(summary['setup_first_echo_p99_ms'], ' ms')}"),
        (f"echo RTT p50/p99 ({summary['rtt_method'] or 'none'}, n={summary['rtt_samples']})",
         f"{f(summary['rtt_p50_ms'], ' ms')} / {f(summary['rtt_p99_ms'], ' ms')}"),
        ("loss (all / worst session)",
         "-" if loss is None else
         f"{100 * loss:.2f} % / {100 * (summary['loss_worst_session'] or 0):.2f} %"),
        ("jitter p50/p99 (per session)",
         f"{f(summary['jitter_p50_ms'], ' ms')} / {f(summary['jitter_p99_ms'], ' ms')}"),
    ]
    if summary.get("turns"):
        rows += [
            ("turns (answered / heard while talking)",
             f"{summary['turns']} ({summary['turns_answered']} / {summary['turns_overlapped']})"),
            ("reply after the caller stops p50/p99",
             f"{f(summary['reply_after_p50_ms'], ' ms')} / "
             f"{f(summary['reply_after_p99_ms'], ' ms')}"),
        ]
    rows += [
        ("load generator", f"{summary['loadgen_cpu_s']} s CPU in {summary['wall_s']} s, "
                           f"pacer late p99 {f(summary['pacer_late_p99_ms'], ' ms')}"),
    ]
    rows += [(f"failed: {reason}", str(n)) for reason, n in summary["failures"].items()]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
