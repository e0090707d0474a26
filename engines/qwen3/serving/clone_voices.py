"""The Base engine's stored voice-clone prompts: each prompt file is a voice named by its stem.

``--clone-prompt P.npz`` adds one voice and makes it the default;
``--clone-prompt-dir DIR`` adds every ``DIR/*.npz`` (rescanned by the cmd port's
``RELOAD_VOICES``). Without any prompt the only voice is ``default`` (the
``--speaker-embedding`` / ``--ref-codes`` flags, or the zero x-vector).
Selection: engine-wide with ``SET_VOICE:<name>``, per call with
``SET_CALL_VOICE:<call_id>|<name>`` (the runtime keeps it in the call's ``CallState``).
Every prompt is checked against the loaded model's size and width when read.
"""

from __future__ import annotations

import threading
from pathlib import Path

import structlog

from engines.qwen3.serving.clone_prompt import ClonePrompt, ClonePromptError, load_prompt
from engines.runtime.synth import SynthesisError

log = structlog.get_logger(__name__)

DEFAULT_VOICE = "default"


class ClonePromptVoices:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prompts: dict[str, ClonePrompt] = {}
        self.default: str | None = None
        self._single: Path | None = None
        self._dir: Path | None = None
        self._size: str | None = None
        self._width: int | None = None

    def configure(
        self,
        single: Path | None,
        directory: Path | None,
        *,
        model_size: str | None,
        width: int | None,
    ) -> None:
        """Load the prompts; an unusable ``single`` prompt is an error: the engine does not dock."""
        self._single, self._dir, self._size, self._width = single, directory, model_size, width
        if directory is not None and not directory.is_dir():
            raise SynthesisError(f"qwen3: --clone-prompt-dir {str(directory)!r}: not a directory")
        if single is not None:
            try:
                prompt = load_prompt(single, model_size=model_size, width=width)
            except ClonePromptError as exc:
                raise SynthesisError(f"qwen3: {exc}") from exc
            with self._lock:
                self._prompts[single.stem] = prompt
                self.default = single.stem
        self.rescan()

    def rescan(self) -> None:
        """(Re)read ``--clone-prompt-dir``; unusable files are skipped with a warning."""
        if self._dir is None:
            return
        found: dict[str, ClonePrompt] = {}
        for f in sorted(self._dir.glob("*.npz")):
            try:
                found[f.stem] = load_prompt(f, model_size=self._size, width=self._width)
            except ClonePromptError as exc:
                log.warning("clone_prompt_skipped", path=str(f), error=str(exc))
        with self._lock:
            keep = {}
            if self._single is not None and self._single.stem in self._prompts:
                keep[self._single.stem] = self._prompts[self._single.stem]
            self._prompts = {**found, **keep}
        log.info("clone_prompts_loaded", voices=sorted(self._prompts))

    def voices(self) -> list[str]:
        with self._lock:
            names = sorted(self._prompts)
        if self.default is not None:
            names.remove(self.default)
            return [self.default, *names]
        return [DEFAULT_VOICE, *names]

    def get(self, name: str | None) -> ClonePrompt | None:
        if name is None:
            return None
        with self._lock:
            return self._prompts.get(name)
