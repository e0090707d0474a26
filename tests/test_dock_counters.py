"""Every dock counter, against the real dock process, plain and encrypted: one scenario
touches each of them a known number of times, and STATS must say exactly that (a counter
that counts twice, or not at all, fails here)."""

from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path

import pytest
from dock_helpers import FakeEngine, audio_payload, eventually, make_rig, recv, recv_until

from protocol.framing import FrameCipher
from protocol.mgmt import CallEnd, Custom, SpeechActive
from protocol.packet import Packet
from ttsdock.stats import Stats

pytestmark = pytest.mark.slow

# counters the backpressure tests own (they need a stalled OAP); hop latency is measured
NOT_HERE = {"engine_read_pauses", "hop_count", "hop_sum_us", "hop_max_us"}


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
async def test_every_counter(tmp_path: Path, encrypted: bool) -> None:
    cipher: FrameCipher | None = None
    args: tuple[str, ...] = ()
    if encrypted:
        key = os.urandom(32)
        (tmp_path / "k.bin").write_bytes(key)
        cipher, args = FrameCipher(key), ("--ic-key", str(tmp_path / "k.bin"))
    async with make_rig(tmp_path, *args, cipher=cipher) as rig:
        dock, llama, oap = rig.dock, rig.llama, rig.oap
        # text with no engine docked is held, then delivered to the first engine
        llama.text(3, "held")
        await eventually(lambda: rig.stat_eq("text_held", 1), what="held")
        a = await rig.engine("a")
        assert await a.next_of(Packet) == Packet(3, b"held")
        llama.text(3, "xy")
        assert await a.next_of(Packet) == Packet(3, b"xy")
        # a bad packet costs only itself
        assert llama.data is not None
        llama.data.send_body(struct.pack(">II", 0, 1) + b"x")
        # call events teed to OAP and the engine
        llama.send(SpeechActive(3))
        llama.send(CallEnd(3))
        assert await a.next_of(CallEnd) == CallEnd(3)
        await recv_until(oap.messages, lambda m: isinstance(m, CallEnd))
        # audio: one normal, one oversize packet (forwarded)
        a.audio(3, samples=480)
        a.send(Packet(3, audio_payload(4801)))
        got = [await recv(oap.packets), await recv(oap.packets)]
        assert [len(p.payload) for p in got] == [12 + 4 * 480, 12 + 4 * 4801]
        # a bad HELLO is rejected; a second engine swaps in, OAP answers FLUSH_TTS
        bad = FakeEngine(dock.ports["dock"], hello=b"nonsense\n")
        assert (await bad.dock()).startswith(b"ERR")
        await bad.close()
        b = await rig.engine("b")
        await oap.flushes()
        await eventually(lambda: rig.stat_eq("flushes_answered", 1), what="flush answered")
        await a.next_of(Custom)  # SHUTDOWN
        a.audio(3)  # the replaced engine's audio is dropped
        await eventually(lambda: rig.stat_eq("drop_stale_engine", 1), what="stale drop")
        # the active engine goes silent: keepalive clears it; this FLUSH_TTS is unanswered
        oap.answer_flush = False
        b.answer_ping = False
        await eventually(lambda: rig.status_is("NONE"), what="slot cleared")
        await eventually(lambda: rig.stat_eq("flushes_unanswered", 1), what="unanswered")
        # OAP goes away and comes back: the dock reconnects both channels
        ports = oap.ports
        await oap.stop()
        await asyncio.sleep(0.3)
        await oap.start(ports)
        await eventually(lambda: rig.stat_eq("oap_reconnects", 2), what="OAP reconnected")
        await eventually(lambda: oap.mgmt is not None and oap.data is not None, what="OAP up")

        s = await dock.stats()
        payloads = [len(audio_payload(480)), len(audio_payload(4801)), len(audio_payload(480))]
        want = {
            "text_frames_in": 2,
            "text_bytes_in": len("held") + len("xy"),
            "text_frames_to_engine": 2,
            "text_bytes_to_engine": len("held") + len("xy"),
            "text_held": 1,
            "text_delivered_from_hold": 1,
            "mgmt_frames_in": 2,
            "mgmt_frames_to_oap": 2,
            "mgmt_frames_to_engine": 2,
            "calls_ended": 1,
            "audio_frames_in": 3,
            "audio_bytes_in": sum(payloads),
            "audio_frames_out": 2,
            "audio_bytes_out": sum(payloads[:2]),  # payload bytes, plain or encrypted
            "audio_oversize": 1,
            "engines_docked": 2,
            "engines_rejected": 1,
            "swaps": 1,
            "keepalive_timeouts": 1,
            "flushes_sent": 2,
            "flushes_answered": 1,
            "flushes_unanswered": 1,
            "oap_reconnects": 2,
            "llama_connects": 2,
        }
        counters = {
            name
            for name in Stats.__slots__
            if isinstance(getattr(Stats(), name), int) and name not in NOT_HERE
        }
        assert set(want) == counters, "a counter of Stats is not covered by this test"
        assert {k: int(s[k]) for k in want} == want
        drops = {k: int(v) for k, v in s.items() if k.startswith("drop_")}
        assert drops == {
            "drop_bad_packet": 1,
            "drop_engine_hello_missing_field": 1,
            "drop_stale_engine": 1,
        }
        assert int(s["drops_total"]) == 3
