"""Batch request files of ``ttsdock qwen3-synth --batch``: one JSON object a line.

Rule: parsing never raises for bad content; each line becomes a ``BatchLine``
or a ``BatchLineError`` that names the line (and the request, when the name
could be read) and the reason, so one bad line costs only itself. Bounds:
``MAX_LINE_BYTES`` per line, ``MAX_LINES`` requests per file.

Fields: ``name`` (file-name safe, unique), ``text``, and optionally
``language``, ``speaker``, ``instruct``, ``non_streaming`` (bool) and
``max_frames`` (int); an absent optional field takes the command-line value.
Blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

MAX_LINE_BYTES = 1 << 16
MAX_LINES = 4096
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_FIELDS = {"name", "text", "language", "speaker", "instruct", "non_streaming", "max_frames"}


@dataclass(frozen=True)
class BatchLine:
    """One valid request line."""

    lineno: int
    name: str
    text: str
    language: str | None = None
    speaker: str | None = None
    instruct: str | None = None
    non_streaming: bool | None = None
    max_frames: int | None = None


@dataclass(frozen=True)
class BatchLineError:
    """A line that is not a valid request: ``message`` names it and says why."""

    lineno: int
    name: str | None
    message: str


def parse_line(line: str, lineno: int) -> BatchLine | BatchLineError | None:
    """One line -> a request, an error, or None (blank or comment)."""
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return None
    where = f"line {lineno}"
    if len(stripped.encode("utf-8", "surrogatepass")) > MAX_LINE_BYTES:
        return BatchLineError(lineno, None, f"{where}: longer than {MAX_LINE_BYTES} bytes")
    try:
        obj = json.loads(stripped)
    except (ValueError, RecursionError) as exc:
        return BatchLineError(lineno, None, f"{where}: not JSON: {exc}")
    if not isinstance(obj, dict):
        return BatchLineError(lineno, None, f"{where}: expected a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        return BatchLineError(
            lineno, None, f"{where}: 'name' must match {NAME_RE.pattern} (it names the .npy file)"
        )
    where = f"line {lineno} (request {name!r})"

    def bad(msg: str) -> BatchLineError:
        return BatchLineError(lineno, name, f"{where}: {msg}")

    unknown = sorted(set(obj) - _FIELDS)
    if unknown:
        return bad(f"unknown field(s) {', '.join(unknown)}; expected {', '.join(sorted(_FIELDS))}")
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
        return bad("'text' must be a non-empty string")
    strs: dict[str, str | None] = {}
    for key in ("language", "speaker", "instruct"):
        v = obj.get(key)
        if v is not None and not isinstance(v, str):
            return bad(f"{key!r} must be a string")
        strs[key] = v
    ns = obj.get("non_streaming")
    if ns is not None and not isinstance(ns, bool):
        return bad("'non_streaming' must be true or false")
    mf = obj.get("max_frames")
    if mf is not None and (isinstance(mf, bool) or not isinstance(mf, int) or mf < 1):
        return bad("'max_frames' must be an integer >= 1")
    return BatchLine(
        lineno=lineno,
        name=name,
        text=text,
        language=strs["language"],
        speaker=strs["speaker"],
        instruct=strs["instruct"],
        non_streaming=ns,
        max_frames=mf,
    )


def parse_batch(text: str) -> list[BatchLine | BatchLineError]:
    """Every line of a batch file, in order; duplicate names and excess lines are errors."""
    out: list[BatchLine | BatchLineError] = []
    names: set[str] = set()
    count = 0
    for i, line in enumerate(text.splitlines(), start=1):
        got = parse_line(line, i)
        if got is None:
            continue
        count += 1
        if count > MAX_LINES:
            out.append(BatchLineError(i, None, f"line {i}: more than {MAX_LINES} requests"))
            break
        if isinstance(got, BatchLine):
            if got.name in names:
                got = BatchLineError(
                    i, got.name, f"line {i} (request {got.name!r}): duplicate name"
                )
            else:
                names.add(got.name)
        out.append(got)
    return out
