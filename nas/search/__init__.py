"""Search strategies of the NAS harness: how the next candidate is proposed (samplers) and
when a candidate's training stops early (pruners), behind two name-based factories.

Optuna brings the study loop, the storages and most strategies (TPE, NSGA-II, random, GP,
the median and successive-halving pruners). What the Evolved Transformer's search adds and
Optuna lacks lives here (docs/design.md, section 5): regularized evolution as a sampler
(`RegularizedEvolutionSampler`) and Progressive Dynamic Hurdles as a pruner
(`ProgressiveDynamicHurdles`). The config names a strategy (`sampler=evolution`,
`pruner=pdh`); `make_sampler` and `make_pruner` turn the name and its options into the
Optuna object, so the study loop never branches on names.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any, TypeVar

from optuna.pruners import BasePruner, MedianPruner, NopPruner, SuccessiveHalvingPruner
from optuna.samplers import BaseSampler, GPSampler, NSGAIISampler, RandomSampler, TPESampler

from nas.search.evolution import RegularizedEvolutionSampler
from nas.search.pdh import ProgressiveDynamicHurdles, clears, hurdle

__all__ = [
    "PRUNERS",
    "SAMPLERS",
    "ProgressiveDynamicHurdles",
    "RegularizedEvolutionSampler",
    "clears",
    "hurdle",
    "make_pruner",
    "make_sampler",
]

T = TypeVar("T")

SAMPLERS: dict[str, Callable[..., BaseSampler]] = {
    "tpe": TPESampler,
    "nsga2": NSGAIISampler,
    "random": RandomSampler,
    "gp": GPSampler,
    "evolution": RegularizedEvolutionSampler,
}

PRUNERS: dict[str, Callable[..., BasePruner]] = {
    "pdh": ProgressiveDynamicHurdles,
    "median": MedianPruner,
    "none": NopPruner,
    "sha": SuccessiveHalvingPruner,  # for comparison with the hurdles
}


def _lookup(kind: str, name: str, table: dict[str, T]) -> T:
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; valid {kind}s: {', '.join(table)}")
    return table[name]


def make_sampler(name: str, seed: int | None = None, **options: Any) -> BaseSampler:
    """The sampler called `name` ("tpe", "nsga2", "random", "gp", "evolution"), seeded with
    `seed`; `options` go to its constructor (e.g. `population_size=` for "evolution").

    "gp" needs scipy besides torch (Optuna imports it only when the first model is fitted,
    mid-study): without it this raises ImportError here rather than failing trials later."""
    factory = _lookup("sampler", name, SAMPLERS)
    if name == "gp" and importlib.util.find_spec("scipy") is None:
        raise ImportError(
            "sampler 'gp' (optuna.samplers.GPSampler) needs scipy, which is not installed "
            "(pip install scipy)"
        )
    return factory(seed=seed, **options)


def make_pruner(name: str, **options: Any) -> BasePruner:
    """The pruner called `name` ("pdh", "median", "none", "sha"); `options` go to its
    constructor (e.g. `budgets=[100, 300, 1000]` for "pdh", the last the full training
    length; `min_resource=100, reduction_factor=3` for "sha", successive halving)."""
    factory = _lookup("pruner", name, PRUNERS)
    if name == "none" and options:
        raise ValueError(f"pruner 'none' takes no options, got {sorted(options)}")
    return factory(**options)
