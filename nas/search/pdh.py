"""Progressive Dynamic Hurdles (So et al. 2019), the Evolved Transformer's early stopping.

A candidate trains in stages, budgets b_1 < b_2 < ... steps. The hurdle at b_i is the mean
fitness at b_i of the first `min_trials` models that were trained to b_i; a later model that
reaches b_i trains on only if it beats that hurdle, otherwise it stops there. Hurdles thus
spend the training budget on the promising candidates while comparing models only at equal
step counts (fitness grows with steps). Optuna has no such pruner, hence this module:

* `ProgressiveDynamicHurdles`, an `optuna.pruners.BasePruner`, for single-objective studies
  (`trial.report(value, budget)`, then `trial.should_prune()`);
* `passes` / `record` for multi-objective studies, where Optuna 5 raises on `report` and
  `should_prune`: the harness stores the validation metric per budget in the trial's user
  attribute `pdh:<budget>` (`record`), asks `passes`, and ends a failing trial as pruned;
* `hurdle` and `clears`, the two pure rules, for anyone who holds the values already.

Which trials count at budget b (`values_at`): every trial, running, complete or pruned, that
has a finite value at step b: its intermediate value at b, else its user attribute
`pdh:<b>`. Failed trials do not count (their values may be what made them fail, and a
retried trial would count twice); NaN and infinities do not count either.

When a hurdle is set (frozen): at the first `prune`/`passes` call at b that sees at least
`min_trials` counted trials. The `min_trials` lowest-numbered of them (in a sequential study,
the first `min_trials` models trained to b) are its members; its value is their mean. It is
stored in the study's system attribute `pdh:hurdle:<b>:<min_trials>` (value, members,
min_trials) and never changes afterwards, whatever later trials score, even if a member
fails later (a study resumed with another `min_trials` sets its own). Members pass b (they
trained before the hurdle existed, as in the paper); until the hurdle is set nothing is
pruned at b.

Several workers on one storage may freeze the same hurdle at once, each from what it has
seen (one may see a trial at b that the other does not yet). Optuna's attribute writes are
upserts (the last writer wins), so the first writer wins another way, atomically, and every
worker then uses the stored hurdle, never its own candidate (`_claim`), numbered:

    1. RDB storages (SQLite, PostgreSQL, MySQL): the candidate is INSERTed into Optuna's
       `study_system_attributes` table, whose (study_id, key) is unique: one insert
       commits, every other fails with an IntegrityError and changes nothing;
    2. journal files and in-memory storages: each candidate is stored under its own key
       `<key>#<uuid>`; the shared log (or the one process's lock) orders the writes, every
       reader replays that order into the attribute dict, and the first candidate in it is
       the hurdle, for every worker and for good.

Passing means strictly beating the hurdle, as in the paper ("if its fitness is at or below the
hurdle it stops"): a value equal to the hurdle stops the trial, in either direction.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import uuid
from collections.abc import Sequence
from typing import Any

import optuna
import sqlalchemy
from optuna.pruners import BasePruner
from optuna.storages import RDBStorage
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from nas.search.records import StudyRecords

__all__ = [
    "HURDLE_KEY",
    "VALUE_KEY",
    "ProgressiveDynamicHurdles",
    "clears",
    "hurdle",
    "stored_hurdle",
]

VALUE_KEY = "pdh:{budget}"  # trial user attribute: the metric at a budget (multi-objective)
HURDLE_KEY = "pdh:hurdle:{budget}:{min_trials}"  # study system attribute: a hurdle

_COUNTED = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)


def hurdle(values_at_budget: Sequence[float]) -> float:
    """The hurdle for a budget: the mean of the values the models reached at that budget."""
    values = [float(v) for v in values_at_budget]
    if not values:
        raise ValueError("a hurdle needs at least one value")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"hurdle values must be finite, got {values}")
    return math.fsum(values) / len(values)


def stored_hurdle(study: Study, budget: int, min_trials: int) -> dict[str, Any] | None:
    """The hurdle frozen at `budget` for `min_trials` in `study` (value, member trials,
    min_trials), if any: the first writer's (module docstring)."""
    key = HURDLE_KEY.format(budget=budget, min_trials=min_trials)
    attrs = StudyRecords(study).study_attrs()
    if key in attrs:
        return dict(attrs[key])
    first = next((value for name, value in attrs.items() if name.startswith(f"{key}#")), None)
    return None if first is None else dict(first)


def _claim(study: Study, budget: int, candidate: dict[str, Any]) -> dict[str, Any]:
    """Store `candidate` as the hurdle at `budget` unless another writer did first; return
    the stored hurdle (the numbered steps of the module docstring)."""
    key = HURDLE_KEY.format(budget=budget, min_trials=candidate["min_trials"])
    records = StudyRecords(study)
    backend = getattr(records.storage, "_backend", records.storage)  # an RDBStorage's cache
    if isinstance(backend, RDBStorage):  # 1.
        table = sqlalchemy.Table("study_system_attributes", sqlalchemy.MetaData(),
                                 autoload_with=backend.engine)  # fmt: skip
        row = {"study_id": records.study_id, "key": key, "value_json": json.dumps(candidate)}
        with contextlib.suppress(sqlalchemy.exc.IntegrityError), backend.engine.begin() as db:
            db.execute(table.insert().values(**row))
    else:  # 2.
        records.set_study_attr(f"{key}#{uuid.uuid4().hex}", candidate)
    stored = stored_hurdle(study, budget, candidate["min_trials"])
    assert stored is not None, "a hurdle was just stored"
    return stored


def _direction(direction: StudyDirection | str) -> StudyDirection:
    if isinstance(direction, StudyDirection):
        if direction == StudyDirection.NOT_SET:
            raise ValueError("direction must be minimize or maximize, got NOT_SET")
        return direction
    names = {"minimize": StudyDirection.MINIMIZE, "maximize": StudyDirection.MAXIMIZE}
    if direction not in names:
        raise ValueError(f"direction must be 'minimize' or 'maximize', got {direction!r}")
    return names[direction]


def clears(value: float, hurdle_value: float, direction: StudyDirection | str) -> bool:
    """Whether `value` strictly beats `hurdle_value` (below it when minimizing, above it when
    maximizing); equal, NaN or worse: the trial stops, as in the paper."""
    if _direction(direction) == StudyDirection.MINIMIZE:
        return value < hurdle_value
    return value > hurdle_value


def _value_at(trial: FrozenTrial, budget: int) -> float | None:
    """The trial's finite value at `budget` (intermediate value, else `pdh:<budget>`)."""
    value: Any = trial.intermediate_values.get(budget)
    if value is None:
        value = trial.user_attrs.get(VALUE_KEY.format(budget=budget))
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


class ProgressiveDynamicHurdles(BasePruner):
    """Progressive Dynamic Hurdles as an Optuna pruner (see the module docstring for which
    trials count and when a hurdle is frozen).

    Lifecycle (`optuna.pruners.BasePruner`): the objective calls `trial.report(value, step)`
    and then `trial.should_prune()`, which calls `prune(study, trial)`. At a step that is one
    of `budgets`, `prune` sets the hurdle there if enough trials reached it, and returns True
    when the trial's value at that step does not beat it. At other steps it returns False, so
    report at exactly the budgets. Single-objective studies only (Optuna raises on
    `should_prune` otherwise); multi-objective harnesses call `record` and `passes`, which read
    and write the same state.
    """

    def __init__(self, budgets: Sequence[int], min_trials: int = 5) -> None:
        if isinstance(budgets, str) or not isinstance(budgets, Sequence):
            raise ValueError(f"budgets must be a sequence of step counts, got {budgets!r}")
        if not budgets:
            raise ValueError("budgets must name at least one step count, got an empty sequence")
        for b in budgets:
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                raise ValueError(f"every budget must be a positive integer, got {b!r}")
        if any(a >= b for a, b in itertools.pairwise(budgets)):
            raise ValueError(f"budgets must be strictly increasing, got {list(budgets)}")
        if isinstance(min_trials, bool) or not isinstance(min_trials, int) or min_trials < 1:
            raise ValueError(f"min_trials must be a positive integer, got {min_trials!r}")
        self.budgets: tuple[int, ...] = tuple(budgets)
        self.min_trials = min_trials

    def __repr__(self) -> str:
        budgets = list(self.budgets)
        return f"ProgressiveDynamicHurdles(budgets={budgets}, min_trials={self.min_trials})"

    # --- BasePruner ---------------------------------------------------------------------

    def prune(self, study: Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step not in self.budgets:
            return False
        return not self.passes(study, step, trial.intermediate_values[step], trial=trial.number)

    # --- the harness's interface (any number of objectives) ---------------------------

    @staticmethod
    def record(trial: optuna.Trial, budget: int, value: float) -> None:
        """Store the metric at `budget` as the trial's user attribute `pdh:<budget>`."""
        trial.set_user_attr(VALUE_KEY.format(budget=budget), float(value))

    def values_at(self, study: Study, budget: int) -> dict[int, float]:
        """{trial number: value at `budget`} of every trial that counts (module docstring)."""
        self._check_budget(budget)
        values = {}
        for t in study.get_trials(deepcopy=False, states=_COUNTED):
            value = _value_at(t, budget)
            if value is not None:
                values[t.number] = value
        return values

    def hurdle_at(self, study: Study, budget: int) -> float | None:
        """The hurdle at `budget`, setting it if it can be set now; None while fewer than
        `min_trials` trials have reached `budget`."""
        frozen = self._frozen(study, budget)
        return None if frozen is None else float(frozen["value"])

    def passes(
        self,
        study: Study,
        budget: int,
        value: float,
        *,
        trial: int | None = None,
        direction: StudyDirection | str | None = None,
    ) -> bool:
        """Whether a trial with `value` at `budget` may train on.

        `trial`: its number, if it has already recorded `value` (a member of the hurdle
        passes). `direction`: of the metric, default the study's first objective. True while
        the hurdle at `budget` is not set.
        """
        frozen = self._frozen(study, budget)
        if frozen is None or (trial is not None and trial in frozen["trials"]):
            return True
        way = study.directions[0] if direction is None else direction
        return clears(float(value), float(frozen["value"]), way)

    # --- internals ----------------------------------------------------------------------

    def _check_budget(self, budget: int) -> None:
        if budget not in self.budgets:
            raise ValueError(f"budget {budget!r} is not one of the budgets {list(self.budgets)}")

    def _frozen(self, study: Study, budget: int) -> dict[str, Any] | None:
        """The stored hurdle at `budget`, set now from the counted trials if possible."""
        self._check_budget(budget)
        stored = stored_hurdle(study, budget, self.min_trials)
        if stored is not None:
            return stored
        values = self.values_at(study, budget)
        if len(values) < self.min_trials:
            return None
        members = sorted(values)[: self.min_trials]
        frozen: dict[str, Any] = {
            "value": hurdle([values[n] for n in members]),
            "trials": members,
            "min_trials": self.min_trials,
        }
        return _claim(study, budget, frozen)
