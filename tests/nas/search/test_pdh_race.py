"""Workers sharing one storage race to set the same hurdle: the first proposal wins for all.

A race needs two workers to both find no hurdle and to have seen different trials. The
pruners here are real ones with a pause in `values_at` (after the trials are read, before
the hurdle is proposed), where the other worker does its whole part: reports a trial that
the first did not see, and sets the hurdle from what it sees. Storages are real (in memory,
SQLite, a journal file), each worker with its own study object (its own connection and
cache), and in the last test each in its own process.
"""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages import BaseStorage, InMemoryStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.study import Study

from nas.search import ProgressiveDynamicHurdles
from nas.search.pdh import stored_hurdle

optuna.logging.set_verbosity(optuna.logging.WARNING)

NAME = "race"
WAIT = 20.0  # seconds a process waits for the other at a barrier


def storage_for(kind: str, path: Path) -> str | BaseStorage:
    """A new handle on the shared storage of `kind` under `path` (not for "memory")."""
    if kind == "sqlite":
        return f"sqlite:///{path / 'race.db'}"  # load_study wraps it as Optuna does
    return JournalStorage(JournalFileBackend(str(path / "race.log")))


def workers(kind: str, path: Path) -> Callable[[], Study]:
    """Creates the study; returns a maker of study objects on it, one per worker."""
    shared = InMemoryStorage() if kind == "memory" else None

    def storage() -> str | BaseStorage:
        return shared if shared is not None else storage_for(kind, path)

    optuna.create_study(study_name=NAME, storage=storage(), direction="minimize")
    return lambda: optuna.load_study(study_name=NAME, storage=storage())


class Paused(ProgressiveDynamicHurdles):
    """Runs `meanwhile` once, between reading the trials and proposing the hurdle."""

    def __init__(self, budgets: Sequence[int], min_trials: int, meanwhile: Callable[[], None]):
        super().__init__(budgets, min_trials)
        self.meanwhile: Callable[[], None] | None = meanwhile

    def values_at(self, study: Study, budget: int) -> dict[int, float]:
        values = super().values_at(study, budget)
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            meanwhile()
        return values


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["memory", "sqlite", "journal"])
def test_a_worker_that_read_before_another_set_the_hurdle_uses_that_one(
    kind: str, tmp_path: Path
) -> None:
    new_worker = workers(kind, tmp_path)
    a, b = new_worker(), new_worker()
    late = a.ask()  # trial 0: reaches step 10 only after worker A has read the trials
    for value in (2.0, 4.0):  # trials 1 and 2, still running
        a.ask().report(value, 10)
    used: dict[str, float | None] = {}

    def worker_b() -> None:
        late.report(0.0, 10)
        used["b"] = ProgressiveDynamicHurdles([10], min_trials=2).hurdle_at(b, 10)

    pruner_a = Paused([10], 2, worker_b)
    used["a"] = pruner_a.hurdle_at(a, 10)
    # A saw trials 1 and 2: it proposes (2 + 4) / 2 = 3. B saw 0, 1 and 2 and proposed
    # (0 + 2) / 2 = 1 first; first writer wins, so A uses 1 too.
    assert used == {"a": 1.0, "b": 1.0}
    assert stored_hurdle(new_worker(), 10, 2) == {"value": 1.0, "trials": [0, 1], "min_trials": 2}
    assert not pruner_a.passes(a, 10, 4.0, trial=2)  # a member of A's losing proposal only
    assert pruner_a.passes(a, 10, 0.0, trial=0)


class Gated(ProgressiveDynamicHurdles):
    """Waits at `barriers` (one after the other) between reading the trials and proposing."""

    def __init__(self, min_trials: int, barriers: Sequence[Any]) -> None:
        super().__init__([10], min_trials)
        self.barriers = barriers

    def values_at(self, study: Study, budget: int) -> dict[int, float]:
        values = super().values_at(study, budget)
        for barrier in self.barriers:
            barrier.wait(WAIT)
        return values


def race(kind: str, path: Path, role: str, read: Any, propose: Any, used: Any) -> None:
    """One worker process. A reads the trials (trial 1 only), then lets B report trial 0 and
    read (trials 0 and 1); then both propose at once, A (5) and B (0), min_trials 1."""
    study = optuna.load_study(study_name=NAME, storage=storage_for(kind, path))
    if role == "a":
        pruner = Gated(1, [read, propose])
    else:
        read.wait(WAIT)
        trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, 0)
        study._storage.set_trial_intermediate_value(trial_id, 10, 0.0)
        pruner = Gated(1, [propose])
    used.put((role, pruner.hurdle_at(study, 10)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_two_processes_racing_for_one_hurdle_agree(kind: str, tmp_path: Path) -> None:
    study = workers(kind, tmp_path)()
    study.ask()  # trial 0, reported by process B during the race
    study.ask().report(5.0, 10)  # trial 1
    context = multiprocessing.get_context("spawn")
    read, propose, used = context.Barrier(2), context.Barrier(2), context.Queue()
    processes = [
        context.Process(target=race, args=(kind, tmp_path, role, read, propose, used))
        for role in ("a", "b")
    ]
    for p in processes:
        p.start()
    try:
        results = dict(used.get(timeout=2 * WAIT) for _ in processes)
    except queue.Empty:
        results = {}
    for p in processes:
        p.join(WAIT)
    assert [p.exitcode for p in processes] == [0, 0]
    assert results["a"] == results["b"] in (0.0, 5.0)  # either may write first; both use it
    view = optuna.load_study(study_name=NAME, storage=storage_for(kind, tmp_path))
    assert (stored_hurdle(view, 10, 1) or {}).get("value") == results["a"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["memory", "sqlite", "journal"])
def test_a_study_made_again_under_a_deleted_ones_name_sets_its_own_hurdles(
    kind: str, tmp_path: Path
) -> None:
    new_worker = workers(kind, tmp_path)
    pruner = ProgressiveDynamicHurdles([10], min_trials=1)
    first = new_worker()
    first.ask().report(1.0, 10)
    assert pruner.hurdle_at(first, 10) == 1.0
    storage = first._storage
    optuna.delete_study(study_name=NAME, storage=storage)  # its hurdles go with it
    again = optuna.create_study(study_name=NAME, storage=storage)
    again.ask().report(7.0, 10)
    assert pruner.hurdle_at(again, 10) == 7.0
