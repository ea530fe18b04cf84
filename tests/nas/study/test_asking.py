"""`nas.study.asking`: two workers asking a study's last place at the same moment, on a
real SQLite study (no processes: the asks are interleaved by hand)."""

from __future__ import annotations

import math
from pathlib import Path

import optuna

from nas.settings import NasSettings, StudySettings
from nas.study.asking import Asker
from nas.study.opening import open_study
from nas.study.space import configured_space
from nas.study.trials import OWNER, finished


def two_askers(tmp_path: Path, name: str, n_trials: int) -> tuple[optuna.Study, list[Asker]]:
    """A fresh SQLite study of `n_trials` (no seeds enqueued) and the askers of workers
    "a" and "b" on it."""
    settings = NasSettings(
        study=StudySettings(name=name, n_trials=n_trials, enqueue_seeds=False),
        studies_dir=str(tmp_path),
    )
    study, space = open_study(settings), configured_space(settings)
    return study, [Asker(settings, study, space, owner, math.inf) for owner in ("a", "b")]


def test_of_two_workers_that_both_saw_one_trial_left_the_later_asker_stands_down(
    tmp_path: Path,
) -> None:
    study, (first, second) = two_askers(tmp_path, "race", n_trials=3)
    for _ in range(2):  # two trials already count
        study.tell(study.ask(), 1.0)
    # both saw one trial left, then asked: `first` a moment before `second`
    asked = []
    for asker in (first, second):
        trial = study.ask()
        trial.set_user_attr(OWNER, asker.owner)
        asked.append(trial)
    assert not first.surplus(asked[0]) and second.surplus(asked[1])
    # the same reading from either side, and once `first`'s trial counts
    study.tell(asked[0], 1.0)
    assert second.surplus(asked[1]) and finished(study) == 3
    assert first.next() is None and second.next() is None  # the study has its trials


def test_right_after_an_ask_one_left_says_the_trial_is_the_studys_last_to_start(
    tmp_path: Path,
) -> None:
    study, (a, b) = two_askers(tmp_path, "last", n_trials=3)
    asked_a = a.next()
    assert asked_a is not None and a.left() == 3  # its own trial counts as one to start
    asked_b = b.next()
    assert asked_b is not None and b.left() == 2  # and a's, running, as started
    study.tell(asked_a[0], 1.0)
    again = a.next()
    assert again is not None and a.left() == 1  # one finished, b's running: the last
    # the last to start, but b's trial runs (it may be sizing, holding no process yet): the
    # last is not alone with the machine's processes until b's trial ends
    assert not a.alone()
    study.tell(asked_b[0], 1.0)
    assert a.alone()
    study.tell(again[0], 1.0)
    assert a.left() == 0 and a.next() is None
