"""The study's search strategies from the settings: its sampler and its pruner.

`nas.search` builds a strategy from a name and options; this module gives it what only the
harness knows: the seed, a user's sampler class by import path (`nas.plugins`), the
pruner's top rung (`train.steps`), and for regularized evolution a proposal check that
knows the study's space and trials (`TrainableProposals`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from nas.plugins import is_import_path, load_class
from nas.search import SAMPLERS, RegularizedEvolutionSampler, make_pruner, make_sampler
from nas.search.edits import complete, inside
from nas.search.records import trial_id
from nas.settings import NasSettings
from nas.study.space import configured_space
from nas.study.trials import MODEL_DIGEST, model_digest
from search_spaces.architecture import functional_key

__all__ = ["TrainableProposals", "pruner_options", "study_pruner", "study_sampler"]


def study_sampler(settings: NasSettings) -> optuna.samplers.BaseSampler:
    """The configured sampler: a built-in by name, or a user's `BaseSampler` subclass by
    import path (`nas.plugins`), built with `seed=` and the sampler's options. Evolution
    proposes only children the study would train (`TrainableProposals`)."""
    name, options = settings.sampler.name, settings.sampler.options
    if is_import_path(name):
        cls = load_class("sampler", name, optuna.samplers.BaseSampler)  # type: ignore[type-abstract]
        return cls(seed=settings.seed, **options)  # type: ignore[call-arg]
    if SAMPLERS.get(name) is RegularizedEvolutionSampler:
        options = {"proposal_check": TrainableProposals(settings), **options}
    return make_sampler(name, seed=settings.seed, **options)


def study_pruner(settings: NasSettings) -> optuna.pruners.BasePruner:
    """The configured pruner with its options (`pruner_options`)."""
    return make_pruner(settings.pruner.name, **pruner_options(settings))


def pruner_options(settings: NasSettings) -> dict[str, Any]:
    """The configured pruner's options; for the hurdles ("pdh") the budgets end with the top
    rung, `train.steps`, so a trial that clears every hurdle completes at the full budget."""
    options = dict(settings.pruner.options)
    budgets = list(options.get("budgets", []))
    if settings.pruner.name == "pdh" and budgets and budgets[-1] != settings.train.steps:
        options["budgets"] = [*budgets, settings.train.steps]
    return options


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
