"""Text command ports (docs/wire.md#command-ports: dock 13142, engines 13144).

Rule 1: one command per TCP connection, read up to a bound (512 bytes for the
dock, 4096 for engines), trailing CR/LF stripped; one reply line, then close.
Rule 2: this file knows the line format and the C++ number formatting, not
which commands exist: the dock and the engine runtime own their tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_DOCK_COMMAND = 512
MAX_ENGINE_COMMAND = 4096
COMMAND_TIMEOUT = 10.0  # seconds; docs/wire.md#engine-cmd-port receive timeout


@dataclass(frozen=True, slots=True)
class Command:
    """``NAME`` or ``NAME:arg``; ``raw`` is the stripped line."""

    name: str
    arg: str | None
    raw: str


def parse_command(data: bytes) -> Command:
    """Decode a command line; never raises (undecodable bytes become U+FFFD)."""
    raw = data.decode("utf-8", errors="replace")
    nl = raw.find("\n")
    if nl >= 0:
        raw = raw[:nl]
    raw = raw.rstrip("\r\n")
    name, sep, arg = raw.partition(":")
    return Command(name.strip().upper(), arg if sep else None, raw)


def encode_reply(line: str) -> bytes:
    """One reply line; embedded newlines are flattened so the reply stays one line."""
    return line.replace("\r", " ").replace("\n", " ").encode("utf-8") + b"\n"


def cpp_double(x: float) -> str:
    """Format like C++ ``std::to_string(double)``: fixed, six decimals (``printf("%f")``)."""
    if math.isnan(x):  # printf keeps the sign bit of a NaN; Python's format drops it
        return "-nan" if math.copysign(1.0, x) < 0 else "nan"
    return f"{x:.6f}"


def is_error_reply(line: str) -> bool:
    return line.startswith(("ERR", "ERROR"))
