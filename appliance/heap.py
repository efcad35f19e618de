"""The frozen start-up heap (docs/architecture.md, ADR-5): every command calls
:func:`settle_heap` once its modules are imported.

Its own module because both ``appliance`` (cli.py) and ``python -m appliance.loadgen``
use it, and cli.py loads the loadgen's module as one of its roles.
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Move everything start-up made (modules, classes, functions: ~70 000 objects once
    trio, cryptography, numpy and PyAV are imported) out of the cyclic collector's reach.

    A full (generation 2) collection walks every tracked object; measured in a transceiver
    carrying 70 PCM sessions, one took 41 ms — a 41 ms stall of every session's audio —
    and 3 ms with the start-up objects frozen (docs/performance-history.md, "Fifth pass"). Nothing
    frozen is ever garbage: it lives as long as the process does anyway.
    """
    gc.collect()
    gc.freeze()
