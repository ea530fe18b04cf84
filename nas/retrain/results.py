"""What retraining produces, and how its models compare: the records a report reads.

A retraining (`nas.retrain.stage`) trains each model once per training seed; these are its
records (`Model`, `RetrainRun`, `RetrainResult`) and the two ways it reads them: a table of
each model's mean and sd over its seeds (`model_table`), and each model's paired difference
against the reference seed model, seed by seed, on the fitness and the task's headline
metrics (`compare`, `nas.paired`). Pure: figures in, figures out, no processes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nas.paired import PairedDifference, paired_difference, reference_model
from nas.settings import direction, lower_is_better, objectives
from nas.tasks import task_class

__all__ = [
    "Model",
    "RetrainResult",
    "RetrainRun",
    "compare",
    "headline_objectives",
    "model_table",
    "paired_metrics",
    "score",
]


@dataclass(frozen=True)
class Model:
    """An architecture to retrain: its name, trial (None for a seed), parameters, JSON."""

    name: str
    trial: int | None
    params: dict[str, Any]
    architecture: str


@dataclass
class RetrainRun:
    """One model trained with one seed: what it scored and how the training went."""

    model: str
    seed: int
    trial: int | None
    params: dict[str, Any]
    parameters: int = 0
    steps: int = 0
    seconds: float = 0.0
    samples_per_s: float = 0.0
    tokens_per_s: float = 0.0
    peak_memory_bytes: int = 0
    metrics: dict[str, float] = field(default_factory=dict)  # validation_*, test_*
    history: list[dict[str, float]] = field(default_factory=list)  # per step
    error: str | None = None
    time_s: dict[str, float] = field(default_factory=dict)  # by phase (`nas.study.phases`)


@dataclass(frozen=True)
class RetrainResult:
    """Every run, the folder each model was exported to, the model chosen, each other model
    against the reference seed model (`paired[model][metric]`), and each searched model
    against every seed model (`against`, step 5)."""

    study_name: str
    runs: tuple[RetrainRun, ...]
    exported: dict[str, str]
    selected: str | None
    fitness: str
    run_dirs: tuple[str, ...] = ()
    reference: str | None = None
    paired: dict[str, dict[str, PairedDifference]] = field(default_factory=dict)
    # every searched model against every retrained seed model: `against[seed][model][metric]`
    against: dict[str, dict[str, dict[str, PairedDifference]]] = field(default_factory=dict)
    # with `retrain.selection_seeds`: the retraining that chose among the top-k on those
    # seeds (its `selected` went on to be judged here, on `retrain.seeds`)
    selection: RetrainResult | None = None


def model_table(runs: Sequence[RetrainRun], fitness: str) -> list[dict[str, Any]]:
    """One row per model, best mean `fitness` first: mean and sd over its seeds of every
    metric, its parameters and training throughput, and the seeds that failed."""
    names = list(dict.fromkeys(run.model for run in runs))
    rows = []
    for name in names:
        mine = [r for r in runs if r.model == name]
        done = [r for r in mine if r.error is None]
        row: dict[str, Any] = {
            "model": name,
            "trial": mine[0].trial,
            "seeds": len(done),
            "failed": len(mine) - len(done),
            "parameters": mine[0].parameters,
        }
        keys = sorted({k for r in done for k in r.metrics} | {"samples_per_s", "tokens_per_s"})
        for key in keys:
            values = [float(r.metrics.get(key, getattr(r, key, math.nan))) for r in done]
            row[f"{key}_mean"] = statistics.fmean(values) if values else math.nan
            row[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
            row[f"{key}_values"] = values
        row.setdefault(f"{fitness}_mean", math.nan)
        rows.append(row)
    return sorted(rows, key=lambda row: lower_is_better(fitness, row[f"{fitness}_mean"]))


def compare(
    runs: Sequence[RetrainRun], fitness: str, *, headline: Sequence[str]
) -> tuple[str | None, dict[str, dict[str, PairedDifference]]]:
    """Step 5: the reference seed model (`nas.paired.reference_model`: the Evolved
    Transformer when retrained) and every other model's paired difference against it on
    `fitness` and, where the runs have them, the `headline` metrics (the task's
    `Task.headline_metrics`, as `validation_<metric>`: `headline_objectives`); (None, {})
    without one."""
    rows = model_table(runs, fitness)
    seeds = {row["model"]: row[f"{fitness}_mean"] for row in rows if row["trial"] is None}
    reference = reference_model(seeds, maximize=direction(fitness) == "maximize")
    if reference is None:
        return None, {}
    metrics = [
        m for m in dict.fromkeys((fitness, *headline)) if any(m in run.metrics for run in runs)
    ]
    return reference, {
        row["model"]: paired_metrics(runs, row["model"], reference, metrics)
        for row in rows
        if row["model"] != reference
    }


def against_seed_models(
    runs: Sequence[RetrainRun], fitness: str, *, headline: Sequence[str]
) -> dict[str, dict[str, dict[str, PairedDifference]]]:
    """Step 5, the winner judged against every seed model, not one reference: for each
    retrained seed model (`against[seed][model][metric]`), every searched model's paired
    difference from it on `fitness` and the `headline` metrics the runs have."""
    rows = model_table(runs, fitness)
    seeds = [r["model"] for r in rows if r["trial"] is None and math.isfinite(r[f"{fitness}_mean"])]
    searched = [r["model"] for r in rows if r["trial"] is not None]
    metrics = [
        m for m in dict.fromkeys((fitness, *headline)) if any(m in run.metrics for run in runs)
    ]
    return {
        seed: {model: paired_metrics(runs, model, seed, metrics) for model in searched}
        for seed in seeds
    }


def headline_objectives(task: str) -> tuple[str, ...]:
    """The headline metrics of `task` (`Task.headline_metrics`) as a run's validation
    figures are named: `validation_<metric>`."""
    return tuple(f"validation_{metric}" for metric in task_class(task).headline_metrics)


def paired_metrics(
    runs: Sequence[RetrainRun], model: str, reference: str, metrics: Iterable[str]
) -> dict[str, PairedDifference]:
    """`model - reference` per metric over the training seeds both trained (`nas.paired`)."""
    return {
        metric: paired_difference(
            _per_seed(runs, model, metric),
            _per_seed(runs, reference, metric),
            maximize=objectives().get(metric) == "maximize",
        )
        for metric in metrics
    }


def _per_seed(runs: Sequence[RetrainRun], model: str, metric: str) -> dict[int, float]:
    """The model's `metric` per training seed, in run order; failed seeds left out."""
    return {
        run.seed: float(run.metrics[metric])
        for run in runs
        if run.model == model and run.error is None and metric in run.metrics
    }


def score(run: RetrainRun, fitness: str) -> float:
    """Lower is better: the run's validation fitness, signed by its direction."""
    value = run.metrics.get(fitness, math.nan) if run.error is None else math.nan
    return lower_is_better(fitness, value)
