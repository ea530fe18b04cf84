"""Inherited fidelity's pure parts: estimates, promotion's bars, settings (no processes)."""

from __future__ import annotations

import math

import optuna
import pytest

from nas.search.fidelity import Fidelity, record
from nas.study.judging import best_measured, estimate, promoted, recent_estimates
from tests.nas.harness.common import composed


def test_an_estimate_is_the_parents_metric_moved_by_the_childs_paired_difference() -> None:
    parent = {"validation_loss": 0.70, "validation_accuracy": 0.80}
    child = {"validation_loss": 0.65, "validation_accuracy": 0.85, "validation_s": 3.0}
    control = {"validation_loss": 0.66, "validation_accuracy": 0.83}
    assert estimate(parent, child, control) == pytest.approx(
        {"validation_loss": 0.69, "validation_accuracy": 0.82}
    )


def _trial(
    value: float, fidelity: Fidelity | None, state: str = "COMPLETE"
) -> optuna.trial.FrozenTrial:
    attrs = {} if fidelity is None else record(fidelity)
    done = state == "COMPLETE"
    return optuna.trial.create_trial(
        state=optuna.trial.TrialState[state],
        value=value if done else None,
        user_attrs=attrs,
    )


def test_an_estimate_is_promoted_only_past_the_best_full_budget_measurement() -> None:
    trials = [
        _trial(0.70, Fidelity.FULL),
        _trial(0.60, Fidelity.INHERITED),  # an estimate: never the bar
        _trial(0.65, Fidelity.PROMOTED),  # measured in full after its estimate beat 0.70
        _trial(0.50, None, "PRUNED"),
        _trial(math.inf, Fidelity.FULL),  # a failed evaluation counts as the worst
        _trial(0.68, None),  # a study at full fidelity records none: measured
    ]
    assert best_measured(trials, "validation_loss") == 0.65
    assert best_measured(trials[1:2], "validation_loss") is None
    accuracies = [
        _trial(0.80, Fidelity.FULL),
        _trial(0.90, Fidelity.INHERITED),
        _trial(0.85, Fidelity.PROMOTED),
    ]
    assert best_measured(accuracies, "validation_accuracy") == 0.85  # higher is better
    estimates = {"validation_loss": 0.62, "validation_chrf": 41.0}
    assert promoted(estimates, ["validation_loss", "validation_chrf", "validation_bleu"]) == {
        **record(Fidelity.PROMOTED),
        "estimated_validation_loss": 0.62,
        "estimated_validation_chrf": 41.0,
    }


def test_recent_estimates_are_the_last_childrens_promoted_ones_by_their_estimate() -> None:
    trials = [
        _trial(0.70, Fidelity.INHERITED),
        _trial(0.65, Fidelity.FULL),  # measured, not an estimate
        _trial(0.60, Fidelity.INHERITED),
        _trial(0.50, None, "PRUNED"),
        optuna.trial.create_trial(
            value=0.66,
            user_attrs={**record(Fidelity.PROMOTED), "estimated_validation_loss": 0.58},
        ),
        _trial(0.62, Fidelity.INHERITED),
    ]
    assert recent_estimates(trials, "validation_loss", 3) == [0.60, 0.58, 0.62]
    assert recent_estimates(trials, "validation_loss", 10) == [0.70, 0.60, 0.58, 0.62]
    assert recent_estimates(trials[:2], "validation_loss", 3) == [0.70]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("study.fidelity=rungs",),
            "study.fidelity='rungs' is not valid; valid values: full, inherited",
        ),
        (("study.inherit_steps=0",), "study.inherit_steps=0 is not valid"),
        (("study.fidelity=inherited", "study.inherit_weights=true"), "choose one"),
        (("study.promote=maybe",), "override study.promote=maybe"),
        (("study.promote_window=1",), "study.promote_window=1 is not valid"),
    ],
)
def test_inherited_fidelity_settings_are_checked(overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(Exception, match=message.replace("(", r"\(")):
        composed(*overrides)
