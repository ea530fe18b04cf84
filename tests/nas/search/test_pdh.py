"""Progressive Dynamic Hurdles against hurdles computed by hand, on real Optuna studies.

Every test builds its study trial by trial with ask / report / should_prune / tell, so the
values at each budget are chosen by the test and the expected hurdle is a mean or a quantile
written out in a comment. Boundaries are checked one float step either side of the hurdle
and on it. The last budget of each pruner is its top rung, where nothing is pruned.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import optuna
import pytest
import yaml
from optuna.pruners import SuccessiveHalvingPruner
from optuna.trial import TrialState

from nas.search import ProgressiveDynamicHurdles, clears, hurdle, make_pruner

optuna.logging.set_verbosity(optuna.logging.WARNING)

BUDGETS = (10, 20, 30)  # hurdles at 10 and 20; 30 is the top rung
CONF = Path(__file__).resolve().parents[3] / "conf" / "pruner"


Direction = Literal["minimize", "maximize"]


def study_with(
    direction: Direction, storage: str, tmp_path: Path, min_trials: int = 3, **options: Any
) -> optuna.Study:
    url = None if storage == "memory" else f"sqlite:///{tmp_path / 'study.db'}"
    pruner = ProgressiveDynamicHurdles(BUDGETS, min_trials=min_trials, **options)
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


def attrs(study: optuna.Study, number: int) -> dict[str, Any]:
    return study.trials[number].user_attrs


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
    with pytest.raises(ValueError, match=r"quantile must be a number in \[0, 1\], got 1.5"):
        hurdle([1.0], quantile=1.5)


def test_quantiles_rank_from_worst_to_best_so_higher_is_stricter() -> None:
    values = [3.0, 10.0, 1.0, 2.0]
    # Minimizing, worst to best: 10, 3, 2, 1. Position q * 3, interpolated linearly.
    assert hurdle(values, 0.0, "minimize") == 10.0
    assert hurdle(values, 0.5, "minimize") == 2.5  # between 3 and 2: the median
    assert hurdle(values, 0.75, "minimize") == 1.75  # 2 + (1 - 2) * 0.25
    assert hurdle(values, 1.0, "minimize") == 1.0  # the best
    # Maximizing, worst to best: 1, 2, 3, 10.
    assert hurdle(values, 0.0, "maximize") == 1.0
    assert hurdle(values, 0.5, "maximize") == 2.5
    assert hurdle(values, 0.75, "maximize") == 4.75  # 3 + (10 - 3) * 0.25
    assert hurdle(values, 1.0, "maximize") == 10.0
    assert hurdle([7.0], 0.3, "minimize") == 7.0


@pytest.mark.parametrize("storage", ["memory", "sqlite"])
@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_a_hurdle_against_a_hand_computed_mean(
    direction: Direction, storage: str, tmp_path: Path
) -> None:
    study = study_with(direction, storage, tmp_path)
    # Until three other trials reached step 10 there is no hurdle there: none is pruned,
    # not even 6.0 when minimizing or 1.0 when maximizing.
    assert run(study, {10: 1.0}) is None
    assert run(study, {10: 2.0}) is None
    assert pdh(study).hurdle_at(study, 10) is None  # 2 of 3 trials: no hurdle yet
    assert run(study, {10: 6.0}) is None
    assert attrs(study, 2)["pdh:hurdle:10"] is None  # judged with no hurdle: it passed
    assert pdh(study).hurdle_at(study, 10) == 3.0  # (1 + 2 + 6) / 3

    better = down if direction == "minimize" else up
    assert run(study, {10: 3.0}) == 10  # equal: stops, as in the paper
    assert attrs(study, 3) == {
        "pdh:hurdle:10": 3.0,
        "pdh:pruned_at": 10,
        "pdh:hurdle_at_prune": 3.0,
    }
    assert pdh(study).hurdle_at(study, 10) == 3.0  # (1 + 2 + 6 + 3) / 4
    assert run(study, {10: math.nan}) == 10  # NaN stops and does not count
    assert pdh(study).hurdle_at(study, 10) == 3.0
    assert run(study, {10: better(3.0)}) is None  # beats the hurdle by one float step
    assert attrs(study, 5)["pdh:hurdle:10"] == 3.0  # the hurdle it cleared
    assert "pdh:pruned_at" not in attrs(study, 5)
    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE] * 3 + [TrialState.PRUNED] * 2 + [TrialState.COMPLETE]


def test_the_hurdle_rises_as_better_trials_reach_the_rung() -> None:
    study = optuna.create_study(
        direction="minimize", pruner=ProgressiveDynamicHurdles(BUDGETS, min_trials=2)
    )
    assert run(study, {10: 4.0}) is None
    assert run(study, {10: 6.0}) is None  # hurdle now (4 + 6) / 2 = 5
    assert run(study, {10: 4.5}) is None  # 4.5 < 5: passes
    assert attrs(study, 2)["pdh:hurdle:10"] == 5.0
    assert run(study, {10: 1.0}) is None  # (4 + 6 + 4.5) / 3 = 4.83...
    assert run(study, {10: 1.0}) is None  # (4 + 6 + 4.5 + 1) / 4 = 3.875
    assert pdh(study).hurdle_at(study, 10) == 3.3  # (4 + 6 + 4.5 + 1 + 1) / 5
    # The same 4.5 that passed against 5 now fails: a hurdle frozen at 5 would let it on.
    assert run(study, {10: 4.5}) == 10
    assert attrs(study, 5)["pdh:pruned_at"] == 10
    assert attrs(study, 5)["pdh:hurdle_at_prune"] == 3.3


def test_a_quantile_hurdle_is_stricter_the_higher_it_is() -> None:
    def decides(quantile: float) -> int | None:
        pruner = ProgressiveDynamicHurdles(BUDGETS, 4, hurdle="quantile", quantile=quantile)
        study = optuna.create_study(direction="minimize", pruner=pruner)
        for value in (3.0, 10.0, 1.0, 2.0):
            assert run(study, {10: value}) is None  # fewer than 4 others: no hurdle
        return run(study, {10: 2.0})

    assert decides(0.5) is None  # the median of 10, 3, 2, 1 is 2.5: 2 beats it
    assert decides(0.75) == 10  # 1.75: 2 does not


def test_each_rung_counts_the_trials_that_reached_it_and_the_top_prunes_none() -> None:
    study = optuna.create_study(
        direction="minimize", pruner=ProgressiveDynamicHurdles(BUDGETS, min_trials=2)
    )
    assert run(study, {10: 4.0, 20: 3.0, 30: 9.0}) is None
    assert run(study, {10: 2.0, 20: 1.0, 30: 0.0}) is None  # hurdle at 10: (4 + 2) / 2 = 3
    assert run(study, {10: 5.0, 20: 0.0}) == 10  # never reaches 20, so never counts there
    # At 10: (4 + 2 + 5) / 3 = 3.67; at 20, trials 0 and 1: (3 + 1) / 2 = 2.
    assert run(study, {10: 2.5, 20: 2.0}) == 20  # passes 10, equal at 20
    assert attrs(study, 3)["pdh:pruned_at"] == 20
    # At 20, trials 0, 1, 3: (3 + 1 + 2) / 3 = 2. At the top rung, a far worse value
    # completes: a trial that cleared every hurdle trains to the end.
    assert run(study, {10: 2.5, 20: down(2.0), 30: 1e9}) is None
    assert pdh(study).values_at(study, 20) == {0: 3.0, 1: 1.0, 3: 2.0, 4: down(2.0)}
    assert pdh(study).hurdle_at(study, 30) == pytest.approx(1e9 / 3)  # (9 + 0 + 1e9) / 3
    assert pdh(study).passes(study, 30, 1e12, trial=4)
    assert "pdh:hurdle:30" not in attrs(study, 4)  # nothing is decided at the top


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
    running.report(9.0, 10)  # running, not yet judged at 10: a child, not yet counted
    assert pruner.values_at(study, 10) == {3: 1.0, 4: 2.0}
    assert not running.should_prune()  # 2 others: no hurdle yet
    assert pruner.values_at(study, 10) == {3: 1.0, 4: 2.0, 5: 9.0}  # judged: counts
    assert pruner.hurdle_at(study, 10) == 4.0  # (1 + 2 + 9) / 3
    assert pruner.hurdle_at(study, 10, exclude=5) is None
    study.tell(running, state=TrialState.FAIL)  # failed later: no longer counts
    assert pruner.hurdle_at(study, 10) is None


def test_no_pruning_away_from_the_budgets_or_before_a_hurdle() -> None:
    study = optuna.create_study(pruner=ProgressiveDynamicHurdles([10, 20], min_trials=2))
    for _ in range(2):
        assert run(study, {5: 0.0, 10: 0.0, 15: 0.0}) is None
    # Hurdles at 10: 0, then (0 + 0 - 1) / 3; a trial far worse elsewhere is judged at 10.
    assert run(study, {5: 1e9, 10: -1.0, 15: 1e9}) is None
    assert run(study, {5: -1e9, 10: 1.0, 15: -1e9}) == 10


def test_multi_objective_studies_use_the_recorded_metric() -> None:
    # Objectives: validation loss (minimize) and tokens per second (maximize).
    pruner = ProgressiveDynamicHurdles(BUDGETS, min_trials=2)
    study = optuna.create_study(directions=["minimize", "maximize"], pruner=pruner)

    def stage(loss: float) -> tuple[optuna.Trial, bool]:
        trial = study.ask()
        pruner.record(trial, 10, loss)
        return trial, pruner.passes(study, 10, loss, trial=trial)

    trial, ok = stage(5.0)
    with pytest.raises(NotImplementedError):  # why the helper exists
        trial.should_prune()
    assert ok
    study.tell(trial, [5.0, 100.0])
    trial, ok = stage(1.0)
    assert ok and pruner.hurdle_at(study, 10) == 3.0  # (5 + 1) / 2
    study.tell(trial, [1.0, 100.0])
    assert study.trials[1].user_attrs == {"pdh:10": 1.0, "pdh:hurdle:10": None}

    trial, ok = stage(3.0)  # equal to the hurdle: stop
    assert not ok
    assert trial.user_attrs["pdh:pruned_at"] == 10  # written through the Trial
    study.tell(trial, state=TrialState.PRUNED)  # how the harness ends it
    trial, ok = stage(2.0)  # (5 + 1 + 3) / 3 = 3
    assert ok
    study.tell(trial, [2.0, 50.0])
    assert study.trials[3].user_attrs["pdh:hurdle:10"] == 3.0
    # The direction defaults to the first objective's and can be given for a metric to
    # maximize; without a trial nothing is written; given its number, through the storage.
    assert pruner.hurdle_at(study, 10) == 2.75  # (5 + 1 + 3 + 2) / 4
    assert not pruner.passes(study, 10, 3.0)
    assert pruner.passes(study, 10, 3.0, direction="maximize")
    late = study.ask()
    pruner.record(late, 10, 9.0)
    assert not pruner.passes(study, 10, 9.0, trial=late.number)
    assert study.trials[4].user_attrs["pdh:hurdle_at_prune"] == 2.75
    assert pruner.passes(study, 20, 1e9)  # no hurdle at 20 yet
    with pytest.raises(ValueError, match="budget 15 is not one of the budgets"):
        pruner.passes(study, 15, 0.0)


@pytest.mark.parametrize(
    ("budgets", "options", "message"),
    [
        ([], {}, r"at least two step counts.*got \[\]"),
        ([10], {}, r"at least two step counts.*top rung\), got \[10\]"),
        ("10", {}, "budgets must be a sequence of step counts, got '10'"),
        ([10, 10], {}, r"strictly increasing, got \[10, 10\]"),
        ([20, 10], {}, r"strictly increasing, got \[20, 10\]"),
        ([0, 10], {}, "positive integer, got 0"),
        ([1.5, 10], {}, "positive integer, got 1.5"),
        ([True, 10], {}, "positive integer, got True"),
        ([10, 20], {"min_trials": 0}, "min_trials must be a positive integer, got 0"),
        ([10, 20], {"min_trials": 2.0}, "min_trials must be a positive integer, got 2.0"),
        ([10, 20], {"hurdle": "median"}, "hurdle must be 'mean' or 'quantile', got 'median'"),
        ([10, 20], {"quantile": 0.5}, "quantile=0.5 needs hurdle='quantile'"),
        ([10, 20], {"hurdle": "quantile"}, "hurdle='quantile' needs quantile"),
        ([10, 20], {"hurdle": "quantile", "quantile": -0.1}, r"\[0, 1\], got -0.1"),
        ([10, 20], {"hurdle": "quantile", "quantile": "0.5"}, r"\[0, 1\], got '0.5'"),
    ],
)
def test_bad_arguments_are_named(budgets: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProgressiveDynamicHurdles(budgets, **options)


def test_make_pruner_pdh_prunes_inside_optimize() -> None:
    curves = {0: 1.0, 1: 3.0, 2: 2.0, 3: 0.5, 4: 4.0}  # trial -> value at every budget

    def objective(trial: optuna.Trial) -> float:
        for step in (10, 20):
            trial.report(curves[trial.number] * step, step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return curves[trial.number] * 20

    pruner = make_pruner("pdh", budgets=[10, 20], min_trials=3, hurdle="mean")
    study = optuna.create_study(direction="maximize", pruner=pruner)
    study.optimize(objective, n_trials=5)
    # At 10 the hurdle for trial 3 is (10 + 30 + 20) / 3 = 20: it (5) stops; for trial 4
    # (10 + 30 + 20 + 5) / 4 = 16.25, which 40 beats. 20 is the top rung: no hurdle there.
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3 + ["PRUNED", "COMPLETE"]
    assert study.trials[3].user_attrs == {
        "pdh:hurdle:10": 20.0,
        "pdh:pruned_at": 10,
        "pdh:hurdle_at_prune": 20.0,
    }
    assert study.trials[4].user_attrs == {"pdh:hurdle:10": 16.25}


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_pruner_config_builds(path: Path) -> None:
    conf = yaml.safe_load(path.read_text())
    assert conf["name"] == path.stem
    assert make_pruner(conf["name"], **conf["options"]) is not None


def test_successive_halving_is_selectable() -> None:
    pruner = make_pruner("sha", min_resource=10, reduction_factor=3)
    assert isinstance(pruner, SuccessiveHalvingPruner)
    study = optuna.create_study(direction="minimize", pruner=pruner)
    assert [run(study, {10: v}) for v in (1.0, 2.0, 0.5, 3.0)] == [None, 10, None, 10]
