"""Progressive Dynamic Hurdles against hurdles computed by hand, on real Optuna studies.

Every test builds its study trial by trial with ask / report / should_prune / tell, so the
values at each budget are chosen by the test and the expected hurdle is a mean written out
in a comment. Boundaries are checked one float step either side of the hurdle and on it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import optuna
import pytest
from optuna.trial import TrialState

from nas.search import ProgressiveDynamicHurdles, clears, hurdle, make_pruner
from nas.search.pdh import stored_hurdle

optuna.logging.set_verbosity(optuna.logging.WARNING)

BUDGETS = (10, 20)


Direction = Literal["minimize", "maximize"]


def study_with(
    direction: Direction, storage: str, tmp_path: Path, min_trials: int = 3
) -> optuna.Study:
    url = None if storage == "memory" else f"sqlite:///{tmp_path / 'study.db'}"
    pruner = ProgressiveDynamicHurdles(BUDGETS, min_trials=min_trials)
    return optuna.create_study(direction=direction, storage=url, pruner=pruner)


def run(study: optuna.Study, values: dict[int, float]) -> int | None:
    """One trial reporting `values` {step: value} in step order, as a training loop would:
    the step it was pruned at, else None (then it completes with its last value)."""
    trial = study.ask()
    for step, value in sorted(values.items()):
        trial.report(value, step)
        if trial.should_prune():
            study.tell(trial, state=TrialState.PRUNED)
            return step
    study.tell(trial, values[max(values)])
    return None


def pdh(study: optuna.Study) -> ProgressiveDynamicHurdles:
    assert isinstance(study.pruner, ProgressiveDynamicHurdles)
    return study.pruner


def up(x: float) -> float:
    return math.nextafter(x, math.inf)


def down(x: float) -> float:
    return math.nextafter(x, -math.inf)


def test_the_pure_rules() -> None:
    assert hurdle([1.0, 2.0, 6.0]) == 3.0  # (1 + 2 + 6) / 3
    assert hurdle([0.1, 0.2]) == pytest.approx(0.15)
    assert clears(down(3.0), 3.0, "minimize") and not clears(3.0, 3.0, "minimize")
    assert not clears(up(3.0), 3.0, "minimize")
    assert clears(up(3.0), 3.0, "maximize") and not clears(3.0, 3.0, "maximize")
    assert not clears(down(3.0), 3.0, optuna.study.StudyDirection.MAXIMIZE)
    assert not clears(math.nan, 3.0, "minimize") and not clears(math.nan, 3.0, "maximize")
    with pytest.raises(ValueError, match="at least one value"):
        hurdle([])
    with pytest.raises(ValueError, match="finite"):
        hurdle([1.0, math.inf])
    with pytest.raises(ValueError, match="'up'"):
        clears(1.0, 2.0, "up")


@pytest.mark.parametrize("storage", ["memory", "sqlite"])
@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_first_hurdle_against_a_hand_computed_mean(
    direction: Direction, storage: str, tmp_path: Path
) -> None:
    study = study_with(direction, storage, tmp_path)
    # The first three trials to reach step 10 set the hurdle there; none of them is pruned,
    # not even the one that is worse than the mean (6.0 when minimizing, 1.0 when maximizing).
    assert run(study, {10: 1.0}) is None
    assert pdh(study).hurdle_at(study, 10) is None  # 1 of 3 trials: no hurdle yet
    assert run(study, {10: 2.0}) is None
    assert run(study, {10: 6.0}) is None
    assert pdh(study).hurdle_at(study, 10) == 3.0  # (1 + 2 + 6) / 3

    better, worse = (down, up) if direction == "minimize" else (up, down)
    assert run(study, {10: better(3.0)}) is None  # beats the hurdle by one float step
    assert run(study, {10: 3.0}) == 10  # equal: stops, as in the paper
    assert run(study, {10: worse(3.0)}) == 10
    assert run(study, {10: math.nan}) == 10
    # The hurdle is frozen: three far better trials since then leave it where it was.
    far = -100.0 if direction == "minimize" else 100.0
    assert [run(study, {10: far}) for _ in range(3)] == [None] * 3
    assert pdh(study).hurdle_at(study, 10) == 3.0
    assert stored_hurdle(study, 10, 3) == {"value": 3.0, "trials": [0, 1, 2], "min_trials": 3}
    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE] * 4 + [TrialState.PRUNED] * 3 + [TrialState.COMPLETE] * 3


def test_later_budgets_count_the_trials_that_reached_them() -> None:
    study = optuna.create_study(
        direction="minimize", pruner=ProgressiveDynamicHurdles(BUDGETS, min_trials=2)
    )
    assert run(study, {10: 4.0, 20: 3.0}) is None  # members at 10 and at 20
    assert run(study, {10: 2.0, 20: 1.0}) is None  # hurdle at 10: (4 + 2) / 2 = 3
    assert run(study, {10: 5.0, 20: 0.0}) == 10  # never reaches 20, so never counts there
    # Hurdle at 20 was set by trials 0 and 1: (3 + 1) / 2 = 2.
    assert run(study, {10: 2.5, 20: 2.0}) == 20  # passes 10 (2.5 < 3), equal at 20
    assert run(study, {10: 2.5, 20: down(2.0)}) is None
    assert pdh(study).hurdle_at(study, 20) == 2.0
    assert pdh(study).values_at(study, 20) == {0: 3.0, 1: 1.0, 3: 2.0, 4: down(2.0)}


def test_which_trials_count() -> None:
    pruner = ProgressiveDynamicHurdles(BUDGETS, min_trials=3)
    study = optuna.create_study(direction="minimize", pruner=pruner)
    failed = study.ask()
    failed.report(100.0, 10)
    study.tell(failed, state=TrialState.FAIL)  # failed: does not count
    nan = study.ask()
    nan.report(math.nan, 10)
    study.tell(nan, state=TrialState.PRUNED)  # not finite: does not count
    other_step = study.ask()
    other_step.report(100.0, 15)
    study.tell(other_step, 100.0)  # no value at 10: does not count
    pruned = study.ask()
    pruned.report(1.0, 10)
    study.tell(pruned, state=TrialState.PRUNED)  # pruned: counts
    complete = study.ask()
    complete.report(2.0, 10)
    study.tell(complete, 2.0)  # complete: counts
    running = study.ask()
    running.report(9.0, 10)  # running: counts
    assert pruner.values_at(study, 10) == {3: 1.0, 4: 2.0, 5: 9.0}
    assert not running.should_prune()  # it is the third member: (1 + 2 + 9) / 3 = 4
    assert pruner.hurdle_at(study, 10) == 4.0
    study.tell(running, state=TrialState.FAIL)  # a member failing later changes nothing
    assert pruner.hurdle_at(study, 10) == 4.0
    assert run(study, {10: 4.0}) == 10


def test_no_pruning_away_from_the_budgets_or_before_a_hurdle() -> None:
    study = optuna.create_study(pruner=ProgressiveDynamicHurdles([10], min_trials=2))
    for _ in range(2):
        assert run(study, {5: 0.0, 10: 0.0, 15: 0.0}) is None
    # Hurdle at 10 is 0; a trial far worse elsewhere is only judged at 10.
    assert run(study, {5: 1e9, 10: -1.0, 15: 1e9}) is None
    assert run(study, {5: -1e9, 10: 1.0, 15: -1e9}) == 10


def test_min_trials_of_one_freezes_on_the_first_trial() -> None:
    study = optuna.create_study(
        direction="maximize", pruner=ProgressiveDynamicHurdles([10], min_trials=1)
    )
    assert run(study, {10: 0.5}) is None
    assert run(study, {10: 0.5}) == 10
    assert run(study, {10: 0.75}) is None


def test_multi_objective_studies_use_the_recorded_metric() -> None:
    # Objectives: validation loss (minimize) and tokens per second (maximize).
    pruner = ProgressiveDynamicHurdles(BUDGETS, min_trials=2)
    study = optuna.create_study(directions=["minimize", "maximize"], pruner=pruner)

    def stage(loss: float) -> tuple[optuna.Trial, bool]:
        trial = study.ask()
        pruner.record(trial, 10, loss)
        return trial, pruner.passes(study, 10, loss, trial=trial.number)

    trial, ok = stage(5.0)
    with pytest.raises(NotImplementedError):  # why the helper exists
        trial.should_prune()
    assert ok
    study.tell(trial, [5.0, 100.0])
    trial, ok = stage(1.0)  # the second member: passes although the hurdle will be 3
    assert ok and pruner.hurdle_at(study, 10) == 3.0  # (5 + 1) / 2
    study.tell(trial, [1.0, 100.0])
    assert study.trials[1].user_attrs == {"pdh:10": 1.0}

    trial, ok = stage(3.0)  # equal to the hurdle: stop
    assert not ok
    study.tell(trial, state=TrialState.PRUNED)  # how the harness ends it
    trial, ok = stage(down(3.0))
    assert ok
    study.tell(trial, [down(3.0), 50.0])
    # Without the trial's number a member would be judged like anyone else; the direction
    # defaults to the first objective's and can be given for a metric to maximize.
    assert not pruner.passes(study, 10, 5.0)
    assert pruner.passes(study, 10, 5.0, trial=0)
    assert pruner.passes(study, 10, 5.0, direction="maximize")
    assert pruner.passes(study, 20, 1e9)  # no hurdle at 20 yet
    with pytest.raises(ValueError, match="budget 15 is not one of the budgets"):
        pruner.passes(study, 15, 0.0)


def test_a_resumed_study_with_another_min_trials_sets_hurdles_afresh(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(
        study_name="s", storage=url, pruner=ProgressiveDynamicHurdles([10], min_trials=2)
    )
    for value in (1.0, 3.0, 8.0):
        run(study, {10: value})
    assert pdh(study).hurdle_at(study, 10) == 2.0  # (1 + 3) / 2
    resumed = optuna.load_study(
        study_name="s", storage=url, pruner=ProgressiveDynamicHurdles([10], min_trials=3)
    )
    assert pdh(resumed).hurdle_at(resumed, 10) == 4.0  # (1 + 3 + 8) / 3
    same = optuna.load_study(
        study_name="s", storage=url, pruner=ProgressiveDynamicHurdles([10], min_trials=3)
    )
    assert pdh(same).hurdle_at(same, 10) == 4.0


@pytest.mark.parametrize(
    ("budgets", "min_trials", "message"),
    [
        ([], 5, "at least one step count"),
        ("10", 5, "budgets must be a sequence of step counts, got '10'"),
        ([10, 10], 5, r"strictly increasing, got \[10, 10\]"),
        ([20, 10], 5, r"strictly increasing, got \[20, 10\]"),
        ([0, 10], 5, "positive integer, got 0"),
        ([1.5], 5, "positive integer, got 1.5"),
        ([True], 5, "positive integer, got True"),
        ([10], 0, "min_trials must be a positive integer, got 0"),
        ([10], 2.0, "min_trials must be a positive integer, got 2.0"),
    ],
)
def test_bad_arguments_are_named(budgets: object, min_trials: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProgressiveDynamicHurdles(budgets, min_trials)  # type: ignore[arg-type]


def test_make_pruner_pdh_prunes_inside_optimize() -> None:
    curves = {0: 1.0, 1: 3.0, 2: 2.0, 3: 0.5, 4: 4.0}  # trial -> value at every budget

    def objective(trial: optuna.Trial) -> float:
        for step in (10, 20):
            trial.report(curves[trial.number] * step, step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return curves[trial.number] * 20

    pruner = make_pruner("pdh", budgets=[10, 20], min_trials=3)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    study.optimize(objective, n_trials=5)
    # At 10 the hurdle is (10 + 30 + 20) / 3 = 20: trial 3 (5) stops, trial 4 (40) passes.
    # At 20 trials 0, 1, 2 set (20 + 60 + 40) / 3 = 40, and trial 4 (80) passes.
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3 + ["PRUNED", "COMPLETE"]
    assert study.trials[3].last_step == 10
