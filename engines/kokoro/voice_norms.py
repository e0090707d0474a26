"""Each voice's instance-norm statistics: measured once, cached, handed to every window.

Rule 1: ``VoiceNorms.get`` never raises: a voice whose statistics cannot be measured
(or a decoder whose norms take none) gets None, and its windows take their own
statistics as before (with the wider context that needs; ``norms`` says why).
Rule 2: statistics are measured from ``CALIBRATION_TEXTS`` in the voice's own style
rows (one whole decode each: 4-5 s per voice on 2 vCPUs, once), cached in the models
directory by the decoder, the voice's rows, the texts and ``NORMS_VERSION``; a cache file that is
unreadable or wrong is measured again, never trusted.
Rule 3: nobody waits for a measurement but the engine's start: the default voice is
measured at load, before the engine docks; the other voices one after another in a
background thread after that (one intra-op thread), and an utterance in a voice not
measured yet takes its windows' own statistics (as ``--no-voice-norms`` does).
Rule 4: calls come first: the background measurement runs only while no utterance
is in progress (``busy``); an utterance that starts stops the sentence being
measured (``yield_to_calls``), which is measured again once the engine is idle.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import structlog

from engines.kokoro.backend import Prosody
from engines.kokoro.norms import NormCache, NormStats, pool, voice_key
from engines.runtime.synth import CancelToken, FloatArray, SynthesisCancelled

log = structlog.get_logger(__name__)

#: Spoken once per voice to measure its statistics: ordinary telephony sentences of
#: several lengths (pooled over 4 or 8 such sentences, the 12-sentence test set was
#: heard with the same word errors, within one; README "Kokoro pipeline").
CALIBRATION_TEXTS = (
    "The weather tomorrow should be mostly sunny with a light breeze.",
    "Your account balance is forty two dollars and seventeen cents.",
    "We have received your request and will call you back shortly.",
    "Can you confirm the address where the delivery should be made?",
    "Please say yes or no after the tone.",
)
#: How often the background measurement looks whether the engine is idle again (s).
IDLE_POLL_S = 0.05


class NormBackend(Protocol):
    """What the measurement needs of a backend (``OnnxBackend``)."""

    norm_count: int

    def prosody(
        self, tokens: Sequence[int], style: FloatArray, speed: float, cancel: CancelToken
    ) -> Prosody: ...

    def sentence_norms(
        self, prosody: Prosody, style: FloatArray, cancel: CancelToken
    ) -> tuple[int, list[Any], list[Any]]: ...


class VoiceNorms:
    """The statistics of every voice in use (Rules 1 and 2)."""

    def __init__(
        self,
        backend: NormBackend,
        tokens: Callable[[str], list[int]],
        cache_dir: Path,
        model_key: str,
        texts: Sequence[str] = CALIBRATION_TEXTS,
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        self.backend = backend
        self.tokens = tokens
        self.cache = NormCache(cache_dir)
        self.model_key = model_key
        self.texts = tuple(texts)
        self._known: dict[str, NormStats | None] = {}
        self._lock = threading.Lock()  # one measurement at a time; others wait for it
        self._pending: list[tuple[str, Any]] = []
        self._thread: threading.Thread | None = None
        self._closed = CancelToken()  # close(): the measurement in progress stops
        #: whether an utterance is in progress (Rule 4)
        self.busy = busy
        self._background_thread: int | None = None  # ident of the measuring thread
        self._sentence = CancelToken()  # the background sentence being measured now
        self.yielded = 0  # background sentences stopped for a call (measured again)

    @property
    def enabled(self) -> bool:
        return self.backend.norm_count > 0

    def get(self, name: str, voice: Any) -> NormStats | None:
        """``name``'s statistics: known, cached, else measured now (Rule 2)."""
        if not self.enabled:
            return None
        if name in self._known:
            return self._known[name]
        with self._lock:
            if name not in self._known:
                self._known[name] = self._load_or_measure(name, voice)
            return self._known[name]

    def count(self) -> int:
        """Voices whose statistics are known."""
        return sum(1 for v in list(self._known.values()) if v is not None)

    def pending(self) -> int:
        """Voices the background measurement has still to read or measure (Rule 3; 0 once
        it is done, closed or never started): while it runs it shares the CPU whenever no
        utterance is in progress, so a benchmark that times anything else then (a
        baseline beside the engine, a probe in the same process) waits for 0 first."""
        if self._closed.cancelled or self._thread is None:
            return 0
        return sum(1 for name, _ in list(self._pending) if name not in self._known)

    def ready(self, name: str) -> NormStats | None:
        """``name``'s statistics if they are known now; never waits (Rule 3)."""
        return self._known.get(name) if self.enabled else None

    def measure_in_background(self, voices: dict[str, Any]) -> None:
        """Measure (or read from the cache) every voice of ``voices`` not known yet, one
        after another in a daemon thread (Rule 3)."""
        todo = [(n, v) for n, v in voices.items() if n not in self._known]
        if not self.enabled or not todo:
            return
        self._pending = todo
        self._thread = threading.Thread(
            target=self._background, name="kokoro-voice-norms", daemon=True
        )
        # an inference still running in a daemon thread while the interpreter exits
        # aborts the process (std::terminate): stop it first
        atexit.register(self.close)
        self._thread.start()

    def _background(self) -> None:
        self._background_thread = threading.get_ident()
        for name, voice in self._pending:
            if self._closed.cancelled:
                return
            self.get(name, voice)

    def yield_to_calls(self) -> None:
        """An utterance starts: stop the background sentence being measured (Rule 4)."""
        self._sentence.cancel()

    def _idle_token(self) -> tuple[CancelToken, Callable[[], None]]:
        """In the background thread: wait until no utterance is in progress, then a
        token that ``yield_to_calls`` and ``close`` cancel, and the function that
        unlinks it from ``close`` (elsewhere: ``close``'s token)."""
        if threading.get_ident() != self._background_thread:
            return self._closed, lambda: None
        while self.busy() and not self._closed.cancelled:
            time.sleep(IDLE_POLL_S)
        token = CancelToken()
        self._sentence = token
        forget = self._closed.on_cancel(token.cancel)
        if self.busy():  # an utterance started meanwhile
            token.cancel()
        return token, forget

    def wait(self, timeout: float) -> bool:
        """Wait for the background measurement; False if it is still running."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Stop measuring: the run in progress is terminated, nothing more is cached."""
        self._closed.cancel()
        atexit.unregister(self.close)
        if self._thread is not None:
            self._thread.join(timeout)

    def _load_or_measure(self, name: str, voice: Any) -> NormStats | None:
        count = self.backend.norm_count
        key = voice_key("\n".join((self.model_key, *self.texts)), voice)  # texts too
        cached = self.cache.get(key, count)
        if cached is not None:
            return cached
        t0 = time.perf_counter()
        try:
            stats = self.measure(voice)
        except Exception as exc:  # Rule 1: this voice's windows keep their own statistics
            if self._closed.cancelled:
                return None  # the engine is closing
            log.warning("voice_norms_failed", voice=name, reason=repr(exc))
            return None
        self.cache.put(key, stats)
        log.info(
            "voice_norms_measured",
            voice=name,
            sentences=len(self.texts),
            seconds=round(time.perf_counter() - t0, 2),
        )
        return stats

    def measure(self, voice: Any) -> NormStats:
        """Pool the statistics of ``texts`` spoken whole in ``voice``'s style rows."""
        samples = []
        for text in self.texts:
            tokens = self.tokens(text)
            row = voice[min(max(len(tokens), 1), len(voice)) - 1]
            style = np.asarray(row, np.float32).reshape(1, -1)
            while True:
                cancel, forget = self._idle_token()
                try:
                    prosody = self.backend.prosody(tokens, style, 1.0, cancel)
                    samples.append(self.backend.sentence_norms(prosody, style, cancel))
                    break
                except SynthesisCancelled:
                    if self._closed.cancelled:
                        raise
                    self.yielded += 1  # a call came: this sentence again when idle
                finally:
                    forget()
        stats = pool(samples)
        if len(stats.means) != self.backend.norm_count:
            raise ValueError(f"{len(stats.means)} statistics for {self.backend.norm_count} norms")
        return stats
