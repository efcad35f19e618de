"""Build hook for the one optional C extension; everything else is in pyproject.toml.

``appliance.netio._mmsg`` batches UDP syscalls (recvmmsg/sendmmsg, Linux) for the relay and the
transceiver. It is *optional*: without a compiler or the Python headers the install still
succeeds and the relay uses its pure-Python loop (``appliance relay --io python``; ``--io
auto`` picks the batch path when the module imports).
"""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(
        Extension(
            "appliance.netio._mmsg",
            sources=["appliance/netio/_mmsg.c"],
            optional=True,  # a failed build is a warning, not a failed install
            extra_compile_args=["-O2"],
        )
    )

setup(ext_modules=ext_modules)
