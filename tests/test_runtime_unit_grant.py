"""The pool's grant to each unit of work: one call alone uses every core; with other units
waiting each unit keeps to one (``engines.runtime.synth.unit_grant``)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from engines.runtime.cpus import available_cpus
from engines.runtime.playback import PlaybackMeter
from engines.runtime.pool import Job, Step, SynthesisPool
from engines.runtime.schedule import START_SLACK_S, start_deadline
from engines.runtime.synth import CancelToken, FloatArray, UnitGrant, unit_grant


def _job(gen: Iterator[FloatArray], done: threading.Event, pool: SynthesisPool) -> Job:
    holder: list[Job] = []

    def deliver(step: Step) -> None:
        if step.finished:
            done.set()
        else:
            pool.requeue(holder[0], 0.0)

    job = Job(start=lambda: gen, token=CancelToken(), deliver=deliver, meter=PlaybackMeter())
    holder.append(job)
    return job


def _recording(grants: list[UnitGrant], steps: int, hold: threading.Event | None = None):
    def gen() -> Iterator[FloatArray]:
        for i in range(steps):
            grants.append(unit_grant())
            if hold is not None and i == 0:
                hold.wait(10)
            yield np.zeros(240, np.float32)

    return gen()


def test_a_unit_alone_gets_every_core_and_outside_the_pool_one() -> None:
    assert unit_grant() == UnitGrant(1, 1, 0)
    pool = SynthesisPool(2, cpus=4)
    grants: list[UnitGrant] = []
    done = threading.Event()
    pool.submit(_job(_recording(grants, 3), done, pool), 0.0)
    assert done.wait(10)
    pool.stop()
    assert grants == [UnitGrant(cores=4, cpus=4, others=0)] * 3
    assert unit_grant() == UnitGrant()  # the worker's grant never leaks to this thread


def test_with_units_waiting_a_unit_keeps_to_one_core() -> None:
    pool = SynthesisPool(1, cpus=2)  # one worker: the second job waits while the first runs
    a: list[UnitGrant] = []
    b: list[UnitGrant] = []
    hold = threading.Event()
    done_a, done_b = threading.Event(), threading.Event()
    pool.submit(_job(_recording(a, 2, hold), done_a, pool), 0.0)
    deadline = time.monotonic() + 10
    while not a and time.monotonic() < deadline:  # a's first unit is running (held)
        time.sleep(0.001)
    pool.submit(_job(_recording(b, 2), done_b, pool), 1.0)
    hold.set()
    assert done_a.wait(10) and done_b.wait(10)
    pool.stop()
    # the first unit started alone; while both were open, the ready one kept to one core
    assert a[0].cores == 2
    assert any(g.cores == 1 and g.others == 1 for g in a[1:] + b)
    assert all(g.share == 2 / (g.others + 1) for g in a + b)


def test_a_new_utterance_is_due_after_the_start_slack_or_when_its_call_runs_dry() -> None:
    assert start_deadline(10.0, 0.0, 0.3) == 10.0 + START_SLACK_S
    assert start_deadline(10.0, 12.0, 0.3) == 12.0 - 0.3


class _TwoSessions:
    """A backend stand-in with a 1-thread and a 2-thread session."""

    def threads_for(self, cores: int) -> int:
        return 2 if cores >= 2 else 1


def test_kokoro_keeps_to_one_thread_while_the_wide_session_measures_slower() -> None:
    from engines.kokoro.synth import WIDE_RETRY, KokoroConfig, KokoroSynthesizer
    from engines.runtime.synth import set_unit_grant

    synth = KokoroSynthesizer(KokoroConfig(), backend=_TwoSessions())  # type: ignore[arg-type]
    grant = UnitGrant(cores=2, cpus=2, others=0)

    def cores_after() -> int:
        set_unit_grant(grant)
        try:
            synth._narrow_if_wide_is_slower()
            return unit_grant().cores
        finally:
            set_unit_grant(None)

    synth._speed.seed(1, 0.5)
    synth._speed.seed(2, 0.3)  # wide is faster: it is used
    assert [cores_after() for _ in range(WIDE_RETRY)] == [2] * WIDE_RETRY
    synth._speed.seed(2, 0.6)  # a busy box: two threads are slower than one
    got = [cores_after() for _ in range(2 * WIDE_RETRY)]
    assert got.count(2) == 2 and got.count(1) == 2 * WIDE_RETRY - 2  # tried now and then


def test_kokoro_keeps_windows_short_only_while_utterances_outnumber_the_cores() -> None:
    from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer

    synth = KokoroSynthesizer(KokoroConfig(assume_rtf=0.5), backend=_TwoSessions())  # type: ignore[arg-type]
    alone = synth._pace(UnitGrant(cores=2, cpus=2, others=0))
    two = synth._pace(UnitGrant(cores=1, cpus=2, others=1))  # a core each
    three = synth._pace(UnitGrant(cores=1, cpus=2, others=2))
    four = synth._pace(UnitGrant(cores=1, cpus=2, others=3))
    assert not alone.shared and not two.shared and three.shared and four.shared
    assert two.frame_s == alone.frame_s  # a core each: no slower
    # three need 3 x 0.5 x WINDOW_OVERHEAD (1.25) = 1.9 cores: two keep them all in real
    # time, so each unit runs at one core's speed when its turn comes (the others' units,
    # ahead of their listeners, wait); four need 2.5 cores: each gets its share of two
    assert three.frame_s == alone.frame_s
    assert four.frame_s == pytest.approx(alone.frame_s * 2)
    slower = KokoroSynthesizer(KokoroConfig(assume_rtf=0.7), backend=_TwoSessions())  # type: ignore[arg-type]
    lone = slower._pace(UnitGrant(cores=2, cpus=2, others=0))
    # three need 2.6 cores at 0.7: shares again (2 cores, 3 utterances)
    assert slower._pace(UnitGrant(cores=1, cpus=2, others=2)).frame_s == pytest.approx(
        lone.frame_s * 1.5
    )


def _second_window(rtf: float, grant: UnitGrant, ahead_s: float, context: int = 2) -> int:
    """Frames of the window the engine decodes after a sentence's first (a pinned speed,
    ``ahead_s`` of audio queued, the unit granted ``grant``)."""
    from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer
    from engines.kokoro.windows import WindowPlanner
    from engines.runtime.synth import CallState, set_unit_grant

    synth = KokoroSynthesizer(KokoroConfig(assume_rtf=rtf), backend=_TwoSessions())  # type: ignore[arg-type]
    n = 600
    planner = WindowPlanner(
        n, np.zeros(n), [], first_frames=(4, 8), min_frames=24, context=context, search=2,
        cut_anywhere=True, ramp=12,
    )  # fmt: skip
    assert planner.next(None) is not None  # the first window
    set_unit_grant(grant)
    try:
        gang = synth._next_gang(planner, CallState(1), context, ahead_s)
    finally:
        set_unit_grant(None)
    assert len(gang) == 1
    return gang[0].frames


def test_kokoro_keeps_windows_short_while_another_call_may_start() -> None:
    from engines.kokoro.pacing import BUSY_WINDOW_S
    from engines.kokoro.synth import CALLING_MIN_CONTEXTS
    from engines.kokoro.windows import FRAMES_PER_S

    alone = UnitGrant(cores=2, cpus=2, others=0, calls=1)
    calling = replace(alone, calls=2)  # another call, silent: its sentence may come now
    both = UnitGrant(cores=1, cpus=2, others=1, calls=2)  # the other call speaks too
    # 0.25 compute s per audio s, 3 s queued: the window may be 200 frames (the most;
    # the planner's cut may move 2 frames)
    assert _second_window(0.25, alone, 3.0) >= 198
    assert _second_window(0.25, both, 3.0) >= 198
    # with a call that may start, about BUSY_WINDOW_S of decoding (2 x 2 frames of
    # context): 60 frames, within the planner's cut search of 2
    short = _second_window(0.25, calling, 3.0)
    assert abs(short - (BUSY_WINDOW_S / (0.25 / FRAMES_PER_S) - 4)) <= 2
    assert _second_window(0.25, replace(both, calls=3), 3.0) == short
    # on a slow CPU not below CALLING_MIN_CONTEXTS x the context: 48 frames at 0.8, where
    # 0.4 s decodes 16
    assert abs(_second_window(0.8, calling, 6.0) - CALLING_MIN_CONTEXTS * 2) <= 2
    # a short queue sizes the window as before
    assert _second_window(0.25, calling, 0.5) == _second_window(0.25, alone, 0.5)


def test_kokoro_waives_the_cores_share_while_the_others_end_before_this_utterance() -> None:
    """Three utterances on two cores that need more than both (0.7 x 1.25 each): each
    counts on its share of the cores, unless what the others must decode by the time
    this one's speech has played (their speech left, less the audio they have queued)
    and this one's fit in the cores (``pacing`` Rule 6); an utterance the pool counts
    that has not said how long it is (in its prosody pass, say) keeps the rule."""
    from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer

    synth = KokoroSynthesizer(KokoroConfig(assume_rtf=0.7), backend=_TwoSessions())  # type: ignore[arg-type]
    lone = synth._pace(UnitGrant(cores=2, cpus=2, others=0))
    three = UnitGrant(cores=1, cpus=2, others=2)
    me, a, b = (synth._speaking.open() for _ in range(3))
    try:
        for s in (me, a, b):
            s.tell(5.0, 0.0)  # all three at their start
        assert synth._pace(three, speech=me).frame_s == pytest.approx(lone.frame_s * 1.5)
        a.tell(1.5, 0.0)  # the others half done: 8.5 s x 0.875 < 0.9 x 2 x 5
        b.tell(2.0, 0.0)
        assert synth._pace(three, speech=me).frame_s == pytest.approx(lone.frame_s)
        assert synth._pace(three, speech=me).shared  # still short windows: 3 on 2 cores
        a.tell(5.0, 3.0)  # long, but far ahead of their listeners
        b.tell(5.0, 3.5)
        assert synth._pace(three, speech=me).frame_s == pytest.approx(lone.frame_s)
        b.tell(math.inf, 0.0)  # its length not known yet
        assert synth._pace(three, speech=me).frame_s == pytest.approx(lone.frame_s * 1.5)
        b.tell(2.0, 0.0)
        synth._speaking.close(b)  # the pool counts an utterance the engine has not seen
        assert synth._pace(three, speech=me).frame_s == pytest.approx(lone.frame_s * 1.5)
        assert synth._pace(three).frame_s == pytest.approx(lone.frame_s * 1.5)  # no speech
    finally:
        for s in (me, a, b):
            synth._speaking.close(s)
    assert synth._speaking.others(me, 0) == []


def test_queued_audio_plays_out_in_real_time() -> None:
    from engines.kokoro.synth import _Speech

    speech = _Speech()
    speech.tell(4.0, 2.0)
    assert speech.queued_s(speech.at) == 2.0
    assert speech.queued_s(speech.at + 0.5) == pytest.approx(1.5)
    assert speech.queued_s(speech.at + 3.0) == 0.0
    speech.tell(4.0, None)  # no listener: nothing queued
    assert speech.queued_s(speech.at) == 0.0


def test_kokoro_paces_shared_cores_at_the_crowded_speed_and_counts_capacity_by_it() -> None:
    """Two utterances in progress each decode while the other's units run: on cores that
    share execution units (SMT) each is then slower than alone, and the pace and the
    capacity estimate follow the crowded figure (calibrated, then measured)."""
    from engines.kokoro.synth import WINDOW_OVERHEAD, KokoroConfig, KokoroSynthesizer
    from engines.kokoro.windows import FRAMES_PER_S

    synth = KokoroSynthesizer(KokoroConfig(), backend=_TwoSessions())  # type: ignore[arg-type]
    synth._speed.seed(1, 0.5)
    synth._speed.seed(2, 0.5)
    alone = synth._pace(UnitGrant(cores=2, cpus=2, others=0))
    two = synth._pace(UnitGrant(cores=1, cpus=2, others=1))
    assert two.frame_s == pytest.approx(alone.frame_s)  # not measured: the lone speed stands in
    synth._speed.seed(1, 0.9, crowded=True)  # calibration: both cores busy, 0.9 each
    two = synth._pace(UnitGrant(cores=1, cpus=2, others=1))
    assert two.frame_s * FRAMES_PER_S == pytest.approx(0.9)
    # with more cores than utterances each has a core: the lone speed
    wide_box = synth._pace(UnitGrant(cores=1, cpus=16, others=1))
    assert wide_box.frame_s * FRAMES_PER_S == pytest.approx(0.5)
    assert synth._pace(UnitGrant(cores=2, cpus=2, others=0)) == alone  # alone: unchanged
    # windows decoded while another utterance was in progress update the crowded figure
    for _ in range(50):
        synth._speed.update(1, 1.0, 1.2, crowded=True)
    assert synth._speed.rtf(1, crowded=True) == pytest.approx(1.2, abs=0.01)
    assert synth._speed.rtf(1) == pytest.approx(0.5)
    # never below the lone speed: a crowded figure measured on an idle box is not trusted
    synth._speed.seed(1, 0.3, crowded=True)
    assert synth._speed.rtf(1, crowded=True) == pytest.approx(0.5)
    # capacity: every core busy, each at the crowded speed
    synth._speed.seed(1, 1.0, crowded=True)
    cpus = available_cpus()
    per_core = 1.0 if cpus > 1 else 0.5  # one core is never crowded
    assert synth.plan().capacity == pytest.approx(cpus / (per_core * WINDOW_OVERHEAD))


def test_kokoro_decodes_windows_at_once_while_alone_and_that_measures_faster() -> None:
    from engines.kokoro.synth import WIDE_RETRY, KokoroConfig, KokoroSynthesizer
    from engines.kokoro.windows import FRAMES_PER_S

    synth = KokoroSynthesizer(KokoroConfig(), backend=_TwoSessions())  # type: ignore[arg-type]
    synth._split_backend = synth._backend  # type: ignore[assignment]  # (a split backend)
    alone = UnitGrant(cores=2, cpus=2, others=0)
    synth._speed.seed(1, 0.9)
    synth._speed.seed(2, 0.8)  # two threads on one window: 1.25 audio s per s
    synth._speed.seed(1, 1.1, crowded=True)  # two windows at once: 2 / 1.1 = 1.8
    assert synth._gang_size(alone) == 2
    pace = synth._pace(alone, 2)
    assert pace.gang == 2 and pace.frame_s * FRAMES_PER_S == pytest.approx(1.1)
    # another utterance in progress, or one core granted: one window at a time
    assert synth._gang_size(UnitGrant(cores=1, cpus=2, others=1)) == 1
    assert synth._gang_size(UnitGrant(cores=1, cpus=2, others=0)) == 1
    # cores that share execution units: two at once each take twice as long (1.0 per s)
    synth._speed.seed(1, 2.0, crowded=True)
    got = [synth._gang_size(alone) for _ in range(2 * WIDE_RETRY)]
    assert got.count(2) == 2 and got.count(1) == 2 * WIDE_RETRY - 2  # tried now and then
    assert synth._gang_size(alone, retry=False) == 1
    # the option: 1 never, N always (up to the cores granted)
    synth.config.parallel_windows = 1
    synth._speed.seed(1, 1.1, crowded=True)
    assert synth._gang_size(alone) == 1
    synth.config.parallel_windows = 4
    synth._speed.seed(1, 2.0, crowded=True)
    assert synth._gang_size(alone) == 2
    # pinned speeds (tests, reproducible plans): one at a time unless asked for
    pinned = KokoroSynthesizer(KokoroConfig(assume_rtf=0.5), backend=_TwoSessions())  # type: ignore[arg-type]
    pinned._split_backend = pinned._backend  # type: ignore[assignment]
    assert pinned._gang_size(alone) == 1


def test_a_grant_counts_the_calls_the_engine_serves() -> None:
    """Calls connected but silent count too (``UnitGrant.calls``): any of them may send a
    sentence at any moment; never fewer than the utterances in progress."""
    pool = SynthesisPool(2, cpus=2)
    pool.live_calls = lambda: 3
    grants: list[UnitGrant] = []
    done = threading.Event()
    pool.submit(_job(_recording(grants, 2), done, pool), 0.0)
    assert done.wait(10)
    pool.live_calls = lambda: 0  # the call table emptied: the unit's own utterance counts
    done = threading.Event()
    pool.submit(_job(_recording(grants, 1), done, pool), 0.0)
    assert done.wait(10)
    pool.stop()
    assert [g.calls for g in grants] == [3, 3, 1]
    assert all(g.cores == 2 and g.others == 0 for g in grants)


def test_kokoro_leaves_the_other_cores_free_while_one_keeps_up_and_other_calls_are_connected() -> (
    None
):
    """Alone but with other calls connected, an utterance whose queued audio lets one
    core decode long windows in time keeps to one core (``_solo_pace``): a gang or a
    wide session holding every core made another call's start wait and stutter."""
    from engines.kokoro.synth import SOLO_MIN_FRAMES, KokoroConfig, KokoroSynthesizer
    from engines.kokoro.windows import FRAMES_PER_S

    synth = KokoroSynthesizer(KokoroConfig(), backend=_TwoSessions())  # type: ignore[arg-type]
    synth._speed.seed(1, 0.5)
    synth._speed.seed(2, 0.3)
    served = UnitGrant(cores=2, cpus=2, others=0, calls=2)
    # one core decodes SOLO_MIN_FRAMES (and its context) by 85 % of the queue, less 0.1 s
    enough = ((SOLO_MIN_FRAMES + 4) * 0.5 / FRAMES_PER_S + 0.1) / 0.85 + 0.05
    pace = synth._solo_pace(served, enough, 2)
    assert pace is not None and pace.gang == 1
    assert pace.frame_s * FRAMES_PER_S == pytest.approx(0.5)  # one core's speed
    assert synth._solo_pace(served, enough - 0.1, 2) is None  # too little queued: every core
    assert synth._solo_pace(replace(served, calls=1), enough, 2) is None  # no other call
    assert synth._solo_pace(replace(served, others=1), enough, 2) is None  # one core anyway
    assert synth._solo_pace(replace(served, cores=1), enough, 2) is None
    synth.config.parallel_windows = 2  # a forced gang is a gang
    assert synth._solo_pace(served, enough, 2) is None
    pinned = KokoroSynthesizer(KokoroConfig(assume_rtf=0.5), backend=_TwoSessions())  # type: ignore[arg-type]
    assert pinned._solo_pace(served, enough, 2) is None  # plans independent of the machine
