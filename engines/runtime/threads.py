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
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

SYNTH_NICE = 0  # opt-in: synthesis threads may run this much below the loop thread (Linux)

_live: set[threading.Thread] = set()


def lower_thread_priority(nice: int | None = None) -> None:
    """Run the calling synthesis thread ``nice`` steps below the event-loop thread.

    On Linux ``setpriority(PRIO_PROCESS, tid)`` applies to one thread. Off by
    default (``TTSDOCK_SYNTH_NICE``, default 0): a niced synthesis thread that
    holds the GIL while other processes load the host is descheduled with the
    GIL in hand, and the event loop then waits behind it (priority inversion;
    measured: dock keepalive timeouts under two CPU-burning neighbours with nice
    5, none with 0). Only worth enabling when the model library releases the
    GIL for nearly all of its work and the host is otherwise idle.
    Threads the model library starts itself (onnxruntime/torch pools) are not
    affected. A no-op elsewhere (on macOS it would renice the whole process).
    """
    if nice is None:
        try:
            nice = int(os.environ.get("TTSDOCK_SYNTH_NICE", SYNTH_NICE))
        except ValueError:
            nice = SYNTH_NICE
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (OSError, AttributeError):
        pass


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

    # getattr: any callable (a partial, a bound method) may lack ``__name__``
    th = threading.Thread(
        target=body, name=f"blocking-{getattr(fn, '__name__', 'call')}", daemon=True
    )
    _live.add(th)
    th.start()
    return await fut
