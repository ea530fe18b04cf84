"""The study's shape when it is left "auto": workers, stages, threads and micro-batches.

`study.workers`, `pipeline.n_stages`, `pipeline.n_microbatches` and
`pipeline.threads_per_stage` may each be "auto". Before any process starts, `resolve`
profiles the study's seed architectures (the models every study trains first, and the
centre of the space evolution explores) in this process, layer by layer, at every
micro-batch size and thread count a shape could give them, and predicts each shape's
samples per second of the whole machine (`pipeline.pure.shape.choose_shape`): one
single-stage worker per core for a small model, a pipeline for a model whose single stage
exceeds `pipeline.memory_budget` or that is predicted faster pipelined. Values the user set
stay as set; the others are filled in, and the shape with its prediction is logged.

What it measures is kept in the machine's cost cache (`cache_path`): the layers' costs by
signature (threads included) and the runtime's own overheads (measured once per machine,
`pipeline.distributed.overheads`). The stage processes start from the same cache, so a
trial's layers already profiled here are not timed again, and each trial logs the shape and
its predicted samples per second beside the measured (`predicted_samples_per_s`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nas.settings import AUTO, NasSettings
from nas.study.profiles import profile_candidates
from nas.study.space import seed_models
from pipeline import CostCache, StageContext, launch, under_torchrun
from pipeline.distributed.overheads import measure_overheads
from pipeline.pure.planner import InfeasibleBudgetError, get_planner
from pipeline.pure.pool_shape import fastest_first, stages_for, with_fallbacks
from pipeline.pure.shape import (
    RuntimeOverheads,
    Shape,
    ShapeLimits,
    ShapeOption,
    choose_shape,
    preference,
)
from search_spaces.architecture import Architecture

__all__ = [
    "ShapeChoice",
    "cache_path",
    "cores",
    "learn_costs",
    "least_stage_bytes",
    "load_cache",
    "machine_costs",
    "per_candidate",
    "pool_threads",
    "refresh_costs",
    "resolve",
    "resolve_one",
    "save_cache",
    "with_shape",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShapeChoice:
    """The shape a study runs with, what it predicted, and every shape it weighed."""

    shape: Shape
    predicted_samples_per_s: float  # the machine's, over the seed architectures
    predicted_peak_bytes: int  # the largest stage's, over the seed architectures
    overheads: RuntimeOverheads
    tried: tuple[dict[str, Any], ...]  # per shape: `ShapeOption.to_dict` and the prediction

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.shape.to_dict(),
            "shape": str(self.shape),
            "predicted_samples_per_s": self.predicted_samples_per_s,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "overheads": self.overheads.to_dict(),
            "tried": list(self.tried),
        }


def cores() -> int:
    """The cores this process may run on (its affinity where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cache_path() -> Path:
    """This machine's cost cache: `$XDG_CACHE_HOME/elastic-nas/costs-<host>-torch<v>.json`
    (`~/.cache` by default): layer costs and overheads depend on the machine and torch."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    host = platform.node() or "host"
    return base / "elastic-nas" / f"costs-{host}-torch{torch.__version__}.json"


def load_cache() -> CostCache:
    """This machine's cost cache (empty if none was saved, or unreadable: then re-measured)."""
    path = cache_path()
    try:
        return CostCache.load(path)
    except (OSError, ValueError, KeyError) as error:
        if path.exists():
            logger.warning("cost cache %s unreadable (%s): measuring again", path, error)
        return CostCache()


def save_cache(costs: CostCache) -> None:
    """Keep `costs` as this machine's cache; where it cannot be written (a read-only home),
    say so: the next study measures again."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        costs.save(tmp)
        tmp.replace(path)  # atomic: another worker may read it meanwhile
    except OSError as error:
        logger.warning("cost cache %s not saved: %s", path, error)


def learn_costs(learned: CostCache, *, errors: bool = True) -> None:
    """Merge what a pipeline measured into this machine's cost cache (workers may save it
    side by side: each merges into what is on disk then). `errors`: whether `learned`'s
    prediction errors are the newest (a pipeline's, which measured its plans against them);
    a worker that only sized candidates holds the errors it read, which trials have since
    added to."""
    merged = load_cache()
    merged.update(learned.entries())
    if merged.overheads is None and learned.overheads is not None:
        merged.set_overheads(learned.overheads)
    if errors and learned.errors.to_dict():  # it started from the cache: they are the newest
        merged.set_errors(learned.errors)
    save_cache(merged)


def refresh_costs(costs: CostCache) -> None:
    """Bring `costs` up to this machine's cache: the layers other processes timed since it
    was read, and the prediction errors the trials since have learned."""
    saved = load_cache()
    costs.update(saved.entries())
    if costs.overheads is None and saved.overheads is not None:
        costs.set_overheads(saved.overheads)
    if saved.errors.to_dict():
        costs.set_errors(saved.errors)


def machine_costs() -> CostCache:
    """This machine's cost cache, with the runtime's overheads (measured here, once per
    machine, when the cache has none)."""
    costs = load_cache()
    if costs.overheads is None:
        logger.info("measuring the runtime's overheads on this machine (once)")
        costs.set_overheads(measure_overheads())
        save_cache(costs)
    return costs


def per_candidate(
    settings: NasSettings,
    arch: Architecture,
    task: Any,
    costs: CostCache,
    max_stages: int,
    *,
    alone: bool = False,
    measured: Mapping[int, float] | None = None,
) -> list[ShapeOption]:
    """The pipelines one candidate can train on from a pool of `max_stages` processes
    (`pipeline.per_candidate`), preferred first: the fewest stages whose plan fits
    `pipeline.memory_budget`, more only where predicted faster per process by more than
    the cost cache's error (`pipeline.pure.pool_shape.stages_for`), then the fewer stages it
    may start on at once rather than wait for more processes
    (`pipeline.pure.pool_shape.with_fallbacks`); from its layers' costs (profiled here unless
    `costs` has them: it keeps what it measures).
    `alone`: no other trial will want the pool (the study's last, no peer's running):
    the fastest first, more stages where free (`pipeline.pure.pool_shape.fastest_first`).
    `measured`: per stage count, what the pool's jobs measured against their prediction
    (`nas.study.trials.measured_shares`), which scales the predictions (`stages_for`).
    ValueError naming the budget when no pipeline of at most `max_stages` fits it."""
    assert costs.overheads is not None, "machine_costs() measures the overheads"
    p = settings.pipeline
    [profile] = profile_candidates(settings, [arch], costs, task)
    best, tried = stages_for(
        get_planner(p.planner),
        profile.costs_at,
        costs.overheads,
        max_stages=max_stages,
        batch_size=settings.train.batch_size,
        threads=pool_threads(settings),
        n_microbatches=None if p.n_microbatches == AUTO else int(p.n_microbatches),
        schedule=p.schedule,
        memory_budget=p.memory_budget,
        exhaustive=alone,
        error=costs.errors.error,
        sizes_at=profile.sizes_at,
        measured=measured,
    )
    return fastest_first(tried) if alone else with_fallbacks(best, tried)


def least_stage_bytes(
    settings: NasSettings, arch: Architecture, task: Any, costs: CostCache, n_stages: int
) -> int:
    """The smallest per-stage memory budget under which `arch` can be planned on `n_stages`
    stages (its memory plan at its leanest: the planner's `InfeasibleBudgetError`), at
    `pipeline.n_microbatches` (2 when "auto") and the pool's threads, for the task's
    largest batch (as a budget is planned)."""
    p = settings.pipeline
    [profile] = profile_candidates(settings, [arch], costs, task, budgeted=True)
    microbatches = 2 if p.n_microbatches == AUTO else int(p.n_microbatches)
    layer_costs = profile.costs_at(
        pool_threads(settings), settings.train.batch_size // microbatches
    )
    assert costs.overheads is not None, "machine_costs() measures the overheads"
    try:
        plan = get_planner(p.planner).plan(
            layer_costs,
            n_stages,
            schedule=p.schedule,
            n_microbatches=microbatches,
            memory_budget=1,
            link=costs.overheads.link() if n_stages > 1 else None,
        )
    except InfeasibleBudgetError as error:
        return error.min_budget
    return max(plan.predicted_stage_bytes)  # pragma: no cover - nothing fits in one byte


def pool_threads(settings: NasSettings) -> int:
    """Threads of each pool process: `pipeline.threads_per_stage` when set, else 1."""
    threads = settings.pipeline.threads_per_stage
    return threads if isinstance(threads, int) else 1


def resolve(
    settings: NasSettings,
    *,
    max_workers: int | None = None,
    architectures: Sequence[Architecture] | None = None,
) -> tuple[NasSettings, ShapeChoice | None]:
    """`settings` with every "auto" shape value chosen (module doc), and the choice; the
    same settings and None when nothing is "auto". `max_workers`: at most this many workers
    (no more than there is work for); `architectures`: the models to shape the machine for
    (default: the study's seed architectures)."""
    p, workers = settings.pipeline, settings.study.workers
    if not p.auto_keys and workers != AUTO:
        return settings, None
    costs = machine_costs()
    assert costs.overheads is not None
    limits = ShapeLimits(
        cores=cores(),
        batch_size=settings.train.batch_size,
        workers=None if workers == AUTO else int(workers),
        n_stages=None if p.n_stages == AUTO else int(p.n_stages),
        threads_per_stage=_fixed_threads(p.threads_per_stage, p.n_stages),
        n_microbatches=None if p.n_microbatches == AUTO else int(p.n_microbatches),
        max_workers=max_workers,
    )
    if architectures is None:
        architectures = list(seed_models(settings).values())
    options = [
        choose_shape(
            get_planner(p.planner),
            profile.costs_at,
            limits,
            costs.overheads,
            schedule=p.schedule,
            memory_budget=p.memory_budget,
            sizes_at=profile.sizes_at,
        )[1]
        for profile in profile_candidates(settings, architectures, costs)
    ]
    save_cache(costs)
    choice = _best(options, costs.overheads)
    logger.info(
        "shape: %s, predicted %.0f samples/s on %d cores",
        choice.shape,
        choice.predicted_samples_per_s,
        limits.cores,
    )
    return with_shape(settings, choice.shape), choice


def with_shape(settings: NasSettings, shape: Shape) -> NasSettings:
    """`settings` with the workers, stages, micro-batches and threads of `shape`."""
    return dataclasses.replace(
        settings,
        study=dataclasses.replace(settings.study, workers=shape.workers),
        pipeline=dataclasses.replace(
            settings.pipeline,
            n_stages=shape.n_stages,
            n_microbatches=shape.n_microbatches,
            threads_per_stage=shape.threads_per_stage,
        ),
    )


def resolve_one(settings: NasSettings) -> tuple[NasSettings, ShapeChoice | None]:
    """`resolve` for one worker (a retraining, a study's stages under torchrun): under
    torchrun the stages are its WORLD_SIZE processes, and rank 0 alone chooses for all of
    them. Timings differ between processes: ranks that each chose from their own profile
    once chose different micro-batch counts and each waited for messages the other never
    sent (a torchrun study hung so, 300 s, until the group's timeout)."""
    fixed = dataclasses.replace(settings.pipeline)
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else None
    if world is not None:
        fixed.n_stages = world
    one = dataclasses.replace(
        settings, study=dataclasses.replace(settings.study, workers=1), pipeline=fixed
    )
    if world is None:
        return resolve(one, max_workers=1)
    chosen = launch(functools.partial(_resolved_here, settings=one), world)[0]
    assert chosen is not None, "rank 0 resolves the shape"
    return chosen


def _resolved_here(
    ctx: StageContext, settings: NasSettings
) -> tuple[NasSettings, ShapeChoice | None] | None:
    """`resolve` for one worker on rank 0 (`resolve_one` hands it to every rank)."""
    return resolve(settings, max_workers=1) if ctx.rank == 0 else None


def _fixed_threads(threads: int | str | None, n_stages: int | str) -> int | None:
    """A fixed thread count; None (cores / stages) is fixed once the stages are."""
    if threads == AUTO:
        return None
    if threads is None:
        return max(1, cores() // int(n_stages)) if n_stages != AUTO else None
    return int(threads)


def _best(options: Sequence[Sequence[ShapeOption]], overheads: RuntimeOverheads) -> ShapeChoice:
    """The shape with the most samples/s over the seeds (their harmonic mean: the rate at
    which the machine trains one step of each), among those every seed could be planned on."""
    rows = [_row(per_seed) for per_seed in zip(*options, strict=True)]
    feasible = [row for row in rows if row["predicted_samples_per_s"] > 0]
    if not feasible:
        raise ValueError("no shape can train the study's seed architectures: " + rows[0]["reason"])
    best = max(feasible, key=lambda row: preference(_shape(row), row["predicted_samples_per_s"]))
    chosen = _shape(best)
    return ShapeChoice(
        chosen,
        best["predicted_samples_per_s"],
        best["predicted_peak_bytes"],
        overheads,
        tuple(rows),
    )


def _shape(row: dict[str, Any]) -> Shape:
    return Shape(row["workers"], row["n_stages"], row["threads_per_stage"], row["n_microbatches"])


def _row(per_seed: Sequence[ShapeOption]) -> dict[str, Any]:
    """One shape over the seeds: its rate (0 unless every seed was planned), its peak, why not."""
    planned = [o.plan for o in per_seed if o.plan is not None]
    rate = (
        statistics.harmonic_mean([o.predicted_samples_per_s for o in per_seed])
        if len(planned) == len(per_seed)
        else 0.0
    )
    return {
        **per_seed[0].shape.to_dict(),
        "predicted_samples_per_s": rate,
        "predicted_peak_bytes": max(
            (max(plan.predicted_stage_bytes) for plan in planned), default=0
        ),
        "reason": "; ".join(o.reason for o in per_seed if o.reason),
    }
