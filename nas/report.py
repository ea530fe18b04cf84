"""What a user sees when a study ends: the best trials, plots, and where everything is.

Printed with rich: a table of the best trials (values, architecture, parameters, state),
the best architecture's summary, and the commands to open the study in `optuna-dashboard`
and to upload the offline W&B runs (`wandb sync`). PNG plots go to the run folder
(`nas.tracking.plots`): optimization history, the Pareto front for multi-objective studies,
which layers each stage held over the best trial's steps (its partition, and the migrations
that changed it), the fitness every trial reported at its evaluations (a single-objective
study's) and the timeline of the trials.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import optuna
from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table

from nas.paired import REFERENCE, PairedDifference
from nas.retrain.results import RetrainResult, model_table
from nas.search.fidelity import Fidelity
from nas.settings import NasSettings, task_metrics
from nas.storage.opening import dashboard_target, make_storage
from nas.study import leading, phases, promotion, trials
from nas.study.run import StudyResult
from nas.study.space import seed_models
from nas.tasks import task_class
from nas.tracking.plots import (
    plot_history,
    plot_intermediate_values,
    plot_pareto,
    plot_partition,
    plot_timeline,
)
from nas.tracking.pool_plot import save_pool_plot
from search_spaces.architecture import functional_key

__all__ = ["report_study"]


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
        top = _best(settings, study)
        console.print(
            f"best architecture (trial {top.number}, "
            f"{top.user_attrs.get('parameters', '?')} parameters): "
            f"{escape(top.user_attrs.get('architecture', '?'))}",
            soft_wrap=True,
        )
    if settings.study.fidelity == Fidelity.INHERITED and settings.study.promote:
        _report_promotion(settings, study, console)
    skipped = [t.user_attrs for t in study.trials if t.user_attrs.get(trials.INVALID)]
    repeats = sum(trials.DUPLICATE_OF in attrs for attrs in skipped)
    if skipped:
        console.print(
            f"{len(skipped) - repeats} proposed architectures fell outside the parameter "
            f"window and {repeats} repeated one already trained; they were skipped (failed "
            "trials, their cause in the storage)"
        )
    _report_time(study, console)
    out = Path(settings.output_dir)
    plots = [plot_history(study, out / "optimization_history.png", settings.study.fitness)]
    if len(study.directions) > 1 and complete:
        plots.append(plot_pareto(study, settings.study.objectives, out / "pareto_front.png"))
    if complete:
        plots.append(plot_partition(study.best_trials[0], out / "partition_best_trial.png"))
    pool = save_pool_plot(trials.trials_table(study), out / "stage_pool.png")  # on the pool
    if pool is not None:
        plots.append(pool)
    for drawn in (
        plot_intermediate_values(study, out / "intermediate_values.png"),
        plot_timeline(study, out / "timeline.png"),
    ):
        if drawn is not None:
            plots.append(drawn)
    run_dirs = list(result.run_dirs) if result else []
    if retrained is not None:
        _report_retrained(settings, retrained, console)
        run_dirs += retrained.run_dirs
    # commands and paths unwrapped, so they can be copied whole
    console.print(f"plots: {', '.join(str(p) for p in plots)}", soft_wrap=True)
    console.print(f"dashboard: optuna-dashboard {dashboard_target(storage_url)}", soft_wrap=True)
    if run_dirs:
        console.print(f"W&B (offline): wandb sync {' '.join(run_dirs)}", soft_wrap=True)


def _report_time(study: optuna.Study, console: Console) -> None:
    """Where the trials' seconds went (`nas.study.phases`): training steps and fixed costs."""
    total, by_phase = phases.shares(t.user_attrs for t in study.get_trials(deepcopy=False))
    if total > 0:
        parts = ", ".join(f"{name} {share:.0%}" for name, share in by_phase.items())
        console.print(
            f"the trials' {total / 60:.1f} min: {parts} (before: start-up and between trials)"
        )


def _trials_table(settings: NasSettings, study: optuna.Study, width: int = 100) -> Group:
    """One line per trial: state, objectives, the task's metrics, size, speed, memory (a
    metric no trial recorded is left out); the architecture's short name (or the failure's
    cause) in what width is left, or, where that would cut it, listed under the table with
    the columns that did not fit `width` (nothing is cut)."""
    objectives = list(settings.study.objectives)
    measured = [m for m in task_metrics(settings.task.name) if m not in objectives]
    extra = [
        m
        for m in ("parameters", "n_stages", "samples_per_s", "peak_memory_bytes")
        if m not in objectives
    ]
    best = {t.number for t in study.best_trials} if study.best_trials else set()
    shown = [t for t in study.get_trials(deepcopy=False) if not t.user_attrs.get("invalid")]
    finished = sum(t.state.is_finished() for t in shown)  # the skipped are counted below
    base = _reference_parameters(settings, shown)
    recorded = [m for m in (*measured, *extra) if any(m in t.user_attrs for t in shown)]
    rows, names = [], []
    study_attrs = study.user_attrs
    for t in sorted(shown, key=lambda t: t.number):
        values = [f"{v:.4g}" for v in t.values] if t.values else ["-"] * len(study.directions)
        others = [_cell(t.user_attrs.get(m), m, base) for m in recorded]
        state = t.state.name.lower() + (" *" if t.number in best else "")
        rows.append([str(t.number), state, *values, *others])
        names.append(
            trials.fail_reason(t, study_attrs)
            or t.user_attrs.get("short_name")
            or t.user_attrs.get("architecture", "")
        )
    labels = task_class(settings.task.name).metric_labels
    headers = [_header(c, labels) for c in ["trial", "state", *objectives, *recorded]]
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]
    kept = len(headers)  # numbers are never cut: the last columns (size, stages, speed,
    movable = sum(m in extra for m in recorded)  # memory) move under the table instead
    while kept > len(headers) - movable and sum(w + 2 for w in widths[:kept]) > width:
        kept -= 1
    table = Table(
        title=f"study {study.study_name}: {finished} trials",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for header, fits in zip(headers[:kept], widths[:kept], strict=True):
        table.add_column(header, no_wrap=True, min_width=fits)
    left = width - sum(w + 2 for w in widths[:kept]) - 2
    if kept < len(headers) or left < max((len(n) for n in names), default=0):
        for row in rows:
            table.add_row(*row[:kept])
        moved = [[row[0], *row[kept:]] for row in rows]  # the trial's number first
        return Group(table, _listing(headers[kept:], moved, names))
    table.add_column("architecture", no_wrap=True)
    for row, text in zip(rows, names, strict=True):
        table.add_row(*row, escape(text))
    return Group(table)


def _header(column: str, labels: dict[str, str]) -> str:
    metric = column.removeprefix("validation_")
    return _HEADERS.get(column) or labels.get(metric, metric)


def _listing(headers: list[str], cells: list[list[str]], names: list[str]) -> Table:
    """Under the table: each trial's number and the columns that did not fit beside it
    (`cells`), and its architecture (or failure), wrapped rather than cut."""
    listing = Table(box=None, pad_edge=False, show_header=True)
    listing.add_column("#", no_wrap=True, justify="right")
    for header in headers:
        listing.add_column(header, no_wrap=True)
    listing.add_column("architecture", overflow="fold")
    for row, text in zip(cells, names, strict=True):
        listing.add_row(*row, escape(text))
    return listing


def _best(settings: NasSettings, study: optuna.Study) -> optuna.trial.FrozenTrial:
    """The study's best: the leader (`nas.study.leading`: the best mean over the seeds it
    was measured on), or with several objectives the first of the Pareto front."""
    if len(study.directions) == 1:
        trials = study.get_trials(deepcopy=False)
        top = leading.leader(trials, study.user_attrs, settings.seed, settings.study.fitness)
        if top is not None:
            return top
    return study.best_trials[0]


def _report_promotion(settings: NasSettings, study: optuna.Study, console: Console) -> None:
    """How the promoted children's estimates ranked against their measurements
    (`nas.study.promotion.agreement`)."""
    said = promotion.agreement(study.get_trials(deepcopy=False), settings.study.fitness)
    if not said.promoted:
        return
    tau = "-" if math.isnan(said.kendall_tau) else f"{said.kendall_tau:.2f}"
    console.print(
        f"promotion: {said.promoted} children measured in full; their paired differences "
        f"and measured differences rank at Kendall tau {tau} over the {said.paired} with a "
        "measured parent"
    )


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
    _against_seed_models(retrained, console)
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


def _against_seed_models(retrained: RetrainResult, console: Console) -> None:
    """The chosen model against every retrained seed model, one line each, paired by
    training seed: `vs transformer: val loss -0.051 ± 0.004 (3/3 better), chrf ...`."""
    chosen = retrained.selected
    for seed, models in retrained.against.items():
        pairs = models.get(chosen or "", {})
        if not pairs:
            continue
        cells = [f"{_short(metric)} {_pair_text(pair)}" for metric, pair in pairs.items() if pair.n]
        console.print(f"{chosen} vs {seed}: {', '.join(cells) or 'no shared seed'}")


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
    return _pair_text(pair)


def _pair_text(pair: PairedDifference) -> str:
    spread = f" ± {pair.stderr:.2g}" if pair.n > 1 else ""
    return f"{pair.mean:+.3g}{spread} ({pair.wins}/{pair.n} better)"


def _short(metric: str) -> str:
    return metric.replace("validation_", "val ").replace("_", " ")


_HEADERS = {
    "samples_per_s": "smp/s",
    "peak_memory_bytes": "MB",
    "n_stages": "stg",  # the stages it trained on (pipeline.per_candidate: its own)
    "parameters": "params (x ET)",
    "trial": "#",
}


def _reference_parameters(
    settings: NasSettings, shown: list[optuna.trial.FrozenTrial]
) -> int | None:
    """The Evolved Transformer seed's parameters as its trial recorded them (None when the
    study has no such trial): every model's size is shown against it."""
    seed = seed_models(settings).get(REFERENCE)
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
        megabytes = value / 2**20
        return f"{megabytes:.1f}" if megabytes < 10 else f"{megabytes:.0f}"
    if column == "parameters" and isinstance(value, int) and base:
        return f"{value:,} ({value / base:.3f}x)"
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
