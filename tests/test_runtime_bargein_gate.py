"""The runtime's barge-in gate, black-box through the public ``CallManager`` API: audio
already synthesised and waiting (in the thread->loop channel and behind a dock that
pushes back) when SPEECH_ACTIVE or CALL_END arrives never leaves afterwards."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from engines.runtime.calls import CallManager, EngineSettings
from engines.runtime.stats import RuntimeStats
from engines.runtime.synth import CallState, CancelToken

CHUNK = 4800  # one packet's worth of samples
UNIT_PACKETS = 10  # packets per unit of synthesis work (one next() of the generator)
CHUNKS = 40  # units: far more than any queue of the runtime holds, 80 s of audio
WAIT = 20.0  # generous: waiting for events on a shared machine, not a time limit


class BurstSynth:
    """Produces audio far faster than real time, 10 packets per unit; counts packets."""

    name = "burst"
    sample_rate = 24000
    default_voice = "v"

    def __init__(self) -> None:
        self.produced = 0
        self.lock = threading.Lock()
        self.finished = threading.Event()

    def load(self) -> None: ...

    def warm_up(self) -> None: ...

    def voices(self) -> list[str]:
        return ["v"]

    def stats(self) -> dict[str, float]:
        return {}

    def status_suffix(self) -> str:
        return ""

    def close(self) -> None: ...

    def synthesize(self, text: str, state: CallState, cancel: CancelToken) -> Iterator[np.ndarray]:
        self.finished.clear()
        try:
            for _ in range(CHUNKS):
                if cancel.cancelled:
                    return
                with self.lock:
                    self.produced += UNIT_PACKETS
                yield np.full(CHUNK * UNIT_PACKETS, 0.25, dtype=np.float32)
        finally:
            self.finished.set()


class PushBackSink:
    """A dock link that pushes back from the first packet on: above its high-water mark,
    ``drain`` blocks until the test releases it."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.released = asyncio.Event()

    def send_audio(self, call_id: int, pcm: bytes) -> bool:
        self.sent.append(call_id)
        return True

    @property
    def write_paused(self) -> bool:
        return bool(self.sent) and not self.released.is_set()

    async def drain(self) -> None:
        await self.released.wait()


async def _until(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("event", ["speech_active", "call_end"])
async def test_nothing_leaves_after_bargein_or_call_end(event: str) -> None:
    synth, sink = BurstSynth(), PushBackSink()
    mgr = CallManager(synth, sink, RuntimeStats(), EngineSettings(), 2)
    try:
        mgr.on_text(3, b"ein langer satz", time.monotonic_ns())
        # the first packet went out, the sink pushes back, and more audio waits inside the
        # runtime (produced but not sent): the situation the gate exists for
        await _until(lambda: len(sink.sent) >= 1, "first packet")
        await _until(lambda: synth.produced >= len(sink.sent) + 2, "audio waiting")
        await asyncio.sleep(0.2)  # let the runtime's queues fill as far as they go
        before = len(sink.sent)
        waiting = synth.produced - before
        assert waiting >= 2
        if event == "speech_active":
            mgr.on_speech_active(3, time.monotonic_ns())
        else:
            mgr.on_call_end(3)
        sink.released.set()  # the dock reads again: whatever still waits would go now
        await _until(synth.finished.is_set, "synthesis stopped")
        for _ in range(50):  # many loop turns with the sink writable
            await asyncio.sleep(0.005)
        assert len(sink.sent) == before, f"{len(sink.sent) - before} of {waiting} leaked"
        # the sink is alive: new text is spoken again (barge-in); a new call id after end
        cid = 3 if event == "speech_active" else 4
        mgr.on_text(cid, b"weiter", time.monotonic_ns())
        await _until(lambda: cid in sink.sent[before:], "new audio after the cut")
    finally:
        sink.released.set()
        await mgr.close(2.0)
