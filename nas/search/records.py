"""A study's records below Optuna's public API, reached in this one module only.

Optuna's samplers and pruners keep per-trial and per-study state as "system attributes", and
failing a trial from outside its worker, or writing a user attribute from a pruner (which sees
only a `FrozenTrial`), needs the storage too; Optuna exposes neither the storage of a
`Study`, nor its id, nor a `FrozenTrial`'s id, nor a distribution's range check publicly (its
own samplers use the private attributes). Every use in `nas` goes through
`StudyRecords` and `contains`, so a change in Optuna's internals is mended here.
"""

from __future__ import annotations

from typing import Any

from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage
from optuna.study import Study
from optuna.trial import FrozenTrial, Trial, TrialState

__all__ = ["StudyRecords", "contains", "trial_id"]


def trial_id(trial: FrozenTrial | Trial) -> int:
    """The storage's id of `trial` (unique across studies, unlike `trial.number`)."""
    return int(trial._trial_id)


def contains(distribution: BaseDistribution, value: Any) -> bool:
    """Whether `value` (external representation) is a legal value of `distribution`."""
    try:
        internal = distribution.to_internal_repr(value)
    except (ValueError, TypeError):
        return False
    return bool(distribution._contains(internal))


class StudyRecords:
    """One study's storage and id, and the reads and writes `nas` makes through them."""

    def __init__(self, study: Study) -> None:
        self.storage: BaseStorage = study._storage
        self.study_id: int = study._study_id

    def study_attrs(self) -> dict[str, Any]:
        return self.storage.get_study_system_attrs(self.study_id)

    def set_study_attr(self, key: str, value: Any) -> None:
        self.storage.set_study_system_attr(self.study_id, key, value)

    def trial_attrs(self, trial: FrozenTrial | Trial) -> dict[str, Any]:
        return self.storage.get_trial_system_attrs(trial_id(trial))

    def set_trial_attr(self, trial: FrozenTrial | Trial, key: str, value: Any) -> None:
        self.storage.set_trial_system_attr(trial_id(trial), key, value)

    def set_trial_user_attr(self, trial: FrozenTrial | Trial, key: str, value: Any) -> None:
        """A user attribute written where only a `FrozenTrial` is at hand (a pruner's)."""
        self.storage.set_trial_user_attr(trial_id(trial), key, value)

    def trial_by_number(self, number: int) -> FrozenTrial:
        return self.storage.get_trial(
            self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        )

    def fail(self, trial: FrozenTrial, user_attrs: dict[str, Any]) -> None:
        """Fail a trial from outside its worker, with `user_attrs` saying why; raises
        `optuna.exceptions.UpdateFinishedTrialError` if it finished meanwhile."""
        for key, value in user_attrs.items():
            self.storage.set_trial_user_attr(trial_id(trial), key, value)
        self.storage.set_trial_state_values(trial_id(trial), TrialState.FAIL)

    def sqlite_file(self) -> str | None:
        """The database file of a study on SQLite (whose RDB storage Optuna wraps in its
        cache of finished trials), else None."""
        rdb = getattr(self.storage, "_backend", self.storage)
        engine = getattr(rdb, "engine", None)
        if engine is None or engine.dialect.name != "sqlite":
            return None
        database = engine.url.database
        return str(database) if database and database != ":memory:" else None
