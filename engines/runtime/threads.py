"""Running blocking ``Synthesizer`` methods off the event loop.

Rule: every blocking call of the runtime (load, warm-up, offline synthesis,
close, status) goes through ``in_thread``: a daemon thread per call, so a
model that never returns can delay an orderly exit by at most the caller's
timeout and can never keep the process alive (``ThreadPoolExecutor`` threads
are joined at interpreter exit; these are not).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_live: set[threading.Thread] = set()


def live_threads() -> int:
    """Blocking calls started by ``in_thread`` that have not returned yet."""
    return sum(1 for t in list(_live) if t.is_alive())


async def in_thread(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn`` in a new daemon thread (with the caller's contextvars); await its result."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()
    ctx = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            assert isinstance(value, BaseException)
            fut.set_exception(value)

    def body() -> None:
        ok: bool = False
        value: Any = None
        try:
            value = ctx.run(fn, *args, **kwargs)
            ok = True
        except BaseException as exc:
            value = exc
        finally:
            _live.discard(threading.current_thread())
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:  # the loop is gone: nobody waits any more
            pass

    th = threading.Thread(
        target=body, name=f"blocking-{getattr(fn, '__name__', 'call')}", daemon=True
    )
    _live.add(th)
    th.start()
    return await fut
