"""`nas.study.trials`' pure pieces on a real in-memory Optuna study (no processes)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import optuna

from nas.search.lineage import KEY_GRAFT, KEY_PROPOSAL, KEY_ROLE
from nas.settings import NasSettings, StudySettings
from nas.study.trials import (
    MODEL_DIGEST,
    model_digest,
    open_study,
    param_window,
    sample_architecture,
    seconds_searched,
    time_left,
)
from search_spaces.architecture import functional_key
from search_spaces.compile import parameter_count
from search_spaces.evolved_transformer import validate
from search_spaces.suggest import FixedSuggest
from tests.nas.harness.common import composed


def finished_trial(
    seconds: float, state: optuna.trial.TrialState, start_s: float = 0.0
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
        user_attrs={},
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


def test_evolution_proposes_only_models_inside_the_window_that_no_trial_trained(
    tmp_path: Path,
) -> None:
    """`search_2h`'s evolution on a real SQLite study, its objective the model's size: every
    child, mutated or grafted, is inside the window (the seeds are trained whatever their
    size) and no two trials train one model, so no proposal is refused."""
    settings = composed("experiment=search_2h", f"studies_dir={tmp_path}")
    study = open_study(settings)
    window = param_window(settings)

    def objective(trial: optuna.Trial) -> float:
        arch = sample_architecture(trial, settings)
        trial.set_user_attr(MODEL_DIGEST, model_digest(functional_key(arch)))
        return float(parameter_count(arch))  # a deterministic fitness: smaller is better

    study.optimize(objective, n_trials=20)
    kids = [t for t in study.trials if t.system_attrs.get(KEY_ROLE) == "child"]
    assert len(kids) == 18 and all(KEY_PROPOSAL in t.system_attrs for t in kids)
    assert any(KEY_GRAFT in t.system_attrs for t in kids)  # recombined: valid all the same
    for kid in kids:
        validate(sample_architecture(FixedSuggest(kid.params), settings), window=window)
    digests = [t.user_attrs[MODEL_DIGEST] for t in study.trials]
    assert len(set(digests)) == len(digests)  # never a model twice
