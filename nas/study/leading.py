"""Which trial leads the study: the best mean fitness over the training seeds it was measured on.

One training seed of full training is noisy: two seeds agree on how they rank one-edit
mutants at Kendall tau 0.27-0.39, and a 2-hour study's leader, 0.011 better than the ET on
the study's seed, retrained worse than the ET on two others. So with
`study.confirm_seed` set, a trial measured at the full budget whose fitness would lead the
study (it beats the leader's standing) is measured again, from scratch, on that second
training seed before it leads, and the leader too where it lacks that seed, so the two are
paired on the same seeds (`nas.study.candidate`):

1. Each measured trial records its fitness per training seed (`seed_values`); a finished
   leader measured on the second seed later keeps it in the study's user attributes
   (`seed_value:<trial>:<seed>`), as a parent's control is kept.
2. A trial's *standing* is the mean of its measured seeds; the leader is the measured
   trial of the best standing (`leader`); the trial's objective value is its standing.
3. The second seed is never one the retraining judges the winner on
   (`retrain.seeds`, a settings rule), so the seeds that choose are not the seeds that judge.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from nas.search.fidelity import is_measured
from nas.settings import lower_is_better

__all__ = [
    "SEED_VALUES",
    "Challenge",
    "leader",
    "mean_value",
    "seed_values",
    "standing",
    "study_attr",
]

SEED_VALUES = "seed_values"  # a measured trial's user attribute: {seed: fitness}
_LATER = "seed_value"  # study user attribute prefix: `<prefix>:<trial>:<seed>`


def study_attr(number: int, seed: int) -> str:
    """The study's user attribute holding finished trial `number`'s fitness on `seed`."""
    return f"{_LATER}:{number}:{seed}"


def seed_values(trial: FrozenTrial, study_attrs: Mapping[str, Any], seed: int) -> dict[int, float]:
    """A measured trial's fitness per training seed (1.); one that records none was
    measured on the study's `seed` alone, its first objective value."""
    recorded = trial.user_attrs.get(SEED_VALUES)
    if recorded:
        values = {int(k): float(v) for k, v in recorded.items()}
    else:
        values = {seed: trial.values[0]} if trial.values else {}
    prefix = f"{_LATER}:{trial.number}:"
    for key, value in study_attrs.items():
        if key.startswith(prefix):
            values[int(key.removeprefix(prefix))] = float(value)
    return values


def standing(trial: FrozenTrial, study_attrs: Mapping[str, Any], seed: int, fitness: str) -> float:
    """Lower is better: the mean of a measured trial's fitness over its seeds (2.)."""
    values = seed_values(trial, study_attrs, seed)
    if not values:
        return lower_is_better(fitness, float("nan"))
    return lower_is_better(fitness, statistics.fmean(values.values()))


def leader(
    trials: Sequence[FrozenTrial], study_attrs: Mapping[str, Any], seed: int, fitness: str
) -> FrozenTrial | None:
    """The complete measured trial of the best standing (ties: the earlier), or None."""
    measured = [t for t in trials if t.state == TrialState.COMPLETE and is_measured(t)]
    return min(
        measured,
        key=lambda t: (standing(t, study_attrs, seed, fitness), t.number),
        default=None,
    )


@dataclass(frozen=True)
class Challenge:
    """A trial that would lead: the leader it is paired with, and the leader's architecture
    (JSON) where the leader lacks the second seed and is measured on it too (None: it has)."""

    leader: int
    architecture: str | None


def mean_value(values: Mapping[Any, float]) -> float:
    """The mean of a trial's fitness over its seeds: its objective value (2.)."""
    return statistics.fmean(float(v) for v in values.values())
