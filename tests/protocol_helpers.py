"""Shared pieces of the protocol test suite: hypothesis strategies and stream helpers.

Golden bytes live in the test files themselves, written out by hand from docs/wire.md;
this module only holds what several files need: event strategies, a splitter that
feeds a stream in arbitrary pieces, and drain loops for the two incremental decoders.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from hypothesis import strategies as st

from protocol import (
    NEED_DATA,
    CallEnd,
    Custom,
    EngineEvent,
    EngineFrameDecoder,
    FrameDecoder,
    Hello,
    MgmtMessage,
    Packet,
    Ping,
    Pong,
    SpeechActive,
    SpeechIdle,
)
from protocol.mgmt import MAX_CUSTOM_ENGINE

T = TypeVar("T")
U32_MAX = 0xFFFF_FFFF

call_ids = st.integers(min_value=1, max_value=U32_MAX)
payloads = st.binary(max_size=2048)
packets = st.builds(Packet, call_ids, payloads)


def mgmt_messages(max_custom: int = MAX_CUSTOM_ENGINE) -> st.SearchStrategy[MgmtMessage]:
    return st.one_of(
        st.builds(CallEnd, call_ids),
        st.builds(SpeechActive, call_ids),
        st.builds(SpeechIdle, call_ids),
        st.just(Ping()),
        st.just(Pong()),
        st.builds(Custom, st.binary(max_size=min(max_custom, 512))),
        st.sampled_from([Custom(b""), Custom(b"SHUTDOWN"), Custom(b"FLUSH_TTS")]),
    )


def engine_events() -> st.SearchStrategy[EngineEvent]:
    return st.one_of(packets, mgmt_messages())


NAME_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
hello_names = st.text(alphabet=NAME_ALPHABET, min_size=1, max_size=32)
hellos = st.builds(Hello, hello_names)


@st.composite
def splits(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut at arbitrary points (empty pieces allowed: a read may return nothing)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    pieces, last = [], 0
    for cut in cuts:
        pieces.append(data[last:cut])
        last = cut
    pieces.append(data[last:])
    return pieces


def one_byte_at_a_time(data: bytes) -> Iterator[bytes]:
    for i in range(len(data)):
        yield data[i : i + 1]


def drain_frames(dec: FrameDecoder) -> list[bytes]:
    out: list[bytes] = []
    while True:
        body = dec.next_body()
        if body is NEED_DATA:
            return out
        assert isinstance(body, bytes)
        out.append(body)


def drain_engine(dec: EngineFrameDecoder) -> list[EngineEvent]:
    out: list[EngineEvent] = []
    while True:
        ev = dec.next_event()
        if ev is NEED_DATA:
            return out
        out.append(ev)  # type: ignore[arg-type]


def feed_all(
    pieces: Sequence[bytes], feed: Callable[[bytes], None], drain: Callable[[], list[T]]
) -> list[T]:
    """Feed every piece, draining after each one; return all events in order."""
    events: list[T] = []
    for piece in pieces:
        feed(piece)
        events.extend(drain())
    return events


def held_bytes(decoder: object) -> int:
    """Bytes the decoder really keeps (consumed or not), found without naming its private
    attributes: the sizes of the byte buffers it references."""
    return sum(len(r) for r in gc.get_referents(decoder) if isinstance(r, bytes | bytearray))
