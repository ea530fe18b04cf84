"""Trials left RUNNING by stage processes or workers that died: failed and asked again.

A trial is RUNNING from `study.ask` until `study.tell`; when the processes training it die
in between, nobody tells it. Whoever finds such an orphan fails it as `interrupted` (it
does not count) and enqueues its answers again, so that the study trains it after all:
the caller of `run_study` after its stage processes died (`nas.study.run`), and every
worker's leader before each ask (`nas.study.asking`), which finds a dead peer's trials.
"""

from __future__ import annotations

import optuna

from nas import storage
from nas.search.records import StudyRecords
from nas.study.trials import INTERRUPTED, OWNER

__all__ = ["ORPHANED", "fail_running"]

ORPHANED = "left running by a worker that stopped"  # fail_reason of a dead worker's trial


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
