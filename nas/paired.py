"""Paired differences: is a retrained model better than a seed model beyond seed noise?

Retraining trains every model once per training seed (`retrain.seeds`), and a training
seed alone fixes the order of the training batches, whatever the model. Two models'
figures for the same seed share that source of noise, so the per-seed difference says
more than two means and their sds side by side: its mean, its standard error and on how
many seeds the model was better tell whether a searched architecture beats the seed it
should beat (the Evolved Transformer). The pieces here are pure: figures in, figures out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["REFERENCE", "PairedDifference", "paired_difference", "reference_model"]

REFERENCE = "evolved_transformer"  # the seed a searched model must beat


@dataclass(frozen=True)
class PairedDifference:
    """`model - reference` over the training seeds both have a finite figure for.

    `mean` is NaN when no seed is shared (n = 0); `stderr` (the sd of the per-seed
    differences / sqrt(n)) is NaN when n < 2: one difference has no spread to measure.
    `signs` is +1 where the model was better on that seed (lower when the metric is
    minimized, higher when maximized), -1 where worse, 0 on a tie; `wins` counts the +1s.
    """

    mean: float
    stderr: float
    n: int
    wins: int
    seeds: tuple[int, ...]
    diffs: tuple[float, ...]
    signs: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: NaN as None."""
        return {
            "mean": _finite(self.mean),
            "stderr": _finite(self.stderr),
            "n": self.n,
            "wins": self.wins,
            "seeds": list(self.seeds),
            "diffs": [_finite(d) for d in self.diffs],
            "signs": list(self.signs),
        }


def paired_difference(
    model: Mapping[int, float], reference: Mapping[int, float], *, maximize: bool = False
) -> PairedDifference:
    """`model - reference`, seed by seed, on the seeds both have (in `model`'s order) with
    finite figures; a seed only one of them has (it failed for the other) is left out.
    `maximize`: higher is better for this metric (an accuracy), else lower (a loss)."""
    seeds = tuple(
        s
        for s in model
        if s in reference and math.isfinite(model[s]) and math.isfinite(reference[s])
    )
    diffs = tuple(model[s] - reference[s] for s in seeds)
    better = 1.0 if maximize else -1.0
    signs = tuple(0 if d == 0 else (1 if better * d > 0 else -1) for d in diffs)
    n = len(diffs)
    mean = statistics.fmean(diffs) if n else math.nan
    stderr = statistics.stdev(diffs) / math.sqrt(n) if n > 1 else math.nan
    return PairedDifference(mean, stderr, n, signs.count(1), seeds, diffs, signs)


def reference_model(seed_fitness: Mapping[str, float], *, maximize: bool = False) -> str | None:
    """Which seed model the others are compared with, given each retrained seed model's mean
    validation fitness: the Evolved Transformer when it was retrained (a finite mean: at
    least one seed trained); else the seed model with the best finite mean; else None."""
    scored = {name: value for name, value in seed_fitness.items() if math.isfinite(value)}
    if REFERENCE in scored:
        return REFERENCE
    if not scored:
        return None
    sign = -1.0 if maximize else 1.0
    return min(scored, key=lambda name: sign * scored[name])


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
