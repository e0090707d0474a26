"""Engine dock handshake: the HELLO line and the ``OK`` / ``ERR <reason>`` reply
(docs/wire.md#handshake).

Rule 1: the HELLO is one line of at most 1 KiB, with no control bytes but
the final ``\\n`` (a ``\\r`` is ignored); the dock answers exactly one line.
Rule 2: this file does not know about the 2 s timeout's clock or sockets: the
I/O layer reports a timeout with ``HelloRejected(REASON_TIMEOUT_OR_TOO_LONG)``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from protocol.errors import ProtocolError

MAX_HELLO_LINE = 1024  # docs/wire.md#handshake: at most 1 KiB including the newline
MAX_REPLY_LINE = 256
SAMPLE_RATE = 24000
CHANNELS = 1
FORMAT = "f32le"
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,32}")

REASON_TIMEOUT_OR_TOO_LONG = "hello_timeout_or_too_long"
REASON_MISSING_FIELD = "hello_missing_field"
REASON_BAD_NAME = "hello_bad_name"
REASON_BAD_SAMPLE_RATE = "hello_bad_sample_rate"
REASON_BAD_CHANNELS = "hello_bad_channels"
REASON_BAD_FORMAT = "hello_bad_format"

OK_LINE = b"OK\n"


class HelloRejected(ProtocolError):
    """The dock refuses a HELLO; ``reason`` is the token sent back in ``ERR <reason>``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason, detail)

    @property
    def reply(self) -> bytes:
        return encode_err(self.reason)


@dataclass(frozen=True, slots=True)
class Hello:
    name: str
    sample_rate: int = SAMPLE_RATE
    channels: int = CHANNELS
    format: str = FORMAT


def encode_hello(hello: Hello) -> bytes:
    """Compact JSON, fields in the reference order, one line."""
    obj = {
        "name": hello.name,
        "sample_rate": hello.sample_rate,
        "channels": hello.channels,
        "format": hello.format,
    }
    line = json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"
    if len(line) > MAX_HELLO_LINE:
        raise ValueError("HELLO line longer than 1 KiB")
    return line


def encode_err(reason: str) -> bytes:
    return b"ERR " + reason.encode("ascii", errors="replace") + b"\n"


class LineReader:
    """Collects one ``\\n``-terminated line of at most ``limit`` bytes (newline included).

    ``feed`` returns the line without its terminator (and without ``\\r``) once
    complete, else ``None``; bytes after the newline are kept in ``rest``.
    Control bytes other than ``\\r``/``\\n`` and over-long lines raise
    ``HelloRejected(hello_timeout_or_too_long)``: the reference's line reader
    fails on them exactly as on a timeout.
    """

    __slots__ = ("_buf", "limit", "rest")

    def __init__(self, limit: int = MAX_HELLO_LINE) -> None:
        self._buf = bytearray()
        self.limit = limit
        self.rest = b""

    def feed(self, data: bytes) -> bytes | None:
        nl = data.find(b"\n")
        part = data if nl < 0 else data[:nl]
        if len(self._buf) + len(part) + (1 if nl >= 0 else 0) > self.limit:
            raise HelloRejected(REASON_TIMEOUT_OR_TOO_LONG, "line longer than the limit")
        self._buf += part
        if nl < 0:
            return None
        self.rest = data[nl + 1 :]
        line = bytes(self._buf).replace(b"\r", b"")
        if any(b < 0x20 or b == 0x7F for b in line):
            raise HelloRejected(REASON_TIMEOUT_OR_TOO_LONG, "control byte in line")
        return line


def parse_hello(line: bytes) -> Hello:
    """Validate a HELLO line (without its newline) exactly as the reference dock does."""
    if len(line) >= MAX_HELLO_LINE:  # the newline must still fit in the 1 KiB
        raise HelloRejected(REASON_TIMEOUT_OR_TOO_LONG, "line longer than the limit")
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # RecursionError: ~1000 nested brackets fit in 1 KiB and exhaust json's recursion.
        raise HelloRejected(REASON_MISSING_FIELD, "not a JSON object") from exc
    if not isinstance(obj, dict) or not all(
        k in obj for k in ("name", "sample_rate", "channels", "format")
    ):
        raise HelloRejected(REASON_MISSING_FIELD, "needs name, sample_rate, channels, format")
    name = obj["name"]
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise HelloRejected(REASON_BAD_NAME, "name must match [A-Za-z0-9_-]{1,32}")
    rate = obj["sample_rate"]
    if isinstance(rate, bool) or not isinstance(rate, int) or rate != SAMPLE_RATE:
        raise HelloRejected(REASON_BAD_SAMPLE_RATE, f"sample_rate must be {SAMPLE_RATE}")
    ch = obj["channels"]
    if isinstance(ch, bool) or not isinstance(ch, int) or ch != CHANNELS:
        raise HelloRejected(REASON_BAD_CHANNELS, f"channels must be {CHANNELS}")
    fmt = obj["format"]
    if fmt != FORMAT:
        raise HelloRejected(REASON_BAD_FORMAT, f"format must be {FORMAT}")
    return Hello(name, rate, ch, fmt)


@dataclass(frozen=True, slots=True)
class HelloReply:
    """The dock's answer as an engine sees it: ``ok`` or the ``ERR`` reason."""

    ok: bool
    reason: str = ""


def parse_hello_reply(line: bytes) -> HelloReply:
    if line == b"OK":
        return HelloReply(True)
    if line.startswith(b"ERR "):
        return HelloReply(False, line[4:].decode("ascii", errors="replace"))
    raise ProtocolError("bad_hello_reply", repr(line[:64]))
