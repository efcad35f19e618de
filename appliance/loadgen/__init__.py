"""The load generator: N real WebRTC voice sessions against any WHIP-style endpoint.

Each session is a full client from :mod:`appliance.client` (ICE checks, DTLS client, SRTP,
RTCP mux) that POSTs its offer to ``{url}/v1/sessions``, sends pre-encoded Opus at 50 packets/s
and measures what comes back. One pacing task drives every session (no task per packet).

* :mod:`.media` — the test signal (a tone with a silent gap once a second, or for
  turn-taking agents talk-then-listen turns; encoded once),
  the sequence tag hidden in Opus padding, and the onset detector for re-encoding servers.
* :mod:`.stats` — per-session results and the p50/p99 aggregate.
* :mod:`.runner` — the trio shell: ramp, pacer, progress line.
* :mod:`.cli` — ``appliance loadgen`` / ``python -m appliance.loadgen``.

How the echo round trip is measured (two methods, chosen per session automatically):

``tag``
    Every packet carries an 8-byte tag (magic, session index, packet counter) in the Opus
    padding of a code-3 packet (RFC 6716 §3.2.5). Padding is ignored by every decoder, so
    the audio is unchanged, and a server that echoes RTP without touching the codec returns
    the tag intact: one RTT sample per packet, exact loss and duplicates.
``onset``
    A server that decodes and re-encodes (an agent in the path, aiortc's echo track) returns
    different bytes. The signal is a 440 Hz tone with a 100 ms gap every second; the RTT is
    the time between the tone's onset leaving us and its onset coming back, located to the
    sample in the decoded echo (only the packets between gap and onset are decoded, ~8 a
    second). This is mouth-to-ear latency, including the server's codec delay.
"""

from .runner import LoadConfig, run_load
from .stats import Report, SessionResult

__all__ = ["LoadConfig", "Report", "SessionResult", "run_load"]
