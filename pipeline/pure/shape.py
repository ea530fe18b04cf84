"""How a machine's cores are shaped to train many models: workers, stages, threads, micro-batches.

A search trains many candidates, each on its own; what it is judged by is the samples per
second of the whole machine, summed over its workers. A `Shape` is W workers (each its own
pipeline, training its own candidate), S stages per worker, T threads per stage and M
micro-batches per step: it occupies W x S x T cores. A small model pays a pipeline's bubble
and per-micro-batch overheads for nothing, so one single-stage worker per core trains the
most; a model whose single stage exceeds the memory budget, or whose pipeline is predicted
faster, stays pipelined. `choose_shape` predicts every shape that fits the cores and keeps the
fastest:

    costs    the model's per-layer costs measured at the micro-batch size B / M and at T
             threads (`CostsAt`: the caller profiles, this module only does arithmetic)
    plan     the planner cuts them into S stages under the memory budget (no plan: the shape
             is left out, with the planner's reason)
    step_s   = plan.predicted_iteration_s          compute, bubble, messages (link latency)
             + (M + S - 1) x overheads.microbatch_s   the runtime's fixed cost per micro-batch,
                                                    paid along the pipeline's critical path
             + overheads.step_s                     the optimizer step and agreement
    samples/s of the machine = W x B / step_s

`RuntimeOverheads` are the runtime's own costs, measured once per machine
(`pipeline.distributed.overheads`) and kept beside the layer costs (`CostCache`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.pure.checks import is_int, is_number
from pipeline.pure.costs import LayerCost, LinkCost
from pipeline.pure.planner.base import InfeasibleBudgetError, Plan, Planner

__all__ = [
    "CostsAt",
    "RuntimeOverheads",
    "Shape",
    "ShapeLimits",
    "ShapeOption",
    "choose_shape",
    "fastest_first",
    "most_per_process",
    "predicted_step_s",
    "preference",
    "shapes",
    "stages_for",
    "with_fallbacks",
]

# (threads per stage, micro-batch size) -> the model's per-layer costs measured there
CostsAt = Callable[[int, int], Sequence[LayerCost]]


@dataclass(frozen=True)
class RuntimeOverheads:
    """What the runtime costs besides the layers, in seconds (measured once per machine).

    microbatch_s  a stage's fixed cost per micro-batch, forward and backward together
                  (dispatch, splitting, the loss's bookkeeping): paid M times per step
    message_s     one point-to-point message between two stage processes (its latency)
    step_s        per step whatever M: the optimizer step, the agreement on the loss
    """

    microbatch_s: float = 0.0
    message_s: float = 0.0
    step_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("microbatch_s", "message_s", "step_s"):
            value = getattr(self, name)
            if not is_number(value):
                raise TypeError(f"{name} must be seconds (a number), got {value!r}")
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite seconds >= 0, got {value!r}")

    def link(self, bandwidth_bytes_per_s: float = 1e9) -> LinkCost:
        """The link between two stages as the planner models it: this latency per message."""
        return LinkCost(bandwidth_bytes_per_s=bandwidth_bytes_per_s, latency_s=self.message_s)

    def to_dict(self) -> dict[str, float]:
        return {
            "microbatch_s": self.microbatch_s,
            "message_s": self.message_s,
            "step_s": self.step_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RuntimeOverheads:
        return cls(float(data["microbatch_s"]), float(data["message_s"]), float(data["step_s"]))


@dataclass(frozen=True, order=True)
class Shape:
    """W workers x S stages x T threads per stage, M micro-batches per step."""

    workers: int
    n_stages: int
    threads_per_stage: int
    n_microbatches: int

    @property
    def cores(self) -> int:
        return self.workers * self.n_stages * self.threads_per_stage

    def __str__(self) -> str:
        return (
            f"{self.workers} worker{'s' * (self.workers > 1)} x {self.n_stages} stage"
            f"{'s' * (self.n_stages > 1)} x {self.threads_per_stage} thread"
            f"{'s' * (self.threads_per_stage > 1)}, {self.n_microbatches} micro-batch"
            f"{'es' * (self.n_microbatches > 1)}"
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "workers": self.workers,
            "n_stages": self.n_stages,
            "threads_per_stage": self.threads_per_stage,
            "n_microbatches": self.n_microbatches,
        }


@dataclass(frozen=True)
class ShapeLimits:
    """What the shapes may be: the cores, the batch, and the values a user fixed (None: any).

    max_workers bounds W where there is not enough work for more (trials left, runs to train).
    """

    cores: int
    batch_size: int
    workers: int | None = None
    n_stages: int | None = None
    threads_per_stage: int | None = None
    n_microbatches: int | None = None
    max_workers: int | None = None

    def __post_init__(self) -> None:
        for name in ("cores", "batch_size"):
            _check_positive(name, getattr(self, name))
        for name in ("workers", "n_stages", "threads_per_stage", "n_microbatches", "max_workers"):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        if self.n_microbatches is not None and self.batch_size % self.n_microbatches:
            raise ValueError(
                f"n_microbatches={self.n_microbatches} does not divide batch_size="
                f"{self.batch_size}; valid: a divisor of the batch"
            )


def _check_positive(name: str, value: Any) -> None:
    if not is_int(value) or value < 1:
        raise ValueError(f"{name}={value!r} is not valid; it must be a positive integer")


@dataclass(frozen=True)
class ShapeOption:
    """One shape `choose_shape` tried: its plan and prediction, or why it has none."""

    shape: Shape
    plan: Plan | None
    predicted_step_s: float  # one worker's step; inf without a plan
    predicted_samples_per_s: float  # the machine's: W x batch / step; 0 without a plan
    reason: str = ""  # "" for a shape that was planned

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.shape.to_dict(),
            "predicted_step_s": None if self.plan is None else self.predicted_step_s,
            "predicted_samples_per_s": self.predicted_samples_per_s,
            "reason": self.reason,
        }


def predicted_step_s(plan: Plan, overheads: RuntimeOverheads) -> float:
    """One worker's step under `plan` with the runtime's overheads (module doc)."""
    pipeline_slots = plan.n_microbatches + plan.n_stages - 1
    return plan.predicted_iteration_s + pipeline_slots * overheads.microbatch_s + overheads.step_s


def shapes(limits: ShapeLimits, n_layers: int) -> list[Shape]:
    """Every shape that fits: S x T x W cores at most (W as many as fit, at least 1, within
    `max_workers`; a fixed W gives each worker cores / W, at least one), S <= layers, M a
    power of two up to 8 dividing the batch (or the fixed one)."""
    microbatches = (
        [limits.n_microbatches]
        if limits.n_microbatches is not None
        else [m for m in (1, 2, 4, 8) if limits.batch_size % m == 0]
    )
    stage_counts = _fixed_or(limits.n_stages, range(1, min(limits.cores, n_layers) + 1))
    thread_counts = _fixed_or(limits.threads_per_stage, range(1, limits.cores + 1))
    found: list[Shape] = []
    for s in stage_counts:
        for t in thread_counts:
            workers = limits.workers or limits.cores // (s * t)
            if limits.max_workers is not None:
                workers = min(workers, limits.max_workers)
            # a fixed worker count leaves each worker its share of the cores (at least one)
            if workers < 1 or s * t > max(1, limits.cores // workers):
                continue
            found.extend(Shape(workers, s, t, m) for m in microbatches)
    if not found:
        raise ValueError(
            f"no shape fits {limits.cores} cores with workers={limits.workers}, n_stages="
            f"{limits.n_stages}, threads_per_stage={limits.threads_per_stage} and {n_layers} "
            "layers; set fewer workers, stages or threads, or leave them 'auto'"
        )
    return found


def _fixed_or(value: int | None, every: range) -> Sequence[int]:
    return [value] if value is not None else list(every)


def choose_shape(
    planner: Planner,
    costs_at: CostsAt,
    limits: ShapeLimits,
    overheads: RuntimeOverheads,
    *,
    schedule: str = "1f1b",
    memory_budget: int | None = None,
) -> tuple[ShapeOption, list[ShapeOption]]:
    """(the fastest shape for the machine, every shape tried); ValueError if none can be
    planned (each shape's reason in the message)."""
    n_layers = len(costs_at(1, limits.batch_size))
    tried = [
        _option(planner, costs_at, shape, limits.batch_size, overheads, schedule, memory_budget)
        for shape in shapes(limits, n_layers)
    ]
    planned = [o for o in tried if o.plan is not None]
    if not planned:
        reasons = "; ".join(f"{o.shape}: {o.reason}" for o in tried[:6])
        raise ValueError(f"no shape can be planned for this model: {reasons}")
    best = max(planned, key=lambda o: preference(o.shape, o.predicted_samples_per_s))
    return best, tried


def stages_for(
    planner: Planner,
    costs_at: CostsAt,
    overheads: RuntimeOverheads,
    *,
    max_stages: int,
    batch_size: int,
    threads: int = 1,
    n_microbatches: int | None = None,
    schedule: str = "1f1b",
    memory_budget: int | None = None,
    exhaustive: bool = False,
    error: float = 0.0,
) -> tuple[ShapeOption, list[ShapeOption]]:
    """One model's own pipeline on a pool of processes (`pipeline.pure.pool`): (the stage
    count and micro-batches it trains on, every option tried); ValueError if none fits.

    The fewest stages whose plan fits `memory_budget`; more only where the pool's
    samples/s per process is predicted higher (the other processes train other models,
    so a pipeline that is faster but not that much faster would slow the pool down), by
    more than the model's `error` (a fraction: predictions closer than that cannot be
    ranked, and fewer stages leave the other processes free; on 2 cores a small model's
    2-stage plan was predicted at 1.9x its 1-stage one's samples/s and ran 1.4x, on twice
    the processes).

    Options are tried in order, fewest stages and micro-batches first, and the first single
    stage that fits keeping every activation ends the search (`_unhindered`), the best of
    those tried so far winning (one stage that recomputes at fewer micro-batches may be
    faster): a pipeline of S stages at the same micro-batches does the same compute on S
    processes plus its bubble, messages and overheads, so it cannot be faster per process,
    and the micro-batches are split further only where memory needs it (profiling a model
    at every micro-batch size costs a pool more than the few percent its per-sample cost
    varies among them). Each option profiles the model at its micro-batch size
    (`costs_at`), so a model that fits one process is profiled once. `exhaustive`: every
    option is tried (a job the pool runs alone wants the fastest: `fastest_first`)."""
    limits = ShapeLimits(
        cores=max_stages * threads,
        batch_size=batch_size,
        workers=1,
        threads_per_stage=threads,
        n_microbatches=n_microbatches,
    )
    n_layers = len(costs_at(threads, batch_size // (n_microbatches or 1)))
    tried: list[ShapeOption] = []
    for shape in shapes(limits, n_layers):
        tried.append(
            _option(planner, costs_at, shape, batch_size, overheads, schedule, memory_budget)
        )
        if _unhindered(tried[-1]) and not exhaustive:
            break
    planned = [o for o in tried if o.plan is not None]
    if not planned:
        reasons = "; ".join(f"{o.shape.n_stages} stages: {o.reason}" for o in tried[:6])
        raise ValueError(f"no pipeline of at most {max_stages} stages fits this model: {reasons}")
    return most_per_process(planned, error), tried


def most_per_process(planned: Sequence[ShapeOption], error: float = 0.0) -> ShapeOption:
    """Of planned options, the one a pool runs the most samples/s per process on: among
    those within `error` (a fraction) of the best per process, the fewest stages, then
    the most per process (`stages_for`)."""
    if error < 0:
        raise ValueError(f"error must be >= 0, got {error!r}")
    if not planned:
        raise ValueError("no planned option to choose from")

    def per_process(option: ShapeOption) -> float:
        return option.predicted_samples_per_s / option.shape.n_stages

    top = max(per_process(o) for o in planned)
    close = [o for o in planned if per_process(o) * (1 + error) >= top]
    fewest = min(o.shape.n_stages for o in close)
    return max(
        (o for o in close if o.shape.n_stages == fewest),
        key=lambda o: preference(o.shape, per_process(o)),
    )


FEWER_STAGES_SHARE = 0.75  # `with_fallbacks`: what a job gives up per process to start now


def with_fallbacks(
    best: ShapeOption, tried: Sequence[ShapeOption], least_share: float = FEWER_STAGES_SHARE
) -> list[ShapeOption]:
    """What a pool job of `stages_for`'s model can run on, preferred first: `best`, then for
    each smaller stage count its fastest planned option, where that trains at least
    `least_share` of `best`'s samples/s per process (`StagePool.submit` with several
    counts). A job that waits for more processes than are free leaves the free ones idle
    until the others end; on fewer stages it starts at once and keeps them busy, at most
    1 - least_share less productive per process."""
    if not 0.0 < least_share <= 1.0:
        raise ValueError(f"least_share={least_share!r}: a share in (0, 1]")
    rate = best.predicted_samples_per_s / best.shape.n_stages
    fewer: dict[int, ShapeOption] = {}
    for option in tried:
        stages = option.shape.n_stages
        if option.plan is None or stages >= best.shape.n_stages:
            continue
        option_rate = option.predicted_samples_per_s / stages
        held = fewer.get(stages)
        if option_rate >= least_share * rate and (
            held is None or option.predicted_samples_per_s > held.predicted_samples_per_s
        ):
            fewer[stages] = option
    return [best, *(fewer[n] for n in sorted(fewer, reverse=True))]


def fastest_first(tried: Sequence[ShapeOption]) -> list[ShapeOption]:
    """What a pool job of `stages_for`'s model can run on when no other job will want the
    pool's processes (a study's last trial): for each stage count its fastest planned
    option, the fastest first. The share per process `stages_for` weighs no longer matters
    then, only how soon the job ends: it starts on the first count that is free, so more
    stages where they are free and predicted faster, fewer where they are not."""
    fastest: dict[int, ShapeOption] = {}
    for option in tried:
        held = fastest.get(option.shape.n_stages)
        if option.plan is not None and (
            held is None or option.predicted_samples_per_s > held.predicted_samples_per_s
        ):
            fastest[option.shape.n_stages] = option
    return sorted(fastest.values(), key=lambda o: -o.predicted_samples_per_s)


def _unhindered(option: ShapeOption) -> bool:
    """A single stage planned with every activation kept: nothing on more processes is
    faster per process (`stages_for`)."""
    return (
        option.plan is not None
        and option.shape.n_stages == 1
        and all(action == "keep" for action in option.plan.actions)
    )


def preference(shape: Shape, samples_per_s: float) -> tuple[float, int, int]:
    """How shapes rank (the larger, the better): the most samples/s; on a tie the fewest
    processes, then the fewest micro-batches."""
    return (round(samples_per_s, 6), -shape.workers * shape.n_stages, -shape.n_microbatches)


def _option(
    planner: Planner,
    costs_at: CostsAt,
    shape: Shape,
    batch_size: int,
    overheads: RuntimeOverheads,
    schedule: str,
    memory_budget: int | None,
) -> ShapeOption:
    costs = costs_at(shape.threads_per_stage, batch_size // shape.n_microbatches)
    try:
        plan = planner.plan(
            costs,
            shape.n_stages,
            schedule=schedule,
            n_microbatches=shape.n_microbatches,
            memory_budget=memory_budget,
            link=overheads.link() if shape.n_stages > 1 else None,
        )
    except (InfeasibleBudgetError, ValueError) as error:
        return ShapeOption(shape, None, math.inf, 0.0, str(error))
    step_s = predicted_step_s(plan, overheads)
    return ShapeOption(shape, plan, step_s, shape.workers * batch_size / step_s)
