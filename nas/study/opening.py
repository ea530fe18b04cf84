"""Opening a study: created on its first run (its seeds enqueued first), loaded after.

Every process that reads or writes a study opens it here: the caller of `run_study`, each
worker's leader (`nas.study.leader`), the report and the retraining. A study is its name
on its storage; the sampler, the pruner and the seeds come from the settings
(`nas.study.strategies`, `nas.study.space`). A stored study of another search (other
directions, or trials whose answers the configured space cannot replay: a study another
program made under that name, or this space configured otherwise) is refused before
anything is written to it (`StudyMismatchError`).
"""

from __future__ import annotations

import warnings

import optuna

from nas import storage
from nas.settings import NasSettings
from nas.storage.url import masked
from nas.study.space import configured_space, seed_models
from nas.study.strategies import study_pruner, study_sampler

__all__ = ["StudyMismatchError", "open_study"]


class StudyMismatchError(ValueError):
    """The stored study of that name was made by another search: which, and why."""


def open_study(settings: NasSettings) -> optuna.Study:
    """Create or load the study; a new one gets the space's seed architectures enqueued
    first, in order (`SearchSpace.seeds`)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # ask/tell keeps its own heartbeat (nas.storage.opening.Heartbeat), which Optuna cannot see
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    study = optuna.create_study(
        study_name=settings.study.name,
        storage=storage.make_storage(
            settings.storage_url,
            grace_s=settings.study.heartbeat_grace_s,
            max_retries=settings.study.max_retries,
            wait_s=settings.study.storage_wait_s,
        ),
        load_if_exists=True,
        directions=settings.study.directions,  # type: ignore[arg-type]
        sampler=study_sampler(settings),
        pruner=study_pruner(settings),
    )
    _same_search(study, settings)
    if study.metric_names is None:  # the dashboard and `trials_dataframe` show them
        with warnings.catch_warnings():  # "experimental" in Optuna 5
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(settings.study.objectives))
    if settings.study.enqueue_seeds and not study.trials:
        space = configured_space(settings)
        for arch in seed_models(settings, space).values():
            study.enqueue_trial(space.seed_params(arch), skip_if_exists=True)
    return study


def _same_search(study: optuna.Study, settings: NasSettings) -> None:
    """`StudyMismatchError` unless the stored `study` is this search's (module doc)."""
    where = f"study {study.study_name!r} in {masked(settings.storage_url)}"
    fix = "choose another study.name, or the settings the study was made with"
    wanted = [d.lower() for d in settings.study.directions]
    stored = [d.name.lower() for d in study.directions]
    if stored != wanted:
        raise StudyMismatchError(
            f"{where} was made to {', '.join(stored)}, not to {', '.join(wanted)} "
            f"(study.objectives={list(settings.study.objectives)}); {fix}"
        )
    # a finished trial's answers are whole (one still asking, or failed while asking, may
    # hold some of them)
    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    answered = next(iter(study.get_trials(deepcopy=False, states=done)), None)
    if answered is None:
        return
    try:
        configured_space(settings).replay(answered.params)
    except (KeyError, ValueError) as error:
        raise StudyMismatchError(
            f"{where} holds trials of another search: the configured space cannot replay "
            f"trial {answered.number}'s answers ({error}); {fix}"
        ) from None
