"""Network I/O shared by the relay and the transceiver (the shells, never ``appliance/proto``).

* :mod:`.sockets` — UDP socket set-up: ``SO_REUSEPORT``, kernel buffer sizes, IPv6
  ``V6ONLY``, non-blocking, and what the kernel granted.
* :mod:`.splice` — two byte streams joined both ways (the HTTPS splice from the shared TCP
  port, in the relay and in signaling's relay backend).
* ``_mmsg`` — the optional C extension (``appliance/netio/_mmsg.c``, Linux): batched
  ``recvmmsg``/``sendmmsg`` (with UDP GSO). Import it as::

      try:
          from appliance.netio import _mmsg
      except ImportError:  # not built (no compiler/headers) or not Linux
          _mmsg = None

  Only syscall batching lives there; routing decisions stay in Python.
"""
