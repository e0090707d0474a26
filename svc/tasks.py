"""Task supervisor: one owner for every long-lived task of a process (dock or engine).

Rule 1: every task is started through ``spawn`` and cancelled and awaited by ``close``; no
fire-and-forget tasks. A task spawned ``critical`` must keep running until ``close``: if it
raises (or, with ``must_run``, also if it returns), ``on_fatal`` is called with it, and the
owner stops the process with exit status 1 (its state at the failure is unknown, and
systemd's ``Restart=on-failure`` starts a fresh one). A failed non-critical task is only
logged.
Rule 2: this file knows nothing of what the tasks do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

log = structlog.get_logger(__name__)


class Supervisor:
    def __init__(self, on_fatal: Callable[[asyncio.Task[Any]], None] | None = None) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.critical: set[asyncio.Task[Any]] = set()
        self.must_run: set[asyncio.Task[Any]] = set()
        self.on_fatal = on_fatal
        self.closing = False

    def spawn(
        self,
        coro: Coroutine[Any, Any, Any],
        name: str,
        *,
        critical: bool = False,
        must_run: bool = False,
    ) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        if critical or must_run:
            self.critical.add(task)
        if must_run:
            self.must_run.add(task)
        task.add_done_callback(self._done)
        return task

    def begin_close(self) -> None:
        """A stop was asked for: a ``must_run`` task may end from now on."""
        self.closing = True

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        critical = task in self.critical
        must_run = task in self.must_run
        self.critical.discard(task)
        self.must_run.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None and not (must_run and not self.closing):
            return
        error = repr(exc) if exc is not None else "returned before stop"
        log.error("task_failed", task=task.get_name(), error=error, fatal=critical, exc_info=exc)
        if critical and self.on_fatal is not None:
            self.on_fatal(task)

    async def close(self, keep: Callable[[asyncio.Task[Any]], bool] | None = None) -> None:
        """Cancel and await every task (``keep``: tasks left to finish on their own, still
        awaited)."""
        self.closing = True
        while self.tasks:
            tasks = list(self.tasks)
            for t in tasks:
                if keep is None or not keep(t):
                    t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.tasks.difference_update(tasks)
