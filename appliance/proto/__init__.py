"""Sans-IO protocol cores.

Nothing in this package performs I/O, reads a clock, or imports trio, asyncio, socket or
time: every state machine takes ``now`` as an argument and is driven with the verbs
``handle_input`` / ``poll_output`` (until None) / ``poll_timeout`` / ``handle_timeout``
(docs/style.md rule 18). ``tests/proto/test_sans_io.py`` enforces the purity,
``tests/test_verb_shape.py`` the verbs.
"""
