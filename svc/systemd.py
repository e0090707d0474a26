"""sd_notify without a dependency: a datagram to ``$NOTIFY_SOCKET`` (READY / WATCHDOG /
STOPPING), and a watchdog task that pings at half of ``$WATCHDOG_USEC`` while the loop runs."""

from __future__ import annotations

import asyncio
import os
import socket


def sd_notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to systemd; ``False`` when not under systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(state.encode())
        return True
    except OSError:
        return False


def watchdog_interval() -> float | None:
    """Half of ``WATCHDOG_USEC`` in seconds, when systemd asked for a watchdog for this pid."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 2e6, 0.01)
    except ValueError:
        return None


async def watchdog_loop() -> None:
    """Run forever: ``WATCHDOG=1`` at half the watchdog period. Being late here means the
    event loop is blocked, which is exactly what the watchdog should notice."""
    interval = watchdog_interval()
    if interval is None:
        return
    while True:
        sd_notify("WATCHDOG=1")
        await asyncio.sleep(interval)
