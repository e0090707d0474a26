"""Event-loop choice: uvloop when it imports (Linux/macOS), plain asyncio otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T], *, use_uvloop: bool = True) -> T:
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)
