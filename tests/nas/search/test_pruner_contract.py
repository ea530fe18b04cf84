"""The contract every pruner of the registry (`nas.search.PRUNERS`) honours, built as the
harness builds it (`max_resource`, the top rung, given where the pruner takes it), on an
in-memory and on a SQLite study: trials report at evaluation steps up to the top rung and
ask whether to stop, as the study loop does; every trial ends complete or pruned, none at
or after the top rung, a pruner that prunes stops the trials that fall behind, and a
`FitnessPruner` judges a multi-objective study on its first objective alone."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from nas.search import PRUNERS, FitnessPruner, make_pruner

optuna.logging.set_verbosity(optuna.logging.WARNING)

TOP = 8  # the top rung: the full training length
STEPS = (2, 4, 6, TOP)  # the evaluation steps
OPTIONS: dict[str, dict[str, Any]] = {  # small options, so each prunes within the trials
    "pdh": {"budgets": [2, 4], "min_trials": 2},
    "median": {"n_startup_trials": 2},
    "none": {},
    "sha": {"min_resource": 2},
    "hyperband": {"min_resource": 2},
}
NEVER_PRUNES = {"none"}


def built(name: str) -> optuna.pruners.BasePruner:
    options = dict(OPTIONS[name])
    if PRUNERS.takes(name, "max_resource"):
        options["max_resource"] = TOP
    return make_pruner(name, **options)


def objective(trial: optuna.Trial) -> float:
    """Each trial worse than every one before it at every step (lower is better), asking
    below the top rung only, as the study loop does (trained in full, a trial completes)."""
    for step in STEPS:
        value = trial.number + 1.0 / step
        trial.report(value, step)
        if step < TOP and trial.should_prune():
            raise optuna.TrialPruned
    return value


def test_every_registered_pruner_is_in_the_contract() -> None:
    assert set(PRUNERS) == set(OPTIONS)


@pytest.mark.parametrize("storage", ["memory", "sqlite"])
@pytest.mark.parametrize("name", list(PRUNERS))
def test_pruner_contract(name: str, storage: str, tmp_path: Path) -> None:
    url = None if storage == "memory" else f"sqlite:///{tmp_path / 'study.db'}"
    pruner = pickle.loads(pickle.dumps(built(name)))  # workers rebuild it: it pickles
    study = optuna.create_study(storage=url, pruner=pruner)
    study.optimize(objective, n_trials=12)
    trials = study.get_trials()
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert trials[0].state == TrialState.COMPLETE  # nothing to compare the first with
    for t in trials:
        last = max(t.intermediate_values)
        assert (last == TOP) == (t.state == TrialState.COMPLETE), (t.number, last, t.state)
    pruned = [t.number for t in trials if t.state == TrialState.PRUNED]
    assert bool(pruned) == (name not in NEVER_PRUNES), pruned


@pytest.mark.parametrize("name", [n for n in PRUNERS if issubclass(PRUNERS[n], FitnessPruner)])
def test_a_fitness_pruner_judges_a_multi_objective_study_on_its_fitness(name: str) -> None:
    """Optuna 5 refuses `report` there: the harness asks `prune_on_fitness` at each
    evaluation with the fitness, as `nas.study.leader.Leader.evaluated` does."""
    study = optuna.create_study(directions=["minimize", "maximize"], pruner=built(name))
    for number in range(12):
        trial = study.ask()
        for step in STEPS:
            fitness = number + 1.0 / step
            pruner = study.pruner
            assert isinstance(pruner, FitnessPruner)
            if step < TOP and pruner.prune_on_fitness(study, trial, step, fitness):
                study.tell(trial, state=TrialState.PRUNED)
                break
        else:
            study.tell(trial, [fitness, 1.0])
    states = [t.state for t in study.trials]
    assert states[0] == TrialState.COMPLETE
    assert (TrialState.PRUNED in states) == (name not in NEVER_PRUNES), states
