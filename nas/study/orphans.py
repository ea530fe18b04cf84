"""Trials left RUNNING by stage processes or workers that died: failed and asked again.

A trial is RUNNING from `study.ask` until `study.tell`; when the processes training it die
in between, nobody tells it. Whoever finds such an orphan fails it as `interrupted` (it
does not count) and enqueues its answers again, so that the study trains it after all:
the caller of `run_study` after its stage processes died (`nas.study.run`), and every
worker's leader before each ask (`nas.study.asking`), which finds a dead peer's trials.

A worker whose search is over waits (`settle`) until its peers' trials are told before a
later stage reads the study's results: otherwise two workers sharing a study could pick
different best trials, one before and one after a peer's last trial ended.
"""

from __future__ import annotations

import logging
import time

import optuna

from nas import storage
from nas.search.records import StudyRecords
from nas.study.trials import INTERRUPTED, OWNER

__all__ = ["ORPHANED", "SETTLE_POLL_S", "fail_running", "settle"]

ORPHANED = "left running by a worker that stopped"  # fail_reason of a dead worker's trial
SETTLE_POLL_S = 2.0  # how often `settle` looks at the trials still running

logger = logging.getLogger(__name__)


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


def settle(
    study: optuna.Study,
    wait_s: float,
    max_retries: int = storage.MAX_RETRIES,
    poll_s: float = SETTLE_POLL_S,
) -> list[int]:
    """Wait until no trial of `study` is RUNNING: live peers' trials are told, dead peers'
    are failed (`fail_running`, as before an ask). After `wait_s` seconds it stops waiting
    and returns the trials still running (a trial on another machine whose storage has no
    heartbeat cannot be told from a slow one), logged as a warning; [] once settled."""
    deadline, told = time.monotonic() + wait_s, False
    while True:
        fail_running(study, ORPHANED, max_retries=max_retries)
        states = (optuna.trial.TrialState.RUNNING,)
        running = [t.number for t in study.get_trials(deepcopy=False, states=states)]
        if not running:
            return []
        if time.monotonic() >= deadline:
            logger.warning(
                "trials %s are still running after %g s; going on without them", running, wait_s
            )
            return running
        if not told:
            logger.info("waiting for trials %s of other workers to end", running)
            told = True
        time.sleep(poll_s)
