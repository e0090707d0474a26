"""Markup filter: what an LLM writes for a screen, made fit to be spoken.

Rule 1: markdown (emphasis, inline code, code fences, headings, bullet and
numbered lists, block quotes, tables, rules, links, images), HTML tags and
emoji or other pictographs are removed; the words they carry stay. A line
break that ended a heading or a list item becomes a clause or sentence pause.
Rule 2: linear in the input: every pattern below is a bounded, non-nested
repeat scanned once left to right, so deeply nested markup (``*****...``,
``[[[[...``) costs no more than plain text of the same length.
"""

from __future__ import annotations

import re

#: Pictographs: emoji blocks, dingbats, symbols and arrows used as emoji, flags,
#: keycaps, skin tones, variation selectors, zero-width joiners and tag characters.
_EMOJI_CLASS = (
    "\U0001f000-\U0001faff"  # mahjong .. symbols & pictographs extended-A
    "\u2600-\u27bf"  # misc symbols, dingbats
    "\u2b00-\u2bff"  # arrows and stars used as emoji
    "\u2190-\u21ff"  # arrows
    "\u2300-\u23ff"  # misc technical (⌚ ⏰)
    "\u25a0-\u25ff"  # geometric shapes (▶ ◀ ●)
    "\u3030\u303d\u3297\u3299"
    "\ufe00-\ufe0f"  # variation selectors
    "\u200d"  # zero-width joiner
    "\u20e3"  # combining keycap
    "\U000e0020-\U000e007f"  # tags (subdivision flags)
)
_EMOJI_RUN_RE = re.compile(f"[{_EMOJI_CLASS}]+")

_FENCE_RE = re.compile(r"^[ \t]{0,3}(?:```|~~~)[^\n]{0,200}$", re.M)
_HEADING_RE = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+([^\n]*?)[ \t#]*$", re.M)
_SETEXT_RE = re.compile(r"^[ \t]{0,3}(?:=+|-+)[ \t]*$", re.M)
_RULE_RE = re.compile(r"^[ \t]{0,3}(?:[-*_][ \t]*){3,}$", re.M)
_QUOTE_RE = re.compile(r"^[ \t]{0,3}(?:>[ \t]?)+", re.M)
_BULLET_RE = re.compile(r"^[ \t]{0,12}[-*+•·▪‣◦][ \t]+", re.M)
_CHECKBOX_RE = re.compile(r"^\[[ xX]\][ \t]+", re.M)
# "1. " / "2) " at a line start, unless a month follows ("1. Mai" is a date)
_NUMBERED_RE = re.compile(
    r"^[ \t]{0,12}\d{1,3}[.)][ \t]+(?!(?:Jan|Feb|Mär|Mar|Apr|Mai|May|Jun|Jul|Aug|Sep|Okt|Oct|"
    r"Nov|Dez|Dec)[a-zä]{0,6}\b)",
    re.M,
)
_TABLE_SEP_RE = re.compile(
    r"^[ \t]*\|?[ \t]*:?-{3,}:?[ \t]*(?:\|[ \t]*:?-{3,}:?[ \t]*){0,64}\|?[ \t]*$", re.M
)
_IMAGE_RE = re.compile(r"!\[([^\[\]\n]{0,500})\]\([^()\s]{0,2000}(?:[ \t]+\"[^\"\n]{0,200}\")?\)")
_LINK_RE = re.compile(r"\[([^\[\]\n]{0,500})\]\([^()\s]{0,2000}(?:[ \t]+\"[^\"\n]{0,200}\")?\)")
_REF_LINK_RE = re.compile(r"\[([^\[\]\n]{1,500})\]\[[^\[\]\n]{0,100}\]")
_AUTOLINK_RE = re.compile(r"<((?:https?://|mailto:|www\.)[^<>\s]{1,2000})>")
_HTML_TAG_RE = re.compile(r"</?[A-Za-z][A-Za-z0-9-]{0,20}(?:\s[^<>\n]{0,300})?/?>")
_CODE_RE = re.compile(r"`{1,3}([^`\n]{0,2000})`{1,3}")
_STRIKE_RE = re.compile(r"~~")
# emphasis markers: runs of * or _ at a word edge (snake_case and 2*3 stay)
_STAR_RE = re.compile(r"(?<!\w)\*{1,3}(?=\S)|(?<=\S)\*{1,3}(?!\w)")
_UNDERSCORE_RE = re.compile(r"(?<![^\W_])_{1,3}(?=\S)|(?<=\S)_{1,3}(?![^\W_])")
_LONE_STAR_RE = re.compile(r"(?<!\S)\*+(?!\S)")
_STARS_RE = re.compile(r"\*{2,}")
_TABLE_PIPE_RE = re.compile(r"[ \t]*\|[ \t]*")
_LINE_END_MARK = frozenset(".,;:!?…")
_HTML_ENTITIES = {
    "&nbsp;": " ",
    "&amp;": "&",
    "&lt;": "<",
    "&gt;": ">",
    "&quot;": '"',
    "&#39;": "'",
}
_ENTITY_RE = re.compile("|".join(map(re.escape, _HTML_ENTITIES)))
_SPACES_RE = re.compile(r"[ \t]+")
_SPACE_COMMA_RE = re.compile(r"[ \t]+,")
_COMMAS_RE = re.compile(r",(?:[ \t]*,)+")
_COMMA_MARK_RE = re.compile(r",(?=[ \t]*[.!?;:])")


def _emoji(m: re.Match[str]) -> str:
    """An emoji run between two words is a pause; elsewhere it is just removed."""
    s, i, j = m.string, m.start() - 1, m.end()
    while i >= 0 and s[i] in " \t":
        i -= 1
    while j < len(s) and s[j] in " \t":
        j += 1
    if i >= 0 and j < len(s) and s[i].isalnum() and s[j].isalnum():
        return ", "
    return " "


def strip_markup(text: str) -> str:
    """``text`` without markdown, HTML tags or emoji; lines joined with pauses."""
    if not text:
        return text
    text = _ENTITY_RE.sub(lambda m: _HTML_ENTITIES[m.group(0)], text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _FENCE_RE.sub("", text)
    text = _TABLE_SEP_RE.sub("", text)
    text = _RULE_RE.sub("", text)
    text = _SETEXT_RE.sub("", text)
    text = _HEADING_RE.sub(lambda m: m.group(1) + ("" if _ends_marked(m.group(1)) else "."), text)
    text = _QUOTE_RE.sub("", text)
    text = _BULLET_RE.sub("", text)
    text = _NUMBERED_RE.sub("", text)
    text = _CHECKBOX_RE.sub("", text)
    text = _IMAGE_RE.sub(r"\1", text)
    text = _LINK_RE.sub(r"\1", text)
    text = _REF_LINK_RE.sub(r"\1", text)
    text = _AUTOLINK_RE.sub(r"\1", text)
    text = _HTML_TAG_RE.sub(" ", text)
    text = _CODE_RE.sub(r"\1", text).replace("`", "")
    text = _STRIKE_RE.sub("", text)
    text = _STAR_RE.sub("", text)
    text = _LONE_STAR_RE.sub(" ", text)
    text = _STARS_RE.sub("", text)  # what is left of emphasis inside words ("a**b")
    text = _UNDERSCORE_RE.sub("", text)
    text = _EMOJI_RUN_RE.sub(_emoji, text)
    lines = []
    for line in text.split("\n"):
        line = _TABLE_PIPE_RE.sub(", ", line).strip(" \t,") if "|" in line else line.strip()
        if line:
            lines.append(line)
    # a line that ends without punctuation (a list item, a table row) ends a clause
    joined = " ".join(
        line if i == len(lines) - 1 or _ends_marked(line) else line + ","
        for i, line in enumerate(lines)
    )
    joined = _SPACES_RE.sub(" ", joined)
    joined = _SPACE_COMMA_RE.sub(",", joined)
    joined = _COMMAS_RE.sub(",", joined)
    joined = _COMMA_MARK_RE.sub("", joined)
    return joined.strip(" ,")


def _ends_marked(line: str) -> bool:
    return bool(line) and line.rstrip()[-1:] in _LINE_END_MARK
