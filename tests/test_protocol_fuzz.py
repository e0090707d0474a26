"""Arbitrary bytes in arbitrary pieces into the incremental decoders.

For every input: only ``ProtocolError`` escapes; the events do not depend on how the
stream was split; what the decoder still holds is exactly the unconsumed tail, which
is never more than one maximal frame (plus the last feed, before draining).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from protocol_helpers import engine_events, mgmt_messages, packets, splits

from protocol import (
    MAX_FRAME_BODY,
    NEED_DATA,
    EngineEvent,
    EngineFrameDecoder,
    FrameDecoder,
    ProtocolError,
    encode_engine_frame,
    encode_frame,
    encode_mgmt,
    encode_packet,
)

MAX_FRAME = 4 + MAX_FRAME_BODY
MAX_ENGINE_FRAME = 1 + 8 + 1_048_576

_pipeline_bodies = st.one_of(packets.map(encode_packet), mgmt_messages().map(encode_mgmt))
_pipeline_wire = st.lists(
    st.one_of(
        _pipeline_bodies.map(encode_frame),
        st.binary(max_size=10),
        st.sampled_from(
            [b"\x00\x00\x00", b"\x00\x00\x00\x00", b"\x00\x10\x01\x00", b"\x00\x10\x01\x01"]
        ),
        st.integers(0, 300).map(lambda n: n.to_bytes(4, "big")),
    ),
    max_size=10,
).map(b"".join)

_engine_wire = st.lists(
    st.one_of(
        engine_events().map(encode_engine_frame),
        st.binary(max_size=10),
        st.sampled_from(
            [b"\x01", b"\x02", b"\x02\x0a", b"\x02\x0a\x10\x00", b"\x02\x0a\x10\x01", b"\x00"]
        ),
        st.integers(0, 300).map(lambda n: b"\x01\x00\x00\x00\x01" + n.to_bytes(4, "big")),
    ),
    max_size=10,
).map(b"".join)


def _pipeline(pieces: list[bytes]) -> tuple[list[bytes], str | None]:
    stream = b"".join(pieces)
    dec = FrameDecoder()
    bodies: list[bytes] = []
    fed = consumed = 0
    try:
        for piece in pieces:
            dec.feed(piece)
            fed += len(piece)
            assert dec.buffered == fed - consumed
            assert dec.buffered <= MAX_FRAME + len(piece)
            while (body := dec.next_body()) is not NEED_DATA:
                assert isinstance(body, bytes)
                assert stream[consumed : consumed + 4] == len(body).to_bytes(4, "big")
                assert stream[consumed + 4 : consumed + 4 + len(body)] == body
                consumed += 4 + len(body)
                bodies.append(body)
            # what is left is exactly the unconsumed tail, and it is an incomplete frame
            tail = stream[consumed:fed]
            assert dec.buffered == len(tail) < MAX_FRAME
            if len(tail) >= 4:
                assert len(tail) < 4 + int.from_bytes(tail[:4], "big")
    except ProtocolError as exc:
        return bodies, exc.reason
    return bodies, None


def _engine(pieces: list[bytes]) -> tuple[list[EngineEvent], str | None]:
    stream = b"".join(pieces)
    dec = EngineFrameDecoder()
    events: list[EngineEvent] = []
    fed = consumed = 0
    try:
        for piece in pieces:
            dec.feed(piece)
            fed += len(piece)
            assert dec.buffered == fed - consumed
            assert dec.buffered <= MAX_ENGINE_FRAME + len(piece)
            while (ev := dec.next_event()) is not NEED_DATA:
                wire = encode_engine_frame(ev)  # type: ignore[arg-type]
                assert stream[consumed : consumed + len(wire)] == wire  # canonical encoding
                consumed += len(wire)
                events.append(ev)  # type: ignore[arg-type]
            assert dec.buffered == fed - consumed < MAX_ENGINE_FRAME
    except ProtocolError as exc:
        return events, exc.reason
    return events, None


@given(_pipeline_wire, st.data())
def test_frame_decoder_arbitrary_splits(wire: bytes, data: st.DataObject) -> None:
    assert _pipeline(data.draw(splits(wire))) == _pipeline([wire])


@given(st.binary(max_size=300), st.data())
def test_frame_decoder_random_bytes(wire: bytes, data: st.DataObject) -> None:
    assert _pipeline(data.draw(splits(wire))) == _pipeline([wire])


@given(_engine_wire, st.data())
def test_engine_decoder_arbitrary_splits(wire: bytes, data: st.DataObject) -> None:
    assert _engine(data.draw(splits(wire))) == _engine([wire])


@given(st.binary(max_size=300), st.data())
def test_engine_decoder_random_bytes(wire: bytes, data: st.DataObject) -> None:
    assert _engine(data.draw(splits(wire))) == _engine([wire])


@given(_engine_wire)
def test_engine_decoder_one_byte_at_a_time(wire: bytes) -> None:
    assert _engine([wire[i : i + 1] for i in range(len(wire))]) == _engine([wire])


@given(_pipeline_wire)
def test_frame_decoder_one_byte_at_a_time(wire: bytes) -> None:
    assert _pipeline([wire[i : i + 1] for i in range(len(wire))]) == _pipeline([wire])


def test_error_reasons_are_named() -> None:
    assert _pipeline([b"\xff\xff\xff\xff"]) == ([], "frame_too_large")
    assert _engine([b"\x03"]) == ([], "unknown_tag")
    assert _engine([b"\x02\x06"]) == ([], "unknown_mgmt_type")
    assert _engine([b"\x01" + bytes(8)]) == ([], "bad_call_id")
    assert _engine([b"\x01\x00\x00\x00\x01\x00\x10\x00\x01"]) == ([], "payload_too_large")
    assert _engine([b"\x02\x0a\x10\x01"]) == ([], "custom_too_long")
