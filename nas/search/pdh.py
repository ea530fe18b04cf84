"""Progressive Dynamic Hurdles (So et al. 2019), the Evolved Transformer's early stopping.

A candidate trains in stages, up rungs b_1 < b_2 < ... < b_top steps. At each rung below the
top it trains on only if its fitness there beats the hurdle, a statistic of the fitness that
the population reached at that rung; otherwise it stops there. The top rung is the full
training length (`max_resource`: the harness passes `train.steps`, appended to the
configured budgets when they do not end with it): a trial that clears every rung below
trains to the end and completes. Hurdles thus spend the training budget on promising
candidates, comparing models only at equal step counts (fitness grows with steps), and they
rise as evolution improves the population: each is recomputed at every decision. Optuna has
no such pruner, hence this module:

* `ProgressiveDynamicHurdles`, an `optuna.pruners.BasePruner`, for single-objective studies
  (`trial.report(value, budget)`, then `trial.should_prune()`);
* `prune_on_fitness` (the `FitnessPruner` interface) for multi-objective studies, where
  Optuna 5 raises on `report` and `should_prune`: the validation metric per budget is
  stored in the trial's user attribute `pdh:<budget>` (`record`), judged by `passes`, and
  the harness ends a failing trial as pruned;
* `hurdle` and `clears`, the two pure rules, for anyone who holds the values already.

The rule, numbered:

1. Who counts at rung b (`values_at`): every complete or pruned trial with a finite value at
   b (its intermediate value at b, else its user attribute `pdh:<b>`), and every running one
   once it has been judged at b (it carries `pdh:hurdle:<b>`, note 4). Failed trials do not
   count (their values may be what made them fail, and a retried trial would count twice);
   NaN and infinities do not count either. A running trial that reported at b but is not yet
   judged is a child still being decided, not yet part of the population (the paper computes
   the hurdle from the population before the child); so the deciding trial never counts
   itself, and workers deciding at once are judged against the same population.
2. The hurdle at b is recomputed at every decision from the values of those trials, once at
   least `min_trials` of them exist; before that nothing is pruned at b. The statistic is
   `hurdle="mean"` (the paper's), or `hurdle="quantile"` with `quantile=q` in [0, 1]: the
   values ranked from worst to best in the metric's direction, interpolated linearly at q
   (0: the worst value, 0.5: the median, 1: the best). A higher q is a stricter hurdle, when
   minimizing as when maximizing.
3. Passing means strictly beating the hurdle, as in the paper ("if its fitness is at or below
   the hurdle it stops"): a value equal to the hurdle stops the trial, and so does NaN. At the
   top rung and at steps that are not budgets nothing is decided.
4. Each decision is written on the trial's user attributes: `pdh:hurdle:<b>`, the hurdle it
   was judged against (None: there was none yet, it passed); when it fails,
   `pdh:pruned_at` = b and `pdh:hurdle_at_prune` = that hurdle. `prune` sees only a
   `FrozenTrial`, so it writes through the storage (`nas.search.records`).
5. Several workers on one storage need no coordination: a hurdle is a function of the stored
   trials alone (no cache, nothing shared is written but each trial's own attributes), so
   workers that read the same trials compute the same hurdle.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import optuna
from optuna.pruners import BasePruner
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from nas.search.records import StudyRecords
from pipeline.pure.checks import is_int, is_number

__all__ = [
    "HURDLE_KEY",
    "HURDLE_STATISTICS",
    "PRUNED_AT",
    "PRUNED_HURDLE",
    "VALUE_KEY",
    "FitnessPruner",
    "ProgressiveDynamicHurdles",
    "clears",
    "hurdle",
]

VALUE_KEY = "pdh:{budget}"  # trial user attribute: the metric at a budget (multi-objective)
HURDLE_KEY = "pdh:hurdle:{budget}"  # trial user attribute: the hurdle it was judged against
PRUNED_AT = "pdh:pruned_at"  # trial user attribute: the rung a pruned trial stopped at
PRUNED_HURDLE = "pdh:hurdle_at_prune"  # trial user attribute: the hurdle it failed there
HURDLE_STATISTICS = ("mean", "quantile")

_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
_COUNTED = (TrialState.RUNNING, *_FINISHED)


@runtime_checkable
class FitnessPruner(Protocol):
    """A pruner that judges a trial on its fitness alone, whatever the study's number of
    objectives: what the harness asks of a pruner in a multi-objective study (Optuna's
    `report` and `should_prune` take one objective). A pruner without it prunes
    single-objective studies only, and the study says so when it starts."""

    def prune_on_fitness(self, study: Study, trial: optuna.Trial, step: int, value: float) -> bool:
        """Whether `trial`, whose fitness at `step` is `value`, stops there (the decision
        written on the trial, as `prune` writes it)."""
        ...


def _direction(direction: StudyDirection | str) -> StudyDirection:
    if isinstance(direction, StudyDirection):
        if direction == StudyDirection.NOT_SET:
            raise ValueError("direction must be minimize or maximize, got NOT_SET")
        return direction
    names = {"minimize": StudyDirection.MINIMIZE, "maximize": StudyDirection.MAXIMIZE}
    if direction not in names:
        raise ValueError(f"direction must be 'minimize' or 'maximize', got {direction!r}")
    return names[direction]


def _check_quantile(quantile: Any) -> float:
    if not is_number(quantile):
        raise ValueError(f"quantile must be a number in [0, 1], got {quantile!r}")
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be a number in [0, 1], got {quantile!r}")
    return float(quantile)


def hurdle(
    values_at_budget: Sequence[float],
    quantile: float | None = None,
    direction: StudyDirection | str = "maximize",
) -> float:
    """The hurdle for a budget from the values the models reached there: their mean, or with
    `quantile` q the values ranked from worst to best for `direction`, interpolated linearly
    at q (0: the worst, 0.5: the median, 1: the best; a higher q is stricter either way)."""
    values = [float(v) for v in values_at_budget]
    if not values:
        raise ValueError("a hurdle needs at least one value")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"hurdle values must be finite, got {values}")
    if quantile is None:
        return math.fsum(values) / len(values)
    q = _check_quantile(quantile)
    ranked = sorted(values, reverse=_direction(direction) == StudyDirection.MINIMIZE)
    low, fraction = divmod(q * (len(ranked) - 1), 1.0)
    worse = ranked[int(low)]
    if fraction == 0.0:
        return worse
    return worse + (ranked[int(low) + 1] - worse) * fraction


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
    if not is_number(value):
        return None
    return float(value) if math.isfinite(value) else None


def _in_population(trial: FrozenTrial, budget: int) -> bool:
    """Finished, or running and already judged at `budget` (note 1)."""
    return trial.state in _FINISHED or HURDLE_KEY.format(budget=budget) in trial.user_attrs


def _check_budgets(budgets: Any) -> tuple[int, ...]:
    if isinstance(budgets, str) or not isinstance(budgets, Sequence):
        raise ValueError(f"budgets must be a sequence of step counts, got {budgets!r}")
    for b in budgets:
        if not is_int(b) or b < 1:
            raise ValueError(f"every budget must be a positive integer, got {b!r}")
    if len(budgets) < 2:
        raise ValueError(
            "budgets must name at least two step counts, hurdles at all but the last, which is "
            f"the full training length (the top rung), got {list(budgets)}"
        )
    if any(a >= b for a, b in itertools.pairwise(budgets)):
        raise ValueError(f"budgets must be strictly increasing, got {list(budgets)}")
    return tuple(budgets)


def _check_statistic(statistic: Any, quantile: Any) -> float | None:
    if statistic not in HURDLE_STATISTICS:
        raise ValueError(f"hurdle must be 'mean' or 'quantile', got {statistic!r}")
    if statistic == "mean":
        if quantile is not None:
            raise ValueError(f"quantile={quantile!r} needs hurdle='quantile', got hurdle='mean'")
        return None
    if quantile is None:
        raise ValueError("hurdle='quantile' needs quantile, a number in [0, 1], got None")
    return _check_quantile(quantile)


def _mark(study: Study, trial: optuna.Trial | FrozenTrial | int, attrs: dict[str, Any]) -> None:
    """Write `attrs` on the trial's user attributes: through the `Trial` when given one (its
    cache stays true), else through the storage."""
    if isinstance(trial, optuna.Trial):
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return
    records = StudyRecords(study)
    frozen = records.trial_by_number(trial) if isinstance(trial, int) else trial
    for key, value in attrs.items():
        records.set_trial_user_attr(frozen, key, value)


class ProgressiveDynamicHurdles(BasePruner):
    """Progressive Dynamic Hurdles as an Optuna pruner (the numbered rule is in the module
    docstring).

    Lifecycle (`optuna.pruners.BasePruner`): the objective calls `trial.report(value, step)`
    and then `trial.should_prune()`, which calls `prune(study, trial)`. At a step that is a
    budget below the top one, `prune` computes the hurdle there from the population and
    returns True when the trial's value does not beat it, writing the decision on the trial.
    At other steps, and at the top budget (the full training length), it returns False, so
    report at exactly the budgets. Single-objective studies only (Optuna raises on
    `should_prune` otherwise); multi-objective harnesses call `prune_on_fitness`
    (`record`, then `passes`), which reads and writes the same state.
    """

    def __init__(
        self,
        budgets: Sequence[int],
        min_trials: int = 5,
        hurdle: str = "mean",
        quantile: float | None = None,
        max_resource: int | None = None,
    ) -> None:
        """`max_resource`: the full training length, the top rung, appended to `budgets`
        when they do not end with it (as Optuna's Hyperband names it)."""
        if max_resource is not None and (not budgets or list(budgets)[-1] != max_resource):
            budgets = [*budgets, max_resource]
        self.budgets: tuple[int, ...] = _check_budgets(budgets)
        if not is_int(min_trials) or min_trials < 1:
            raise ValueError(f"min_trials must be a positive integer, got {min_trials!r}")
        self.min_trials = min_trials
        self.quantile = _check_statistic(hurdle, quantile)
        self.hurdle = hurdle

    def __repr__(self) -> str:
        quantile = "" if self.quantile is None else f", quantile={self.quantile}"
        return (
            f"ProgressiveDynamicHurdles(budgets={list(self.budgets)}, "
            f"min_trials={self.min_trials}, hurdle={self.hurdle!r}{quantile})"
        )

    @property
    def top(self) -> int:
        """The top rung, the full training length: nothing is pruned there."""
        return self.budgets[-1]

    # --- BasePruner ---------------------------------------------------------------------

    def prune(self, study: Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step not in self.budgets:
            return False
        return not self.passes(study, step, trial.intermediate_values[step], trial=trial)

    # --- the harness's interface (any number of objectives) ---------------------------

    def prune_on_fitness(self, study: Study, trial: optuna.Trial, step: int, value: float) -> bool:
        """`FitnessPruner`: at a budget, `value` recorded (`record`) and judged (`passes`);
        elsewhere nothing is decided."""
        if step not in self.budgets:
            return False
        self.record(trial, step, value)
        return not self.passes(study, step, value, trial=trial)

    @staticmethod
    def record(trial: optuna.Trial, budget: int, value: float) -> None:
        """Store the metric at `budget` as the trial's user attribute `pdh:<budget>`."""
        trial.set_user_attr(VALUE_KEY.format(budget=budget), float(value))

    def values_at(self, study: Study, budget: int) -> dict[int, float]:
        """{trial number: value at `budget`} of the population there (note 1)."""
        self._check_budget(budget)
        values = {}
        for t in study.get_trials(deepcopy=False, states=_COUNTED):
            value = _value_at(t, budget)
            if value is not None and _in_population(t, budget):
                values[t.number] = value
        return values

    def hurdle_at(
        self,
        study: Study,
        budget: int,
        *,
        exclude: int | None = None,
        direction: StudyDirection | str | None = None,
    ) -> float | None:
        """The hurdle at `budget` now, from the population without trial number `exclude`;
        None while it has fewer than `min_trials` members. `direction`: of the metric
        (matters for a quantile), default the study's first objective."""
        values = self.values_at(study, budget)
        if exclude is not None:
            values.pop(exclude, None)
        if len(values) < self.min_trials:
            return None
        way = study.directions[0] if direction is None else direction
        return hurdle(list(values.values()), self.quantile, way)

    def passes(
        self,
        study: Study,
        budget: int,
        value: float,
        *,
        trial: optuna.Trial | FrozenTrial | int | None = None,
        direction: StudyDirection | str | None = None,
    ) -> bool:
        """Whether a trial with `value` at `budget` may train on (always, at the top rung).

        `trial`: the trial judged (a `Trial`, a `FrozenTrial` or its number): it never counts
        in its own hurdle, and the decision is written on it (note 4). `direction`: of the
        metric, default the study's first objective.
        """
        self._check_budget(budget)
        if budget == self.top:
            return True
        number = trial if isinstance(trial, int) or trial is None else trial.number
        way = study.directions[0] if direction is None else direction
        bar = self.hurdle_at(study, budget, exclude=number, direction=way)
        ok = bar is None or clears(float(value), bar, way)
        if trial is not None:
            failed = {} if ok else {PRUNED_AT: budget, PRUNED_HURDLE: bar}
            _mark(study, trial, {HURDLE_KEY.format(budget=budget): bar, **failed})
        return ok

    # --- internals ----------------------------------------------------------------------

    def _check_budget(self, budget: int) -> None:
        if budget not in self.budgets:
            raise ValueError(f"budget {budget!r} is not one of the budgets {list(self.budgets)}")
