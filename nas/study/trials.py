"""A study's trials as stored: what a trial records, which trials count, and the time spent.

Both sides of a study read these, on the same storage: the caller of `run_study` between
launches of the stage processes (`nas.study.run`), and rank 0's `nas.study.leader.Leader`
inside them; the report and the retraining read them after.
What a trial records in its user attributes beyond its values: `owner` (who asked it),
`fail_reason` (why it failed; for a trial Optuna's heartbeat check failed, the study's
`fail_reason:<trial>`), `invalid` (a proposal not trained: outside the space's
limits, or with `duplicate_of`, the number of a finished trial that trained the same
architecture), `interrupted` (its stage processes died; it is asked again), `model_digest`
(what a trial that trains trains, for its peers).
"""

from __future__ import annotations

import hashlib
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import optuna

from nas import storage
from nas.settings import NasSettings
from nas.tracking.base import TrialEnd

__all__ = [
    "DUPLICATE_OF",
    "INTERRUPTED",
    "INVALID",
    "MODEL_DIGEST",
    "OWNER",
    "Outcome",
    "counted",
    "fail_reason",
    "finished",
    "measured_shares",
    "model_digest",
    "remaining",
    "seconds_searched",
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

    A sample the space refuses (`SearchSpace.validate`: outside a configured parameter
    window, say) is recorded as a failed, invalid trial with its cause and
    another is asked in its place; so is a proposal of an architecture a finished trial
    already trained. A failed trial without a `fail_reason` was failed by Optuna's
    heartbeat check (its worker died).
    """
    attrs = trial.user_attrs
    if trial.state == optuna.trial.TrialState.FAIL and "fail_reason" not in attrs:
        return False
    return trial.state in _DONE and not attrs.get(INTERRUPTED) and not attrs.get(INVALID)


def fail_reason(trial: optuna.trial.FrozenTrial, study_attrs: dict[str, Any]) -> str | None:
    """Why `trial` failed: its own `fail_reason`, or, failed by Optuna's heartbeat check
    (closed to writes by then), the cause kept in the study's attributes `study_attrs`
    (`storage.stale_cause_key`); None if it did not fail or nothing says."""
    if trial.state != optuna.trial.TrialState.FAIL:
        return None
    own = trial.user_attrs.get("fail_reason")
    return str(own) if own is not None else study_attrs.get(storage.stale_cause_key(trial.number))


def finished(study: optuna.Study) -> int:
    return sum(counted(t) for t in study.get_trials(deepcopy=False))


def remaining(study: optuna.Study, n_trials: int) -> int:
    return max(0, n_trials - finished(study))


def measured_shares(study: optuna.Study, last: int = 32) -> dict[int, float]:
    """Per stage count, what the last `last` finished trials on that many stages measured
    against their pipeline's prediction (the median of samples/s over predicted samples/s):
    the load of the machine they shared, which the cost model does not know."""
    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    shares: dict[int, list[float]] = {}
    for trial in study.get_trials(deepcopy=False, states=done):
        attrs = trial.user_attrs
        measured, predicted = attrs.get("samples_per_s"), attrs.get("predicted_samples_per_s")
        if isinstance(attrs.get("n_stages"), int) and measured and predicted:
            shares.setdefault(attrs["n_stages"], []).append(float(measured) / float(predicted))
    return {stages: statistics.median(ratios[-last:]) for stages, ratios in shares.items()}


def trials_table(study: optuna.Study) -> list[dict[str, Any]]:
    """One row per trial: number, state, values and every user attribute."""
    return [
        {"number": t.number, "state": t.state.name, "values": t.values, **t.user_attrs}
        for t in study.get_trials(deepcopy=False)
    ]


def model_digest(key: str) -> str:
    """A model's `functional_key` in 16 hex digits: what a running trial records of its
    model (`MODEL_DIGEST`), so that peers see it trains (`nas.study.asking`) without the
    whole key in every trial's table."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]
