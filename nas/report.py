"""What a user sees when a study ends: the best trials, plots, and where everything is.

Printed with rich: a table of the best trials (values, architecture, parameters, state),
the best architecture's summary, and the commands to open the study in `optuna-dashboard`
and to upload the offline W&B runs (`wandb sync`). PNG plots go to the run folder:
optimization history, the Pareto front for multi-objective studies, and which layers each
stage held over the best trial's steps (its partition, and the migrations that changed it).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import optuna
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nas.settings import TASK_METRICS, NasSettings
from nas.study import StudyResult

__all__ = ["plot_history", "plot_pareto", "plot_partition", "report_study"]


def report_study(
    settings: NasSettings, result: StudyResult, console: Console | None = None
) -> None:
    """Print the best trials and where the results are; write the plots."""
    console = console or Console()
    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    table = Table(title=f"study {study.study_name}: {result.finished} trials finished")
    objectives = list(settings.study.objectives)
    measured = [m for m in TASK_METRICS[settings.task.name] if m not in objectives]
    extra = [m for m in ("parameters",) if m not in objectives]
    for column in ["trial", "state", *objectives, *measured, *extra]:
        name = column.removeprefix("validation_")
        table.add_column(name, no_wrap=True, min_width=10 if name == "state" else len(name))
    table.add_column("architecture", no_wrap=True, overflow="ellipsis")  # one line
    best = {t.number for t in study.best_trials} if complete else set()
    shown = [t for t in study.get_trials(deepcopy=False) if not t.user_attrs.get("invalid")]
    for t in sorted(shown, key=lambda t: t.number):
        values = [f"{v:.4g}" for v in t.values] if t.values else ["-"] * len(study.directions)
        others = [_cell(t.user_attrs.get(m)) for m in (*measured, *extra)]
        state = t.state.name.lower() + (" *" if t.number in best else "")
        cause = t.user_attrs.get("fail_reason", "")
        text = escape((cause or t.user_attrs.get("architecture", ""))[:70])  # [..] is not markup
        table.add_row(str(t.number), state, *values, *others, text)
    console.print(table)
    if complete:
        top = study.best_trials[0]
        console.print(f"best architecture (trial {top.number}, "
                      f"{top.user_attrs.get('parameters', '?')} parameters): "
                      f"{escape(top.user_attrs.get('architecture', '?'))}",
                      soft_wrap=True)  # fmt: skip
    skipped = len(study.trials) - len(shown)
    if skipped:
        console.print(f"{skipped} proposed architectures fell outside the parameter "
                      "window and were skipped (failed trials, their cause in the storage)")
    out = Path(settings.output_dir)
    plots = [plot_history(study, out / "optimization_history.png", settings.study.fitness)]
    if len(study.directions) > 1 and complete:
        plots.append(plot_pareto(study, settings.study.objectives, out / "pareto_front.png"))
    if complete:
        plots.append(plot_partition(study.best_trials[0], out / "partition_best_trial.png"))
    # commands and paths unwrapped, so they can be copied whole
    console.print(f"plots: {', '.join(str(p) for p in plots)}", soft_wrap=True)
    console.print(f"dashboard: optuna-dashboard {result.storage}", soft_wrap=True)
    if result.run_dirs:
        console.print(f"W&B (offline): wandb sync {' '.join(result.run_dirs)}", soft_wrap=True)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def plot_history(study: optuna.Study, path: Path, fitness: str = "validation_loss") -> Path:
    """The fitness (first objective) of every trained trial, and the best so far."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.values or
              fitness in t.user_attrs]  # fmt: skip
    xs = [t.number for t in trials]
    ys = [t.values[0] if t.values else t.user_attrs[fitness] for t in trials]
    better = max if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else min
    best: list[float] = []
    for y in ys:
        best.append(better(best[-1], y) if best else y)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(xs, ys, label="trial")
    ax.step(xs, best, where="post", color="black", label="best so far")
    ax.set(xlabel="trial", ylabel=fitness.replace("_", " "), title="optimization history")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_pareto(study: optuna.Study, objectives: list[str] | tuple[str, ...], path: Path) -> Path:
    """The first two objectives of every complete trial; the Pareto front highlighted."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    front = {t.number for t in study.best_trials}
    fig, ax = plt.subplots(figsize=(6, 4))
    for on_front, colour in ((False, "lightgray"), (True, "tab:red")):
        points = [t.values[:2] for t in complete if (t.number in front) == on_front]
        if points:
            ax.scatter(*zip(*points, strict=True), color=colour,
                       label="Pareto front" if on_front else "trial")  # fmt: skip
    ax.set(xlabel=objectives[0], ylabel=objectives[1], title="Pareto front")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_partition(trial: optuna.trial.FrozenTrial, path: Path) -> Path:
    """Which layers each stage held, step by step, in `trial` (its `partition_history`)."""
    history = trial.user_attrs.get("partition_history") or [[0, trial.user_attrs["partition"]]]
    last = max(int(trial.user_attrs.get("steps", 0)), int(history[-1][0]) + 1)
    fig, ax = plt.subplots(figsize=(6, 4))
    colours = plt.get_cmap("tab10")
    for i, (start, sizes) in enumerate(history):
        end = history[i + 1][0] if i + 1 < len(history) else last
        low = 0
        for stage, size in enumerate(sizes):
            ax.broken_barh([(start, max(end - start, 1))], (low, size), color=colours(stage),
                           label=f"stage {stage}" if i == 0 else None)  # fmt: skip
            low += size
    ax.set(xlabel="step", ylabel="layers (first to last)",
           title=f"partition over time, best trial {trial.number}")  # fmt: skip
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
