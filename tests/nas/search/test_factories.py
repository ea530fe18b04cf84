"""The factories, and the contract every sampler `make_sampler` builds must honour.

The contract runs each sampler on a small define-by-run objective (categorical, int, log-int,
stepped-int and float parameters, a conditional branch per categorical choice) with trials
enqueued before and during the study, on an in-memory and on a SQLite study: every trial
completes, every parameter lies in its distribution, the names asked match the branch taken,
enqueued trials keep their parameters, and the sampler pickles and reseeds.
"""

from __future__ import annotations

import importlib.util
import math
import pickle
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.pruners import MedianPruner, NopPruner
from optuna.samplers import GPSampler, NSGAIISampler, RandomSampler, TPESampler
from optuna.trial import TrialState

from nas.search import (
    PRUNERS,
    SAMPLERS,
    ProgressiveDynamicHurdles,
    RegularizedEvolutionSampler,
    make_pruner,
    make_sampler,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

HAVE_SCIPY = importlib.util.find_spec("scipy") is not None  # GPSampler fits with scipy

# Small options so that every sampler leaves its start-up phase within the test's trials.
OPTIONS: dict[str, dict[str, Any]] = {
    "tpe": {"n_startup_trials": 4},
    "nsga2": {"population_size": 4},
    "random": {},
    "gp": {"n_startup_trials": 4, "warn_independent_sampling": False},
    "evolution": {"population_size": 4, "sample_size": 2},
}
ACTIVATIONS = [None, True, 2, 0.5, "relu"]  # every type a categorical may hold
BRANCH_NAMES = {
    "conv": {"conv.width"},
    "attention": {"attention.heads", "attention.activation"},
    "identity": set(),
}
COMMON_NAMES = {"kind", "depth", "rate", "stride"}
FULL_SEED = {"kind": "conv", "depth": 3, "conv.width": 8, "rate": 0.25, "stride": 4}
PARTIAL_SEED = {"kind": "attention", "attention.heads": 8}
LATE_SEED = {"kind": "identity", "depth": 6, "rate": 0.75, "stride": 10}


def objective(trial: optuna.Trial) -> float:
    kind = trial.suggest_categorical("kind", ["conv", "attention", "identity"])
    score = float(trial.suggest_int("depth", 1, 6))
    if kind == "conv":
        score += trial.suggest_int("conv.width", 1, 64, log=True) / 64
    elif kind == "attention":
        heads = trial.suggest_categorical("attention.heads", [4, 8, 16])
        activation = trial.suggest_categorical("attention.activation", ACTIVATIONS)
        score += int(heads) / 16 + ACTIVATIONS.index(activation) / 10
    score += trial.suggest_float("rate", 0.0, 1.0)
    return score + trial.suggest_int("stride", 2, 10, step=2) / 10


def legal(distribution: BaseDistribution, value: Any) -> bool:
    """`value` is one of the values `distribution` allows (written without optuna internals)."""
    if isinstance(distribution, CategoricalDistribution):
        return any(type(value) is type(c) and value == c for c in distribution.choices)
    if isinstance(distribution, IntDistribution):
        on_grid = (value - distribution.low) % distribution.step == 0
        return isinstance(value, int) and distribution.low <= value <= distribution.high and on_grid
    assert isinstance(distribution, FloatDistribution)
    return isinstance(value, float) and distribution.low <= value <= distribution.high


def storage_url(kind: str, tmp_path: Path) -> str | None:
    return None if kind == "memory" else f"sqlite:///{tmp_path / 'study.db'}"


@pytest.mark.parametrize("storage", ["memory", "sqlite"])
@pytest.mark.parametrize("name", list(SAMPLERS))
def test_sampler_contract(name: str, storage: str, tmp_path: Path) -> None:
    if name == "gp" and not HAVE_SCIPY:
        pytest.skip("GPSampler needs scipy, which is not installed")
    sampler = make_sampler(name, seed=0, **OPTIONS[name])
    study = optuna.create_study(storage=storage_url(storage, tmp_path), sampler=sampler)
    study.enqueue_trial(FULL_SEED)
    study.enqueue_trial(PARTIAL_SEED)
    study.optimize(objective, n_trials=10)
    study.enqueue_trial(LATE_SEED)  # once model-based sampling (or breeding) has begun
    study.optimize(objective, n_trials=4)

    trials = study.get_trials()
    assert len(trials) == 14
    assert all(t.state == TrialState.COMPLETE for t in trials)
    for t in trials:
        assert t.params.keys() == COMMON_NAMES | BRANCH_NAMES[t.params["kind"]], t.number
        for param, value in t.params.items():
            assert legal(t.distributions[param], value), (t.number, param, value)
    assert trials[0].params == FULL_SEED
    assert {k: trials[1].params[k] for k in PARTIAL_SEED} == PARTIAL_SEED
    assert trials[10].params == LATE_SEED
    assert math.isfinite(study.best_value)

    copy = pickle.loads(pickle.dumps(study.sampler))  # the samplers pickle and reseed
    copy.reseed_rng()
    study.sampler = copy
    study.optimize(objective, n_trials=1)
    assert study.trials[-1].state == TrialState.COMPLETE


def test_make_sampler_builds_each_named_sampler_with_its_seed() -> None:
    expected = {
        "tpe": TPESampler,
        "nsga2": NSGAIISampler,
        "random": RandomSampler,
        "gp": GPSampler,
        "evolution": RegularizedEvolutionSampler,
    }
    assert list(SAMPLERS) == list(expected)
    for name, cls in expected.items():
        if name != "gp" or HAVE_SCIPY:
            assert type(make_sampler(name, seed=1)) is cls
    evolution = make_sampler("evolution", 7, population_size=6, sample_size=3)
    assert isinstance(evolution, RegularizedEvolutionSampler)
    assert (evolution.population_size, evolution.sample_size) == (6, 3)
    # The same seed gives the same random draws.
    draws = []
    for _ in range(2):
        study = optuna.create_study(sampler=make_sampler("random", seed=5))
        study.optimize(objective, n_trials=3)
        draws.append([t.params for t in study.trials])
    assert draws[0] == draws[1]


@pytest.mark.skipif(HAVE_SCIPY, reason="scipy is installed")
def test_make_sampler_gp_without_scipy_fails_at_once() -> None:
    with pytest.raises(ImportError, match="sampler 'gp'.*needs scipy"):
        make_sampler("gp", seed=0)


def test_make_sampler_rejects_an_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"unknown sampler 'cmaes'.*tpe, nsga2, random, gp"):
        make_sampler("cmaes", seed=0)


def test_make_pruner_builds_each_named_pruner() -> None:
    assert list(PRUNERS) == ["pdh", "median", "none", "sha", "hyperband"]
    pdh = make_pruner("pdh", budgets=[10, 30], min_trials=2)
    assert isinstance(pdh, ProgressiveDynamicHurdles)
    assert (pdh.budgets, pdh.min_trials) == ((10, 30), 2)
    topped = make_pruner("pdh", budgets=[10], max_resource=30)  # the top rung appended
    assert isinstance(topped, ProgressiveDynamicHurdles) and topped.budgets == (10, 30)
    assert type(make_pruner("median", n_startup_trials=2)) is MedianPruner
    assert isinstance(make_pruner("none"), NopPruner)


def test_make_pruner_rejects_bad_names_and_options() -> None:
    with pytest.raises(ValueError, match=r"unknown pruner 'patient'.*pdh, median, none"):
        make_pruner("patient")
    with pytest.raises(TypeError, match="bad options for pruner 'none'.*valid options: none"):
        make_pruner("none", n_startup_trials=3)
    with pytest.raises(ValueError, match="budgets"):
        make_pruner("pdh", budgets=[])


def test_a_users_sampler_and_pruner_are_found_by_import_path() -> None:
    sampler = make_sampler("optuna.samplers:RandomSampler", seed=3)
    assert type(sampler) is RandomSampler
    assert type(make_pruner("optuna.pruners:PercentilePruner", percentile=25.0)).__name__ == (
        "PercentilePruner"
    )
    with pytest.raises(ValueError, match="is not a subclass of optuna.samplers._base.BaseSampler"):
        make_sampler("optuna.pruners:MedianPruner", seed=0)
