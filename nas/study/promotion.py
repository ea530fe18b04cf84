"""Promotion: which children judged at inherited fidelity are measured in full, and how well.

A child judged at inherited fidelity (`nas.study.judging`) has an estimate of its fitness,
its parent's plus its paired difference `d = child_k - control_k` (the child and its parent
continued the same k steps on the same batches). Where the parent's own fitness was an
estimate, the estimate chains: errors add over generations, and evolution keeps the
children whose error came out low (a 2-hour study's 22 promoted children ranked against
their measurements at Kendall tau -0.14). So a child is promoted, trained again from scratch
to the full budget in the same trial (`Fidelity.PROMOTED`, that measurement its fitness), by
its own paired difference, the estimate `benchmarks/fidelity.py` measures:

1. **Anchored.** Its parent's fitness was measured at the full budget and the one-link
   estimate, that measurement plus `d`, beats the best fitness measured so far
   (`best_measured`); or
2. **The best of its time.** `d` beats the paired difference of each of the
   `study.promote_window - 1` children judged before it (`recent_differences`): about one
   child in that many is measured.

Every child records `d` per metric (`difference_<metric>`). Once measured, a promoted child
of a measured parent shows how well `d` ranked: its measured difference is its measurement
less its parent's, and `agreement` is Kendall's tau between the two over the promoted
children, kept in the study's summary.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from nas.search.agreement import kendall_tau
from nas.search.fidelity import Fidelity, fidelity_of, is_measured, record
from nas.settings import lower_is_better
from nas.study.inheritance import INHERITED_FROM

__all__ = [
    "Agreement",
    "agreement",
    "best_measured",
    "difference_attrs",
    "promoted",
    "promotes",
    "recent_differences",
]

DIFFERENCE = "difference_{metric}"  # a child's user attribute: child_k - control_k


def difference_attrs(
    measured: Mapping[str, float], control: Mapping[str, float]
) -> dict[str, float]:
    """A child's paired differences, `child_k - control_k`, per metric both have."""
    return {
        DIFFERENCE.format(metric=name): measured[name] - control[name]
        for name in measured
        if name in control
    }


def best_measured(trials: Iterable[FrozenTrial], fitness: str) -> float | None:
    """The best first objective `fitness` among complete trials measured at the full budget
    (None: none yet): what an anchored estimate must beat to be promoted (1.)."""
    values = [
        t.values[0]
        for t in trials
        if t.state == TrialState.COMPLETE and t.values and is_measured(t)
    ]
    finite = [v for v in values if math.isfinite(lower_is_better(fitness, v))]
    return min(finite, key=lambda v: lower_is_better(fitness, v), default=None)


def recent_differences(trials: Sequence[FrozenTrial], fitness: str, count: int) -> list[float]:
    """The paired differences on `fitness` of the last `count` complete children judged at
    inherited fidelity (promoted or not), most recent last (2.)."""
    key = DIFFERENCE.format(metric=fitness)
    found: list[float] = []
    for t in reversed(trials):
        if len(found) == count:
            break
        if t.state == TrialState.COMPLETE and key in t.user_attrs:
            found.append(float(t.user_attrs[key]))
    return found[::-1]


def promotes(
    trials: Sequence[FrozenTrial],
    fitness: str,
    difference: float,
    parent: int,
    window: int | None,
) -> bool:
    """Whether a child of trial `parent` whose paired difference on `fitness` is
    `difference` is trained again in full (module docstring: anchored, or the best of its
    time); `trials` are the study's, numbers as indices."""
    if not math.isfinite(difference):
        return False
    mine = lower_is_better(fitness, difference)
    source = trials[parent]
    best = best_measured(trials, fitness)
    if best is not None and is_measured(source) and source.values:
        anchored = source.values[0] + difference
        if lower_is_better(fitness, anchored) < lower_is_better(fitness, best):
            return True
    if window is None:
        return False
    recent = recent_differences(trials, fitness, window - 1)
    return len(recent) == window - 1 and all(mine < lower_is_better(fitness, r) for r in recent)


def promoted(estimates: Mapping[str, float], names: Iterable[str]) -> dict[str, Any]:
    """What a promoted trial records beside its full-budget measurement: its estimates."""
    return record(Fidelity.PROMOTED) | {
        f"estimated_{name}": float(estimates[name]) for name in names if name in estimates
    }


@dataclass(frozen=True)
class Agreement:
    """How the promotions' estimates ranked against their measurements (module docstring):
    `promoted` children, `paired` of them with a measured parent, Kendall's tau over those
    (NaN below 2)."""

    promoted: int
    paired: int
    kendall_tau: float

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["kendall_tau"] = None if math.isnan(self.kendall_tau) else self.kendall_tau
        return values


def agreement(trials: Sequence[FrozenTrial], fitness: str) -> Agreement:
    """Kendall's tau between the promoted children's paired differences and their measured
    differences (measurement less the measured parent's), over those with a measured parent."""
    key = DIFFERENCE.format(metric=fitness)
    promoted_trials = [
        t
        for t in trials
        if t.state == TrialState.COMPLETE and fidelity_of(t) is Fidelity.PROMOTED and t.values
    ]
    estimates, measurements = [], []
    for t in promoted_trials:
        parent = trials[int(t.user_attrs[INHERITED_FROM])]
        if key in t.user_attrs and is_measured(parent) and parent.values:
            estimates.append(lower_is_better(fitness, float(t.user_attrs[key])))
            measurements.append(lower_is_better(fitness, t.values[0] - parent.values[0]))
    return Agreement(len(promoted_trials), len(estimates), kendall_tau(estimates, measurements))
