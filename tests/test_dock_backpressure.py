"""Back-pressure against the real dock process: an engine that bursts far more audio than
OAP takes loses none of it, and is not declared dead while the dock is not reading it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from dock_helpers import FakeEngine, Rig, audio_payload, eventually, make_rig, recv

from protocol.engine_frames import encode_engine_frame
from protocol.framing import FrameCipher
from protocol.packet import Packet
from ttsdock.config import OAP_HIGH_WATER

pytestmark = pytest.mark.slow

FRAMES = 2000  # 20 calls x 100 chunks of 4800 samples: 38 MB, ~9x the dock's default bounds
CALLS = 20
SAMPLES = 4800
READ_MAX = 1 << 20  # one socket read of the dock (uvloop reads at most 256 KiB)


def _burst() -> bytes:
    """Every frame of the burst, in one buffer: the engine writes it as fast as TCP lets it."""
    return b"".join(
        encode_engine_frame(Packet(i % CALLS + 1, audio_payload(SAMPLES))) for i in range(FRAMES)
    )


async def _burst_through(rig: Rig, eng: FakeEngine, stall_s: float) -> list[Packet]:
    """OAP stops reading for ``stall_s`` (longer than the 600 ms PONG deadline) while the
    engine bursts; then it reads everything."""
    assert rig.oap.data is not None
    oap_transport = rig.oap.data.writer.transport
    oap_transport.pause_reading()
    eng.send_raw(_burst())
    await eventually(lambda: rig.dock.stat("engine_read_paused"), what="engine paused")
    await asyncio.sleep(stall_s)
    assert (await rig.dock.cmd("STATUS")).strip() == "ACTIVE fake"  # not declared dead
    # bounded: what waits for OAP is the high-water mark plus at most one engine read
    assert await rig.dock.stat("oap_write_buffer_bytes") <= OAP_HIGH_WATER + READ_MAX
    oap_transport.resume_reading()
    return [await recv(rig.oap.packets, 30) for _ in range(FRAMES)]


def _key(tmp_path: Path) -> tuple[FrameCipher, tuple[str, ...]]:
    key = os.urandom(32)
    (tmp_path / "ic_key.bin").write_bytes(key)
    return FrameCipher(key), ("--ic-key", str(tmp_path / "ic_key.bin"))


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
async def test_unpaced_burst_loses_nothing(tmp_path: Path, encrypted: bool) -> None:
    cipher, args = _key(tmp_path) if encrypted else (None, ())
    async with make_rig(tmp_path, *args, cipher=cipher) as rig:
        eng = await rig.engine()
        got = await _burst_through(rig, eng, stall_s=1.5)
        # every frame, per call in the order sent
        per_call: dict[int, int] = {}
        for p in got:
            per_call[p.call_id] = per_call.get(p.call_id, 0) + 1
            assert len(p.payload) == 12 + 4 * SAMPLES
        assert per_call == {c: FRAMES // CALLS for c in range(1, CALLS + 1)}
        s = await rig.dock.stats()
        payload = 12 + 4 * SAMPLES
        assert int(s["audio_frames_in"]) == int(s["audio_frames_out"]) == FRAMES
        assert int(s["audio_bytes_in"]) == int(s["audio_bytes_out"]) == FRAMES * payload
        assert int(s["drops_total"]) == 0
        assert int(s["keepalive_timeouts"]) == 0
        assert int(s["engine_read_pauses"]) >= 1
        await eventually(lambda: rig.stat_eq("engine_read_paused", 0), what="resumed")
        # the keepalive still works once reading resumed: a silent engine is cleared
        eng.answer_ping = False
        await eventually(lambda: rig.status_is("NONE"), what="slot cleared")
        assert await rig.dock.stat("keepalive_timeouts") == 1


async def test_oversize_audio_forwarded_and_counted(tmp_path: Path) -> None:
    async with make_rig(tmp_path) as rig:
        eng = await rig.engine()
        eng.audio(5, samples=4801)
        eng.audio(5, samples=4800)
        first, second = await recv(rig.oap.packets), await recv(rig.oap.packets)
        assert (len(first.payload), len(second.payload)) == (12 + 4 * 4801, 12 + 4 * 4800)
        s = await rig.dock.stats()
        assert (int(s["audio_oversize"]), int(s["drops_total"])) == (1, 0)


async def test_real_engine_runtime_under_back_pressure(tmp_path: Path) -> None:
    """The real engine runtime (tone synthesiser) docked to the real dock: OAP stalls for
    longer than every keepalive deadline on both sides while four calls synthesise far
    faster than real time; nobody is declared dead and every packet the engine sent
    reaches OAP."""
    from runtime_helpers import ToneSynth, running_engine

    async with make_rig(tmp_path) as rig:
        synth = ToneSynth(phrase_ms=2000)  # one 2 s phrase per word, no delay
        async with running_engine(synth, rig.dock.ports["dock"]) as engine:
            await eventually(lambda: rig.status_is("ACTIVE tone"), what="engine docked")
            assert rig.oap.data is not None
            oap_transport = rig.oap.data.writer.transport
            oap_transport.pause_reading()
            for cid in (1, 2, 3, 4):  # 4 calls x 40 s of audio: ~15 MB
                rig.llama.text(cid, " ".join(["wort"] * 20))
            await eventually(lambda: rig.dock.stat("engine_read_paused"), what="dock pushes back")
            await asyncio.sleep(1.5)  # > 600 ms (dock's PONG deadline), > 1 s (engine's)
            assert (await rig.dock.cmd("STATUS")).strip() == "ACTIVE tone"
            assert engine.stats.dock_losses == 0
            oap_transport.resume_reading()
            await eventually(
                lambda: synth.finished == 4 and engine.stats.packets_sent == 800,
                within=60,
                what="all audio synthesised and sent",
            )
            got = [await recv(rig.oap.packets, 30) for _ in range(800)]
            assert sorted({p.call_id for p in got}) == [1, 2, 3, 4]
            s = await rig.dock.stats()
            assert int(s["audio_frames_out"]) == 800 and int(s["drops_total"]) == 0
            assert int(s["keepalive_timeouts"]) == 0 and engine.stats.dock_losses == 0
