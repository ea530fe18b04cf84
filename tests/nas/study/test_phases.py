"""`nas.study.phases`: each second of a trial goes to one phase, the innermost open one; a
phase hands over what it learns was another's; nothing is timed without an active clock."""

from __future__ import annotations

from typing import Any

import pytest

from nas.study.phases import Phase, TrialClock, hand_over, shares, timed


class Ticks:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_second_goes_to_the_innermost_open_phase_and_the_rest_to_other() -> None:
    ticks = Ticks()
    clock = TrialClock(ticks)
    clock.charge(Phase.BEFORE, 2.0)
    with clock.running():
        ticks.now += 1.0  # no phase open: other
        with timed(Phase.TRAIN):
            ticks.now += 5.0
            with timed(Phase.CHECKPOINT):
                ticks.now += 3.0
            ticks.now += 1.0
        with timed(Phase.EVALUATE):
            ticks.now += 4.0
            hand_over(1.5, Phase.DECODE)  # what the task said it spent decoding
    attrs = clock.attrs()
    seconds = attrs["time_s"]
    assert seconds["before"] == 2.0 and seconds["other"] == 1.0
    assert seconds["train"] == 6.0 and seconds["checkpoint"] == 3.0
    assert seconds["evaluate"] == 2.5 and seconds["decode"] == 1.5
    assert seconds["build"] == 0.0 and seconds["total"] == 16.0
    assert sum(v for k, v in seconds.items() if k != "total") == seconds["total"]
    assert attrs["time_fixed_share"] == 10 / 16  # all but the training steps' 6 s


def test_without_an_active_clock_nothing_is_timed_and_a_running_clock_has_no_attrs() -> None:
    with timed(Phase.TRAIN):  # a retraining or a benchmark: free, no error
        hand_over(1.0, Phase.DECODE)
    clock = TrialClock()
    with clock.running(), pytest.raises(RuntimeError, match="still running"):
        clock.attrs()
    with timed(Phase.BUILD):  # after the block, not this clock's
        pass
    assert clock.attrs()["time_s"]["build"] == 0.0


def test_a_phase_left_out_of_order_is_an_error_and_a_hand_over_is_bounded() -> None:
    ticks = Ticks()
    clock = TrialClock(ticks)
    with clock.running():
        clock.enter(Phase.TRAIN)
        ticks.now += 2.0
        with pytest.raises(RuntimeError, match="left while"):
            clock.leave(Phase.BUILD)
        clock.hand_over(60.0, Phase.DECODE)  # more than it holds: all it holds
        ticks.now += 1.0
        clock.leave(Phase.TRAIN)
    spent = clock.spent()
    assert spent[Phase.DECODE] == 2.0 and spent[Phase.TRAIN] == 1.0


def test_shares_sum_the_trials_that_recorded_a_breakdown() -> None:
    records: list[dict[str, Any]] = [
        {"time_s": {"total": 8.0, "train": 6.0, "before": 2.0}},
        {"time_s": {"total": 2.0, "train": 1.0, "other": 1.0}},
        {"state": "no breakdown"},
    ]
    total, by_phase = shares(records)
    assert total == 10.0
    assert list(by_phase)[:3] == ["train", "before", "other"]
    assert by_phase["train"] == 0.7 and by_phase["before"] == 0.2
    assert sum(by_phase.values()) == pytest.approx(1.0)
    assert shares([]) == (0.0, {})
