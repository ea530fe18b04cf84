"""The pictures of a study: the W&B front drawn from rows (numeric rows only, skipped when
there are none), and a real Optuna study drawn by Optuna's plots where they fit and by ours
where they do not, without Optuna's style or warnings leaking out."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import matplotlib
import optuna
import pytest

from nas.tracking.plots import (
    numeric_pairs,
    plot_history,
    plot_intermediate_values,
    plot_pareto,
    plot_partition,
    plot_timeline,
    save_pareto_plot,
)

ROWS: list[dict[str, Any]] = [
    {"loss": 1.0, "tokens_per_s": 100},
    {"loss": 0.5, "tokens_per_s": 50.0},
    {"loss": None, "tokens_per_s": 10},  # a failed trial
    {"loss": math.nan, "tokens_per_s": 10},
    {"loss": True, "tokens_per_s": 10},
    {"tokens_per_s": 10},
]


def is_png(path: Path | None) -> bool:
    return path is not None and path.read_bytes().startswith(b"\x89PNG")


def test_numeric_pairs_skip_missing_and_non_finite_values() -> None:
    assert numeric_pairs(ROWS, "loss", "tokens_per_s") == [(1.0, 100.0), (0.5, 50.0)]


def test_the_picture_is_a_png(tmp_path: Path) -> None:
    path = save_pareto_plot(ROWS, ROWS[:2], "loss", "tokens_per_s", tmp_path / "a" / "p.png")
    assert path == tmp_path / "a" / "p.png" and is_png(path)
    assert save_pareto_plot(ROWS[2:], [], "loss", "tokens_per_s", tmp_path / "q.png") is None
    assert not (tmp_path / "q.png").exists()


def single_objective_study() -> optuna.Study:
    """Six trials reporting a fitness at three steps, the highest pruned at its last; one
    more waiting."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", 0, 1)
        for step in range(3):
            trial.report(x + 1 / (step + 1), step)
        if x > 0.7:
            trial.set_user_attr("validation_loss", x + 1 / 3)
            raise optuna.TrialPruned()
        trial.set_user_attr("partition_history", [[0, [2, 2]], [2, [1, 3]]])
        return x

    study.optimize(objective, n_trials=6)
    study.enqueue_trial({"x": 0.5})
    return study


@pytest.mark.timeout(120)
def test_a_single_objective_study_is_drawn_with_its_curves_and_timeline(tmp_path: Path) -> None:
    study = single_objective_study()
    facecolor = matplotlib.rcParams["axes.facecolor"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        drawn = [
            plot_history(study, tmp_path / "history.png", "validation_loss"),
            plot_intermediate_values(study, tmp_path / "curves.png"),
            plot_timeline(study, tmp_path / "timeline.png"),
            plot_partition(study.best_trial, tmp_path / "partition.png"),
        ]
    assert all(is_png(path) for path in drawn)
    assert not [w for w in caught if issubclass(w.category, optuna.exceptions.ExperimentalWarning)]
    assert matplotlib.rcParams["axes.facecolor"] == facecolor  # Optuna's style stayed inside
    empty = optuna.create_study()
    assert plot_timeline(empty, tmp_path / "none.png") is None
    assert plot_intermediate_values(empty, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


@pytest.mark.timeout(120)
def test_a_multi_objective_study_shows_its_front_on_the_first_two_objectives(
    tmp_path: Path,
) -> None:
    study = optuna.create_study(
        directions=["maximize", "minimize", "minimize"],
        sampler=optuna.samplers.RandomSampler(seed=0),
    )

    def objective(trial: optuna.Trial) -> tuple[float, float, float]:
        x = trial.suggest_float("x", 0, 1)
        trial.set_constraint("memory", x - 0.8)  # the highest break the budget
        return x, x**2, 1.0

    study.optimize(objective, n_trials=8)
    objectives = ("validation_chrf", "parameters", "peak_memory_bytes")
    assert is_png(plot_pareto(study, objectives, tmp_path / "front.png"))
    assert plot_intermediate_values(study, tmp_path / "curves.png") is None  # none reported
    assert not (tmp_path / "curves.png").exists()
