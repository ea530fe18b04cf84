"""A study's trials as stored: opening the study, which trials count, and cleaning up.

Both sides of a study use these, on the same storage: the caller of `run_study` between
launches of the stage processes (`nas.study.run`), and rank 0's `nas.study.leader.Leader`
inside them.
What a trial records in its user attributes beyond its values: `owner` (who asked it),
`fail_reason` (why it failed), `invalid` (a proposal not trained: outside the parameter
window, or with `duplicate_of`, the number of a finished trial that trained the same
architecture), `interrupted` (its stage processes died; it is asked again).
"""

from __future__ import annotations

import functools
import hashlib
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import optuna

from nas import storage
from nas.plugins import is_import_path, load_class
from nas.search import SAMPLERS, RegularizedEvolutionSampler, make_pruner, make_sampler
from nas.search.edits import complete, inside
from nas.search.records import StudyRecords, trial_id
from nas.settings import NasSettings
from nas.tracking.base import TrialEnd
from search_spaces.architecture import Architecture, functional_key, to_json
from search_spaces.evolved_transformer import (
    PRIMITIVES,
    ParamWindow,
    Primitive,
    WindowSeed,
    evolved_transformer,
    sample,
    seed_params,
    transformer,
)
from search_spaces.suggest import FixedSuggest, Suggest

__all__ = [
    "DUPLICATE_OF",
    "INTERRUPTED",
    "INVALID",
    "MODEL_DIGEST",
    "OWNER",
    "InWindowProposals",
    "Outcome",
    "architecture_of",
    "counted",
    "fail_running",
    "finished",
    "model_digest",
    "model_key",
    "open_study",
    "param_window",
    "pruner_options",
    "remaining",
    "sample_architecture",
    "seconds_searched",
    "seed_architectures",
    "space_primitives",
    "time_left",
    "trials_table",
]

_DONE = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
    optuna.trial.TrialState.FAIL,
)
INTERRUPTED = "interrupted"  # user attr of a trial failed because its processes died
INVALID = "invalid"  # user attr of a proposal not trained (window, or a duplicate)
DUPLICATE_OF = "duplicate_of"  # user attr: the trial that trained (or trains) the same model
OWNER = "owner"  # user attr: "<host>:<pid>" of the harness that asked the trial
MODEL_DIGEST = "model_digest"  # user attr of a trial that trains: `model_digest`, for peers


@dataclass(frozen=True)
class Outcome:
    """How a trial ended (complete with values, pruned or failed) and what to record."""

    state: TrialEnd
    attrs: dict[str, Any] = field(default_factory=dict)
    values: list[float] | None = None


def open_study(settings: NasSettings) -> optuna.Study:
    """Create or load the study; a new one gets the seed architectures enqueued first."""
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
        sampler=_sampler(settings),
        pruner=make_pruner(settings.pruner.name, **pruner_options(settings)),
    )
    if study.metric_names is None:  # the dashboard and `trials_dataframe` show them
        with warnings.catch_warnings():  # "experimental" in Optuna 5
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(settings.study.objectives))
    if settings.study.enqueue_seeds and not study.trials:
        primitives = space_primitives(settings)
        for arch in seed_architectures(settings).values():
            study.enqueue_trial(seed_params(arch, primitives=primitives), skip_if_exists=True)
    return study


def pruner_options(settings: NasSettings) -> dict[str, Any]:
    """The configured pruner's options; for the hurdles ("pdh") the budgets end with the top
    rung, `train.steps`, so a trial that clears every hurdle completes at the full budget."""
    options = dict(settings.pruner.options)
    budgets = list(options.get("budgets", []))
    if settings.pruner.name == "pdh" and budgets and budgets[-1] != settings.train.steps:
        options["budgets"] = [*budgets, settings.train.steps]
    return options


def _sampler(settings: NasSettings) -> optuna.samplers.BaseSampler:
    """The configured sampler: a built-in by name, or a user's `BaseSampler` subclass by
    import path (`nas.plugins`), built with `seed=` and the sampler's options. Evolution
    proposes only children the study would train (`InWindowProposals`)."""
    name, options = settings.sampler.name, settings.sampler.options
    if is_import_path(name):
        cls = load_class("sampler", name, optuna.samplers.BaseSampler)  # type: ignore[type-abstract]
        return cls(seed=settings.seed, **options)  # type: ignore[call-arg]
    if SAMPLERS.get(name) is RegularizedEvolutionSampler:
        options = {"proposal_check": InWindowProposals(settings), **options}
    return make_sampler(name, seed=settings.seed, **options)


class InWindowProposals:
    """Evolution's `ProposalCheck` in the harness: a child is proposed only if it is inside
    the parameter window and no trial of the study trained or trains its model (its
    `MODEL_DIGEST`); the sampler draws another edit instead of the harness recording a
    refused trial. The digests are read once per trial proposed (for all its draws)."""

    def __init__(self, settings: NasSettings) -> None:
        self._space = functools.partial(sample_architecture, settings=settings)
        self._window = param_window(settings)
        self._taken: tuple[int | None, set[str]] = (None, set())  # (for trial id, digests)

    def __call__(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        answers: Mapping[str, Any],
        seed: int,
    ) -> dict[str, Any] | None:
        params, child = complete(answers, self._space, seed)
        if not inside(child, self._window):
            return None
        digest = model_digest(functional_key(child))
        return None if digest in self._digests(study, trial) else params

    def _digests(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> set[str]:
        if self._taken[0] != trial_id(trial):
            trials = study.get_trials(deepcopy=False)
            digests = {t.user_attrs[MODEL_DIGEST] for t in trials if MODEL_DIGEST in t.user_attrs}
            self._taken = (trial_id(trial), digests)
        return self._taken[1]


def seed_architectures(settings: NasSettings) -> dict[str, Architecture]:
    """The two seed architectures of the configured space, the smallest it holds:
    `transformer` (2 layers per cell) and `evolved_transformer`."""
    space = settings.search_space
    d, heads, cells = space.d_model[0], space.n_heads, space.min_cells
    n_enc = 0 if space.decoder_only else cells
    return {
        "transformer": transformer(d, n_heads=heads, n_enc=2 * n_enc, n_dec=2 * cells),
        "evolved_transformer": evolved_transformer(d, n_heads=heads, n_enc=n_enc, n_dec=cells),
    }


def sample_architecture(suggest: Suggest, settings: NasSettings) -> Architecture:
    """The configured space's architecture for `suggest`'s answers (an Optuna trial, or a
    stored trial's parameters replayed by `FixedSuggest`), repaired the same way every time;
    the parameter window is not applied here (`param_window`)."""
    space = settings.search_space
    return sample(
        suggest,
        d_model=space.d_model,
        decoder_only=bool(space.decoder_only),
        cells=(space.min_cells, space.max_cells),
        window=None,
        primitives=space_primitives(settings),
    )


def space_primitives(settings: NasSettings) -> tuple[Primitive, ...]:
    """The optional primitives the configured space offers (checked by the settings)."""
    return tuple(p for p in PRIMITIVES if p in settings.search_space.primitives)


def architecture_of(trial: optuna.trial.FrozenTrial, settings: NasSettings) -> str:
    """The architecture (JSON) a stored trial proposed, rebuilt from its parameters."""
    return to_json(sample_architecture(FixedSuggest(trial.params), settings))


def model_key(trial: optuna.trial.FrozenTrial, settings: NasSettings) -> str:
    """What a stored trial trained, as `functional_key`: equal for two trials whose
    architectures differ only in the order of a block's branches (the same model)."""
    return functional_key(sample_architecture(FixedSuggest(trial.params), settings))


def model_digest(key: str) -> str:
    """A `model_key` in 16 hex digits: what a running trial records of its model, so that
    peers see it trains (`nas.study.leader`) without the whole key in every trial's table."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def param_window(settings: NasSettings) -> ParamWindow | None:
    """The configured parameter window, relative to the seed `search_space.window_reference`
    (the Transformer with 2 layers per cell of `min_cells`, or the Evolved Transformer with
    `min_cells` cells); None when the space has none."""
    space = settings.search_space
    return (
        ParamWindow(
            *space.param_window,
            layers=2 * space.min_cells,
            seed=cast(WindowSeed, space.window_reference),  # one of them: the settings check
        )
        if space.param_window
        else None
    )


def seconds_searched(study: optuna.Study) -> float:
    """The wall-clock seconds in which at least one of the study's finished trials was
    training, over every run: what `study.time_budget_s` counts. Trials side by side
    (several workers) count once, so a budget is the search's time whatever its width; the
    pauses between stopped runs do not count."""
    spans = sorted(
        (t.datetime_start.timestamp(), t.datetime_complete.timestamp())
        for t in study.get_trials(deepcopy=False)
        if t.datetime_start is not None and t.datetime_complete is not None
    )
    total, covered = 0.0, -math.inf  # covered: the end of the union so far
    for start, end in spans:
        total += max(0.0, end - max(start, covered))
        covered = max(covered, end)
    return total


def time_left(study: optuna.Study, settings: NasSettings) -> bool:
    """Whether the study has searched less than `study.time_budget_s` (`seconds_searched`)."""
    budget = settings.study.time_budget_s
    return budget is None or seconds_searched(study) < budget


def counted(trial: optuna.trial.FrozenTrial) -> bool:
    """Does the trial count toward `study.n_trials`? Not if interrupted or never trained.

    Every sample of the space is a valid architecture except one outside a configured
    parameter window: that one is recorded as a failed, invalid trial with its cause and
    another is asked in its place; so is a proposal of an architecture a finished trial
    already trained. A failed trial without a `fail_reason` was failed by Optuna's
    heartbeat check (its worker died).
    """
    attrs = trial.user_attrs
    if trial.state == optuna.trial.TrialState.FAIL and "fail_reason" not in attrs:
        return False
    return trial.state in _DONE and not attrs.get(INTERRUPTED) and not attrs.get(INVALID)


def finished(study: optuna.Study) -> int:
    return sum(counted(t) for t in study.get_trials(deepcopy=False))


def remaining(study: optuna.Study, n_trials: int) -> int:
    return max(0, n_trials - finished(study))


def fail_running(
    study: optuna.Study,
    cause: str,
    owner: str | None = None,
    max_retries: int = storage.MAX_RETRIES,
) -> int:
    """Fail the RUNNING trials asked by `owner` (its stage processes died), or with no
    owner given, those whose owner is gone or whose heartbeat stopped (`nas.storage.opening`), and
    enqueue each again unless its architecture reached `max_retries` retries
    (`storage.retry`); returns how many it failed by owner were enqueued again (Optuna's
    callback enqueues the heartbeat's). Workers may call it at once: each trial is failed,
    and enqueued again, by one of them (`storage.one_check_at_a_time`; a trial failed
    meanwhile is skipped)."""
    with storage.one_check_at_a_time(study):
        storage.fail_stale(study)
        running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        return sum(_fail_orphan(study, t, cause, owner, max_retries) for t in running)


def _fail_orphan(
    study: optuna.Study,
    trial: optuna.trial.FrozenTrial,
    cause: str,
    owner: str | None,
    max_retries: int,
) -> bool:
    """Fail `trial` and enqueue it again if `owner` asked it (or, with no owner given, its
    owner is gone); True if enqueued again."""
    asked_by = trial.user_attrs.get(OWNER)
    if not (asked_by == owner if owner else not storage.owner_alive(asked_by)):
        return False
    last = storage.retried_enough(trial, max_retries)
    reason = f"{cause} (retried {max_retries} times: not again)" if last else cause
    try:
        StudyRecords(study).fail(trial, {"fail_reason": reason, INTERRUPTED: True})
    except optuna.exceptions.UpdateFinishedTrialError:  # finished, or failed by a peer, meanwhile
        return False
    return storage.retry(study, trial, max_retries)


def trials_table(study: optuna.Study) -> list[dict[str, Any]]:
    """One row per trial: number, state, values and every user attribute."""
    return [
        {"number": t.number, "state": t.state.name, "values": t.values, **t.user_attrs}
        for t in study.get_trials(deepcopy=False)
    ]
