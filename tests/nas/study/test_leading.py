"""`nas.study.leading`: the leader is the best mean over the seeds each trial was measured
on (pure, on trials made in memory)."""

from __future__ import annotations

import math

import optuna
import pytest

from nas.search.fidelity import Fidelity, record
from nas.settings import NasSettings, RetrainSettings, StudySettings
from nas.study.leading import SEED_VALUES, leader, mean_value, seed_values, standing, study_attr

LOSS = "validation_loss"


def _trial(number: int, value: float, **attrs: object) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(value=value, user_attrs=dict(attrs))
    trial.number = number
    return trial


def test_a_trial_stands_on_the_mean_of_its_seeds_a_later_one_included() -> None:
    lone = _trial(0, 0.70)  # measured before any confirmation: its value, on the study's seed
    assert seed_values(lone, {}, seed=0) == {0: 0.70}
    confirmed = _trial(1, 0.69, **{SEED_VALUES: {"0": 0.68, "6": 0.70}})
    assert seed_values(confirmed, {}, seed=0) == {0: 0.68, 6: 0.70}
    later = {study_attr(0, 6): 0.74, study_attr(10, 6): 0.1}  # trial 0 measured on seed 6
    assert seed_values(lone, later, seed=0) == {0: 0.70, 6: 0.74}
    assert standing(lone, later, 0, LOSS) == pytest.approx(0.72)
    assert standing(confirmed, later, 0, "validation_chrf") == pytest.approx(-0.69)  # maximised
    assert mean_value({"0": 0.68, "6": 0.70}) == pytest.approx(0.69)


def test_the_leader_is_the_measured_trial_of_the_best_mean() -> None:
    trials = [
        _trial(0, 0.70),
        _trial(1, 0.69, **{SEED_VALUES: {"0": 0.68, "6": 0.70}}),
        _trial(2, 0.60, **record(Fidelity.INHERITED)),  # an estimate never leads
        _trial(3, 0.695),  # one seed, behind trial 1's mean over two
    ]
    assert leader(trials, {}, 0, LOSS) is trials[1]
    assert leader(trials[:3], {study_attr(0, 6): 0.66}, 0, LOSS) is trials[0]  # 0.68 < 0.69
    assert leader(trials[2:3], {}, 0, LOSS) is None
    tied = [_trial(0, 0.7), _trial(1, 0.7)]
    assert leader(tied, {}, 0, LOSS) is tied[0]
    failed = _trial(4, 0.7, **{SEED_VALUES: {"0": math.nan}})  # a seed's run diverged
    assert math.isinf(standing(failed, {}, 0, LOSS))


def test_the_second_seed_never_judges_the_winner() -> None:
    apart = NasSettings(study=StudySettings(confirm_seed=6), retrain=RetrainSettings(seeds=(1, 2)))
    assert apart.study.confirm_seed == 6
    with pytest.raises(ValueError, match="study.confirm_seed=0 is the study's seed"):
        NasSettings(study=StudySettings(confirm_seed=0), retrain=RetrainSettings(seeds=(1,)))
    with pytest.raises(ValueError, match=r"must not judge the winner \(retrain.seeds=\[1, 6\]\)"):
        NasSettings(study=StudySettings(confirm_seed=6), retrain=RetrainSettings(seeds=(1, 6)))
    with pytest.raises(ValueError, match="must not judge the winner"):  # the study's own seed
        NasSettings(study=StudySettings(confirm_seed=6), retrain=RetrainSettings(seeds=(0, 1)))
