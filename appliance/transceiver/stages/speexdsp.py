"""A minimal ctypes binding to speexdsp's acoustic echo canceller (MDF) and its
preprocessor's residual-echo suppressor: the system library (Debian ``libspeexdsp1``,
``make sysdeps``), no compiled extension of ours.

Only what aec.py uses: ``speex_echo_state_init/destroy/reset``, ``speex_echo_cancellation``,
``speex_echo_ctl(SET_SAMPLING_RATE)``, ``speex_preprocess_state_init/destroy/run/ctl``
(``SET_ECHO_STATE``, ``SET_DENOISE`` off — noise is RNNoise's job —, ``SET_ECHO_SUPPRESS``,
``SET_ECHO_SUPPRESS_ACTIVE``). Constants from ``<speex/speex_echo.h>`` and
``<speex/speex_preprocess.h>`` (speexdsp 1.2).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

from .base import StageUnavailable

SPEEX_ECHO_SET_SAMPLING_RATE = 24
SPEEX_PREPROCESS_SET_DENOISE = 0
SPEEX_PREPROCESS_SET_AGC = 2
SPEEX_PREPROCESS_SET_DEREVERB = 8
SPEEX_PREPROCESS_SET_ECHO_SUPPRESS = 20
SPEEX_PREPROCESS_SET_ECHO_SUPPRESS_ACTIVE = 22
SPEEX_PREPROCESS_SET_ECHO_STATE = 24

_lib: Any = None
_PCM = ctypes.POINTER(ctypes.c_int16)


def load() -> Any:
    """The library, loaded once; :class:`StageUnavailable` naming the package if absent."""
    global _lib
    if _lib is not None:
        return _lib
    lib = None
    for name in ("libspeexdsp.so.1", ctypes.util.find_library("speexdsp")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        raise StageUnavailable("needs the speexdsp library (Debian: apt-get install "
                               "libspeexdsp1; make sysdeps)")
    vp = ctypes.c_void_p
    lib.speex_echo_state_init.restype = vp
    lib.speex_echo_state_init.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.speex_echo_state_destroy.argtypes = [vp]
    lib.speex_echo_state_reset.argtypes = [vp]
    lib.speex_echo_cancellation.argtypes = [vp, _PCM, _PCM, _PCM]
    lib.speex_echo_ctl.argtypes = [vp, ctypes.c_int, vp]
    lib.speex_echo_ctl.restype = ctypes.c_int
    lib.speex_preprocess_state_init.restype = vp
    lib.speex_preprocess_state_init.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.speex_preprocess_state_destroy.argtypes = [vp]
    lib.speex_preprocess_run.argtypes = [vp, _PCM]
    lib.speex_preprocess_run.restype = ctypes.c_int
    lib.speex_preprocess_ctl.argtypes = [vp, ctypes.c_int, vp]
    lib.speex_preprocess_ctl.restype = ctypes.c_int
    _lib = lib
    return lib


class SpeexEcho:
    """One MDF echo canceller + residual-echo suppressor, ``frame`` samples per call."""

    def __init__(self, frame: int, tail: int, rate: int, *, suppress_db: int = -40,
                 suppress_active_db: int = -15) -> None:
        lib = self._lib = load()
        self.frame = frame
        self._echo = lib.speex_echo_state_init(frame, tail)
        self._pre = lib.speex_preprocess_state_init(frame, rate)
        if not self._echo or not self._pre:
            self.close()
            raise MemoryError("speexdsp could not allocate its state")
        r = ctypes.c_int(rate)
        lib.speex_echo_ctl(self._echo, SPEEX_ECHO_SET_SAMPLING_RATE, ctypes.byref(r))
        off = ctypes.c_int(0)
        for req in (SPEEX_PREPROCESS_SET_DENOISE, SPEEX_PREPROCESS_SET_AGC,
                    SPEEX_PREPROCESS_SET_DEREVERB):
            lib.speex_preprocess_ctl(self._pre, req, ctypes.byref(off))
        # Residual echo: how far down to push what the linear filter left, with and without
        # near-end speech (speexdsp's defaults, -40 / -15 dB).
        for req, db in ((SPEEX_PREPROCESS_SET_ECHO_SUPPRESS, suppress_db),
                        (SPEEX_PREPROCESS_SET_ECHO_SUPPRESS_ACTIVE, suppress_active_db)):
            v = ctypes.c_int(db)
            lib.speex_preprocess_ctl(self._pre, req, ctypes.byref(v))
        lib.speex_preprocess_ctl(self._pre, SPEEX_PREPROCESS_SET_ECHO_STATE,
                                 ctypes.c_void_p(self._echo))
        self._out = (ctypes.c_int16 * frame)()

    def process(self, near: bytes, far: bytes) -> bytes:
        """One frame of microphone (``near``) and time-aligned reference (``far``), both
        ``frame`` PCM16 samples: the microphone with the echo taken out."""
        n = self.frame
        rec = (ctypes.c_int16 * n).from_buffer_copy(near)
        play = (ctypes.c_int16 * n).from_buffer_copy(far)
        out = self._out
        self._lib.speex_echo_cancellation(self._echo, rec, play, out)
        self._lib.speex_preprocess_run(self._pre, out)
        return bytes(out)

    def reset(self) -> None:
        if self._echo:
            self._lib.speex_echo_state_reset(self._echo)

    def close(self) -> None:
        lib = self._lib
        if getattr(self, "_pre", None):
            lib.speex_preprocess_state_destroy(self._pre)
            self._pre = None
        if getattr(self, "_echo", None):
            lib.speex_echo_state_destroy(self._echo)
            self._echo = None
