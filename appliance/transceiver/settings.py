"""A transceiver's settings (:class:`TransceiverConfig`): what ``appliance transceiver``'s
flags and ``appliance up`` set, read by the server (server.py), its control operations
(ops.py) and its load glue (load.py). A module of its own so that those can name the type
without importing the server (tests/test_import_cycles.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance import recordings

from .call import Addr
from .opus import DEFAULT_COMPLEXITY

#: Defence in depth behind signaling's admission (issue 23, docs/operations.md
#: "Admission"): a create is refused ``503 overloaded`` when the measured busy share
#: (headroom.py) plus the creates since the last window, at this transceiver's cost per
#: call, reaches this. Above signaling's admission limit (0.75), so that only a burst
#: signaling could not see (another signaling, a stale report) reaches it.
REFUSE_BUSY = 0.95


@dataclass(frozen=True, slots=True)
class TransceiverConfig:
    id: int
    secrets: tuple[bytes, ...]
    listen: Addr = ("127.0.0.1", 4000)
    control: str | None = None  # Unix socket path or host:port; None: no control server
    cluster: int = 0
    agent: str = "echo"
    #: agent specs resolved in a worker thread at start (``--preload``): the assistant's
    #: speech models load before the first call asks for them, not inside its set-up
    preload: tuple[str, ...] = ()
    max_sessions: int = 500
    exit_when_drained: bool = False  # serve_transceiver returns once drained and idle
    opus_complexity: int = DEFAULT_COMPLEXITY  # encoder complexity of every PCM session
    # DTLS versions a call's handshake may negotiate (--dtls-versions; docs/dtls13.md).
    dtls_versions: frozenset[str] = frozenset({"1.2", "1.3"})
    # DTLS 1.2 False Start (RFC 7918) as client: only the SCTP INIT goes with our Finished,
    # a data channel half a round trip sooner (docs/sctp.md "Setup latency").
    dtls_false_start: bool = True
    # Queue what sessions send while a receive batch is handled and send it with one
    # sendmmsg (module docstring); False, or the C extension not built: one sendto each.
    batch_sends: bool = True
    # Receive with one recvmmsg per RECV_MSGS datagrams (the same C extension); False, or
    # not built: one recvfrom_into each.
    batch_recv: bool = True
    # Lower the Opus complexity of the calls step by step as headroom shrinks (degrade.py).
    adaptive_complexity: bool = True
    refuse_busy: float = REFUSE_BUSY  # see REFUSE_BUSY
    # Run the headroom meter's tick task (the CLI does: `appliance transceiver` is a process
    # of its own). Off by default in process: the meter reads the whole process's CPU, which
    # in a test or benchmark includes its clients; tests feed TransceiverLoad.handle_tick (load.py).
    measure_load: bool = False
    # What the headroom counts (--headroom, headroom.py): "core", what the CPUs it may run on
    # have left (issue 32), or "own", its own CPU only (a core of its own: before issue 32).
    headroom: str = "core"
    # Recordings (recording.py, docs/recordings.md): where they go (None: no call can be
    # recorded), whether calls are recorded unless they say otherwise (--record), the
    # directory's quota in bytes and how long a recording is kept.
    recordings_dir: str | None = None
    record: bool = False
    recording_quota: int = recordings.DEFAULT_QUOTA
    recording_retention: float = recordings.DEFAULT_RETENTION
