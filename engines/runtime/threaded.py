"""The thread-per-utterance synthesis driver, for a synthesiser that schedules across
calls itself (``synth.SelfScheduled``: Qwen3's batch scheduler).

Rule 1: one thread per utterance iterates the blocking ``synthesize`` generator, frames
its chunks into packets and hands them to the loop through a bounded ``ChunkChannel``;
on the loop, ``run`` passes each packet to the caller's ``send`` (which applies the
barge-in gate) and waits while the socket pushes back.
Rule 2: this file knows no calls, sockets or lifecycle; the call table decides.

Why it is kept beside the pool (``engines.runtime.calls``): such a generator blocks in
``next()`` until the engine's batch scheduler has the utterance's next frames, so in the
pool each utterance in progress would hold a pool worker while it waits, and no more
than ``--synth-workers`` utterances could ever be in one batch. It goes when that
synthesiser no longer blocks in ``next()``.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable

from engines.runtime.audio import UtteranceFramer
from engines.runtime.calltable import UtteranceEnd
from engines.runtime.channel import ChunkChannel
from engines.runtime.playback import PlaybackMeter
from engines.runtime.pool import close_generator
from engines.runtime.synth import CallState, CancelToken, SynthesisCancelled, Synthesizer
from engines.runtime.threads import lower_thread_priority


class UtteranceThreads:
    """Runs each utterance of a self-scheduled synthesiser in a thread of its own."""

    def __init__(self, synth: Synthesizer) -> None:
        self.synth = synth
        self.threads: set[threading.Thread] = set()

    def live(self) -> int:
        """Utterance threads still alive."""
        return sum(1 for t in list(self.threads) if t.is_alive())

    async def run(
        self,
        call_id: int,
        state: CallState,
        text: str,
        token: CancelToken,
        meter: PlaybackMeter,
        send: Callable[[bytes], None],
        pace: Callable[[], Awaitable[None]],
    ) -> UtteranceEnd:
        """Synthesise ``text`` in a new thread; ``send`` each packet on the loop, then
        ``pace`` (wait while the socket pushes back). Cancelled while waiting, the token
        fires and the thread finishes on its own."""
        chan = ChunkChannel(asyncio.get_running_loop())
        ctx = contextvars.copy_context()
        th = threading.Thread(
            target=ctx.run,
            args=(self._produce, state, text, token, chan, meter),
            name=f"synth-{call_id}",
            daemon=True,
        )
        self.threads.add(th)
        th.start()
        end: UtteranceEnd | None = None
        try:
            while True:
                item = await chan.get()
                if isinstance(item, UtteranceEnd):
                    end = item
                    break
                send(item)
                await pace()
        finally:
            if end is None:  # cancelled while waiting: the thread finishes on its own
                token.cancel()
        return end

    def _produce(
        self,
        state: CallState,
        text: str,
        token: CancelToken,
        chan: ChunkChannel,
        meter: PlaybackMeter,
    ) -> None:
        """The utterance's thread: run the blocking generator, frame, hand packets to the
        loop."""
        lower_thread_priority()
        framer = UtteranceFramer()
        error: BaseException | None = None
        gen = None
        try:
            gen = self.synth.synthesize(text, state, token)
            for chunk in gen:
                if token.cancelled:
                    break
                for pcm in framer.process(chunk):
                    meter.produced(len(pcm) // 4)
                    if not chan.put(pcm, token):
                        break
                if token.cancelled or framer.truncated:
                    break
        except SynthesisCancelled:
            pass
        except BaseException as exc:  # reported on the loop; never kills other calls
            error = exc
        finally:
            error = close_generator(gen, error)
            chan.finish(framer.samples_out, framer.truncated, error)
            self.threads.discard(threading.current_thread())
