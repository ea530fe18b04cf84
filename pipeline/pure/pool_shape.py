"""One model's own pipeline on a pool of stage processes: how many stages, which counts it
may also start on, preferred first.

A search on a `pipeline.distributed.pool.StagePool` trains each candidate on the stage count
it needs, several side by side (`pipeline.pure.pool` lends the processes). What it is judged
by is the pool's samples per second, summed over its processes, so a candidate takes more
stages only where they are predicted faster *per process*: the other processes train other
candidates meanwhile. The arithmetic is `pipeline.pure.shape`'s (`plan_shape`: a plan and
its predicted step per shape); this module picks among the options:

    stages_for        the options tried (fewest stages and micro-batches first) and the
                      best per process within the model's error
    with_fallbacks    the best, then smaller counts that lose at most a share per process
                      (a job starts on what is free rather than wait for more)
    fastest_first     a job no other will want the pool for: its fastest option first
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from pipeline.pure.planner.base import Planner
from pipeline.pure.shape import (
    CostsAt,
    RuntimeOverheads,
    ShapeLimits,
    ShapeOption,
    SizesAt,
    layer_count,
    plan_shape,
    preference,
    shapes,
)

__all__ = [
    "FEWER_STAGES_SHARE",
    "fastest_first",
    "most_per_process",
    "stages_for",
    "with_fallbacks",
]


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
    sizes_at: SizesAt | None = None,
    measured: Mapping[int, float] | None = None,
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
    (`costs_at`), so a model that fits one process is profiled once, and one its bytes
    (`sizes_at`) rule out under the budget is not (`plan_shape`). `exhaustive`: every
    option is tried (a job the pool runs alone wants the fastest: `fastest_first`).

    `measured`: per stage count, what the pool's earlier jobs on that many stages measured
    against their prediction (samples/s, a ratio); each option's prediction is scaled by
    its count's (1 where none ran) before they are ranked. The model knows the layers and
    the runtime's overheads, not the pool's load: on 2 cores, beside the workers sizing
    their next candidates, 2-stage jobs ran at 0.69 of their prediction and single stages
    at 0.95-1.05 (a stalled stage stalls the pipeline)."""
    limits = ShapeLimits(
        cores=max_stages * threads,
        batch_size=batch_size,
        workers=1,
        threads_per_stage=threads,
        n_microbatches=n_microbatches,
    )
    ratios = dict(measured or {})
    for stages, ratio in ratios.items():
        if not (math.isfinite(ratio) and ratio > 0):
            raise ValueError(f"measured[{stages}]={ratio!r}: a ratio must be finite and > 0")
    n_layers = layer_count(costs_at, sizes_at, threads, batch_size // (n_microbatches or 1))
    tried: list[ShapeOption] = []
    for shape in shapes(limits, n_layers):
        option = plan_shape(
            planner, costs_at, shape, batch_size, overheads, schedule, memory_budget, sizes_at
        )
        tried.append(_as_measured(option, ratios.get(shape.n_stages, 1.0)))
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


def _as_measured(option: ShapeOption, ratio: float) -> ShapeOption:
    """`option` with its prediction scaled by `ratio` (measured / predicted samples/s)."""
    if ratio == 1.0 or option.plan is None:
        return option
    return dataclasses.replace(
        option,
        predicted_step_s=option.predicted_step_s / ratio,
        predicted_samples_per_s=option.predicted_samples_per_s * ratio,
    )


def _unhindered(option: ShapeOption) -> bool:
    """A single stage planned with every activation kept: nothing on more processes is
    faster per process (`stages_for`)."""
    return (
        option.plan is not None
        and option.shape.n_stages == 1
        and all(action == "keep" for action in option.plan.actions)
    )
