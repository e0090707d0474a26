"""The silence rule (``svc.keepalive``) without sockets: the dock's PONG deadline and the
engine client's dock-silence rule are the same ``Keepalive``."""

from __future__ import annotations

from svc.keepalive import Keepalive, Ticks


# ---------------------------------------------------------------------- the dock's PONG rule
def test_keepalive_times_out_after_two_ticks_past_the_deadline() -> None:
    ka = Keepalive(0.0, timeout=0.6)
    assert ka.tick(0.5) is False
    assert ka.tick(0.7) is False  # first tick past the deadline: overdue only
    assert ka.tick(0.75) is True


def test_keepalive_pong_resets() -> None:
    ka = Keepalive(0.0, timeout=0.6)
    ka.tick(0.7)
    ka.pong(0.72)
    assert ka.tick(0.75) is False and ka.tick(1.0) is False


def test_keepalive_does_not_count_paused_reading() -> None:
    ka = Keepalive(0.0, timeout=0.6)
    ka.pause(0.1)
    for t in (0.5, 1.0, 5.0, 10.0):
        assert ka.tick(t) is False  # the dock is not reading: PONGs cannot arrive
    assert 0.09 < ka.silent_for(10.0) < 0.11
    ka.resume(10.0)
    assert ka.tick(10.4) is False
    assert ka.tick(10.6) is False  # 0.1 + 0.6 silent: first tick overdue
    assert ka.tick(10.65) is True


def test_keepalive_pong_while_paused_restarts_the_pause() -> None:
    ka = Keepalive(0.0, timeout=0.6)
    ka.pause(1.0)
    ka.pong(2.0)  # read in the same socket read that triggered the pause
    ka.resume(3.0)
    assert abs(ka.silent_for(3.0)) < 1e-9


def test_keepalive_stall_credit() -> None:
    ka = Keepalive(0.0, timeout=0.6)
    ka.stalled(1.0)  # the dock's own loop did not run for a second
    assert ka.tick(1.5) is False and ka.tick(1.55) is False
    assert 0.54 < ka.silent_for(1.55) < 0.56


# -------------------------------------------------------------------------------- Ticks
def test_ticks_report_only_lateness_over_the_slack() -> None:
    t = Ticks(0.0, interval=0.1, slack=0.1)
    assert t.late(0.1) == 0.0
    assert t.late(0.25) == 0.0  # 50 ms late: jitter
    late = t.late(0.65)  # 300 ms late: a stall, credited in full
    assert abs(late - 0.3) < 1e-9


# ----------------------------------------------------- the engine client's dock-silence rule
def watch(rx: list[float], checks: list[float], limit: float = 1.0) -> float | None:
    """Drive the rule as ``EngineClient._watch`` does: every check, a frame received since
    the last one counts as heard at its time, a late check credits the stall; the time of
    the check that declares the dock gone, or None."""
    ka = Keepalive(0.0, limit)
    ticks = Ticks(0.0, 0.1, 0.1)
    for now in checks:
        heard = [t for t in rx if t <= now]
        late = ticks.late(now)
        if heard and heard[-1] != ka.last_pong:
            ka.pong(heard[-1])
        if late:
            ka.stalled(late)
        if ka.tick(now):
            return now
    return None


def test_dock_silence_needs_two_checks_past_the_limit() -> None:
    checks = [round(0.1 * i, 1) for i in range(1, 20)]
    assert watch([], checks) == 1.2  # overdue at 1.1, gone at the next check


def test_dock_frames_keep_the_link() -> None:
    checks = [round(0.1 * i, 1) for i in range(1, 40)]
    assert watch([0.5 * i for i in range(10)], checks) is None


def test_dock_silence_does_not_count_our_own_stall() -> None:
    # the process slept 3 s between two checks: no frame could be read meanwhile
    checks = [0.1, 0.2, 3.3, 3.4, 3.5, 3.6]
    assert watch([0.0], checks) is None
