"""The capacity benchmark's bookkeeping: which turns started while another call spoke, and
what a share of the physical limit asks of the engine."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from kokoro_capacity import (
    Conversation,
    Result,
    Sentences,
    Turn,
    another_speaks,
    few_turns_line,
    overlap_line,
    sentence_bank,
    share_needs,
)


def _turn(sent: float, played_out: float) -> Turn:
    return Turn([sent, sent + 0.4], 0, played_out=played_out)


def test_a_turn_overlaps_while_another_calls_turn_is_in_progress() -> None:
    a = Conversation(1, [_turn(0.0, 5.0), _turn(7.0, 0.0)])  # the second never played out
    b = Conversation(2, [_turn(4.0, 9.0)])
    convs = [a, b]
    assert another_speaks(convs, 2, 4.0)  # a's first turn plays until 5.0
    assert not another_speaks(convs, 2, 5.0)  # ... and has played out at 5.0
    assert not another_speaks(convs, 1, 0.0)  # b has not started yet
    assert another_speaks(convs, 1, 7.0)  # b's turn plays until 9.0
    assert another_speaks(convs, 2, 100.0)  # a's turn that never played out still counts
    assert not another_speaks([a], 1, 7.0)  # its own turns never count


def test_the_overlap_line_splits_the_turns() -> None:
    r = Result(2, [300.0, 900.0, 320.0, 700.0], 4, 0, 0.0, 0.0, 0, 8.0, 20.0, [900.0, 700.0])
    line = overlap_line(r)
    assert "another call spoke: 2, TTFA p50 700 ms p95 900 ms" in line
    assert "the others: 2, p50 300 ms p95 320 ms" in line


def test_a_share_of_the_limit_is_a_whole_number_of_calls_and_their_load() -> None:
    # 3.44 audio s per s on all cores, a call asking 0.77: the limit is 4.47 calls, and
    # 70 % of it (3.13) needs 4 calls: 3.08 audio s per s (90 %), 4 (116 %) at once
    line = share_needs(3.44 / 0.77, 0.77, 3.44)
    assert "needs a capacity of 4: 4 call(s) ask 3.08 audio s per s on average (90% of" in line
    assert "and 4 (116%) while all of them speak" in line
    # a box half as fast: 70 % of 2.23 calls (1.56) needs 2 calls
    assert "needs a capacity of 2: 2 call(s) ask 1.54 audio s per s" in share_needs(
        1.72 / 0.77, 0.77, 1.72
    )


def test_runs_with_too_few_turns_for_the_gap_rule_are_named() -> None:
    def result(n: int, turns: int) -> Result:
        return Result(n, [300.0] * turns, turns, 0, 0.0, 0.0, 0, 8.0, 20.0, [])

    line = few_turns_line([result(1, 6), result(2, 12), result(3, 20)])
    assert "N=1 (6), N=2 (12);" in line  # under 20 turns one gap is over 5 %
    assert "N=3" not in line
    assert few_turns_line([result(2, 20), result(3, 41)]) == ""


def test_a_long_soak_never_hears_a_sentence_twice_and_says_when_they_run_out() -> None:
    """16 calls used the first bank's sentences in 19 minutes: the ones after it are new,
    the first ones are the same as before (runs stay comparable), and running out is a
    clear error, not a StopIteration inside a coroutine."""
    bank = sentence_bank(7)
    texts = Sentences(7)
    drawn = [texts.next() for _ in range(3 * len(bank))]
    assert drawn[: len(bank)] == bank
    assert len(set(drawn)) == len(drawn) and texts.used == len(drawn)
    try:
        while True:
            texts.next()
    except RuntimeError as exc:
        assert f"after {texts.used}" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("unreachable")
