"""Engine dock handshake (docs/wire.md#handshake): one HELLO line of at most 1 KiB,
answered ``OK\\n`` or ``ERR <reason>\\n``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from protocol_helpers import hello_names, hellos, splits

from protocol import (
    OK_LINE,
    Hello,
    HelloRejected,
    HelloReply,
    LineReader,
    ProtocolError,
    encode_err,
    encode_hello,
    parse_hello,
    parse_hello_reply,
)
from protocol.hello import MAX_HELLO_LINE

HELLO_LINE = b'{"name":"kokoro","sample_rate":24000,"channels":1,"format":"f32le"}\n'
KOKORO = Hello("kokoro", 24000, 1, "f32le")
REASONS = [
    "hello_timeout_or_too_long",
    "hello_missing_field",
    "hello_bad_name",
    "hello_bad_sample_rate",
    "hello_bad_channels",
    "hello_bad_format",
]
GOOD: dict[str, Any] = {"name": "kokoro", "sample_rate": 24000, "channels": 1, "format": "f32le"}


def line_of(obj: object) -> bytes:
    return json.dumps(obj).encode()


def with_field(key: str, value: object) -> bytes:
    return line_of({**GOOD, key: value})


def without(key: str) -> bytes:
    return line_of({k: v for k, v in GOOD.items() if k != key})


def reject_reason(line: bytes) -> str:
    with pytest.raises(HelloRejected) as info:
        parse_hello(line)
    assert isinstance(info.value, ProtocolError)
    return info.value.reason


# ---------------------------------------------------------------- golden lines


def test_encode_hello_golden() -> None:
    assert encode_hello(Hello("kokoro")) == HELLO_LINE
    assert encode_hello(KOKORO) == HELLO_LINE
    assert encode_hello(Hello("qwen3")) == (
        b'{"name":"qwen3","sample_rate":24000,"channels":1,"format":"f32le"}\n'
    )


def test_parse_hello_golden() -> None:
    assert parse_hello(HELLO_LINE[:-1]) == KOKORO


def test_ok_line() -> None:
    assert OK_LINE == b"OK\n"
    assert parse_hello_reply(OK_LINE[:-1]) == HelloReply(True)


@pytest.mark.parametrize("reason", REASONS)
def test_err_lines(reason: str) -> None:
    wire = b"ERR " + reason.encode() + b"\n"
    assert encode_err(reason) == wire
    assert HelloRejected(reason).reply == wire
    assert parse_hello_reply(wire[:-1]) == HelloReply(False, reason)


def test_err_lines_spelled_out() -> None:
    assert encode_err("hello_timeout_or_too_long") == b"ERR hello_timeout_or_too_long\n"
    assert encode_err("hello_missing_field") == b"ERR hello_missing_field\n"
    assert encode_err("hello_bad_name") == b"ERR hello_bad_name\n"
    assert encode_err("hello_bad_sample_rate") == b"ERR hello_bad_sample_rate\n"
    assert encode_err("hello_bad_channels") == b"ERR hello_bad_channels\n"
    assert encode_err("hello_bad_format") == b"ERR hello_bad_format\n"


@pytest.mark.parametrize("line", [b"", b"ok", b"OK ", b"ERR", b"ERROR x", b"KO", b"OK\r"])
def test_bad_reply_lines(line: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_hello_reply(line)
    assert info.value.reason == "bad_hello_reply"


def test_err_with_empty_reason() -> None:
    assert parse_hello_reply(b"ERR ") == HelloReply(False, "")


def test_encode_hello_refuses_over_1_kib() -> None:
    with pytest.raises(ValueError, match="1 KiB"):
        encode_hello(Hello("x" * 1000))


# ---------------------------------------------------------------- validation


def test_accepts_variants() -> None:
    assert parse_hello(line_of({**GOOD, "version": 2, "extra": [1, 2]})) == KOKORO
    rev = dict(reversed(list(GOOD.items())))
    assert parse_hello(line_of(rev)) == KOKORO
    assert parse_hello(b'{ "name" : "kokoro" , "sample_rate" : 24000 ,'
                       b' "channels" : 1 , "format" : "f32le" }') == KOKORO  # fmt: skip
    for name in ["a", "A" * 32, "A-z_0-9", "neutts-air", "_", "-"]:
        assert parse_hello(with_field("name", name)).name == name


@pytest.mark.parametrize(
    "line",
    [
        b"{}",
        without("name"),
        without("sample_rate"),
        without("channels"),
        without("format"),
        b'{"name":"kokoro"}',
        b'{"Name":"kokoro","sample_rate":24000,"channels":1,"format":"f32le"}',
    ],
)
def test_missing_field(line: bytes) -> None:
    assert reject_reason(line) == "hello_missing_field"


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"{",
        b"not json",
        b"HELLO kokoro",
        b'{"name":"kokoro",}',
        b"[]",
        b'["name","sample_rate","channels","format"]',
        b'"kokoro"',
        b"null",
        b"24000",
        b"\xff\xfe{}",
        b'{"name":"k\xc3"}',
        b"[" * 1000,  # deep nesting within 1 KiB must not escape as RecursionError
        b"[" * 511 + b"]" * 511,
        b'{"a":' * 200,
    ],
)
def test_bad_json_is_missing_field(line: bytes) -> None:
    assert reject_reason(line) == "hello_missing_field"


@pytest.mark.parametrize(
    "name",
    [
        "",
        "A" * 33,
        "ko koro",
        " kokoro",
        "kokoro ",
        "kökoro",
        "коkoro",
        "ko.koro",
        "ko/koro",
        "ko:koro",
        "kokoro\n",
        "kokoro\u0000",
        42,
        None,
        True,
        ["kokoro"],
        {"n": "kokoro"},
    ],
)
def test_bad_name(name: object) -> None:
    assert reject_reason(with_field("name", name)) == "hello_bad_name"


def test_bad_name_raw_utf8_and_escaped() -> None:
    raw = '{"name":"kö","sample_rate":24000,"channels":1,"format":"f32le"}'.encode()
    escaped = b'{"name":"k\\u00f6","sample_rate":24000,"channels":1,"format":"f32le"}'
    assert reject_reason(raw) == "hello_bad_name"
    assert reject_reason(escaped) == "hello_bad_name"


@pytest.mark.parametrize(
    "rate", [16000, 48000, 22050, 0, -24000, "24000", True, False, 24000.0, 2.4e4, None, [24000]]
)
def test_bad_sample_rate(rate: object) -> None:
    assert reject_reason(with_field("sample_rate", rate)) == "hello_bad_sample_rate"


@pytest.mark.parametrize("channels", [2, 0, -1, "1", True, 1.0, None, [1]])
def test_bad_channels(channels: object) -> None:
    assert reject_reason(with_field("channels", channels)) == "hello_bad_channels"


@pytest.mark.parametrize(
    "fmt", ["s16le", "F32LE", "f32", "f32be", "", " f32le", 1, None, ["f32le"]]
)
def test_bad_format(fmt: object) -> None:
    assert reject_reason(with_field("format", fmt)) == "hello_bad_format"


def test_reason_precedence() -> None:
    everything_bad = {"name": "a b", "sample_rate": 1, "channels": 2, "format": "x"}
    assert reject_reason(line_of(everything_bad)) == "hello_bad_name"
    assert reject_reason(line_of({**everything_bad, "name": "ok"})) == "hello_bad_sample_rate"
    assert (
        reject_reason(line_of({**everything_bad, "name": "ok", "sample_rate": 24000}))
        == "hello_bad_channels"
    )
    assert reject_reason(line_of({"name": "a b", "channels": 2})) == "hello_missing_field"


def test_parse_hello_refuses_over_long_line() -> None:
    line = with_field("pad", "x" * 1100)
    assert reject_reason(line) == "hello_timeout_or_too_long"


# ---------------------------------------------------------------- line reader


def test_line_reader_one_feed() -> None:
    r = LineReader()
    assert r.feed(HELLO_LINE) == HELLO_LINE[:-1]
    assert r.rest == b""


def test_line_reader_cr_ignored() -> None:
    r = LineReader()
    assert r.feed(HELLO_LINE[:-1] + b"\r\n") == HELLO_LINE[:-1]
    r = LineReader()
    line = r.feed(b'{"name":"kok\roro",\r"sample_rate":24000,"channels":1,"format":"f32le"}\r\n')
    assert line is not None
    assert parse_hello(line) == KOKORO  # a \r anywhere in the line is ignored


def test_line_reader_split_feeding() -> None:
    r = LineReader()
    for i in range(len(HELLO_LINE) - 1):
        assert r.feed(HELLO_LINE[i : i + 1]) is None
    assert r.feed(b"\n") == HELLO_LINE[:-1]


def test_line_reader_keeps_bytes_after_newline() -> None:
    after = b"\x02\x05" + b"\x01\x00\x00\x00\x01\x00\x00\x00\x00"
    r = LineReader()
    assert r.feed(HELLO_LINE[:10]) is None
    assert r.feed(HELLO_LINE[10:] + after) == HELLO_LINE[:-1]
    assert r.rest == after
    r = LineReader()
    assert r.feed(b"OK\nERR x\n") == b"OK"
    assert r.rest == b"ERR x\n"


def test_line_reader_empty_line() -> None:
    assert LineReader().feed(b"\n") == b""
    assert LineReader().feed(b"\r\n") == b""


def test_line_reader_limit_edges() -> None:
    assert MAX_HELLO_LINE == 1024
    r = LineReader()
    assert r.feed(b"a" * 1023 + b"\n") == b"a" * 1023  # 1 KiB including the newline
    r = LineReader()
    assert r.feed(b"a" * 1024) is None
    with pytest.raises(HelloRejected) as info:
        r.feed(b"\n")
    assert info.value.reason == "hello_timeout_or_too_long"


@pytest.mark.parametrize(
    "pieces",
    [
        [b"a" * 1025],
        [b"a" * 1025 + b"\n"],
        [b"a" * 600, b"a" * 600],
        [b"{" * 512, b"}" * 512, b"\n"],
        [b"x" * 5000],
    ],
)
def test_line_reader_over_long(pieces: list[bytes]) -> None:
    r = LineReader()
    with pytest.raises(HelloRejected) as info:
        for p in pieces:
            r.feed(p)
    assert info.value.reason == "hello_timeout_or_too_long"
    assert info.value.reply == b"ERR hello_timeout_or_too_long\n"


def test_line_reader_rejects_before_newline_when_too_long() -> None:
    r = LineReader()
    r.feed(b"a" * 1000)
    with pytest.raises(HelloRejected):
        r.feed(b"a" * 100)  # no newline yet: a slow peer cannot park more than 1 KiB


@pytest.mark.parametrize("ctrl", [b"\x00", b"\x01", b"\t", b"\x0b", b"\x0c", b"\x1b", b"\x7f"])
def test_line_reader_control_bytes(ctrl: bytes) -> None:
    r = LineReader()
    with pytest.raises(HelloRejected) as info:
        r.feed(b'{"name":"ko' + ctrl + b'koro"}\n')
    assert info.value.reason == "hello_timeout_or_too_long"


def test_line_reader_utf8_is_not_control() -> None:
    line = '{"name":"kö"}'.encode()
    assert LineReader().feed(line + b"\n") == line


def test_line_reader_custom_limit() -> None:
    r = LineReader(limit=4)
    assert r.feed(b"abc\n") == b"abc"
    with pytest.raises(HelloRejected):
        LineReader(limit=4).feed(b"abcd\n")


# ---------------------------------------------------------------- properties


@given(hellos)
def test_hello_roundtrip(h: Hello) -> None:
    wire = encode_hello(h)
    assert wire.endswith(b"\n")
    assert wire.count(b"\n") == 1
    assert parse_hello(wire[:-1]) == h


@given(hellos, st.data())
def test_hello_roundtrip_through_line_reader(h: Hello, data: st.DataObject) -> None:
    wire = encode_hello(h) + b"\x02\x04"
    r = LineReader()
    line = None
    tail = b""
    for piece in data.draw(splits(wire)):
        if line is None:
            line = r.feed(piece)
            if line is not None:
                tail = r.rest
        else:
            tail += piece
    assert line is not None
    assert parse_hello(line) == h
    assert tail == b"\x02\x04"


_JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**33), 2**33),
    st.sampled_from([24000, 1, 2, 16000, 24000.0]),
    st.floats(allow_nan=False, allow_subnormal=False),
    hello_names,
    st.text(max_size=40),
    st.sampled_from(["f32le", "s16le", "kokoro", "A" * 33]),
)
_FIELDS = ["name", "sample_rate", "channels", "format"]


def _expected_reason(obj: dict[str, Any]) -> str | None:
    """The docs/wire.md#handshake rules, stated independently of protocol/hello.py."""
    if not all(k in obj for k in _FIELDS):
        return "hello_missing_field"
    name = obj["name"]
    if not (
        isinstance(name, str)
        and 1 <= len(name) <= 32
        and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)
    ):
        return "hello_bad_name"
    for key, want in (("sample_rate", 24000), ("channels", 1)):
        v = obj[key]
        if type(v) is not int or v != want:
            return f"hello_bad_{key}"
    if obj["format"] != "f32le":
        return "hello_bad_format"
    return None


@given(st.dictionaries(st.sampled_from([*_FIELDS, "x"]), _JSON_VALUES))
def test_validation_model(obj: dict[str, Any]) -> None:
    line = json.dumps(obj).encode()
    if len(line) >= MAX_HELLO_LINE:
        return
    want = _expected_reason(obj)
    if want is None:
        assert parse_hello(line) == Hello(obj["name"])
    else:
        assert reject_reason(line) == want


@given(st.binary(max_size=200))
def test_parse_hello_arbitrary_bytes(data: bytes) -> None:
    try:
        parse_hello(data)
    except HelloRejected as exc:
        assert exc.reason in REASONS


_LINEISH = st.lists(
    st.one_of(
        st.binary(max_size=8),
        st.sampled_from([b"\n", b"\r", b"\r\n", b"\x00", b"\x7f", b"\t", b'{"', b"\xc3\xa4"]),
        st.integers(1000, 1030).map(lambda n: b"a" * n),
    ),
    max_size=8,
).map(b"".join)


@given(_LINEISH, st.data())
def test_line_reader_model(data: bytes, draw: st.DataObject) -> None:
    nl = data.find(b"\n")
    if nl < 0:
        want: bytes | str | None = "reject" if len(data) > 1024 else None
    elif nl + 1 > 1024:
        want = "reject"
    else:
        line = data[:nl].replace(b"\r", b"")
        want = "reject" if any(b < 0x20 or b == 0x7F for b in line) else line
    r = LineReader()
    got: bytes | str | None = None
    try:
        for piece in draw.draw(splits(data)):
            got = r.feed(piece)
            if got is not None:
                break
    except HelloRejected as exc:
        assert exc.reason == "hello_timeout_or_too_long"
        got = "reject"
    assert got == want
