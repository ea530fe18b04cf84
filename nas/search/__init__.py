"""Search strategies of the NAS harness: how the next candidate is proposed (samplers) and
when a candidate's training stops early (pruners), each kind in one registry.

Optuna brings the study loop, the storages and most strategies (TPE, NSGA-II, random, GP,
the median, successive-halving and Hyperband pruners). What the Evolved Transformer's search
adds and Optuna lacks lives here (docs/design.md, section 5): regularized evolution as a
sampler (`RegularizedEvolutionSampler`) and Progressive Dynamic Hurdles as a pruner
(`ProgressiveDynamicHurdles`). The config names a strategy (`sampler=evolution`,
`pruner=pdh`) or a user's class by import path; `make_sampler` and `make_pruner` turn the
name and its options into the Optuna object. The harness asks a strategy what it takes
(`Registry.takes`: a proposal check, the top rung) and what it can do (`FitnessPruner`:
prune a multi-objective study), never its name.
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import Any

from optuna.pruners import (
    BasePruner,
    HyperbandPruner,
    MedianPruner,
    NopPruner,
    SuccessiveHalvingPruner,
)
from optuna.samplers import BaseSampler, GPSampler, NSGAIISampler, RandomSampler, TPESampler
from optuna.study import Study
from optuna.trial import Trial

from nas.search.evolution import RegularizedEvolutionSampler
from nas.search.pdh import FitnessPruner, ProgressiveDynamicHurdles, clears, hurdle
from pipeline.pure.registry import Registry

__all__ = [
    "PRUNERS",
    "SAMPLERS",
    "FitnessPruner",
    "NoPruning",
    "ProgressiveDynamicHurdles",
    "RegularizedEvolutionSampler",
    "clears",
    "hurdle",
    "make_pruner",
    "make_sampler",
]


def _gp_sampler(**options: Any) -> GPSampler:
    """Optuna's `GPSampler`, refused at once without scipy (Optuna imports it only when the
    first model is fitted, mid-study): ImportError here rather than failed trials later."""
    if importlib.util.find_spec("scipy") is None:
        raise ImportError(
            "sampler 'gp' (optuna.samplers.GPSampler) needs scipy, which is not installed "
            "(pip install scipy)"
        )
    return GPSampler(**options)


_gp_sampler.__signature__ = inspect.signature(GPSampler)  # type: ignore[attr-defined]


class NoPruning(NopPruner):
    """Optuna's `NopPruner`, which prunes no trial, said of studies of any number of
    objectives (a `FitnessPruner` that never prunes): "none" is never a missing pruner."""

    def prune_on_fitness(self, study: Study, trial: Trial, step: int, value: float) -> bool:
        return False


SAMPLERS: Registry[Any] = Registry(
    "sampler",
    {
        "tpe": TPESampler,
        "nsga2": NSGAIISampler,
        "random": RandomSampler,
        "gp": _gp_sampler,
        "evolution": RegularizedEvolutionSampler,
    },
    base=BaseSampler,
)

PRUNERS: Registry[Any] = Registry(
    "pruner",
    {
        "pdh": ProgressiveDynamicHurdles,
        "median": MedianPruner,
        "none": NoPruning,
        "sha": SuccessiveHalvingPruner,  # for comparison with the hurdles
        "hyperband": HyperbandPruner,
    },
    base=BasePruner,
)


def make_sampler(name: str, seed: int | None = None, **options: Any) -> BaseSampler:
    """The sampler called `name` (`SAMPLERS`: "tpe", "nsga2", "random", "gp", "evolution",
    or a `BaseSampler` subclass by import path), seeded with `seed`; `options` go to its
    constructor (e.g. `population_size=` for "evolution")."""
    sampler: BaseSampler = SAMPLERS.build(name, seed=seed, **options)
    return sampler


def make_pruner(name: str, **options: Any) -> BasePruner:
    """The pruner called `name` (`PRUNERS`: "pdh", "median", "none", "sha", "hyperband", or
    a `BasePruner` subclass by import path); `options` go to its constructor (e.g.
    `budgets=[100, 300, 1000]` for "pdh"; `min_resource=100, reduction_factor=3` for "sha",
    successive halving)."""
    pruner: BasePruner = PRUNERS.build(name, **options)
    return pruner
