"""The harness's typed configuration: one frozen dataclass per swappable part, checked.

Hydra composes YAML from `conf/` at the edge (`nas.config`, `nas.cli`) and converts it into
these dataclasses; the study code (`nas.study.run`) only ever sees them, so it runs the same
from the command line, from a test, or from a user's script, and never imports Hydra.
A wrong value is refused here, naming the key, the value and what would be valid.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nas.learning_rate import SCHEDULES as LR_SCHEDULES
from nas.plugins import is_import_path
from nas.search import PRUNERS, SAMPLERS
from nas.storage import url as storage_url
from nas.tasks import Direction, known_tasks, task_class
from nas.tracking import TRACKERS
from pipeline.local.pipemare import PipeMareConfig
from pipeline.pure.checks import is_int, is_number
from pipeline.pure.planner import PLANNERS
from pipeline.pure.schedule import SCHEDULES
from search_spaces.evolved_transformer import PRIMITIVES, WINDOW_SEEDS

logger = logging.getLogger(__name__)

__all__ = [
    "AUTO",
    "DIRECTIONS",
    "FIDELITIES",
    "RUNTIME_OBJECTIVES",
    "NasSettings",
    "PipelineSettings",
    "PrunerSettings",
    "RetrainSettings",
    "SamplerSettings",
    "SearchSpaceSettings",
    "StudySettings",
    "TaskSettings",
    "TrackerSettings",
    "TrainSettings",
    "direction",
    "lower_is_better",
    "objectives",
    "task_metrics",
]

# What a study may optimise besides its task's validation metrics, with the direction.
RUNTIME_OBJECTIVES: dict[str, Direction] = {
    "tokens_per_s": "maximize",
    "peak_memory_bytes": "minimize",
    "parameters": "minimize",
}
DIRECTIONS = ("minimize", "maximize")
FIDELITIES = ("full", "inherited")  # study.fidelity (`nas.study.inherited`)


def task_metrics(task: str) -> tuple[str, ...]:
    """The validation metrics `task` measures (`Task.metric_directions`), as a trial logs
    them (`validation_<metric>`)."""
    return tuple(f"validation_{metric}" for metric in task_class(task).metric_directions)


def objectives() -> dict[str, Direction]:
    """Every metric a study may optimise, with its direction: each known task's validation
    metrics (a task loaded by import path counts from then on), then the runtime's. The
    first objective of a study is its fitness: measured at every evaluation (a
    `validation_*` metric), it is what pruners and hurdles see and what evolution ranks by."""
    known: dict[str, Direction] = {}
    for cls in known_tasks().values():
        known |= {f"validation_{m}": way for m, way in cls.metric_directions.items()}
    return known | RUNTIME_OBJECTIVES


def direction(metric: str) -> Direction:
    """Whether `metric` is minimised or maximised (`objectives`)."""
    known = objectives()
    if metric not in known:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(known)}")
    return known[metric]


def lower_is_better(metric: str, value: float) -> float:
    """`value` of `metric` on a scale where lower is better: negated when the metric is
    maximised; +inf when it is not finite (a failed run ranks last)."""
    if not math.isfinite(value):
        return math.inf
    return -value if direction(metric) == "maximize" else value


STAGES = ("search", "retrain")  # in this order
# The choices are read from the registries they name, at the moment a setting is checked,
# so a schedule registered by the user (`pipeline.register_schedule`) is a valid one.
PIPEMARE_OPTIONS = tuple(PipeMareConfig.__dataclass_fields__)


def _one_of(key: str, value: Any, valid: Iterable[str]) -> None:
    names = tuple(valid)
    if value not in names:
        raise ValueError(f"{key}={value!r} is not valid; valid values: {', '.join(names)}")


def _built_in_or_class(key: str, value: Any, valid: Iterable[str]) -> None:
    """One of the built-in choices, or a user's class by import path (`nas.plugins`)."""
    if not (isinstance(value, str) and is_import_path(value)):
        try:
            _one_of(key, value, valid)
        except ValueError as error:
            raise ValueError(f"{error}, or a class as 'package.module:ClassName'") from None


def _positive(key: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not is_int(value) or value < 1:
        raise ValueError(f"{key}={value!r} is not valid; it must be a positive integer")


AUTO = "auto"  # a shape value chosen from the profile (`nas.study.shape`)


def _positive_or_auto(key: str, value: Any, *, allow_none: bool = False) -> None:
    if value == AUTO:
        return
    try:
        _positive(key, value, allow_none=allow_none)
    except ValueError:
        raise ValueError(
            f"{key}={value!r} is not valid; use a positive integer or 'auto' (chosen from "
            "the profile of the study's candidates)"
        ) from None


@dataclass
class StudySettings:
    name: str = "nas"
    n_trials: int = 4
    storage: str | None = None  # None: SQLite at outputs/studies/<name>.db (nas.storage.url)
    # how long a database server's (or the gRPC proxy's) outage is waited out, retrying,
    # before the workers stop with an error naming the storage (nas.storage.retrying)
    storage_wait_s: float = 60.0
    # local workers training this study's trials side by side, each with its own stage
    # processes on its own cores (`nas.study.workers`); "auto": as many as the chosen shape fits
    # on this machine's cores (`nas.study.shape`)
    workers: int | str = AUTO
    objectives: tuple[str, ...] = ("validation_loss",)
    enqueue_seeds: bool = True
    inherit_weights: bool = False
    # how a child of a trained evolution parent is judged (`nas.study.inherited`): "full" trains it
    # from scratch to train.steps; "inherited" starts it from its parent's trained weights
    # (tensor by tensor, its edited branch afresh), trains it `inherit_steps` steps and scores
    # it as the parent's fitness plus its difference from the parent continued those steps
    # on the same batches (`benchmarks/fidelity.py` measures how well that ranks); children
    # without a trained parent train from scratch; weights kept in Optuna's artifact store
    fidelity: str = "full"
    inherit_steps: int = 200
    # at inherited fidelity, the tensors a child's edit touches start afresh instead of from
    # the parent's (`benchmarks/fidelity.py`: that ranks worse than inheriting them all)
    edited_afresh: bool = False
    max_restarts: int = 2  # stage processes restarted after a death, per study run
    # a trial whose worker died (stage processes, or a heartbeat that stopped) is tried again
    # at most this many times; then it stays failed with its cause and the study goes on
    max_retries: int = 2
    # a trial whose rank 0 recorded no heartbeat for this many seconds (a worker that died or
    # hung, on any machine) is failed by the next worker that asks for a trial and retried;
    # RDB storages only (SQLite, PostgreSQL, MySQL: nas.storage.opening); alike on every
    # worker (each beats every sixth of its grace, 5 s at most)
    heartbeat_grace_s: int = 30
    # no trial starts once this run of the study has lasted `timeout_s` seconds (Optuna's
    # `timeout`: the running trial finishes); None: only `n_trials` ends it
    timeout_s: float | None = None
    # no trial starts once the study has searched `time_budget_s` seconds: wall-clock time
    # with at least one trial training, over every run (a stopped study resumes with what is
    # left; workers side by side count once); None: no such budget
    time_budget_s: float | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"study.name={self.name!r} is not valid; use a non-empty string")
        _positive("study.n_trials", self.n_trials)
        _positive_or_auto("study.workers", self.workers)
        if self.storage is not None:
            storage_url.kind(self.storage)  # a URL of a storage it knows (ValueError)
        wait = self.storage_wait_s
        if not is_number(wait) or not 0 < wait < math.inf:
            raise ValueError(
                f"study.storage_wait_s={wait!r} is not valid; use seconds > 0 (how long a "
                "storage server's outage is waited out)"
            )
        _one_of("study.fidelity", self.fidelity, FIDELITIES)
        _positive("study.inherit_steps", self.inherit_steps)
        if self.fidelity == "inherited" and self.inherit_weights:
            raise ValueError(
                "study.inherit_weights=true trains a child to the full budget from its "
                "parent's weights; study.fidelity=inherited trains it study.inherit_steps "
                "steps from them and scores the difference: choose one"
            )
        for key in ("max_restarts", "max_retries"):
            value = getattr(self, key)
            if not is_int(value) or value < 0:
                raise ValueError(f"study.{key}={value!r} is not valid; use an integer >= 0")
        grace = self.heartbeat_grace_s
        if not is_int(grace) or grace < 2:
            raise ValueError(
                f"study.heartbeat_grace_s={grace!r} is not valid; use whole seconds >= 2 (a "
                "trial whose heartbeat is silent this long is failed and asked again)"
            )
        for key in ("timeout_s", "time_budget_s"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ValueError(
                    f"study.{key}={value!r} is not valid; use seconds > 0 or null (no time limit)"
                )
        # the task's validation metrics are checked with the task (`NasSettings`)
        if not self.objectives:
            raise ValueError(
                "study.objectives is empty; valid objectives: " + ", ".join(objectives())
            )
        for objective in self.objectives:
            if not objective.startswith("validation_"):
                _one_of("study.objectives", objective, [*objectives()])
        if not self.objectives[0].startswith("validation_"):
            raise ValueError(
                f"study.objectives={list(self.objectives)} must start with a validation metric "
                "(the fitness, measured at every evaluation); valid first objectives: "
                + ", ".join(o for o in objectives() if o.startswith("validation_"))
            )
        if len(set(self.objectives)) != len(self.objectives):
            raise ValueError(f"study.objectives={list(self.objectives)} names one twice")

    @property
    def directions(self) -> list[str]:
        return [direction(o) for o in self.objectives]

    @property
    def fitness(self) -> str:
        """The first objective: what pruners, hurdles and evolution compare."""
        return self.objectives[0]


@dataclass
class TrainSettings:
    steps: int = 60
    batch_size: int = 32
    lr: float = 2e-3
    eval_every: int = 20
    eval_batches: int = 4  # validation batches per evaluation; the final one reads them all
    # translation: validation pairs greedily decoded (chrF, exact match) per evaluation
    # (a fixed, evenly spaced subset) and at the final one; None: all, 0: none
    decode_pairs: int | None = 64
    final_decode_pairs: int | None = None
    dropout: float = 0.1
    # nas.learning_rate: linear warm-up over `warmup_steps`, then constant or a cosine decay
    # to `min_lr_ratio` x lr at the last step
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        for key in ("steps", "batch_size", "eval_every", "eval_batches"):
            _positive(f"train.{key}", getattr(self, key))
        for key in ("decode_pairs", "final_decode_pairs"):
            value = getattr(self, key)
            if value is not None and (not is_int(value) or value < 0):
                raise ValueError(
                    f"train.{key}={value!r} is not valid; use a count >= 0 "
                    "(0: no decoding) or null (all pairs)"
                )
        if not self.lr > 0:
            raise ValueError(f"train.lr={self.lr!r} is not valid; it must be > 0")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"train.dropout={self.dropout!r} is not valid; it must be in [0, 1)")
        _one_of("train.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        if (
            isinstance(self.warmup_steps, bool)
            or not isinstance(self.warmup_steps, int)
            or self.warmup_steps < 0
        ):
            raise ValueError(
                f"train.warmup_steps={self.warmup_steps!r} is not valid; use a count >= 0"
            )
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(
                f"train.min_lr_ratio={self.min_lr_ratio!r} is not valid; it must be in [0, 1]"
            )


@dataclass
class PipelineSettings:
    """One worker's pipeline. `n_stages`, `n_microbatches` and `threads_per_stage` may be
    "auto": chosen with `study.workers` from the candidates' profile (`nas.study.shape`), the
    shape predicted to train the most samples per second of the machine."""

    n_stages: int | str = AUTO
    schedule: str = "1f1b"
    n_microbatches: int | str = AUTO
    memory_budget: int | None = None  # bytes per stage process
    planner: str = "time"
    rebalance_every: int | None = None
    threads_per_stage: int | str | None = AUTO  # None: the cores / stages
    timeout_s: float = 300.0
    # schedule=pipemare: PipeMareConfig's fields (lr_reschedule, warmup_updates, correction,
    # correction_decay, update_every); checked by the runtime when the pipeline is built
    pipemare: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _positive_or_auto("pipeline.n_stages", self.n_stages)
        _positive_or_auto("pipeline.n_microbatches", self.n_microbatches)
        _positive("pipeline.memory_budget", self.memory_budget, allow_none=True)
        _positive("pipeline.rebalance_every", self.rebalance_every, allow_none=True)
        _positive_or_auto("pipeline.threads_per_stage", self.threads_per_stage, allow_none=True)
        _one_of("pipeline.schedule", self.schedule, SCHEDULES)
        _one_of("pipeline.planner", self.planner, PLANNERS)
        if self.pipemare and self.schedule != "pipemare":
            raise ValueError(
                f"pipeline.pipemare is set but pipeline.schedule={self.schedule!r}; "
                "PipeMare's options apply to schedule=pipemare only"
            )
        unknown = sorted(set(self.pipemare) - set(PIPEMARE_OPTIONS))
        if unknown:
            raise ValueError(
                f"pipeline.pipemare has unknown options {unknown}; valid: "
                + ", ".join(PIPEMARE_OPTIONS)
            )

    @property
    def auto_keys(self) -> tuple[str, ...]:
        """The shape's keys left to the profile ("auto")."""
        keys = ("n_stages", "n_microbatches", "threads_per_stage")
        return tuple(key for key in keys if getattr(self, key) == AUTO)

    @property
    def stage_count(self) -> int:
        """`n_stages` once chosen (`nas.study.shape.resolve`)."""
        return _chosen("n_stages", self.n_stages)

    @property
    def microbatch_count(self) -> int:
        """`n_microbatches` once chosen (`nas.study.shape.resolve`)."""
        return _chosen("n_microbatches", self.n_microbatches)

    @property
    def thread_count(self) -> int | None:
        """`threads_per_stage` once chosen (`nas.study.shape.resolve`); None: cores / stages."""
        if self.threads_per_stage is None:
            return None
        return _chosen("threads_per_stage", self.threads_per_stage)


def _chosen(key: str, value: int | str) -> int:
    if isinstance(value, str):
        raise RuntimeError(f"pipeline.{key} is {value!r}: choose the shape first (nas.study.shape)")
    return value


@dataclass
class TaskSettings:
    name: str = "translation"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        task_class(self.name)  # a built-in name, or a Task subclass by import path


@dataclass
class SearchSpaceSettings:
    name: str = "evolved_transformer"
    decoder_only: bool | None = None  # None: as the task needs (translation: encoder-decoder)
    d_model: tuple[int, ...] = (64,)
    n_heads: int = 4
    min_cells: int = 1
    max_cells: int = 2
    # (low, high) x the body parameters of the seed `window_reference` ("transformer": 2
    # layers per min_cells; "evolved_transformer": min_cells cells); e.g. [0.3, 1.02] of the
    # ET: up to 2% larger than it
    param_window: tuple[float, float] | None = None
    window_reference: str = "transformer"
    # Primer's primitives added to the choices (search_spaces.evolved_transformer.PRIMITIVES)
    primitives: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for primitive in self.primitives:
            _one_of("search_space.primitives", primitive, PRIMITIVES)
        _one_of("search_space.window_reference", self.window_reference, WINDOW_SEEDS)
        if not self.d_model or any(d < 32 or d % 32 for d in self.d_model):
            raise ValueError(
                f"search_space.d_model={list(self.d_model)!r} is not valid; "
                "widths are positive multiples of 32"
            )
        if not 1 <= self.min_cells <= self.max_cells:
            raise ValueError(
                f"search_space cells {self.min_cells}..{self.max_cells} must "
                "satisfy 1 <= min_cells <= max_cells"
            )


@dataclass
class SamplerSettings:
    name: str = "tpe"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _built_in_or_class("sampler", self.name, SAMPLERS)


@dataclass
class PrunerSettings:
    name: str = "none"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _one_of("pruner", self.name, PRUNERS)
        if self.name == "none" and self.options:
            # an experiment's options for its pruner stay when only the group is swapped
            # (`experiment=search_2h pruner=none`), and Hydra cannot remove them
            logger.warning(
                "pruner=none: ignoring pruner.options %s (options of another pruner)",
                sorted(self.options),
            )
            self.options = {}


@dataclass
class TrackerSettings:
    name: str = "jsonl"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _built_in_or_class("tracker", self.name, TRACKERS)


@dataclass
class RetrainSettings:
    """The retrain stage (`nas.retrain.stage`): the `top_k` best architectures of the study (and,
    with `seed_models`, both seed architectures) trained from scratch for `steps` steps
    (None: `train.steps`) once per training seed in `seeds`; with `selection_seeds`, the
    `top_k` are first trained on those and only the best goes on to `seeds` (which then
    judge a model no choice saw them for); scored on whole splits with
    `decode_pairs` pairs decoded (None: all), then exported to `<models_dir>/<study>/<model>/`;
    each run checkpoints every `checkpoint_every` steps so that a killed retraining resumes;
    a worker waits up to `claim_wait_s` for a run another worker retraining it trains."""

    top_k: int = 1
    seeds: tuple[int, ...] = (0,)
    selection_seeds: tuple[int, ...] = ()
    steps: int | None = None
    seed_models: bool = False
    models_dir: str = "outputs/models"
    decode_pairs: int | None = None  # pairs decoded in the final scoring; None: every pair
    # each (model, seed) run saves a checkpoint every N steps into
    # <models_dir>/<study>/<model>/checkpoints/seed-<seed>/, so a killed retraining resumes
    # there (`nas.retrain.runs`); 0 or None: no checkpoints
    checkpoint_every: int | None = 100
    # several workers retraining one study share its runs (`nas.retrain.claims`): one with
    # only runs left that others train waits for their records, at most this many seconds
    # without any of them recorded, then stops with an error naming the claim it waited for
    claim_wait_s: float = 7200.0

    def __post_init__(self) -> None:
        _positive("retrain.top_k", self.top_k)
        wait = self.claim_wait_s
        if not is_number(wait) or not 0 < wait < math.inf:
            raise ValueError(
                f"retrain.claim_wait_s={wait!r} is not valid; use seconds > 0 (how long a "
                "worker waits for a run another worker trains)"
            )
        every = self.checkpoint_every
        if every is not None and (not is_int(every) or every < 0):
            raise ValueError(
                f"retrain.checkpoint_every={every!r} is not valid; use a step count > 0, "
                "or 0 or null for no checkpoints"
            )
        _positive("retrain.steps", self.steps, allow_none=True)
        _positive("retrain.decode_pairs", self.decode_pairs, allow_none=True)
        if not self.seeds or any(not is_int(s) for s in self.seeds):
            raise ValueError(
                f"retrain.seeds={list(self.seeds)!r} is not valid; use a non-empty list of integers"
            )
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"retrain.seeds={list(self.seeds)!r} names a seed twice")
        chosen = self.selection_seeds
        if any(not is_int(s) for s in chosen) or len(set(chosen)) != len(chosen):
            raise ValueError(
                f"retrain.selection_seeds={list(chosen)!r} is not valid; use distinct integers"
            )
        if set(chosen) & set(self.seeds):
            raise ValueError(
                f"retrain.selection_seeds={list(chosen)!r} share "
                f"{sorted(set(chosen) & set(self.seeds))} with retrain.seeds="
                f"{list(self.seeds)!r}: the seeds that judge must play no part in the choice"
            )


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
    retrain: RetrainSettings = field(default_factory=RetrainSettings)
    # what a run does: "search" (run or resume the study), then "retrain" (its best,
    # from scratch, exported); either alone (retrain alone reads the stored study)
    stages: tuple[str, ...] = ("search", "retrain")
    seed: int = 0
    output_dir: str = "outputs/run"
    studies_dir: str = "outputs/studies"

    def __post_init__(self) -> None:
        if (
            not self.stages
            or any(s not in STAGES for s in self.stages)
            or list(self.stages) != sorted(set(self.stages), key=STAGES.index)
        ):
            raise ValueError(
                f"stages={list(self.stages)!r} is not valid; valid: [search], "
                "[retrain] or [search, retrain]"
            )
        wants = task_class(self.task.name).decoder_only
        if self.search_space.decoder_only is None:
            self.search_space.decoder_only = wants
        elif self.search_space.decoder_only != wants:
            raise ValueError(
                f"search_space.decoder_only={self.search_space.decoder_only} does not fit "
                f"task={self.task.name}; valid: {wants} (or leave it unset)"
            )
        measured = task_metrics(self.task.name)
        for objective in self.study.objectives:
            if objective.startswith("validation_") and objective not in measured:
                raise ValueError(
                    f"study.objectives has {objective}, which task={self.task.name} does not "
                    f"measure; valid: {', '.join(measured)} and " + ", ".join(RUNTIME_OBJECTIVES)
                )
        self._check_decoding()
        self._check_pruner()
        if self.pipeline.schedule == "pipemare" and (
            self.train.lr_schedule != "constant" or self.train.warmup_steps
        ):  # PipeMare's T1 sets the rates itself: the runtime takes no lr_scheduler there
            raise ValueError(
                f"train.lr_schedule={self.train.lr_schedule!r} with train.warmup_steps="
                f"{self.train.warmup_steps} cannot run under pipeline.schedule=pipemare; "
                "valid: train.lr_schedule=constant and train.warmup_steps=0"
            )
        microbatches = self.pipeline.n_microbatches
        if isinstance(microbatches, int) and self.train.batch_size % microbatches:
            raise ValueError(
                f"train.batch_size={self.train.batch_size} is not a multiple of "
                f"pipeline.n_microbatches={self.pipeline.n_microbatches}"
            )

    def _check_decoding(self) -> None:
        """An objective only decoding measures (`Task.decoded_metrics`) needs pairs decoded:
        at every evaluation for the first (the fitness, reported as the trial trains), at
        the final one for the others."""
        decoded = {f"validation_{m}" for m in task_class(self.task.name).decoded_metrics}
        for key, ranked in (("decode_pairs", 1), ("final_decode_pairs", None)):
            needing = [o for o in self.study.objectives[:ranked] if o in decoded]
            if getattr(self.train, key) == 0 and needing:
                raise ValueError(
                    f"train.{key}=0 decodes no pair, but study.objectives has {needing[0]}, "
                    "which only decoding measures; valid: a count > 0 or null (all pairs)"
                )

    def _check_pruner(self) -> None:
        """Pruners decide at evaluations; several objectives allow only the hurdles, whose top
        rung is the full training length (`nas.study.trials.pruner_options` adds `train.steps`)."""
        name, options = self.pruner.name, self.pruner.options
        if name in ("median", "sha") and len(self.study.objectives) > 1:
            raise ValueError(
                f"pruner={name} is not valid with several study.objectives (Optuna 5 "
                "refuses report/should_prune there); valid: pdh (applied to "
                "validation_loss), none"
            )
        if name != "pdh":
            return
        budgets, steps = list(options.get("budgets", [])), self.train.steps
        bad = [b for b in budgets if b > steps or (b % self.train.eval_every and b != steps)]
        if bad:
            raise ValueError(
                f"pruner.options.budgets={budgets} has {bad}, not an evaluation step; "
                f"valid: multiples of train.eval_every={self.train.eval_every} "
                f"up to train.steps={steps}, and train.steps"
            )

    @property
    def storage_url(self) -> str:
        if self.study.storage:
            return self.study.storage
        return f"sqlite:///{self.studies_dir}/{self.study.name}.db"
