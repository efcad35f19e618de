"""Sans-IO protocol cores.

Nothing in this package performs I/O, reads a clock, or imports trio, asyncio, socket or
time: every state machine takes ``now`` as an argument and is driven with the verbs
``handle_datagram`` / ``handle_timeout`` / ``poll_transmit`` / ``poll_event`` /
``poll_timeout`` (see docs/style.md). ``tests/proto/test_sans_io.py`` enforces it.
"""
