"""The knobs of an `ElasticPipeline` as typed groups, each checked once where it is made.

    ElasticPipeline(specs, optimizer=..., loss_fn=..., schedule=..., n_microbatches=...,
                    planning=PlanOptions(...),     how the model is cut and what it keeps
                    elastic=ElasticOptions(...),   when it re-plans and migrates on its own
                    checkpoint=CheckpointOptions(...),  when it saves, what it resumes from
                    ...)

Each group is a frozen dataclass that validates its values in `__post_init__`, before any
process talks to another, so a bad value fails the same way on every rank. The facade keeps
them, with the few top-level knobs, in one `PipelineOptions`: every value lives in one place.
A harness builds the groups from its own configuration (`dataclasses.replace` to vary one).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from pipeline.local.cost_cache import CostCache
from pipeline.local.pipemare import PipeMareConfig
from pipeline.pure.checks import is_int
from pipeline.pure.planner import Plan, Planner

__all__ = [
    "LATEST",
    "NONFINITE_POLICIES",
    "PROFILE_SOURCES",
    "CheckpointOptions",
    "ElasticOptions",
    "NonFinitePolicy",
    "OptionViews",
    "PipelineOptions",
    "PlanOptions",
    "ProfileSource",
    "check_partition",
    "moved_argument_error",
]

ProfileSource = Literal["sandbox", "estimate"]
NonFinitePolicy = Literal["raise", "ignore"]
PROFILE_SOURCES: tuple[str, ...] = get_args(ProfileSource)
NONFINITE_POLICIES: tuple[str, ...] = get_args(NonFinitePolicy)
LATEST = "latest"  # CheckpointOptions.resume_from: the newest checkpoint in `directory`


def _positive(name: str, value: object, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def check_partition(partition: str | Sequence[int] | Plan) -> str | Sequence[int] | Plan:
    """`partition` if it is one: "auto", stage sizes or a `Plan` (sizes checked at build)."""
    if isinstance(partition, str) and partition != "auto":
        raise ValueError(f"partition must be 'auto', stage sizes or a Plan, got {partition!r}")
    if not isinstance(partition, str | Plan | Sequence):
        raise TypeError(f"partition must be 'auto', stage sizes or a Plan, got {partition!r}")
    return partition


@dataclass(frozen=True)
class PlanOptions:
    """How the model is cut into stages and what each layer keeps for its backward.

    Args:
        partition: "auto" (planned on the first step, from a profile of its shapes), stage
            sizes, or a `Plan`.
        planner: "time", "memory", "bipartition" or a `pipeline.pure.planner.Planner`.
        memory_budget: bytes per rank the plan must fit (parameters, gradients, optimizer
            state and in-flight activations of its stages); layers are recomputed where
            needed.
        profile: "sandbox" (time each distinct layer once) or "estimate" (FLOPs only).
        cost_cache: measured costs by layer signature, shared across models (and
            pipelines: pass the same one to keep what was measured).
        handoff: Bi-Partition with explicit stage sizes: per boundary s | s+1, how many of
            stage s's last layers run their backward on stage s + 1 (they must be separable:
            nn.Linear, or a type registered with `pipeline.separable`); flushed schedules
            only. planner="bipartition" chooses it (and the sizes) with partition="auto".
    """

    partition: str | Sequence[int] | Plan = "auto"
    planner: str | Planner = "time"
    memory_budget: int | None = None
    profile: ProfileSource = "sandbox"
    cost_cache: CostCache = field(default_factory=CostCache)
    handoff: Sequence[int] | None = None  # kept as a tuple

    def __post_init__(self) -> None:
        partition = check_partition(self.partition)
        if not isinstance(partition, str | Plan):
            object.__setattr__(self, "partition", tuple(partition))
        if not isinstance(self.planner, str | Planner):
            raise TypeError(f"planner must be a name or a Planner, got {self.planner!r}")
        _positive("memory_budget", self.memory_budget, optional=True)
        if self.profile not in PROFILE_SOURCES:
            raise ValueError(f"profile must be one of {PROFILE_SOURCES}, got {self.profile!r}")
        if not isinstance(self.cost_cache, CostCache):
            raise TypeError(f"cost_cache must be a CostCache, got {self.cost_cache!r}")
        if self.handoff is None:
            return
        object.__setattr__(self, "handoff", tuple(self.handoff))
        if any(not is_int(k) or k < 0 for k in self.handoff):
            raise ValueError(f"handoff must be layer counts >= 0, got {self.handoff!r}")
        if isinstance(self.partition, str):
            raise ValueError(
                "handoff= needs explicit stage sizes (partition=[...]); with "
                "partition='auto', planner='bipartition' chooses the cut"
            )


@dataclass(frozen=True)
class ElasticOptions:
    """When the pipeline re-plans from measured costs and migrates on its own.

    Args:
        rebalance_every: re-plan every N steps (None: only on demand, `rebalance()`).
        rebalance_on_drift: re-plan when the stages' measured / predicted compute times
            spread by more than this fraction (e.g. 0.1) on two measuring steps in a row
            (`measure_memory_every`); see `pipeline.distributed.triggers`.
        rebalance_horizon: the steps a re-plan expects to remain: a new plan is taken only
            when the time it saves over them exceeds the time its migration takes.
        rebalance_settle: steps a plan runs before its measurements are compared with it.
        correct_after: a model planned with partition="auto" on several stages re-plans once
            from the costs its stages measured, on the first measuring step at least this
            many steps after it was built, and migrates when that pays back over
            `rebalance_horizon` (None: never). The cost cache learns the measured costs.
        measure_memory_every: measure saved activations and each layer's times every N
            steps (and on the first step of every plan); measuring costs a hook per saved
            tensor and an autograd call per layer, so the other steps run each stage's
            layers as one graph (`pipeline.local.fused`). 1: measure every step.
        try_plans: with schedule="auto", the most plans tried on the first steps when the
            cost model cannot tell them apart (their predictions, corrected by what earlier
            plans measured, within the model's measured error of the best): each runs
            `try_steps` measured steps and the fastest is kept (`pipeline.distributed.tryout`;
            1: the best predicted, untried). What they measured corrects the cost cache.
            At the first correction (`correct_after`) the other schedules' plans from the
            measured costs are weighed against the plan in force, and tried the same way
            (each schedule's fastest first: 4 lets every exact schedule be tried there).
        try_steps: the measured steps of each plan tried per visit (after one warm-up step).
        try_rounds: how many times the plans tried are visited in turn (A B A B: 2); each
            is measured by the median of all its steps, so a spell of a slower machine
            weighs on every plan rather than on the one that ran then.
        try_rounds_max: after `try_rounds`, more rounds (this many in all at most) while
            the fastest measured has not beaten every other plan in every round both ran;
            they visit it and the plans it has not beaten only.
    """

    rebalance_every: int | None = None
    rebalance_on_drift: float | None = None
    rebalance_horizon: int = 100
    rebalance_settle: int = 3
    measure_memory_every: int = 10
    correct_after: int | None = 10
    try_plans: int = 4
    try_steps: int = 3
    try_rounds: int = 2
    try_rounds_max: int = 4

    def __post_init__(self) -> None:
        _positive("rebalance_every", self.rebalance_every, optional=True)
        _positive("correct_after", self.correct_after, optional=True)
        _positive("rebalance_horizon", self.rebalance_horizon)
        _positive("measure_memory_every", self.measure_memory_every)
        _positive("try_plans", self.try_plans)
        _positive("try_steps", self.try_steps)
        _positive("try_rounds", self.try_rounds)
        if not is_int(self.try_rounds_max) or self.try_rounds_max < self.try_rounds:
            raise ValueError(
                f"try_rounds_max must be an int >= try_rounds ({self.try_rounds}), "
                f"got {self.try_rounds_max!r}"
            )
        settle = self.rebalance_settle
        if not is_int(settle) or settle < 0:
            raise ValueError(f"rebalance_settle must be an int >= 0, got {settle!r}")
        drift = self.rebalance_on_drift
        if drift is not None and not (isinstance(drift, int | float) and drift > 0):
            raise ValueError(f"rebalance_on_drift must be a fraction > 0, got {drift!r}")


@dataclass(frozen=True)
class CheckpointOptions:
    """When the pipeline saves a checkpoint on its own, and which one it resumes from.

    Args:
        directory: where automatic saves go, one folder per save, `<directory>/step-<8
            digits>` (`pipeline.pure.checkpoint_format`).
        every: save after every N-th training step (None: only `save_checkpoint`); needs
            `directory`.
        keep_last: how many of the newest automatic checkpoints to keep (None: all).
        resume_from: a checkpoint folder (what `save_checkpoint` wrote), a directory of
            automatic checkpoints (its newest is taken), or "latest": the newest in
            `directory`, or a fresh start while it holds none, so a job relaunched with the
            same arguments goes on from its last save. The checkpoint may come from another
            partition, schedule or number of ranks.
    """

    directory: str | os.PathLike[str] | None = None  # kept as a Path
    every: int | None = None
    keep_last: int | None = 3
    resume_from: str | os.PathLike[str] | None = None  # kept as a Path, or LATEST

    def __post_init__(self) -> None:
        for name in ("directory", "resume_from"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, str | os.PathLike) or str(value) == "":
                raise TypeError(f"{name} must be a path (str or os.PathLike), got {value!r}")
            if not (name == "resume_from" and value == LATEST):
                object.__setattr__(self, name, Path(value))
        _positive("every", self.every, optional=True)
        _positive("keep_last", self.keep_last, optional=True)
        if self.every is not None and self.directory is None:
            raise ValueError(f"every={self.every} saves into a directory: pass directory=...")
        if self.resume_from == LATEST and self.directory is None:
            raise ValueError(
                "resume_from='latest' resumes from the newest checkpoint in directory: "
                "pass directory=..."
            )


@dataclass(frozen=True)
class PipelineOptions:
    """Everything an `ElasticPipeline` was configured with, besides its model and recipe."""

    n_microbatches: int = 4
    on_nonfinite: NonFinitePolicy = "raise"
    pipemare: PipeMareConfig | None = None  # checked by `check_pipemare` with the schedule
    planning: PlanOptions = field(default_factory=PlanOptions)
    elastic: ElasticOptions = field(default_factory=ElasticOptions)
    checkpoint: CheckpointOptions = field(default_factory=CheckpointOptions)

    def __post_init__(self) -> None:
        _positive("n_microbatches", self.n_microbatches)
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise ValueError(
                f"on_nonfinite must be one of {NONFINITE_POLICIES}, got {self.on_nonfinite!r}"
            )
        if self.pipemare is not None and not isinstance(self.pipemare, PipeMareConfig):
            raise TypeError(f"pipemare must be a PipeMareConfig, got {self.pipemare!r}")
        groups = (
            ("planning", PlanOptions),
            ("elastic", ElasticOptions),
            ("checkpoint", CheckpointOptions),
        )
        for name, group in groups:
            if not isinstance(getattr(self, name), group):
                raise TypeError(f"{name} must be a {group.__name__}, got {getattr(self, name)!r}")


class OptionViews:
    """The options a pipeline's user reads most, as properties over its `options` (mixed
    into `ElasticPipeline`): each value is kept once, in `PipelineOptions`."""

    options: PipelineOptions

    @property
    def n_microbatches(self) -> int:
        return self.options.n_microbatches

    @property
    def memory_budget(self) -> int | None:
        return self.options.planning.memory_budget

    @property
    def profile(self) -> str:
        return self.options.planning.profile

    @property
    def cost_cache(self) -> CostCache:
        """Measured costs by layer signature (`PlanOptions.cost_cache`)."""
        return self.options.planning.cost_cache

    @property
    def pipemare(self) -> PipeMareConfig | None:
        """PipeMare's T1/T2 (None: another schedule)."""
        return self.options.pipemare


_GROUP_OF = {
    **{name: "planning=PlanOptions" for name in PlanOptions.__dataclass_fields__},
    **{name: "elastic=ElasticOptions" for name in ElasticOptions.__dataclass_fields__},
    **{name: "checkpoint=CheckpointOptions" for name in CheckpointOptions.__dataclass_fields__},
}
_RENAMED = {"checkpoint_every": "every", "checkpoint_dir": "directory", "resume": "resume_from"}


def moved_argument_error(arguments: Sequence[str]) -> TypeError:
    """The error for `ElasticPipeline` keywords that are not (or no longer) its own."""
    hints = []
    for name in arguments:
        if name in _GROUP_OF:
            hints.append(f"{name}= is now {_GROUP_OF[name]}({name}=...)")
        elif name in _RENAMED:
            hints.append(f"{name}= is checkpoint=CheckpointOptions({_RENAMED[name]}=...)")
        elif name == "stages_per_rank":
            hints.append(
                "stages_per_rank= is now part of the schedule: "
                "schedule=pipeline.get_schedule('interleaved_1f1b', stages_per_rank=...)"
            )
        else:
            hints.append(f"{name}= is not an argument")
    return TypeError("ElasticPipeline(): " + "; ".join(hints))
