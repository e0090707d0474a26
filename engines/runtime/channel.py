"""Thread -> event loop hand-off of one utterance's packets (the thread-per-utterance
driver of ``engines.runtime.calls``).

Rule 1: the only place where a synthesis thread hands audio to the event loop outside the
pool: bounded (a producer blocks while the loop is behind), cancellable (a blocked
producer re-checks its token), and always able to finish (the end marker is unbounded).
Rule 2: this file knows no calls, sockets or audio framing.
"""

from __future__ import annotations

import asyncio
import threading

from engines.runtime.calltable import UtteranceEnd
from engines.runtime.synth import CancelToken

CHANNEL_PACKETS = 32  # packets (<= 200 ms each) a synthesis thread may run ahead of the socket
PUT_POLL = 0.1  # seconds: a blocked producer re-checks its cancel token this often


class ChunkChannel:
    """Thread -> loop hand-off of packet PCM, bounded at ``size`` packets in flight.

    The producer thread takes a unit of ``_room`` per packet (blocking while the loop is
    behind, re-checking its cancel token every ``PUT_POLL``) and posts with
    ``call_soon_threadsafe``; the consumer gives the unit back when it takes the packet.
    The end marker takes no room, so the producer can always finish.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int = CHANNEL_PACKETS) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[bytes | UtteranceEnd] = asyncio.Queue()
        self._room = threading.Semaphore(size)  # packets that may still be in flight

    def put(self, pcm: bytes, token: CancelToken) -> bool:
        while not self._room.acquire(timeout=PUT_POLL):
            if token.cancelled:
                return False
        return self._post(pcm)

    def finish(self, samples: int, truncated: bool, error: BaseException | None) -> None:
        self._post(UtteranceEnd(samples, truncated, error))

    def _post(self, item: bytes | UtteranceEnd) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # loop closed: the process is exiting
            return False
        return True

    async def get(self) -> bytes | UtteranceEnd:
        item = await self._queue.get()
        if not isinstance(item, UtteranceEnd):
            self._room.release()
        return item
