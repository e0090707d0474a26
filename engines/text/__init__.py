"""The telephony text front end shared by every engine (imports no engine, no runtime).

``TextFrontEnd.speak(text) -> Spoken``: markup filter (``markup``), language per
sentence (``lang``), normaliser for English and German (``normalize``, with the
number words of ``words``), pronunciation lexicon (``lexicon``).
"""

from engines.text.frontend import (
    LexiconError,
    LexiconReload,
    Segment,
    Spoken,
    TextFrontEnd,
    TextOptions,
    clean_text,
)
from engines.text.lang import Lang, LangOption, detect_language, split_sentences
from engines.text.lexicon import Entry, Problem, parse_lexicon, read_lexicon
from engines.text.markup import strip_markup
from engines.text.normalize import normalize

__all__ = [
    "Entry",
    "Lang",
    "LangOption",
    "LexiconError",
    "LexiconReload",
    "Problem",
    "Segment",
    "Spoken",
    "TextFrontEnd",
    "TextOptions",
    "clean_text",
    "detect_language",
    "normalize",
    "parse_lexicon",
    "read_lexicon",
    "split_sentences",
    "strip_markup",
]
