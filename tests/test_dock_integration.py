"""The dock as a real subprocess with fake LLaMA, OAP and engines over real sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from dock_helpers import (
    FakeLlama,
    FakeOap,
    Rig,
    audio_payload,
    eventually,
    make_rig,
    nothing_more,
    recv,
    recv_until,
)

from protocol.framing import encode_frame
from protocol.mgmt import (
    CallEnd,
    Custom,
    Ping,
    Pong,
    SpeechActive,
    SpeechIdle,
    encode_mgmt,
)
from protocol.packet import Packet

pytestmark = pytest.mark.slow


@pytest_asyncio.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with make_rig(tmp_path, "--hold-seconds", "2") as r:
        yield r


async def test_text_to_engine_audio_to_oap(rig: Rig) -> None:
    eng = await rig.engine()
    rig.llama.text(7, "Hallo Welt.")
    pkt = await eng.next_of(Packet)
    assert pkt == Packet(7, b"Hallo Welt.")
    payload = audio_payload(4800)
    eng.send(Packet(7, payload))
    got = await recv(rig.oap.packets)
    assert got == Packet(7, payload)  # forwarded byte for byte
    stats = await rig.dock.stats()
    assert int(stats["audio_frames_out"]) == 1
    assert int(stats["hop_samples"]) == 1


async def test_hot_swap(rig: Rig) -> None:
    old = await rig.engine("kokoro")
    old.audio(1)
    await recv(rig.oap.packets)
    new = await rig.engine("qwen3")
    # the replaced engine is told to shut down, OAP is told to flush
    assert await old.next_of(Custom) == Custom(b"SHUTDOWN")
    await rig.oap.flushes()
    # new text goes to the newcomer only
    rig.llama.text(5, "nach dem Wechsel")
    assert await new.next_of(Packet) == Packet(5, b"nach dem Wechsel")
    # audio still arriving from the replaced engine is dropped
    old.audio(5)
    new.audio(5, samples=10)
    got = await recv(rig.oap.packets)
    assert len(got.payload) == 12 + 40
    await eventually(lambda: rig.dock.stat("drop_stale_engine"), what="stale drop counted")
    # the replaced engine did not close itself: force-closed after the 2 s grace
    await asyncio.wait_for(old.closed.wait(), 6)
    engines = (await rig.dock.cmd("ENGINES")).strip()
    assert "active=qwen3/2/" in engines and "kokoro/1/replaced" in engines, engines
    assert await rig.dock.stat("swaps") == 1
    assert rig.dock.events("engine_force_closed")
    swapped = rig.dock.events("engine_swapped")[0]
    assert swapped["old"] == "kokoro" and swapped["engine"] == "qwen3"
    assert (await rig.dock.cmd("STATUS")).strip() == "ACTIVE qwen3"


async def test_swap_many_times_keeps_last(rig: Rig) -> None:
    engines = [await rig.engine(f"e{i}") for i in range(5)]
    for e in engines[:-1]:
        assert await e.next_of(Custom) == Custom(b"SHUTDOWN")
        await e.close()
    rig.llama.text(3, "x")
    assert await engines[-1].next_of(Packet) == Packet(3, b"x")
    await eventually(lambda: rig.dock.stat("swaps"))
    assert await rig.dock.stat("swaps") == 4


async def test_keepalive_timeout_clears_slot(rig: Rig) -> None:
    eng = await rig.engine()
    await eventually(lambda: eng.pings >= 2, what="PINGs every 200 ms")
    eng.answer_ping = False
    await rig.oap.flushes()
    await eventually(lambda: rig.status_is("NONE"), what="slot cleared after 600 ms without PONG")
    await asyncio.wait_for(eng.closed.wait(), 5)
    assert await rig.dock.stat("keepalive_timeouts") == 1
    # text now waits in the hold buffer
    rig.llama.text(9, "wartet")
    await eventually(lambda: rig.dock.stat("text_held"), what="text held")


async def test_engine_crash(rig: Rig) -> None:
    eng = await rig.engine()
    eng.abort()
    await rig.oap.flushes()
    await eventually(lambda: rig.status_is("NONE"), what="slot empty after crash")
    left = rig.dock.events("engine_left")
    assert left and left[0]["engine"] == "fake"
    again = await rig.engine("fake2")
    rig.llama.text(2, "weiter")
    assert await again.next_of(Packet) == Packet(2, b"weiter")


async def test_engine_ping_answered_and_engine_mgmt_ignored(rig: Rig) -> None:
    eng = await rig.engine()
    eng.send(Ping())
    assert await eng.next_of(Pong) == Pong()
    eng.send(CallEnd(4))
    eng.send(SpeechActive(4))
    eng.send(Custom(b"hello dock"))
    eng.audio(4)
    assert (await recv(rig.oap.packets)).call_id == 4
    await nothing_more(rig.oap.messages, lambda m: isinstance(m, CallEnd | SpeechActive), 0.3)
    assert (await rig.dock.cmd("STATUS")).strip() == "ACTIVE fake"


async def test_bad_audio_header_dropped_engine_stays(rig: Rig) -> None:
    eng = await rig.engine()
    eng.send(Packet(4, b"\x00\x00\x00\x00" + b"\x00" * 8 + b"\x00" * 4))  # sample rate 0
    eng.send(Packet(4, b"short"))
    eng.audio(4, samples=3)
    got = await recv(rig.oap.packets)
    assert len(got.payload) == 24
    assert await rig.dock.stat("drop_bad_audio") == 2
    assert (await rig.dock.cmd("STATUS")).strip() == "ACTIVE fake"


async def test_oap_restart(rig: Rig) -> None:
    eng = await rig.engine()
    eng.audio(1)
    await recv(rig.oap.packets)
    ports = rig.oap.ports
    await rig.oap.stop()
    oap2 = await FakeOap().start(ports)
    rig.oap = oap2
    await eventually(lambda: oap2.mgmt is not None and oap2.data is not None, what="reconnect")
    eng.audio(1, samples=7)
    got = await recv(oap2.packets)
    assert len(got.payload) == 12 + 28
    assert await rig.dock.stat("oap_reconnects") >= 2


async def test_llama_reconnect_replaces_old(rig: Rig) -> None:
    eng = await rig.engine()
    old = rig.llama
    new = await FakeLlama(rig.dock.ports).connect()
    assert old.mgmt is not None and old.data is not None
    await asyncio.wait_for(old.mgmt.closed.wait(), 5)
    await asyncio.wait_for(old.data.closed.wait(), 5)
    new.text(11, "neu")
    assert await eng.next_of(Packet) == Packet(11, b"neu")
    new.send(Ping())
    assert new.mgmt is not None
    assert await recv_until(new.mgmt.messages, lambda m: isinstance(m, Pong)) == Pong()
    rig.llama = new
    await old.close()


async def test_llama_custom_gets_the_reference_empty_reply(rig: Rig) -> None:
    # the reference answers every CUSTOM request with an empty CUSTOM body: exactly these
    # 7 bytes on the wire (plain); read them raw, not through our own decoder
    r, w = await asyncio.open_connection("127.0.0.1", rig.dock.ports["llama_mgmt"])
    try:
        for body in (b"WHATEVER", b""):
            w.write(encode_frame(encode_mgmt(Custom(body))))
            got = await asyncio.wait_for(r.readexactly(7), 5)
            assert got == bytes.fromhex("000000030a0000")
    finally:
        w.close()


async def test_tee_and_speech_changes_only(rig: Rig) -> None:
    eng = await rig.engine()
    seq = [SpeechIdle(8), SpeechIdle(8), SpeechActive(8), SpeechActive(8), SpeechIdle(8)]
    for m in seq:
        rig.llama.send(m)
    rig.llama.send(CallEnd(8))
    # the first SPEECH_IDLE of a new call prewarms the engine; OAP sees only changes
    want_eng = [SpeechIdle(8), SpeechActive(8), SpeechIdle(8), CallEnd(8)]
    want_oap = want_eng[1:]
    got_oap = [await recv_until(rig.oap.messages, lambda m: not isinstance(m, Custom | Pong))]
    got_eng = [await recv(eng.events) for _ in want_eng]
    for _ in want_oap[1:]:
        got_oap.append(await recv(rig.oap.messages))
    assert got_oap == want_oap and got_eng == want_eng


async def test_call_end_once_and_text_after_end_dropped(rig: Rig) -> None:
    eng = await rig.engine()
    rig.llama.send(CallEnd(12))
    rig.llama.send(CallEnd(12))
    rig.llama.text(12, "zu spaet")
    rig.llama.send(SpeechActive(12))
    rig.llama.text(13, "andere")
    assert await recv_until(rig.oap.messages, lambda m: isinstance(m, CallEnd)) == CallEnd(12)
    assert await eng.next_of(CallEnd) == CallEnd(12)
    assert await eng.next_of(Packet) == Packet(13, b"andere")
    await nothing_more(eng.events, lambda e: True, 0.3)
    stats = await rig.dock.stats()
    assert stats["drop_duplicate_call_end"] == "1"
    assert stats["drop_call_ended"] == "1"
    assert stats["drop_speech_after_end"] == "1"


async def test_held_text_delivered_in_order_on_dock(rig: Rig) -> None:
    for i in range(5):
        rig.llama.text(21, f"satz {i}")
    rig.llama.text(22, "andere")
    await eventually(lambda: rig.stat_eq("text_held", 6), what="6 packets held")
    calls = (await rig.dock.cmd("CALLS")).strip()
    assert "21:new:held=5/" in calls and "held_calls=2" in calls, calls
    eng = await rig.engine()
    got = [await eng.next_of(Packet) for _ in range(6)]
    assert [p.payload for p in got if p.call_id == 21] == [f"satz {i}".encode() for i in range(5)]
    assert Packet(22, b"andere") in got
    assert await rig.dock.stat("text_delivered_from_hold") == 6


async def test_held_text_dropped_on_call_end_and_deadline(rig: Rig) -> None:
    rig.llama.text(31, "weg damit")
    rig.llama.text(32, "verfaellt")
    await eventually(lambda: rig.stat_eq("text_held", 2), what="held")
    rig.llama.send(CallEnd(31))
    await eventually(lambda: rig.stat_eq("drop_call_ended", 1), what="dropped on CALL_END")
    # the rig runs with --hold-seconds 2
    await eventually(lambda: rig.stat_eq("drop_hold_expired", 1), what="deadline drop")
    eng = await rig.engine()
    rig.llama.text(33, "frisch")
    assert await eng.next_of(Packet) == Packet(33, b"frisch")
    assert rig.dock.events("text_dropped")


async def test_oap_down_audio_dropped_and_counted(rig: Rig) -> None:
    eng = await rig.engine()
    await rig.oap.stop()
    for _ in range(300):  # 300 x 19 KB > the 4 MiB bound
        eng.send(Packet(1, audio_payload(4800)))
    await eventually(lambda: rig.dock.stat("drop_oap_down"), what="oap_down drops")
    # the engine is still served: PING/PONG and STATUS unaffected
    assert (await rig.dock.cmd("STATUS")).strip() == "ACTIVE fake"


async def test_barge_in_discards_held_text(rig: Rig) -> None:
    rig.llama.text(41, "alt")
    rig.llama.text(42, "bleibt")
    await eventually(lambda: rig.stat_eq("text_held", 2), what="held")
    rig.llama.send(SpeechActive(41))
    await eventually(lambda: rig.stat_eq("drop_barge_in", 1), what="barge-in drop")
    eng = await rig.engine()
    assert await eng.next_of(Packet) == Packet(42, b"bleibt")
    await nothing_more(eng.events, lambda e: isinstance(e, Packet), 0.3)
