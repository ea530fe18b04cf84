"""`nas.study.trials`: the time a study searched, on a real in-memory Optuna study."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

import optuna

from nas.settings import NasSettings, StudySettings
from nas.study.trials import measured_shares, seconds_searched, time_left


def finished_trial(
    seconds: float,
    state: optuna.trial.TrialState,
    start_s: float = 0.0,
    user_attrs: Mapping[str, object] | None = None,
) -> optuna.trial.FrozenTrial:
    start = datetime(2026, 1, 1, 12, 0, 0) + timedelta(seconds=start_s)
    return optuna.trial.FrozenTrial(
        number=0,
        trial_id=0,
        state=state,
        value=1.0 if state.name == "COMPLETE" else None,
        datetime_start=start,
        datetime_complete=start + timedelta(seconds=seconds),
        params={},
        distributions={},
        user_attrs=dict(user_attrs or {}),
        system_attrs={},
        intermediate_values={},
    )


def test_the_time_budget_counts_the_time_searched_over_runs_and_workers() -> None:
    study = optuna.create_study()
    budget = NasSettings(study=StudySettings(time_budget_s=100.0))
    assert seconds_searched(study) == 0.0 and time_left(study, budget)
    study.add_trial(finished_trial(60, optuna.trial.TrialState.COMPLETE))
    study.add_trial(finished_trial(50, optuna.trial.TrialState.PRUNED, start_s=20))  # beside it
    study.ask()  # running: not counted until it ends
    assert seconds_searched(study) == 70.0 and time_left(study, budget)
    # a later run, after a pause that does not count; a failed trial's time was spent too
    study.add_trial(finished_trial(30, optuna.trial.TrialState.FAIL, start_s=500))
    assert seconds_searched(study) == 100.0
    assert not time_left(study, budget)
    assert time_left(study, NasSettings())  # no budget: never out of time


def test_what_trials_measured_against_their_prediction_per_stage_count() -> None:
    study = optuna.create_study()
    assert measured_shares(study) == {}
    done, pruned = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED
    for stages, measured, predicted, state in [
        (1, 95.0, 100.0, done),
        (2, 70.0, 100.0, done),
        (1, 110.0, 100.0, pruned),  # a pruned trial trained its steps at its speed too
        (1, 100.0, 100.0, done),
        (2, 60.0, 100.0, optuna.trial.TrialState.FAIL),  # failed: not counted
        (2, 0.0, 100.0, done),  # nothing measured
        (3, 50.0, None, done),  # no prediction (no overheads known)
    ]:
        attrs = {
            "n_stages": stages,
            "samples_per_s": measured,
            "predicted_samples_per_s": predicted,
        }
        study.add_trial(finished_trial(1.0, state, user_attrs=attrs))
    assert measured_shares(study) == {1: 1.0, 2: 0.7}
    assert measured_shares(study, last=1) == {1: 1.0, 2: 0.7}  # the newest only
    slow = {"n_stages": 1, "samples_per_s": 50.0, "predicted_samples_per_s": 100.0}
    study.add_trial(finished_trial(1.0, done, user_attrs=slow))
    assert measured_shares(study, last=2)[1] == 0.75  # (1.0 + 0.5) / 2: the last two
