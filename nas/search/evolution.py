"""Regularized evolution (Real et al. 2019), the Evolved Transformer's search, as an Optuna sampler.

Optuna has no evolutionary sampler that works on define-by-run, conditional spaces such as
the Evolved Transformer's (`search_spaces`): NSGA-II crosses over only the parameters every
trial shares. Regularized evolution needs no shared space: a child is its parent with one
choice changed, and whatever the child asks that its parent never did is drawn at random.

The algorithm, on a study's history (so it survives restarts and works with several workers
sharing one storage):

* population: the last `population_size` COMPLETE trials by trial number; a new complete
  trial pushes the oldest out (ageing, the "regularized" part);
* until `population_size` trials have completed, trials come from `warmup_sampler`
  (default: `RandomSampler(seed)`), or with `warmup="mutate"` are children of the trials
  completed so far (the Evolved Transformer's search grows its first population from the
  seed model: in a space where most random points are invalid, random warm-up proposals
  are mostly wasted);
* then each trial is a child: `sample_size` distinct members drawn at random form a
  tournament, the best of them is the parent, and the child copies the parent's parameters
  except exactly one, the mutated one, which gets a different value from its distribution;
* with `graft_rate` r, a child is, with probability r, its parent with an edit another
  lineage measured as an improvement grafted on (`nas.search.lineage.improving_edits`:
  a complete child that beat its complete parent; one of the `graft_top` best that
  applies to this parent, drawn uniformly), so edits found apart meet in one model; the
  edit's source is recorded (`evolution:graft`);
* with a `proposal_check` (the harness's: inside the parameter window, no architecture
  trained or training already), the edit is drawn again until the check accepts the child,
  at most `max_proposals` times; the check completes the child's answers (what its parent
  never asked, drawn at random), and the child answers exactly those. Without one, or when
  no draw passed, the child is proposed unchecked (the harness then records a refusal).

Trials enqueued with `study.enqueue_trial` (seed architectures) are left alone: Optuna
answers their fixed parameters itself, before it would ask the sampler, and any parameter
they do not fix comes from the warm-up sampler.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from nas.search.lineage import (
    KEY_GRAFT,
    KEY_MUTATED,
    KEY_MUTATION_APPLIED,
    KEY_PARENT,
    KEY_PROPOSAL,
    KEY_ROLE,
    KEY_TOURNAMENT,
    improving_edits,
    passed_over,
)
from nas.search.mutation import other_value
from nas.search.records import StudyRecords, contains, trial_id
from pipeline.pure.checks import is_int, is_number

__all__ = ["ProposalCheck", "RegularizedEvolutionSampler"]

_WARMUPS = ("sample", "mutate")  # how the first population is filled (module docstring)


class ProposalCheck(Protocol):
    """Whether a child may be proposed: given the study, the trial it would be, the child's
    answers so far (its parent's, the mutated one changed) and a seed, its complete answers
    (what the parent never asked drawn from `seed`), or None to refuse it."""

    def __call__(
        self, study: Study, trial: FrozenTrial, answers: Mapping[str, Any], seed: int
    ) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class _Plan:
    """What a child copies: its parent's parameters, and the one name it mutates; a checked
    child's every answer (`proposal`), which it gives as they are."""

    parent: int
    params: dict[str, Any]
    mutated: str | None
    proposal: dict[str, Any] | None = None
    graft: dict[str, Any] | None = None  # a grafted edit: {"source": trial, "value": value}


def _positive_int(name: str, value: object) -> int:
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _fitness_key(trial: FrozenTrial, direction: StudyDirection) -> tuple[bool, float, float]:
    """Sort key, smaller is better: feasible first (Optuna 5 `trial.set_constraint`), then
    the total constraint violation, then the first objective in the study's direction."""
    violation = sum(max(0.0, c) for c in trial.constraints.values())
    assert trial.values is not None  # only COMPLETE trials are ranked
    value = trial.values[0]
    objective = value if direction == StudyDirection.MINIMIZE else -value
    if math.isnan(objective):
        objective = math.inf
    return violation > 0, violation, objective


class RegularizedEvolutionSampler(BaseSampler):
    """Regularized evolution (aging evolution with tournament selection) for Optuna.

    Lifecycle (`optuna.samplers.BaseSampler`), per trial:

    1. `before_trial`: decides the trial's role. An enqueued trial (fixed parameters) is a
       "seed"; while fewer than `population_size` trials have completed it is "warmup"
       (with `warmup="mutate"`: while none has); otherwise it is a "child": the
       tournament is drawn, the parent chosen (a member the study passes over,
       `lineage.passed_over_key`, only when every member of the population is: a
       tournament of passed-over members is drawn again among the others), and the name to
       mutate picked uniformly among the parent's parameters that have more than one legal
       value. The decision is written to the trial's system attributes (`evolution:role`,
       `evolution:parent`, `evolution:mutated`, `evolution:tournament`). With a
       `proposal_check` the name and its new value are drawn until the check accepts the
       child, whose every answer is written too (`evolution:proposal`).
    2. `infer_relative_search_space` / `sample_relative`: a child has no relative space
       (everything goes through `sample_independent`); seeds and warm-up trials delegate to
       the warm-up sampler, so a multivariate warm-up sampler keeps working.
    3. `sample_independent`, once per parameter the objective asks: a checked child answers
       its proposal; a child answers its parent's value, a different value for the mutated
       name, and a random value for a name its parent never asked (its branch changed);
       others delegate to the warm-up sampler.
    4. `after_trial`: records `evolution:mutation_applied` (False when the objective never
       asked the mutated name) and forgets the plan. A trial that never gets there (its
       worker died, or the harness failed it through the storage) has its plan forgotten
       at the next `before_trial`, which keeps plans of RUNNING trials only; so the plans
       held (`pending_plans`) never outnumber the running trials plus the one beginning.

    Why the mutated name is always one the child will ask: in a define-by-run space the names
    asked depend only on the answers so far. The child gives its parent's answers up to the
    mutated name, so it retraces its parent's path and reaches that name; only what comes
    after the mutation may differ. (An objective that is not a deterministic function of its
    answers can skip it; that is recorded, not an error.)

    Fitness is the first objective in multi-objective studies (the others are ignored), in
    the study's direction; feasible trials (all `set_constraint` values <= 0) beat
    infeasible ones, which rank by total violation. Failed, pruned and running trials are
    never in the population. The sampler pickles; `reseed_rng` reseeds it and the warm-up
    sampler, as Optuna does for `n_jobs > 1`.
    """

    def __init__(
        self,
        population_size: int = 20,
        sample_size: int = 5,
        seed: int | None = None,
        warmup_sampler: BaseSampler | None = None,
        warmup: str = "sample",
        proposal_check: ProposalCheck | None = None,
        max_proposals: int = 50,
        graft_rate: float = 0.0,
        graft_top: int = 5,
    ) -> None:
        if warmup not in _WARMUPS:
            raise ValueError(f"warmup={warmup!r} is not valid; valid: {', '.join(_WARMUPS)}")
        self.warmup = warmup
        self.population_size = _positive_int("population_size", population_size)
        self.sample_size = _positive_int("sample_size", sample_size)
        if self.sample_size > self.population_size:
            raise ValueError(
                f"sample_size ({sample_size!r}) must not exceed population_size "
                f"({population_size!r})"
            )
        if seed is not None and not is_int(seed):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")
        if warmup_sampler is not None and not isinstance(warmup_sampler, BaseSampler):
            raise TypeError(
                f"warmup_sampler must be an optuna sampler, got {type(warmup_sampler).__name__}"
            )
        self.proposal_check = proposal_check
        self.max_proposals = _positive_int("max_proposals", max_proposals)
        if not (is_number(graft_rate) and 0.0 <= graft_rate <= 1.0):
            raise ValueError(f"graft_rate must be a number in [0, 1], got {graft_rate!r}")
        self.graft_rate = float(graft_rate)
        self.graft_top = _positive_int("graft_top", graft_top)
        self._rng = np.random.RandomState(seed)
        self._random = RandomSampler(seed=seed)  # parameters a child's parent never had
        self._warmup = warmup_sampler if warmup_sampler is not None else self._random
        # trial id -> plan (None: not a child), one object for the whole trial; only RUNNING
        # trials' are kept (`_forget_finished`)
        self._plans: dict[int, _Plan | None] = {}

    def __str__(self) -> str:
        return (
            f"RegularizedEvolutionSampler(population_size={self.population_size}, "
            f"sample_size={self.sample_size})"
        )

    # --- public helpers -----------------------------------------------------------------

    @property
    def pending_plans(self) -> int:
        """How many trials' plans the sampler holds in memory (read-only; for monitoring)."""
        return len(self._plans)

    def population(self, study: Study) -> list[FrozenTrial]:
        """The current population: the last `population_size` COMPLETE trials by number."""
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        complete.sort(key=lambda t: t.number)
        return complete[-self.population_size :]

    def select_parent(self, study: Study, candidates: Sequence[FrozenTrial]) -> FrozenTrial:
        """The best of `candidates` (a tournament), by the study's first objective."""
        if not candidates:
            raise ValueError("a tournament needs at least one candidate")
        direction = study.directions[0]
        return min(candidates, key=lambda t: _fitness_key(t, direction))

    # --- BaseSampler lifecycle ----------------------------------------------------------

    def reseed_rng(self) -> None:
        self._rng.seed()
        self._random.reseed_rng()
        if self._warmup is not self._random:
            self._warmup.reseed_rng()

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._warmup.before_trial(study, trial)
        self._forget_finished(study)
        self._plans[trial_id(trial)] = None
        if "fixed_params" in trial.system_attrs:  # enqueued: Optuna answers the fixed ones
            self._set(study, trial, KEY_ROLE, "seed")
            return
        population = self.population(study)
        growing = self.warmup == "mutate" and population
        if len(population) < self.population_size and not growing:
            self._set(study, trial, KEY_ROLE, "warmup")
            return
        tournament, eligible = self._tournament(population, study.user_attrs)
        parent = self.select_parent(study, eligible or tournament)
        plan = self._propose(study, trial, parent)
        self._plans[trial_id(trial)] = plan
        self._set(study, trial, KEY_ROLE, "child")
        self._set(study, trial, KEY_PARENT, parent.number)
        self._set(study, trial, KEY_MUTATED, plan.mutated)
        self._set(study, trial, KEY_TOURNAMENT, [t.number for t in tournament])
        if plan.proposal is not None:
            self._set(study, trial, KEY_PROPOSAL, plan.proposal)
        if plan.graft is not None:
            self._set(study, trial, KEY_GRAFT, plan.graft)

    def _tournament(
        self, population: list[FrozenTrial], attrs: dict[str, Any]
    ) -> tuple[list[FrozenTrial], list[FrozenTrial]]:
        """A tournament drawn from `population`, and its members the study does not pass
        over; when it passes over every one, the tournament is drawn again from those it
        does not pass over, if any (a child of a passed-over member trains from scratch)."""
        tournament = self._draw(population)
        eligible = [t for t in tournament if not passed_over(attrs, t.number)]
        if not eligible:
            others = [t for t in population if not passed_over(attrs, t.number)]
            if others:
                tournament = eligible = self._draw(others)
        return tournament, eligible

    def _draw(self, members: list[FrozenTrial]) -> list[FrozenTrial]:
        size = min(self.sample_size, len(members))
        drawn = self._rng.choice(len(members), size=size, replace=False)
        return [members[int(i)] for i in drawn]

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if self._plan(study, trial) is not None:
            return {}
        return self._warmup.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self._plan(study, trial) is not None or not search_space:
            return {}
        return self._warmup.sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        plan = self._plan(study, trial)
        if plan is None:
            return self._warmup.sample_independent(study, trial, param_name, param_distribution)
        checked = plan.proposal or {}
        if param_name in checked and contains(param_distribution, checked[param_name]):
            return checked[param_name]
        graft = plan.graft
        if graft and param_name == plan.mutated and contains(param_distribution, graft["value"]):
            return graft["value"]
        known = param_name in plan.params and contains(param_distribution, plan.params[param_name])
        if not known:  # a branch the parent never took (or a changed distribution)
            return self._random.sample_independent(study, trial, param_name, param_distribution)
        if param_name == plan.mutated:
            return self._mutate(study, trial, param_name, param_distribution, plan.params)
        return plan.params[param_name]

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        plan = self._plan(study, trial)
        self._plans.pop(trial_id(trial), None)
        if plan is not None and plan.mutated is not None:
            self._set(study, trial, KEY_MUTATION_APPLIED, plan.mutated in trial.params)
        self._warmup.after_trial(study, trial, state, values)

    # --- internals ----------------------------------------------------------------------

    @staticmethod
    def _set(study: Study, trial: FrozenTrial, key: str, value: Any) -> None:
        # Optuna's own samplers write their per-trial state the same way.
        StudyRecords(study).set_trial_attr(trial, key, value)

    def _forget_finished(self, study: Study) -> None:
        """Drop the plans of trials that are no longer RUNNING in `study`: `after_trial` is
        never called for a trial whose worker died or that was failed through the storage.

        The held ids are listed before the running ones are read: a trial gets its plan only
        after it is created RUNNING, so a plan another thread adds meanwhile is not dropped.
        A plan of another study sharing this sampler is dropped too; `_plan` rebuilds it from
        the storage, equal, if that trial asks again."""
        held = list(self._plans)
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        alive = {trial_id(t) for t in running}
        for held_id in held:
            if held_id not in alive:
                self._plans.pop(held_id, None)

    def _plan(self, study: Study, trial: FrozenTrial) -> _Plan | None:
        """This trial's plan: from memory, or rebuilt from storage (e.g. after unpickling)."""
        key = trial_id(trial)
        if key in self._plans:
            return self._plans[key]
        records = StudyRecords(study)
        attrs = records.trial_attrs(trial)
        plan = None
        if attrs.get(KEY_ROLE) == "child":
            parent = records.trial_by_number(attrs[KEY_PARENT])
            plan = _Plan(
                parent.number,
                dict(parent.params),
                attrs.get(KEY_MUTATED),
                attrs.get(KEY_PROPOSAL),
                attrs.get(KEY_GRAFT),
            )
        self._plans[key] = plan
        return plan

    def _propose(self, study: Study, trial: FrozenTrial, parent: FrozenTrial) -> _Plan:
        """The child's plan: a mutated name drawn among the parent's parameters with more
        than one legal value; with a `proposal_check`, drawn with its new value until the
        check accepts the child (module doc)."""
        if self.graft_rate and self._rng.random_sample() < self.graft_rate:
            grafted = self._graft(study, trial, parent)
            if grafted is not None:
                return grafted
        mutable = sorted(n for n, d in parent.distributions.items() if not d.single())
        plan = _Plan(parent.number, dict(parent.params), None)
        for _ in range(self.max_proposals if self.proposal_check is not None else 1):
            mutated = mutable[self._rng.randint(len(mutable))] if mutable else None
            plan = _Plan(parent.number, dict(parent.params), mutated)
            if self.proposal_check is None or mutated is None:
                return plan
            distribution = parent.distributions[mutated]
            value = self._mutate(study, trial, mutated, distribution, plan.params)
            answers = {**plan.params, mutated: value}
            seed = int(self._rng.randint(2**31))
            proposal = self.proposal_check(study, trial, answers, seed)
            if proposal is not None:
                return _Plan(parent.number, dict(parent.params), mutated, proposal)
        return plan

    def _graft(self, study: Study, trial: FrozenTrial, parent: FrozenTrial) -> _Plan | None:
        """`parent` with one of the `graft_top` best improving edits that apply to it (its
        parameter asked with another value), if any passes the `proposal_check`."""
        trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        applicable = [
            edit
            for edit in improving_edits(trials, study.directions[0])
            if edit.name in parent.distributions
            and contains(parent.distributions[edit.name], edit.value)
            and parent.params[edit.name] != edit.value
        ][: self.graft_top]
        if not applicable:
            return None
        edit = applicable[self._rng.randint(len(applicable))]
        graft = {"source": edit.source, "value": edit.value}
        if self.proposal_check is None:
            return _Plan(parent.number, dict(parent.params), edit.name, graft=graft)
        answers = {**parent.params, edit.name: edit.value}
        proposal = self.proposal_check(study, trial, answers, int(self._rng.randint(2**31)))
        if proposal is None:
            return None
        return _Plan(parent.number, dict(parent.params), edit.name, proposal, graft)

    def _mutate(
        self,
        study: Study,
        trial: FrozenTrial,
        name: str,
        distribution: BaseDistribution,
        params: dict[str, Any],
    ) -> Any:
        """A legal value of `distribution` other than the parent's `params[name]`."""

        def draw() -> Any:  # honours log scales and steps
            return self._random.sample_independent(study, trial, name, distribution)

        return other_value(self._rng, draw, name, distribution, params[name])
