"""What a user sees when a study ends: the best trials, plots, and where everything is.

Printed with rich: a table of the best trials (values, architecture, parameters, state),
the best architecture's summary, and the commands to open the study in `optuna-dashboard`
and to upload the offline W&B runs (`wandb sync`). PNG plots go to the run folder:
optimization history, the Pareto front for multi-objective studies, and which layers each
stage held over the best trial's steps (its partition, and the migrations that changed it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import optuna
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nas.paired import REFERENCE
from nas.retrain.results import RetrainResult, model_table
from nas.settings import NasSettings, task_metrics
from nas.storage.opening import dashboard_target, make_storage
from nas.study import trials
from nas.study.run import StudyResult
from nas.tasks import task_class
from search_spaces.architecture import functional_key

__all__ = ["plot_history", "plot_pareto", "plot_partition", "report_study"]


def report_study(
    settings: NasSettings,
    result: StudyResult | None,
    retrained: RetrainResult | None = None,
    console: Console | None = None,
) -> None:
    """Print the trials, the retrained models and where everything is; write the plots.
    `result` is None when this run only retrained (`stages=[retrain]`)."""
    console = console or Console()
    storage_url = result.storage if result else settings.storage_url
    study = optuna.load_study(study_name=settings.study.name, storage=make_storage(storage_url))
    console.print(_trials_table(settings, study, console.width))
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if complete:
        top = study.best_trials[0]
        console.print(
            f"best architecture (trial {top.number}, "
            f"{top.user_attrs.get('parameters', '?')} parameters): "
            f"{escape(top.user_attrs.get('architecture', '?'))}",
            soft_wrap=True,
        )
    skipped = [t.user_attrs for t in study.trials if t.user_attrs.get(trials.INVALID)]
    repeats = sum(trials.DUPLICATE_OF in attrs for attrs in skipped)
    if skipped:
        console.print(
            f"{len(skipped) - repeats} proposed architectures fell outside the parameter "
            f"window and {repeats} repeated one already trained; they were skipped (failed "
            "trials, their cause in the storage)"
        )
    out = Path(settings.output_dir)
    plots = [plot_history(study, out / "optimization_history.png", settings.study.fitness)]
    if len(study.directions) > 1 and complete:
        plots.append(plot_pareto(study, settings.study.objectives, out / "pareto_front.png"))
    if complete:
        plots.append(plot_partition(study.best_trials[0], out / "partition_best_trial.png"))
    run_dirs = list(result.run_dirs) if result else []
    if retrained is not None:
        _report_retrained(settings, retrained, console)
        run_dirs += retrained.run_dirs
    # commands and paths unwrapped, so they can be copied whole
    console.print(f"plots: {', '.join(str(p) for p in plots)}", soft_wrap=True)
    console.print(f"dashboard: optuna-dashboard {dashboard_target(storage_url)}", soft_wrap=True)
    if run_dirs:
        console.print(f"W&B (offline): wandb sync {' '.join(run_dirs)}", soft_wrap=True)


def _trials_table(settings: NasSettings, study: optuna.Study, width: int = 100) -> Table:
    """One line per trial: state, objectives, the task's metrics, size, speed, memory; the
    architecture's short name (or the failure's cause) takes what width is left."""
    objectives = list(settings.study.objectives)
    measured = [m for m in task_metrics(settings.task.name) if m not in objectives]
    extra = [m for m in ("parameters", "samples_per_s", "peak_memory_bytes") if m not in objectives]
    best = {t.number for t in study.best_trials} if study.best_trials else set()
    shown = [t for t in study.get_trials(deepcopy=False) if not t.user_attrs.get("invalid")]
    finished = sum(t.state.is_finished() for t in shown)  # the skipped are counted below
    base = _reference_parameters(settings, shown)
    rows = []
    for t in sorted(shown, key=lambda t: t.number):
        values = [f"{v:.4g}" for v in t.values] if t.values else ["-"] * len(study.directions)
        others = [_cell(t.user_attrs.get(m), m, base) for m in (*measured, *extra)]
        state = t.state.name.lower() + (" *" if t.number in best else "")
        text = (
            t.user_attrs.get("fail_reason")
            or t.user_attrs.get("short_name")
            or t.user_attrs.get("architecture", "")
        )
        rows.append([str(t.number), state, *values, *others, escape(text[:70])])
    table = Table(
        title=f"study {study.study_name}: {finished} trials",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    used = 0
    for i, column in enumerate(["trial", "state", *objectives, *measured, *extra]):
        name = _HEADERS.get(column, column.removeprefix("validation_"))
        fits = max([len(name)] + [len(row[i]) for row in rows])  # numbers are never cut
        table.add_column(name, no_wrap=True, min_width=fits)
        used += fits + 2
    table.add_column(
        "architecture", no_wrap=True, overflow="ellipsis", max_width=max(12, width - used - 2)
    )  # one line, what width is left
    for row in rows:
        table.add_row(*row)
    return table


def _report_retrained(settings: NasSettings, retrained: RetrainResult, console: Console) -> None:
    """The retrained models side by side (mean ± sd over their seeds, the chosen one first
    and starred; then each against the reference seed model, paired by training seed; then
    the test figures), where each was exported, and how to load the chosen one."""
    if retrained.selection is not None:
        chosen = model_table(retrained.selection.runs, retrained.fitness)
        seeds = sorted({run.seed for run in retrained.selection.runs})
        figures = ", ".join(
            f"{r['model']} {r.get(f'{retrained.fitness}_mean', math.nan):.4g}" for r in chosen
        )
        console.print(
            f"chosen on training seeds {seeds} (mean {retrained.fitness}): {figures}; "
            f"{retrained.selection.selected} judged below on seeds no choice saw"
        )
    rows = model_table(retrained.runs, retrained.fitness)
    table = Table(
        title=f"retrained from scratch: {len(retrained.runs)} runs, chosen on "
        "validation, test split read once",
        box=box.SIMPLE_HEAD,
    )
    table.add_column("")
    for row in rows:
        star = " *" if row["model"] == retrained.selected else ""
        table.add_column(row["model"] + star, justify="right", no_wrap=True)
    table.add_row("seeds (failed)", *[f"{r['seeds']} ({r['failed']})" for r in rows])
    _metric_rows(table, rows, task_metrics(settings.task.name))
    for metric in dict.fromkeys(m for pairs in retrained.paired.values() for m in pairs):
        cells = [_paired_cell(retrained, r["model"], metric) for r in rows]
        table.add_row(f"Δ {_short(metric)} vs {retrained.reference}", *cells)
    _metric_rows(table, rows, ("test_loss", "samples_per_s"))
    table.add_row("parameters", *_parameter_cells(rows, retrained.reference))
    console.print(table)
    for run in retrained.runs:
        if run.error:
            console.print(
                f"retrain {run.model} seed {run.seed} failed: {escape(run.error.splitlines()[0])}"
            )
    for name, folder in retrained.exported.items():
        console.print(f"exported {name}: {folder}", soft_wrap=True)
    if retrained.selected and retrained.selected in retrained.exported:
        folder = retrained.exported[retrained.selected]
        task = task_class(settings.task.name)
        model = "ExportedModel" if task.decoder_only else "TranslationModel"
        call = task.example_call
        console.print(
            f"load the chosen model ({retrained.selected}): "
            f'python -c "from nas.export.pretrained import '
            f"{model}; m = {model}.from_pretrained('{folder}'); print({call})\"\n"
            f"  or: python -c \"import nas; m = nas.load_model('{folder}'); print({call})\"",
            soft_wrap=True,
        )


def _parameter_cells(rows: list[dict[str, Any]], reference: str | None) -> list[str]:
    """Each model's parameters, and their ratio to the reference seed model's when it was
    retrained: `252,081 (1.012x)`."""
    sizes = {r["model"]: r["parameters"] for r in rows}
    base = sizes.get(reference) if reference else None
    if not isinstance(base, int) or base <= 0:
        return [str(size) for size in sizes.values()]
    return [
        f"{size:,} ({size / base:.3f}x)" if isinstance(size, int) else str(size)
        for size in sizes.values()
    ]


def _metric_rows(table: Table, rows: list[dict[str, Any]], metrics: Iterable[str]) -> None:
    """A row per metric any model has: mean ± sd over its seeds, "-" where a model lacks it."""
    for m in metrics:
        if any(f"{m}_mean" in row for row in rows):
            cells = [
                f"{r[f'{m}_mean']:.4g} ± {r[f'{m}_sd']:.2g}" if f"{m}_mean" in r else "-"
                for r in rows
            ]
            table.add_row(m.replace("_", " "), *cells)


def _paired_cell(retrained: RetrainResult, model: str, metric: str) -> str:
    """A model's paired difference from the reference, e.g. `-0.012 ± 0.004 (3/3 better)`:
    the mean, its standard error (none from one seed), on how many of the shared seeds the
    model was better; `=` for the reference itself, `-` where no seed is shared."""
    if model == retrained.reference:
        return "="
    pair = retrained.paired.get(model, {}).get(metric)
    if pair is None or pair.n == 0:
        return "-"
    spread = f" ± {pair.stderr:.2g}" if pair.n > 1 else ""
    return f"{pair.mean:+.3g}{spread} ({pair.wins}/{pair.n} better)"


def _short(metric: str) -> str:
    return metric.replace("validation_", "val ").replace("_", " ")


_HEADERS = {
    "samples_per_s": "smp/s",
    "peak_memory_bytes": "MB",
    "parameters": "params (x ET)",
    "validation_exact_match": "exact",
    "validation_accuracy": "acc",
    "validation_bits_per_char": "bpc",
    "trial": "#",
}


def _reference_parameters(
    settings: NasSettings, shown: list[optuna.trial.FrozenTrial]
) -> int | None:
    """The Evolved Transformer seed's parameters as its trial recorded them (None when the
    study has no such trial): every model's size is shown against it."""
    seed = trials.seed_architectures(settings).get(REFERENCE)
    if seed is None:
        return None
    digest = trials.model_digest(functional_key(seed))
    sizes = [t.user_attrs.get("parameters") for t in shown]
    found = [
        size
        for t, size in zip(shown, sizes, strict=True)
        if t.user_attrs.get(trials.MODEL_DIGEST) == digest and isinstance(size, int) and size > 0
    ]
    return found[0] if found else None


def _cell(value: object, column: str = "", base: int | None = None) -> str:
    """A table cell: MB for memory, parameters with their ratio to `base` (the ET's)."""
    if column == "peak_memory_bytes" and isinstance(value, int | float):
        return f"{value / 2**20:.0f}"
    if column == "parameters" and isinstance(value, int) and base:
        return f"{value:,} ({value / base:.3f}x)"
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg canvas, imported when a plot is drawn (~0.8 s): a
    process that imports this module and draws nothing does not pay for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_history(study: optuna.Study, path: Path, fitness: str = "validation_loss") -> Path:
    """The fitness (first objective) of every trained trial against the wall-clock time it
    finished at, pruned trials marked (their last evaluation), and the best so far."""
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


def plot_pareto(study: optuna.Study, objectives: list[str] | tuple[str, ...], path: Path) -> Path:
    """The first two objectives of every complete trial; the Pareto front highlighted."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    front = {t.number for t in study.best_trials}
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for on_front, colour in ((False, "lightgray"), (True, "tab:red")):
        points = [t.values[:2] for t in complete if (t.number in front) == on_front]
        if points:
            ax.scatter(
                *zip(*points, strict=True),
                color=colour,
                label="Pareto front" if on_front else "trial",
            )
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
