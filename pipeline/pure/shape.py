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
    "SizesAt",
    "choose_shape",
    "layer_count",
    "plan_shape",
    "predicted_step_s",
    "preference",
    "shapes",
]

# (threads per stage, micro-batch size) -> the model's per-layer costs measured there
CostsAt = Callable[[int, int], Sequence[LayerCost]]
# micro-batch size -> the model's per-layer costs with their bytes, seconds maybe unmeasured
# (0): enough to rule a shape out under a memory budget before timing anything (`plan_shape`)
SizesAt = Callable[[int], Sequence[LayerCost]]


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
    sizes_at: SizesAt | None = None,
) -> tuple[ShapeOption, list[ShapeOption]]:
    """(the fastest shape for the machine, every shape tried); ValueError if none can be
    planned (each shape's reason in the message). `sizes_at`: the model's bytes, to rule
    shapes out under `memory_budget` before their costs are measured (`plan_shape`)."""
    batch = limits.batch_size
    tried = [
        plan_shape(planner, costs_at, shape, batch, overheads, schedule, memory_budget, sizes_at)
        for shape in shapes(limits, layer_count(costs_at, sizes_at, 1, batch))
    ]
    planned = [o for o in tried if o.plan is not None]
    if not planned:
        reasons = "; ".join(f"{o.shape}: {o.reason}" for o in tried[:6])
        raise ValueError(f"no shape can be planned for this model: {reasons}")
    best = max(planned, key=lambda o: preference(o.shape, o.predicted_samples_per_s))
    return best, tried


def preference(shape: Shape, samples_per_s: float) -> tuple[float, int, int]:
    """How shapes rank (the larger, the better): the most samples/s; on a tie the fewest
    processes, then the fewest micro-batches."""
    return (round(samples_per_s, 6), -shape.workers * shape.n_stages, -shape.n_microbatches)


def plan_shape(
    planner: Planner,
    costs_at: CostsAt,
    shape: Shape,
    batch_size: int,
    overheads: RuntimeOverheads,
    schedule: str,
    memory_budget: int | None,
    sizes_at: SizesAt | None = None,
) -> ShapeOption:
    """`shape`'s plan and predicted step (module doc), or why it has none. Under a memory
    budget the layers' bytes (`sizes_at`) rule a shape out before its costs are measured
    (`costs_at`): whether any plan fits depends on the bytes alone (every planner's
    contract, `InfeasibleBudgetError`)."""
    microbatch = batch_size // shape.n_microbatches

    def plan(costs: Sequence[LayerCost]) -> Plan:
        return planner.plan(
            costs,
            shape.n_stages,
            schedule=schedule,
            n_microbatches=shape.n_microbatches,
            memory_budget=memory_budget,
            link=overheads.link() if shape.n_stages > 1 else None,
        )

    if memory_budget is not None and sizes_at is not None:
        try:
            plan(sizes_at(microbatch))
        except InfeasibleBudgetError as error:  # its bytes fit no plan: nothing timed here
            return ShapeOption(shape, None, math.inf, 0.0, str(error))
        except ValueError:  # a planner that wants measured seconds decides on them below
            pass
    try:
        planned = plan(costs_at(shape.threads_per_stage, microbatch))
    except (InfeasibleBudgetError, ValueError) as error:
        return ShapeOption(shape, None, math.inf, 0.0, str(error))
    step_s = predicted_step_s(planned, overheads)
    return ShapeOption(shape, planned, step_s, shape.workers * batch_size / step_s)


def layer_count(costs_at: CostsAt, sizes_at: SizesAt | None, threads: int, microbatch: int) -> int:
    """The model's layers, from its bytes where they are given (nothing timed), else from
    its costs on `threads` threads at `microbatch`."""
    return len(sizes_at(microbatch) if sizes_at is not None else costs_at(threads, microbatch))
