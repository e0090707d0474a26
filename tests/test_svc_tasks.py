"""``svc.tasks.Supervisor`` and ``svc.lru.EndedCalls``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from svc.lru import EndedCalls
from svc.tasks import Supervisor


def test_ended_calls_bounded_lru() -> None:
    e = EndedCalls(3)
    for cid in (1, 2, 3):
        e.add(cid)
    e.add(1)  # most recent again
    e.add(4)  # evicts 2, the oldest
    assert [c in e for c in (1, 2, 3, 4)] == [True, False, True, True]
    assert len(e) == 3
    e.discard(3)
    e.discard(99)
    assert 3 not in e and len(e) == 2
    with pytest.raises(ValueError):
        EndedCalls(0)


async def test_critical_failure_is_fatal_helper_failure_is_not() -> None:
    fatal: list[str] = []
    sup = Supervisor(on_fatal=lambda t: fatal.append(t.get_name()))

    async def boom() -> None:
        raise RuntimeError("x")

    helper = sup.spawn(boom(), "helper")
    crit = sup.spawn(boom(), "crit", critical=True)
    await asyncio.wait({helper, crit})
    await asyncio.sleep(0)
    assert fatal == ["crit"]
    assert not sup.tasks


async def test_must_run_task_returning_early_is_fatal() -> None:
    fatal: list[str] = []
    sup = Supervisor(on_fatal=lambda t: fatal.append(t.get_name()))

    async def quits() -> None:
        return None

    t1 = sup.spawn(quits(), "critical_returns", critical=True)  # returning is fine
    t2 = sup.spawn(quits(), "client", must_run=True)  # returning before close is not
    await asyncio.wait({t1, t2})
    await asyncio.sleep(0)
    assert fatal == ["client"]


async def test_close_cancels_and_awaits_everything() -> None:
    sup = Supervisor()
    started = asyncio.Event()
    cancelled: list[bool] = []

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    tasks: list[asyncio.Task[Any]] = [sup.spawn(forever(), f"t{i}") for i in range(3)]
    await started.wait()
    await sup.close()
    assert all(t.done() for t in tasks) and cancelled == [True] * 3 and not sup.tasks


async def test_close_keeps_tasks_that_finish_on_their_own() -> None:
    sup = Supervisor()
    done = asyncio.Event()

    async def finishes() -> str:
        await done.wait()
        return "finished"

    t = sup.spawn(finishes(), "client", must_run=True)
    closing = asyncio.create_task(sup.close(keep=lambda task: task.get_name() == "client"))
    await asyncio.sleep(0)  # one loop turn: close() runs up to its await, past every cancel
    assert sup.closing and not closing.done()
    assert t.cancelling() == 0 and not t.done()  # kept: not cancelled, still waiting
    done.set()
    await closing
    assert t.result() == "finished"
