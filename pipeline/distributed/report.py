"""What a running pipeline reports: statistics, and pictures of its partition and its steps.

Kept apart from `pipeline.distributed.elastic` so the facade stays short. `stats` is a collective
(one all_gather) and returns a `PipelineStats`: frozen, typed, with `to_dict()` for loggers.
The arithmetic (tokens in a batch, throughput, bubble fraction) is in small pure functions
here, testable without processes. The pictures come from `pipeline.pure.timeline`.

Definitions used throughout (times are per step, all micro-batches, medians over the last
steps):

    iteration_s        the slowest stage's total step time (a step ends when its last stage does)
    busy time          a stage's forward + backward + optimizer time (not waiting)
    bubble_fraction    1 - (the busiest stage's busy time) / iteration_s: the share of the
                       step the bottleneck stage spends idle (waiting for its neighbours, on
                       messages, or outside the schedule's actions). 0 means the slowest stage
                       computes all the time; the other stages idle more. Clamped to [0, 1].
    predicted_bubble_fraction
                       the same formula on the plan's simulation: busy = the plan's largest
                       per-micro-batch stage time x n_microbatches, over its predicted
                       iteration. (`pipeline.pure.simulate.SimResult.bubble_fraction` is
                       instead the mean idle share over all stages.)
    tokens             where the batch input (or its first tensor) is an integer tensor of
                       at least two dims (batch, sequence): batch x sequence per step
"""

from __future__ import annotations

import dataclasses
import json
import resource
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.distributed.comm import Comm
from pipeline.distributed.events import plain
from pipeline.distributed.holder import ModelHolder
from pipeline.distributed.migration import MigrationRecord
from pipeline.distributed.parts import ReportedPipeline
from pipeline.local.history import StepHistory
from pipeline.local.stage import Stage
from pipeline.pure.checks import is_int
from pipeline.pure.placement import Placement
from pipeline.pure.planner import Plan
from pipeline.pure.timeline import chrome_trace, partition_svg

__all__ = [
    "PipelineStats",
    "StageStats",
    "bubble_fraction",
    "per_second",
    "predicted_bubble_fraction",
    "process_peak_bytes",
    "save_partition_picture",
    "save_timeline",
    "stats",
    "token_count",
    "tokens_per_s",
]


@dataclass(frozen=True)
class StageStats:
    """One rank's figures (its stage's, or its stages' together under an interleaved or V
    schedule). Times: seconds per step, medians over the last steps."""

    stage: int  # the rank
    layers: tuple[str, ...]  # layer keys, in stage order
    memory_actions: tuple[str, ...]  # per layer: "keep" | "recompute" | "swap"
    forward_s: float
    backward_s: float
    wait_s: float  # blocked on a receive or on the sends before the optimizer step
    optimizer_s: float
    total_s: float
    param_bytes: int
    state_bytes: int  # parameters, gradients and optimizer state
    activation_peak_bytes: int  # the latest measured in-flight activation peak
    measured_peak_bytes: int  # state_bytes + activation_peak_bytes
    predicted_peak_bytes: int | None  # the plan's; None without a plan
    predicted_compute_s: float | None  # the plan's forward + backward per step
    allocator_peak_bytes: int | None  # GPU: the allocator's peak in a measured step
    # this process over the whole run: CPU, the resident set's high-water mark; GPU, the
    # allocator's largest peak over the measured steps (`process_peak_bytes`)
    process_peak_bytes: int
    # of the micro-batch forwards in the last steps, the share that ran the stage as one
    # graph (`pipeline.local.fused`); the rest measured per layer
    fused_share: float = 0.0

    @property
    def busy_s(self) -> float:
        """forward + backward + optimizer: the time the stage computes in a step."""
        return self.forward_s + self.backward_s + self.optimizer_s

    def to_dict(self) -> dict[str, Any]:
        """Every field, in plain JSON values (tuples as lists)."""
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class PipelineStats:
    """What `ElasticPipeline.stats()` returns: the pipeline's figures, predicted beside measured.

    Predicted figures come from the plan in force and are None without one (explicit stage
    sizes). Definitions (iteration, bubble, tokens): module doc.
    """

    generation: int  # which model: +1 per reconfigure
    steps: int  # steps trained on this model
    plan_version: int  # +1 per committed migration
    plan: Plan | None
    schedule: str
    n_microbatches: int
    partition: tuple[int, ...]  # layers per stage
    iteration_s: float
    predicted_iteration_s: float | None
    samples_per_s: float
    tokens_per_s: float | None  # None unless the batch input holds token ids
    bubble_fraction: float
    predicted_bubble_fraction: float | None
    migrations: tuple[MigrationRecord, ...]
    stages: tuple[StageStats, ...]

    def to_dict(self) -> dict[str, Any]:
        """Every field in plain JSON values: the plan via `Plan.to_dict`, records as dicts."""
        out = {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out["plan"] = None if self.plan is None else plain(self.plan.to_dict())
        return out


# -- the arithmetic, pure ----------------------------------------------------------------------
def token_count(x: Any) -> int | None:
    """Tokens in a batch input: batch x sequence where `x` (or its first tensor) is an integer
    tensor of at least two dims; None otherwise (floating inputs, flat ids, no tensor)."""
    first = x[0] if isinstance(x, tuple | list) and x else x
    if not isinstance(first, torch.Tensor) or first.dim() < 2:
        return None
    if first.is_floating_point() or first.is_complex() or first.dtype == torch.bool:
        return None
    return int(first.shape[0]) * int(first.shape[1])


def per_second(counts: Sequence[int], iteration_s: float) -> float:
    """The median count per step over the step time; 0.0 before anything was timed."""
    if iteration_s <= 0 or not counts:
        return 0.0
    return float(statistics.median(counts)) / iteration_s


def tokens_per_s(tokens: Sequence[int | None], iteration_s: float) -> float | None:
    """`per_second` of the tokens per step; None unless every step counted tokens."""
    if not tokens or any(t is None for t in tokens):
        return None
    return per_second([t for t in tokens if t is not None], iteration_s)


def bubble_fraction(busy_s: Sequence[float], iteration_s: float) -> float:
    """1 - max(busy_s) / iteration_s, clamped to [0, 1]; 0.0 before anything was timed."""
    if iteration_s <= 0 or not busy_s:
        return 0.0
    return min(1.0, max(0.0, 1.0 - max(busy_s) / iteration_s))


def predicted_bubble_fraction(
    plan: Plan | None, placement: Placement | None = None
) -> float | None:
    """`bubble_fraction` on the plan's numbers (module doc); None without a plan. A rank
    is busy for all its stages (`placement`; default: one stage per rank)."""
    if plan is None:
        return None
    stage_s = plan.predicted_stage_s
    held = (
        [placement.stages_of(r) for r in range(placement.n_ranks)]
        if placement
        else [(s,) for s in range(len(stage_s))]
    )
    busy = [sum(stage_s[s] for s in stages) * plan.n_microbatches for stages in held]
    return bubble_fraction(busy, plan.predicted_iteration_s)


def _predicted_rank_bytes(plan: Plan | None, rank: int, held: Sequence[int]) -> int | None:
    """The plan's peak for `rank`, which holds stages `held` (None without a plan)."""
    if plan is None:
        return None
    if plan.predicted_rank_bytes:
        return plan.predicted_rank_bytes[rank]
    return sum(plan.predicted_stage_bytes[s] for s in held)


def process_peak_bytes(device: torch.device, history: StepHistory) -> int:
    """This process's memory peak over the whole run: on a GPU the allocator's largest
    measured peak; on the CPU the resident set's high-water mark (`getrusage`, which
    Linux reports in KiB and macOS in bytes)."""
    if device.type == "cuda":
        return history.peak_allocator_bytes or 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


# -- the collective ----------------------------------------------------------------------------
def stats(pipe: ReportedPipeline, stages: Sequence[Stage], last_steps: int) -> PipelineStats:
    """`ElasticPipeline.stats`: gather every rank's numbers; predicted beside measured.

    One `StageStats` per rank: a rank that holds several stages (interleaved, V) reports
    them together, as they share its compute and memory."""
    if not is_int(last_steps) or last_steps < 1:
        raise ValueError(f"last_steps must be a positive int, got {last_steps!r}")
    model = pipe.model
    history = model.history
    recent = history.recent(last_steps)
    times = [r.times for r in recent]
    plan, m, rank = model.plan, pipe.options.n_microbatches, pipe.comm.rank
    activations = history.latest_activation_bytes
    state_bytes = sum(stage.state_bytes() for stage in stages)
    layers = [layer for stage in stages for layer in stage.layers]
    held = [stage.index for stage in stages]
    mine = StageStats(
        stage=rank,
        layers=tuple(layer.key for layer in layers),
        memory_actions=tuple(layer.action for layer in layers),
        forward_s=_median([t.forward_s for t in times]),
        backward_s=_median([t.backward_s for t in times]),
        wait_s=_median([t.wait_s for t in times]),
        optimizer_s=_median([t.optimizer_s for t in times]),
        total_s=_median([t.total_s for t in times]),
        fused_share=sum(t.fused_forwards for t in times) / max(1, sum(t.forwards for t in times)),
        param_bytes=sum(stage.param_bytes() for stage in stages),
        state_bytes=state_bytes,
        activation_peak_bytes=activations,
        measured_peak_bytes=state_bytes + activations,
        predicted_peak_bytes=_predicted_rank_bytes(plan, rank, held),
        predicted_compute_s=sum(plan.predicted_stage_s[s] for s in held) * m if plan else None,
        # GPU: the allocator's peak over a measured step (all memory, not only the planned)
        allocator_peak_bytes=history.latest_allocator_bytes,
        process_peak_bytes=process_peak_bytes(stages[0].device, history),
    )
    per_stage: tuple[StageStats, ...] = tuple(pipe.comm.all_gather_object(mine))
    iteration_s = max(s.total_s for s in per_stage)
    return PipelineStats(
        generation=pipe.generation,
        steps=model.step,
        plan_version=model.version,
        plan=plan,
        schedule=pipe.schedule.name,
        n_microbatches=m,
        partition=tuple(model.sizes),
        iteration_s=iteration_s,
        predicted_iteration_s=plan.predicted_iteration_s if plan else None,
        samples_per_s=per_second([r.samples for r in recent], iteration_s),
        tokens_per_s=tokens_per_s([r.tokens for r in recent], iteration_s),
        bubble_fraction=bubble_fraction([s.busy_s for s in per_stage], iteration_s),
        predicted_bubble_fraction=predicted_bubble_fraction(plan, pipe.placement),
        migrations=tuple(model.migrations),
        stages=per_stage,
    )


def save_partition_picture(model: ModelHolder, path: str | Path) -> Path:
    """An SVG of which layers lived on which stage, step by step."""
    svg = partition_svg(model.partition_history, [s.key for s in model.specs], model.step)
    path = Path(path)
    path.write_text(svg)
    return path


def save_timeline(comm: Comm, stages: Sequence[Stage], path: str | Path, title: str) -> Path | None:
    """Gather every stage's spans of the last step; rank 0 writes Chrome-trace JSON (one
    row per stage)."""
    spans = comm.all_gather_object([span for stage in stages for span in stage.spans])
    if comm.rank != 0:
        return None
    path = Path(path)
    path.write_text(json.dumps(chrome_trace([s for part in spans for s in part], title)))
    return path
