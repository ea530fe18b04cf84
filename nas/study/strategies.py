"""The study's search strategies from the settings: its sampler and its pruner.

`nas.search` builds a strategy from a name (or a user's class by import path) and options;
this module gives it what only the harness knows, where the strategy says it takes it
(`Registry.takes`): the seed; a proposal check that knows the study's space and trials
(`TrainableProposals`, for a sampler taking `proposal_check`: regularized evolution); the
top rung, `train.steps` (for a pruner taking `max_resource`: the hurdles, Hyperband). It
also says when a multi-objective study's pruner cannot prune it (`no_pruning`): only a
`FitnessPruner` can.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

import optuna

from nas.search import PRUNERS, SAMPLERS, FitnessPruner, make_pruner, make_sampler
from nas.search.edits import complete, inside
from nas.search.records import trial_id
from nas.settings import NasSettings
from nas.study.space import configured_space
from nas.study.trials import MODEL_DIGEST, model_digest
from search_spaces.architecture import functional_key

__all__ = ["TrainableProposals", "no_pruning", "pruner_options", "study_pruner", "study_sampler"]

PROPOSAL_CHECK = "proposal_check"  # a sampler's option: which children it may propose
TOP_RUNG = "max_resource"  # a pruner's option: the full training length, as Optuna names it


def study_sampler(settings: NasSettings) -> optuna.samplers.BaseSampler:
    """The configured sampler, built with `seed=` and the sampler's options; one that takes
    a proposal check proposes only children the study would train (`TrainableProposals`)."""
    name, options = settings.sampler.name, dict(settings.sampler.options)
    if SAMPLERS.takes(name, PROPOSAL_CHECK) and PROPOSAL_CHECK not in options:
        options[PROPOSAL_CHECK] = TrainableProposals(settings)
    return make_sampler(name, seed=settings.seed, **options)


def study_pruner(settings: NasSettings) -> optuna.pruners.BasePruner:
    """The configured pruner with its options (`pruner_options`)."""
    return make_pruner(settings.pruner.name, **pruner_options(settings))


def pruner_options(settings: NasSettings) -> dict[str, Any]:
    """The configured pruner's options; a pruner that takes its top rung (`max_resource`)
    is given `train.steps`, so a trial that clears every rung completes at the full budget."""
    options = dict(settings.pruner.options)
    if PRUNERS.takes(settings.pruner.name, TOP_RUNG):
        options.setdefault(TOP_RUNG, settings.train.steps)
    return options


def no_pruning(settings: NasSettings) -> str | None:
    """What a study says when it starts where its pruner cannot judge it (it then prunes no
    trial); None where it can: any pruner prunes a single-objective study, only a
    `FitnessPruner` (on the fitness) a multi-objective one."""
    name, objectives = settings.pruner.name, settings.study.objectives
    if len(objectives) == 1 or _judges_fitness(PRUNERS.find(name)):
        return None
    able = [n for n, member in PRUNERS.items() if _judges_fitness(member)]
    return (
        f"pruner {name} judges one objective and this study has {len(objectives)} "
        f"({', '.join(objectives)}): no trial is pruned (pruners that judge the fitness, "
        f"{settings.study.fitness}, alone: {', '.join(able)})"
    )


def prune_on_fitness(study: optuna.Study, trial: optuna.Trial, step: int, value: float) -> bool:
    """Whether a multi-objective study's `trial` stops at `step` (Optuna refuses `report`
    with several objectives): its pruner judges the fitness `value` where it can, the
    decision written on the trial; another prunes nothing (`no_pruning` said so)."""
    pruner = study.pruner
    return _judges_fitness(pruner) and pruner.prune_on_fitness(study, trial, step, value)


def _judges_fitness(member: object) -> TypeGuard[FitnessPruner]:
    """Whether a pruner, or a pruner class, offers `prune_on_fitness` (`FitnessPruner`)."""
    kind = member if isinstance(member, type) else type(member)
    return issubclass(kind, FitnessPruner)


class TrainableProposals:
    """Evolution's `ProposalCheck` in the harness: a child is proposed only if the space
    accepts it (`SearchSpace.validate`: inside the parameter window, say) and no trial of
    the study trained or trains its model (its `MODEL_DIGEST`); the sampler draws another
    edit instead of the harness recording a refused trial. The digests are read once per
    trial proposed (for all its draws)."""

    def __init__(self, settings: NasSettings) -> None:
        self._space = configured_space(settings)
        self._taken: tuple[int | None, set[str]] = (None, set())  # (for trial id, digests)

    def __call__(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        answers: Mapping[str, Any],
        seed: int,
    ) -> dict[str, Any] | None:
        params, child = complete(answers, self._space, seed)
        if not inside(child, self._space):
            return None
        digest = model_digest(functional_key(child))
        return None if digest in self._digests(study, trial) else params

    def _digests(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> set[str]:
        if self._taken[0] != trial_id(trial):
            trials = study.get_trials(deepcopy=False)
            digests = {t.user_attrs[MODEL_DIGEST] for t in trials if MODEL_DIGEST in t.user_attrs}
            self._taken = (trial_id(trial), digests)
        return self._taken[1]
