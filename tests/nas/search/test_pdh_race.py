"""Workers sharing one storage are judged against the same hurdle: it is computed from the
stored trials alone, and nothing shared is written.

Each worker has its own study object on one storage (SQLite, a journal file, or one
in-memory storage), so its own connection and cache. Two workers decide at once: each has
reported its child's value at the rung, and both read the trials before either writes its
decision (a barrier in `values_at`). Neither child counts in the other's hurdle (a child
joins the population once judged), so both are judged against the same hurdle, the one a
third worker computes from the same trials, even one whose study object read the storage
before most trials were stored.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import optuna
import pytest
from optuna.storages import BaseStorage, InMemoryStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.study import Study
from optuna.trial import TrialState

from nas.search import ProgressiveDynamicHurdles
from nas.search.records import StudyRecords

optuna.logging.set_verbosity(optuna.logging.WARNING)

NAME = "race"
WAIT = 20.0  # seconds a worker waits for the other at the barrier


def workers(kind: str, path: Path) -> Callable[[], Study]:
    """Creates the study; returns a maker of study objects on it, one per worker."""
    shared = InMemoryStorage()

    def storage() -> str | BaseStorage:
        if kind == "sqlite":
            return f"sqlite:///{path / 'race.db'}"  # a new engine and cache per study object
        if kind == "journal":
            return JournalStorage(JournalFileBackend(str(path / "race.log")))
        return shared

    optuna.create_study(study_name=NAME, storage=storage(), direction="minimize")
    return lambda: optuna.load_study(study_name=NAME, storage=storage())


class Gated(ProgressiveDynamicHurdles):
    """Waits at `barrier` between reading the trials and deciding; keeps what it read."""

    def __init__(self, barrier: threading.Barrier) -> None:
        super().__init__([10, 20], min_trials=3)
        self.barrier = barrier
        self.read: dict[int, float] = {}

    def values_at(self, study: Study, budget: int) -> dict[int, float]:
        self.read = super().values_at(study, budget)
        self.barrier.wait(WAIT)
        return self.read


def finish(study: Study, value: float) -> None:
    """A trial trained past step 10 with `value` there, complete."""
    trial = study.ask()
    trial.report(value, 10)
    study.tell(trial, value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["memory", "sqlite", "journal"])
def test_two_workers_deciding_at_once_see_the_same_hurdle(kind: str, tmp_path: Path) -> None:
    new_worker = workers(kind, tmp_path)
    a = new_worker()
    assert ProgressiveDynamicHurdles([10, 20], min_trials=3).hurdle_at(a, 10) is None
    b = new_worker()  # stores the population after A's study object last read
    for value in (1.0, 2.0, 3.0, 6.0):  # trials 0-3: hurdle (1 + 2 + 3 + 6) / 4 = 3
        finish(b, value)
    child_a, child_b = a.ask(), b.ask()  # trials 4 and 5
    child_a.report(2.5, 10)
    child_b.report(3.5, 10)

    barrier = threading.Barrier(2)
    pruners = {"a": Gated(barrier), "b": Gated(barrier)}
    with ThreadPoolExecutor(2) as pool:
        passed_a = pool.submit(pruners["a"].passes, a, 10, 2.5, trial=child_a)
        passed_b = pool.submit(pruners["b"].passes, b, 10, 3.5, trial=child_b)
        assert (passed_a.result(), passed_b.result()) == (True, False)

    population = {0: 1.0, 1: 2.0, 2: 3.0, 3: 6.0}  # neither child: both were undecided
    assert pruners["a"].read == pruners["b"].read == population
    view = new_worker()
    attrs = [t.user_attrs for t in view.get_trials(states=(TrialState.RUNNING,))]
    assert [t["pdh:hurdle:10"] for t in attrs] == [3.0, 3.0]
    assert attrs[1]["pdh:pruned_at"] == 10 and attrs[1]["pdh:hurdle_at_prune"] == 3.0
    # Judged, both children now count, for every worker alike: (12 + 2.5 + 3.5) / 6 = 3.
    after = [ProgressiveDynamicHurdles([10, 20], min_trials=3).hurdle_at(s, 10) for s in (a, b)]
    assert after == [3.0, 3.0]
    assert not any(key.startswith("pdh") for key in StudyRecords(view).study_attrs())


@pytest.mark.timeout(60)
def test_a_worker_loaded_before_the_trials_computes_a_fresh_workers_hurdle(
    tmp_path: Path,
) -> None:
    new_worker = workers("sqlite", tmp_path)
    early = new_worker()
    pruner = ProgressiveDynamicHurdles([10, 20], min_trials=2, hurdle="quantile", quantile=0.5)
    for value in (4.0, 1.0):
        finish(early, value)
    assert pruner.hurdle_at(early, 10) == 2.5  # the median of 4 and 1
    for value in (0.5, 0.25, 0.125):  # stored by another worker
        finish(new_worker(), value)
    # Median of 4, 1, 0.5, 0.25, 0.125: 0.5, whichever study object reads it.
    assert pruner.hurdle_at(early, 10) == pruner.hurdle_at(new_worker(), 10) == 0.5
