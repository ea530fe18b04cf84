"""Pictures of a study as PNG files: what the report shows and the W&B study run logs.

A stored study is drawn with Optuna's own matplotlib plots where one fits: the Pareto front
(`plot_pareto`), every trial's reported fitness over its steps (`plot_intermediate_values`)
and when each trial ran in which state (`plot_timeline`). Optuna has none for the fitness
against wall-clock time (its history is by trial number; here pruned trials are marked at
their last evaluation) nor for which layers each stage held (`plot_partition`), so those two
are drawn here. The W&B tracker holds rows, not a study (`Tracker.end_study`): its front
picture is drawn from them (`save_pareto_plot`).

Everything is drawn on the Agg canvas, saved and closed: nothing is shown on screen.
Optuna's functions switch to its style sheet; they run inside an rc context, so the other
pictures keep matplotlib's defaults, and without Optuna's notice that they are experimental.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna
    from matplotlib.axes import Axes

__all__ = [
    "numeric_pairs",
    "plot_history",
    "plot_intermediate_values",
    "plot_pareto",
    "plot_partition",
    "plot_timeline",
    "save_pareto_plot",
]


def numeric_pairs(rows: Sequence[Mapping[str, Any]], x: str, y: str) -> list[tuple[float, float]]:
    """(row[x], row[y]) of the rows where both are finite numbers (booleans excluded)."""
    pairs = []
    for row in rows:
        a, b = row.get(x), row.get(y)
        if isinstance(a, bool) or isinstance(b, bool):
            continue
        if not isinstance(a, int | float) or not isinstance(b, int | float):
            continue
        if math.isfinite(a) and math.isfinite(b):
            pairs.append((float(a), float(b)))
    return pairs


def save_pareto_plot(
    trials: Sequence[Mapping[str, Any]],
    front: Sequence[Mapping[str, Any]],
    x: str,
    y: str,
    path: str | Path,
    title: str = "Pareto front",
) -> Path | None:
    """Save a PNG scatter of `trials` on columns `x` and `y` with the `front` rows marked.

    Drawn here, not by Optuna: a tracker has the trials' rows, not an `optuna.Study`.
    Returns the path, or None when nothing can be drawn (no trial has both values as
    finite numbers, or matplotlib is not installed).
    """
    points = numeric_pairs(trials, x, y)
    best = sorted(numeric_pairs(front, x, y))
    if not points and not best:
        return None
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    figure = Figure(figsize=(6, 4.5), layout="constrained")
    axes = figure.add_subplot()
    if points:
        axes.scatter(
            [p[0] for p in points], [p[1] for p in points], s=18, color="0.6", label="trials"
        )
    if best:
        axes.plot(
            [p[0] for p in best], [p[1] for p in best], marker="o", color="C3", label="Pareto front"
        )
    axes.set_xlabel(x)
    axes.set_ylabel(y)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path


def _pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg canvas, imported when a plot is drawn (~0.8 s): a
    process that imports this module and draws nothing does not pay for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _optuna_plot(draw: Callable[[], Axes], path: Path) -> Path:
    """Save the figure of one of Optuna's matplotlib plots (`draw`) to `path` and close it;
    its style sheet and its notice that the plots are experimental stay inside."""
    import matplotlib
    from matplotlib.figure import Figure
    from optuna.exceptions import ExperimentalWarning

    plt = _pyplot()
    with matplotlib.rc_context(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        axes = draw()
        figure = axes.get_figure()
        assert isinstance(figure, Figure), "an Optuna plot draws on a figure of its own"
        figure.savefig(path, bbox_inches="tight")  # with a legend beside the axes
    plt.close(figure)
    return path


def plot_pareto(study: optuna.Study, objectives: list[str] | tuple[str, ...], path: Path) -> Path:
    """The first two objectives of every complete trial, the Pareto front (and trials that
    break a constraint) marked: Optuna's `plot_pareto_front`."""
    from optuna.visualization.matplotlib import plot_pareto_front

    return _optuna_plot(
        lambda: plot_pareto_front(
            study, target_names=list(objectives[:2]), targets=lambda t: t.values[:2]
        ),
        path,
    )


def plot_intermediate_values(study: optuna.Study, path: Path) -> Path | None:
    """The fitness every trial reported at its evaluations (`trial.report`), pruned trials'
    curves included: Optuna's `plot_intermediate_values`. None when no trial reported one
    (a multi-objective study reports none)."""
    from optuna.visualization.matplotlib import plot_intermediate_values as draw

    if not any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
        return None
    return _optuna_plot(lambda: draw(study), path)


def plot_timeline(study: optuna.Study, path: Path) -> Path | None:
    """When each trial ran and how it ended: Optuna's `plot_timeline`; None without trials."""
    from optuna.visualization.matplotlib import plot_timeline as draw

    if not study.get_trials(deepcopy=False):
        return None
    return _optuna_plot(lambda: draw(study), path)


def plot_history(study: optuna.Study, path: Path, fitness: str = "validation_loss") -> Path:
    """The fitness (first objective) of every trained trial against the wall-clock time it
    finished at, pruned trials marked (their last evaluation), and the best so far."""
    import optuna

    trained = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.datetime_complete and (t.values or fitness in t.user_attrs)
    ]
    trained.sort(key=lambda t: t.datetime_complete)  # type: ignore[arg-type, return-value]
    starts = [t.datetime_start for t in study.trials if t.datetime_start]
    zero = min(starts) if starts else None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    better = max if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else min
    xs: list[float] = []
    best: list[float] = []
    for t in trained:
        x = (t.datetime_complete - zero).total_seconds() / 60 if zero else 0.0  # type: ignore[operator]
        y = t.values[0] if t.values else float(t.user_attrs[fitness])
        pruned = t.state == optuna.trial.TrialState.PRUNED
        ax.scatter(
            [x], [y], marker="x" if pruned else "o", color="tab:red" if pruned else "tab:blue", s=30
        )
        if t.state == optuna.trial.TrialState.COMPLETE:
            xs.append(x)
            best.append(better(best[-1], y) if best else y)
    if xs:
        ax.step(xs, best, where="post", color="black", label="best so far")
    ax.scatter([], [], marker="o", color="tab:blue", label="complete")
    ax.scatter([], [], marker="x", color="tab:red", label="pruned")
    ax.set(
        xlabel="wall-clock time (minutes since the study began)",
        ylabel=fitness.replace("_", " "),
        title="optimization history",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_partition(trial: optuna.trial.FrozenTrial, path: Path) -> Path:
    """Which layers each stage held, step by step, in `trial` (its `partition_history`)."""
    history = trial.user_attrs.get("partition_history") or [[0, trial.user_attrs["partition"]]]
    last = max(int(trial.user_attrs.get("steps", 0)), int(history[-1][0]) + 1)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    colours = plt.get_cmap("tab10")
    for i, (start, sizes) in enumerate(history):
        end = history[i + 1][0] if i + 1 < len(history) else last
        low = 0
        for stage, size in enumerate(sizes):
            ax.broken_barh(
                [(start, max(end - start, 1))],
                (low, size),
                color=colours(stage),
                label=f"stage {stage}" if i == 0 else None,
            )
            low += size
    ax.set(
        xlabel="step",
        ylabel="layers (first to last)",
        title=f"partition over time, best trial {trial.number}",
    )
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
