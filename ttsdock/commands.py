"""The dock cmd port (docs/wire.md#dock-cmd-port, plus ENGINES, CALLS, STATS, METRICS).

Rule 1: one command per connection, one reply line; METRICS is the one exception
(Prometheus text, several lines, ended by a newline; the connection closes after it).
Rule 2: this file only formats what the dock's cores know; it changes nothing but the
log level.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from protocol.cmd import parse_command
from svc.logs import current_level, set_level

if TYPE_CHECKING:
    from ttsdock.pipeline import Pipeline

MAX_CALLS_LISTED = 100  # CALLS lists at most this many calls (then "more=N")


class CommandTable:
    def __init__(self, pipeline: Pipeline, started_at: float) -> None:
        self.pipeline = pipeline
        self.started_at = started_at

    async def handle(self, data: bytes) -> str:
        cmd = parse_command(data)
        name = cmd.name
        if name == "PING" and cmd.arg is None:
            return "PONG"
        if name == "STATUS" and cmd.arg is None:
            active = self.pipeline.router.slot.active_name
            return f"ACTIVE {active}" if active else "NONE"
        if name == "SET_LOG_LEVEL":
            try:
                set_level(cmd.arg or "")
            except ValueError:
                return f"ERR bad_log_level {(cmd.arg or '')[:32]!r} (ERROR WARN INFO DEBUG TRACE)"
            return "OK"
        if name == "ENGINES" and cmd.arg is None:
            return self.engines()
        if name == "CALLS" and cmd.arg is None:
            return self.calls()
        if name == "STATS" and cmd.arg is None:
            return self.pipeline.stats.line(self.gauges_line())
        if name == "METRICS" and cmd.arg is None:
            return self.pipeline.stats.prometheus(self.gauges())
        return "ERR unknown_command"

    def engines(self) -> str:
        slot = self.pipeline.router.slot
        now = time.monotonic()
        parts = [f"slot={slot.state.value}", f"generation={slot.generation}"]
        if slot.active is not None:
            a = slot.active
            parts.append(f"active={a.name}/{a.generation}/uptime={now - a.docked_at:.1f}s")
        else:
            parts.append("active=none")
        parts.append(f"draining={len(slot.draining)}")
        parts.append(f"swaps={slot.swaps}")
        recent = [
            f"{r.name}/{r.generation}/{r.reason}/{now - (r.left_at or now):.1f}s_ago"
            for r in reversed(slot.history)
        ]
        parts.append("recent=" + (",".join(recent) if recent else "none"))
        return " ".join(parts)

    def calls(self) -> str:
        router = self.pipeline.router
        live = router.tracker.live()
        held = router.hold.calls()
        ids = sorted(set(live) | set(held))
        parts = [
            f"calls={len(ids)}",
            f"held_calls={len(held)}",
            f"held_bytes={router.hold.total_bytes}",
            f"ended_remembered={router.tracker.ended_count}",
        ]
        for cid in ids[:MAX_CALLS_LISTED]:
            state = router.tracker.state(cid).value
            n, nb = held.get(cid, (0, 0))
            parts.append(f"{cid}:{state}:held={n}/{nb}B")
        if len(ids) > MAX_CALLS_LISTED:
            parts.append(f"more={len(ids) - MAX_CALLS_LISTED}")
        return " ".join(parts)

    def gauges(self) -> dict[str, int]:
        p = self.pipeline
        slot, hold = p.router.slot, p.router.hold
        oap_data = p.oap_data
        oap_t = oap_data.transport if oap_data is not None else None
        return {
            "engine_active": int(slot.active is not None),
            "engine_generation": slot.generation,
            "engines_draining": len(slot.draining),
            "engine_read_paused": int(p.hop.engine_paused),
            "oap_mgmt_connected": int(p.oap_mgmt is not None),
            "oap_data_connected": int(oap_data is not None),
            "oap_write_buffer_bytes": oap_t.get_write_buffer_size() if oap_t is not None else 0,
            "llama_mgmt_connected": int("llama_mgmt" in p.llama),
            "llama_data_connected": int("llama_data" in p.llama),
            "held_calls": len(hold.calls()),
            "held_bytes": hold.total_bytes,
            "oap_queued_bytes": p.hop.pending_bytes,
            "uptime_seconds": int(time.monotonic() - self.started_at),
        }

    def gauges_line(self) -> dict[str, int | str]:
        p = self.pipeline
        out: dict[str, int | str] = {
            "slot": p.router.slot.state.value,
            "engine": p.router.slot.active_name or "none",
            "log_level": current_level(),
            "switch_last_us": int(p.last_switch_us),
            "switch_max_us": int(p.max_switch_us),
        }
        out.update(self.gauges())
        return out
