"""`nas.trials`' pure pieces on a real in-memory Optuna study (no processes)."""

from __future__ import annotations

from datetime import datetime, timedelta

import optuna

from nas.settings import NasSettings, StudySettings
from nas.trials import seconds_trained, time_left


def finished_trial(seconds: float, state: optuna.trial.TrialState) -> optuna.trial.FrozenTrial:
    start = datetime(2026, 1, 1, 12, 0, 0)
    return optuna.trial.FrozenTrial(
        number=0,
        trial_id=0,
        state=state,
        value=1.0 if state.name == "COMPLETE" else None,
        datetime_start=start,
        datetime_complete=start + timedelta(seconds=seconds),
        params={},
        distributions={},
        user_attrs={},
        system_attrs={},
        intermediate_values={},
    )


def test_the_time_budget_counts_every_finished_trial_over_runs() -> None:
    study = optuna.create_study()
    budget = NasSettings(study=StudySettings(time_budget_s=100.0))
    assert seconds_trained(study) == 0.0 and time_left(study, budget)
    study.add_trial(finished_trial(60, optuna.trial.TrialState.COMPLETE))
    study.add_trial(finished_trial(30, optuna.trial.TrialState.PRUNED))
    study.ask()  # running: not counted until it ends
    assert seconds_trained(study) == 90.0 and time_left(study, budget)
    study.add_trial(finished_trial(15, optuna.trial.TrialState.FAIL))  # its time was spent too
    assert seconds_trained(study) == 105.0
    assert not time_left(study, budget)
    assert time_left(study, NasSettings())  # no budget: never out of time
