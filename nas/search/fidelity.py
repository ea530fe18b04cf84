"""How a trial's fitness was judged: the fidelities, and the one place they are read and written.

A study judges a candidate at one of three fidelities (`study.fidelity` chooses the first
two; `nas.study.judging` explains the others):

* `FULL`: trained from scratch to the full budget, `train.steps`;
* `INHERITED`: a child continued `study.inherit_steps` steps from its trained parent's
  weights, its fitness an estimate (the parent's plus the child's paired difference);
* `PROMOTED`: a child judged at inherited fidelity whose estimate earned it a full-budget
  run in the same trial: the measurement is its fitness, the estimate kept beside it.

A trial records its fidelity in its user attribute `fidelity` (`record`), read back with
`fidelity_of` (a trial without one, from a study at full fidelity, is `FULL`). Full and
promoted trials are *measured* (`is_measured`): the study's best is always one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from optuna.trial import FrozenTrial

__all__ = ["FIDELITY", "Fidelity", "fidelity_of", "is_measured", "record"]

FIDELITY = "fidelity"  # a trial's user attribute: the `Fidelity` value it was judged at


class Fidelity(StrEnum):
    """How a trial's fitness was judged (module docstring)."""

    FULL = "full"
    INHERITED = "inherited"
    PROMOTED = "promoted"

    @classmethod
    def settable(cls) -> tuple[str, ...]:
        """The values `study.fidelity` takes: how a study judges its children."""
        return (cls.FULL.value, cls.INHERITED.value)

    @property
    def measured(self) -> bool:
        """Whether the fitness is a full-budget measurement (not an estimate)."""
        return self is not Fidelity.INHERITED


def record(fidelity: Fidelity) -> dict[str, Any]:
    """The user attributes that record `fidelity` on a trial."""
    return {FIDELITY: fidelity.value}


def fidelity_of(trial: FrozenTrial | Mapping[str, Any]) -> Fidelity:
    """The fidelity a trial (or its user attributes) records; `FULL` where none is."""
    attrs = trial.user_attrs if isinstance(trial, FrozenTrial) else trial
    return Fidelity(attrs.get(FIDELITY, Fidelity.FULL.value))


def is_measured(trial: FrozenTrial) -> bool:
    """Whether `trial`'s fitness was measured at the full budget (not an estimate)."""
    return fidelity_of(trial).measured
