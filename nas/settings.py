"""The harness's typed configuration: one frozen dataclass per swappable part, checked.

Hydra composes YAML from `conf/` at the edge (`nas.config`, `nas.cli`) and converts it into
these dataclasses; the study code (`nas.study`) only ever sees them, so it runs the same
from the command line, from a test, or from a user's script, and never imports Hydra.
A wrong value is refused here, naming the key, the value and what would be valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DIRECTIONS",
    "OBJECTIVES",
    "NasSettings",
    "PipelineSettings",
    "PrunerSettings",
    "SamplerSettings",
    "SearchSpaceSettings",
    "StudySettings",
    "TaskSettings",
    "TrackerSettings",
    "TrainSettings",
]

OBJECTIVES = {"validation_loss": "minimize", "tokens_per_s": "maximize",
              "peak_memory_bytes": "minimize"}  # fmt: skip
DIRECTIONS = ("minimize", "maximize")
TASKS = ("translation", "charlm", "textfile")
SAMPLERS = ("tpe", "nsga2", "random", "gp", "evolution")
PRUNERS = ("pdh", "median", "none")
TRACKERS = ("wandb", "jsonl", "none")
# pipeline.pure.schedule.SCHEDULES, spelled out so that composing a config needs no torch
# import (tests/nas/test_settings.py keeps the two equal)
PIPEMARE_OPTIONS = ("lr_reschedule", "warmup_updates", "correction", "correction_decay",
                    "update_every")  # pipeline.local.pipemare.PipeMareConfig's fields
SCHEDULES = ("1f1b", "gpipe", "zbh1", "2bw", "pipemare")
PLANNERS = ("time", "memory", "bipartition")  # bipartition: Bi-Partition's cut where it helps


def _one_of(key: str, value: Any, valid: tuple[str, ...] | list[str]) -> None:
    if value not in valid:
        raise ValueError(f"{key}={value!r} is not valid; valid values: {', '.join(valid)}")


def _positive(key: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{key}={value!r} is not valid; it must be a positive integer")


@dataclass
class StudySettings:
    name: str = "nas"
    n_trials: int = 4
    storage: str | None = None  # None: SQLite at outputs/studies/<name>.db
    objectives: tuple[str, ...] = ("validation_loss",)
    enqueue_seeds: bool = True
    inherit_weights: bool = False
    max_restarts: int = 2  # stage processes restarted after a death, per study run

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"study.name={self.name!r} is not valid; use a non-empty string")
        _positive("study.n_trials", self.n_trials)
        if not self.objectives:
            raise ValueError("study.objectives is empty; valid objectives: "
                             + ", ".join(OBJECTIVES))  # fmt: skip
        for objective in self.objectives:
            _one_of("study.objectives", objective, list(OBJECTIVES))
        if self.objectives[0] != "validation_loss":
            raise ValueError("study.objectives must start with validation_loss (the fitness)")

    @property
    def directions(self) -> list[str]:
        return [OBJECTIVES[o] for o in self.objectives]


@dataclass
class TrainSettings:
    steps: int = 60
    batch_size: int = 32
    lr: float = 2e-3
    eval_every: int = 20
    eval_batches: int = 4
    dropout: float = 0.1

    def __post_init__(self) -> None:
        for key in ("steps", "batch_size", "eval_every", "eval_batches"):
            _positive(f"train.{key}", getattr(self, key))
        if not self.lr > 0:
            raise ValueError(f"train.lr={self.lr!r} is not valid; it must be > 0")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"train.dropout={self.dropout!r} is not valid; it must be in [0, 1)")


@dataclass
class PipelineSettings:
    n_stages: int = 2
    schedule: str = "1f1b"
    n_microbatches: int = 4
    memory_budget: int | None = None
    planner: str = "time"
    rebalance_every: int | None = None
    threads_per_stage: int | None = 1
    timeout_s: float = 300.0
    # schedule=pipemare: PipeMareConfig's fields (lr_reschedule, warmup_updates, correction,
    # correction_decay, update_every); checked by the runtime when the pipeline is built
    pipemare: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _positive("pipeline.n_stages", self.n_stages)
        _positive("pipeline.n_microbatches", self.n_microbatches)
        _positive("pipeline.memory_budget", self.memory_budget, allow_none=True)
        _positive("pipeline.rebalance_every", self.rebalance_every, allow_none=True)
        _positive("pipeline.threads_per_stage", self.threads_per_stage, allow_none=True)
        _one_of("pipeline.schedule", self.schedule, SCHEDULES)
        _one_of("pipeline.planner", self.planner, PLANNERS)
        if self.pipemare and self.schedule != "pipemare":
            raise ValueError(f"pipeline.pipemare is set but pipeline.schedule={self.schedule!r}; "
                             "PipeMare's options apply to schedule=pipemare only")  # fmt: skip
        unknown = sorted(set(self.pipemare) - set(PIPEMARE_OPTIONS))
        if unknown:
            raise ValueError(f"pipeline.pipemare has unknown options {unknown}; valid: "
                             + ", ".join(PIPEMARE_OPTIONS))  # fmt: skip


@dataclass
class TaskSettings:
    name: str = "translation"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _one_of("task", self.name, TASKS)


@dataclass
class SearchSpaceSettings:
    name: str = "evolved_transformer"
    decoder_only: bool | None = None  # None: as the task needs (translation: encoder-decoder)
    d_model: tuple[int, ...] = (64,)
    n_heads: int = 4
    min_cells: int = 1
    max_cells: int = 2
    param_window: tuple[float, float] | None = None  # (low, high) x the seed's parameters

    def __post_init__(self) -> None:
        if not self.d_model or any(d < 32 or d % 32 for d in self.d_model):
            raise ValueError(f"search_space.d_model={list(self.d_model)!r} is not valid; "
                             "widths are positive multiples of 32")  # fmt: skip
        if not 1 <= self.min_cells <= self.max_cells:
            raise ValueError(f"search_space cells {self.min_cells}..{self.max_cells} must "
                             "satisfy 1 <= min_cells <= max_cells")  # fmt: skip


@dataclass
class SamplerSettings:
    name: str = "tpe"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _one_of("sampler", self.name, SAMPLERS)


@dataclass
class PrunerSettings:
    name: str = "none"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _one_of("pruner", self.name, PRUNERS)


@dataclass
class TrackerSettings:
    name: str = "jsonl"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _one_of("tracker", self.name, TRACKERS)


@dataclass
class NasSettings:
    """Everything one study needs; `output_dir` is the run folder (Hydra's, or any)."""

    study: StudySettings = field(default_factory=StudySettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    pipeline: PipelineSettings = field(default_factory=PipelineSettings)
    task: TaskSettings = field(default_factory=TaskSettings)
    search_space: SearchSpaceSettings = field(default_factory=SearchSpaceSettings)
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    pruner: PrunerSettings = field(default_factory=PrunerSettings)
    tracker: TrackerSettings = field(default_factory=TrackerSettings)
    seed: int = 0
    output_dir: str = "outputs/run"
    studies_dir: str = "outputs/studies"

    def __post_init__(self) -> None:
        wants = self.task.name != "translation"  # the language models are decoder-only
        if self.search_space.decoder_only is None:
            self.search_space.decoder_only = wants
        elif self.search_space.decoder_only != wants:
            raise ValueError(
                f"search_space.decoder_only={self.search_space.decoder_only} does not fit "
                f"task={self.task.name}; valid: {wants} (or leave it unset)"
            )
        self._check_pruner()
        if self.train.batch_size % self.pipeline.n_microbatches:
            raise ValueError(
                f"train.batch_size={self.train.batch_size} is not a multiple of "
                f"pipeline.n_microbatches={self.pipeline.n_microbatches}"
            )

    def _check_pruner(self) -> None:
        """Pruners decide at evaluations; several objectives allow only the hurdles."""
        name, options = self.pruner.name, self.pruner.options
        if name == "median" and len(self.study.objectives) > 1:
            raise ValueError(
                "pruner=median is not valid with several study.objectives (Optuna 5 "
                "refuses report/should_prune there); valid: pdh (applied to "
                "validation_loss), none"
            )
        budgets = options.get("budgets", []) if name == "pdh" else []
        bad = [b for b in budgets if b % self.train.eval_every and b != self.train.steps]
        if bad:
            raise ValueError(
                f"pruner.options.budgets={list(budgets)} has {bad}, not an evaluation step; "
                f"valid: multiples of train.eval_every={self.train.eval_every} "
                f"or train.steps={self.train.steps}"
            )

    @property
    def storage_url(self) -> str:
        if self.study.storage:
            return self.study.storage
        return f"sqlite:///{self.studies_dir}/{self.study.name}.db"
