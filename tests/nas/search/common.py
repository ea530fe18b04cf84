"""Helpers shared by the evolution sampler's tests: a child's place in its study's lineage,
and an objective with one parameter of each kind a mutation must handle."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial

from nas.search import lineage


def children(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in study.trials if t.system_attrs.get(lineage.KEY_ROLE) == "child"]


def parent_of(study: optuna.Study, child: FrozenTrial) -> FrozenTrial:
    return study.trials[child.system_attrs[lineage.KEY_PARENT]]


def mixed_objective(trial: optuna.Trial) -> float:
    """One parameter of each kind a mutation must handle, and one it must never pick."""
    a = trial.suggest_categorical("cat", ["x", "y", None, 3])
    choices: list[object] = ["x", "y", None, 3]
    b = trial.suggest_int("int", 0, 4)
    c = trial.suggest_int("int_step", 0, 12, step=3)
    d = trial.suggest_int("int_log", 1, 1024, log=True)
    e = trial.suggest_float("float", -1.0, 1.0)
    f = trial.suggest_float("float_log", 1e-4, 1.0, log=True)
    g = trial.suggest_float("float_step", 0.0, 1.0, step=0.25)
    h = trial.suggest_int("single", 5, 5)  # one legal value: nothing to mutate to
    return choices.index(a) * 3 + b + c + d / 1024 + e + f + g + h  # no hash(): salted
