"""Fixture engine with the text front end: ``ToneSynth`` speaking the spoken form.

``TextToneSynth`` runs every text through ``engines.text.TextFrontEnd`` (as the
real engines do) and records what it spoke, then sounds one tone per spoken
word. Run as a script it is an engine process with the common flags, the text
front end's included: ``python tests/text_helpers.py --dock-port N --cmd-port P
--lexicon FILE``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

from runtime_helpers import ToneSynth  # noqa: E402

from engines.runtime.synth import CallState, CancelToken, FloatArray  # noqa: E402
from engines.text import LexiconReload, TextFrontEnd, TextOptions  # noqa: E402


class TextToneSynth(ToneSynth):
    """A tone engine whose text goes through the shared text front end."""

    name = "texttone"

    def __init__(self, options: TextOptions | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.text = TextFrontEnd(options, ipa=False, lang="auto")
        self.spoken: list[str] = []
        self._spoken_lock = threading.Lock()

    def synthesize(self, text: str, state: CallState, cancel: CancelToken) -> Iterator[FloatArray]:
        spoken = self.text.speak(text).text
        with self._spoken_lock:
            self.spoken.append(spoken)
        return super().synthesize(spoken, state, cancel)

    def normalize(self, text: str) -> str:
        return self.text.speak(text).text

    def reload_lexicon(self) -> LexiconReload:
        return self.text.reload_lexicon()


def main(argv: list[str] | None = None) -> int:
    from engines.runtime.cli import common_parser, run_engine, text_options

    p = common_parser("texttone", description="tone engine with the text front end (fixture)")
    args = p.parse_args(argv)
    return run_engine(TextToneSynth(text_options(args), phrase_ms=20), args)


if __name__ == "__main__":
    sys.exit(main())
