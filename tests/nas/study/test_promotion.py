"""`nas.study.promotion`: which children are measured in full, by their own paired
difference, and how well that ranked (pure, on trials made in memory)."""

from __future__ import annotations

import math
from typing import Any

import optuna
import pytest

from nas.search.fidelity import Fidelity, record
from nas.study.inheritance import INHERITED_FROM
from nas.study.promotion import (
    agreement,
    best_measured,
    difference_attrs,
    promoted,
    promotes,
    recent_differences,
)

LOSS = "validation_loss"


def _trial(
    value: float | None,
    fidelity: Fidelity | None = None,
    state: str = "COMPLETE",
    **attrs: Any,
) -> optuna.trial.FrozenTrial:
    recorded = {} if fidelity is None else record(fidelity)
    return optuna.trial.create_trial(
        state=optuna.trial.TrialState[state],
        value=value if state == "COMPLETE" else None,
        user_attrs=recorded | attrs,
    )


def _child(value: float, difference: float, parent: int, *, promoted: bool = False) -> Any:
    """A child judged at inherited fidelity (promoted: then measured in full)."""
    fidelity = Fidelity.PROMOTED if promoted else Fidelity.INHERITED
    attrs: dict[str, Any] = {"difference_validation_loss": difference, INHERITED_FROM: parent}
    return _trial(value, fidelity, **attrs)


def test_the_best_measurement_is_the_bar_and_an_estimate_never_is() -> None:
    trials = [
        _trial(0.70, Fidelity.FULL),
        _trial(0.60, Fidelity.INHERITED),  # an estimate: never the bar
        _trial(0.65, Fidelity.PROMOTED),  # measured in full
        _trial(0.50, None, "PRUNED"),
        _trial(math.inf, Fidelity.FULL),  # a failed evaluation counts as the worst
        _trial(0.68),  # a study at full fidelity records none: measured
    ]
    assert best_measured(trials, LOSS) == 0.65
    assert best_measured(trials[1:2], LOSS) is None
    accuracies = [
        _trial(0.80, Fidelity.FULL),
        _trial(0.90, Fidelity.INHERITED),
        _trial(0.85, Fidelity.PROMOTED),
    ]
    assert best_measured(accuracies, "validation_accuracy") == 0.85  # higher is better
    estimates = {LOSS: 0.62, "validation_chrf": 41.0}
    assert promoted(estimates, [LOSS, "validation_chrf", "validation_bleu"]) == {
        **record(Fidelity.PROMOTED),
        "estimated_validation_loss": 0.62,
        "estimated_validation_chrf": 41.0,
    }


def test_a_childs_paired_difference_is_its_continuation_less_its_parents() -> None:
    measured = {LOSS: 0.65, "validation_chrf": 40.0, "validation_s": 3.0}
    control = {LOSS: 0.66, "validation_chrf": 38.5}
    assert difference_attrs(measured, control) == pytest.approx(
        {"difference_validation_loss": -0.01, "difference_validation_chrf": 1.5}
    )


def test_recent_differences_are_the_last_childrens_promoted_or_not() -> None:
    trials = [
        _child(0.70, 0.02, 0),
        _trial(0.65, Fidelity.FULL),  # no difference: not a child
        _child(0.60, -0.01, 0),
        _trial(None, state="PRUNED"),
        _child(0.66, 0.005, 1, promoted=True),
        _child(0.62, 0.01, 1),
    ]
    assert recent_differences(trials, LOSS, 3) == [-0.01, 0.005, 0.01]
    assert recent_differences(trials, LOSS, 10) == [0.02, -0.01, 0.005, 0.01]


def test_a_child_is_promoted_by_its_own_difference_never_by_a_chained_estimate() -> None:
    trials = [
        _trial(0.70, Fidelity.FULL),  # 0: measured, the best so far
        _child(0.60, -0.10, 0),  # 1: an estimate (lucky: its parent's fitness is not it)
        _trial(0.75, Fidelity.FULL),  # 2: measured
    ]
    # anchored on a measured parent: 0.70 - 0.02 beats the best measured, 0.70
    assert promotes(trials, LOSS, -0.02, parent=0, window=None)
    assert not promotes(trials, LOSS, +0.01, parent=0, window=None)
    assert not promotes(trials, LOSS, -0.04, parent=2, window=None)  # 0.71: not past 0.70
    # a child of an estimate: 0.60 - 0.05 would chain; without a window, never promoted
    assert not promotes(trials, LOSS, -0.05, parent=1, window=None)
    # the best of its time: beats the differences of the window - 1 children before it
    assert promotes(trials, LOSS, -0.11, parent=1, window=2)
    assert not promotes(trials, LOSS, -0.09, parent=1, window=2)
    assert not promotes(trials, LOSS, -0.5, parent=1, window=3)  # too few children yet
    assert not promotes(trials, LOSS, math.nan, parent=0, window=2)


def test_the_promotions_agreement_ranks_estimates_against_measured_differences() -> None:
    trials = [
        _trial(0.70, Fidelity.FULL),  # 0
        _child(0.66, -0.03, 0, promoted=True),  # measured -0.04: best estimate, best
        _child(0.69, -0.02, 0, promoted=True),  # measured -0.01
        _child(0.72, -0.01, 0, promoted=True),  # measured +0.02
        _child(0.60, -0.08, 0),  # 4: an estimate, not promoted
        _child(0.50, -0.05, 4, promoted=True),  # its parent unmeasured: not paired
    ]
    said = agreement(trials, LOSS)
    assert (said.promoted, said.paired) == (4, 3)
    assert said.kendall_tau == pytest.approx(1.0)
    assert said.to_dict() == {"promoted": 4, "paired": 3, "kendall_tau": pytest.approx(1.0)}
    assert math.isnan(agreement(trials[:2], LOSS).kendall_tau)  # one pair: no order
    assert agreement(trials[:2], LOSS).to_dict()["kendall_tau"] is None
