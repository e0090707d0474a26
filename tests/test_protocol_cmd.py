"""Text command ports (docs/wire.md#command-ports): one command line, trailing CR/LF
stripped, ``NAME`` or ``NAME:arg``; one reply line; numbers like C++ ``std::to_string``."""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import (
    MAX_DOCK_COMMAND,
    MAX_ENGINE_COMMAND,
    Command,
    cpp_double,
    encode_reply,
    is_error_reply,
    parse_command,
)


def test_bounds() -> None:
    assert MAX_DOCK_COMMAND == 512
    assert MAX_ENGINE_COMMAND == 4096


@pytest.mark.parametrize(
    ("wire", "cmd"),
    [
        (b"PING", Command("PING", None, "PING")),
        (b"PING\n", Command("PING", None, "PING")),
        (b"PING\r\n", Command("PING", None, "PING")),
        (b"PING\r\r\n", Command("PING", None, "PING")),
        (b"PING\n\r\n", Command("PING", None, "PING")),
        (b"STATUS\n", Command("STATUS", None, "STATUS")),
        (b"SET_LOG_LEVEL:DEBUG\r\n", Command("SET_LOG_LEVEL", "DEBUG", "SET_LOG_LEVEL:DEBUG")),
        (b"SET_SPEED:1.25\n", Command("SET_SPEED", "1.25", "SET_SPEED:1.25")),
        (b"TEST_SYNTH:\n", Command("TEST_SYNTH", "", "TEST_SYNTH:")),
        (
            b"TEST_SYNTH:Hallo: wie geht's?\r\n",
            Command("TEST_SYNTH", "Hallo: wie geht's?", "TEST_SYNTH:Hallo: wie geht's?"),
        ),
        (
            b"BENCHMARK:Guten Tag.|3\n",
            Command("BENCHMARK", "Guten Tag.|3", "BENCHMARK:Guten Tag.|3"),
        ),
        (
            b"SYNTH_WAV:out/a.wav|Hallo Welt\n",
            Command("SYNTH_WAV", "out/a.wav|Hallo Welt", "SYNTH_WAV:out/a.wav|Hallo Welt"),
        ),
        (
            b"TEST_SYNTH: lead and trail \n",
            Command("TEST_SYNTH", " lead and trail ", "TEST_SYNTH: lead and trail "),
        ),
        (
            "TEST_SYNTH:Grüße\n".encode(),
            Command("TEST_SYNTH", "Grüße", "TEST_SYNTH:Grüße"),
        ),
        (b"", Command("", None, "")),
        (b"\r\n", Command("", None, "")),
        (b":x", Command("", "x", ":x")),
        (b"PING\nSTATUS\n", Command("PING", None, "PING")),
    ],
)
def test_parse_golden(wire: bytes, cmd: Command) -> None:
    assert parse_command(wire) == cmd


def test_command_name_is_normalised() -> None:
    assert parse_command(b"ping\n").name == "PING"
    assert parse_command(b" status \n").name == "STATUS"


def test_undecodable_bytes_do_not_raise() -> None:
    cmd = parse_command(b"TEST_SYNTH:\xff\xfe\n")
    assert cmd.name == "TEST_SYNTH"
    assert cmd.arg == "\ufffd\ufffd"


@pytest.mark.parametrize(
    ("line", "wire"),
    [
        ("PONG", b"PONG\n"),
        ("ACTIVE kokoro", b"ACTIVE kokoro\n"),
        ("NONE", b"NONE\n"),
        ("OK", b"OK\n"),
        ("ERR unknown_command", b"ERR unknown_command\n"),
        ("ERROR:Unknown command", b"ERROR:Unknown command\n"),
        ("SPEED:1.00", b"SPEED:1.00\n"),
        ("a\nb", b"a b\n"),
        ("a\r\nb", b"a  b\n"),
        ("Grüße", "Grüße\n".encode()),
        ("", b"\n"),
    ],
)
def test_encode_reply(line: str, wire: bytes) -> None:
    assert encode_reply(line) == wire


@pytest.mark.parametrize(
    ("line", "err"),
    [
        ("ERR unknown_command", True),
        ("ERROR:Unknown command", True),
        ("ERROR:synthesis failed", True),
        ("PONG", False),
        ("OK", False),
        ("SYNTH_RESULT:1ms:2:24000:0.000083s:rtf=0.012000:peak=0.900000:rms=0.100000", False),
    ],
)
def test_is_error_reply(line: str, err: bool) -> None:
    assert is_error_reply(line) is err


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (0.0, "0.000000"),
        (-0.0, "-0.000000"),
        (1.0, "1.000000"),
        (1.5, "1.500000"),
        (-2.25, "-2.250000"),
        (0.9, "0.900000"),
        (1234.5678, "1234.567800"),
        (0.0078125, "0.007812"),  # exact tie: round half to even, as glibc printf
        (0.0234375, "0.023438"),  # exact tie rounding up to even
        (1e-7, "0.000000"),
        (0.1234565, "0.123456"),  # the double is just below the tie
        (24000.0, "24000.000000"),
        (1e20, "100000000000000000000.000000"),
        (math.inf, "inf"),
        (-math.inf, "-inf"),
        (math.nan, "nan"),
        (-math.nan, "-nan"),
    ],
)
def test_cpp_double_golden(x: float, text: str) -> None:
    assert cpp_double(x) == text


def _libc_snprintf() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


_LIBC = _libc_snprintf()


@pytest.mark.skipif(_LIBC is None, reason="no C library to compare with")
@given(
    st.floats(min_value=-1e12, max_value=1e12, allow_subnormal=False)
    | st.floats(allow_subnormal=False)
)
def test_cpp_double_matches_c_printf(x: float) -> None:
    """std::to_string(double) is specified as sprintf("%f"); compare with the C library."""
    assert _LIBC is not None
    buf = ctypes.create_string_buffer(512)
    n = _LIBC.snprintf(buf, 512, b"%f", ctypes.c_double(x))
    assert 0 < n < 512
    assert cpp_double(x) == buf.value.decode()


_NAMES = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=20)
_ARGS = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\r\n"), max_size=200
)


@given(_NAMES, _ARGS, st.sampled_from([b"", b"\n", b"\r\n", b"\r\r\n"]))
def test_parse_roundtrip(name: str, arg: str, ending: bytes) -> None:
    raw = f"{name}:{arg}"
    cmd = parse_command(raw.encode() + ending)
    assert cmd == Command(name, arg, raw)


@given(st.binary(max_size=600))
def test_parse_never_raises(data: bytes) -> None:
    cmd = parse_command(data)
    assert "\n" not in cmd.raw
    assert not cmd.raw.endswith("\r")
    assert cmd.name == cmd.name.strip().upper()


@given(st.text(max_size=200))
def test_reply_is_one_line(line: str) -> None:
    wire = encode_reply(line)
    assert wire.endswith(b"\n")
    assert wire.count(b"\n") == 1
    assert b"\r" not in wire
