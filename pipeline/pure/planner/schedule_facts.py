"""What a schedule implies for planning: its placement, in-flight counts and weight copies.

The planners (`pipeline.pure.planner.base` and the strategies) read these off the schedule
itself, by name or as a function, so a new schedule needs no planner change: its lists give
the in-flight counts, its `placement` and `stages_per_rank` attributes where its stages go
(`pipeline.pure.placement`), its `weight_copies` attribute the parameter copies it keeps.
"""

from __future__ import annotations

from pipeline.pure.placement import Placement
from pipeline.pure.schedule import (
    SCHEDULES,
    ScheduleFn,
    get_schedule,
    in_flight,
    is_multi_stage,
    placement_of,
)

__all__ = ["ScheduleLike", "in_flight_counts", "placement_for", "schedule_name", "weight_copies"]

ScheduleLike = str | ScheduleFn  # a schedule's name, or a schedule function


def schedule_name(schedule: ScheduleLike) -> str:
    """What a plan records as its schedule: the name, or the function's `__name__`."""
    return schedule if isinstance(schedule, str) else getattr(schedule, "__name__", "custom")


def placement_for(schedule: ScheduleLike, n_stages: int) -> Placement:
    """Where `schedule` puts `n_stages` stages: several per rank for an interleaved or V
    schedule (`n_stages` must then be a multiple of its stages per rank), else one each."""
    fn = get_schedule(schedule) if isinstance(schedule, str) else schedule
    v = int(getattr(fn, "stages_per_rank", 1))
    if n_stages % v:
        raise ValueError(
            f"schedule {schedule_name(schedule)!r} holds {v} stages per rank, so "
            f"n_stages must be a multiple of {v}, got {n_stages}"
        )
    return placement_of(fn, n_stages // v)


def in_flight_counts(schedule: ScheduleLike, n_stages: int, n_microbatches: int) -> list[int]:
    """Micro-batches each stage keeps in flight, read off the schedule itself (a schedule
    with several stages per rank: off each stage's actions in its rank's list)."""
    fn = get_schedule(schedule) if isinstance(schedule, str) else schedule
    if not is_multi_stage(fn):
        return [in_flight(fn(n_stages, n_microbatches, s)) for s in range(n_stages)]
    placement = placement_for(fn, n_stages)
    lists = [fn(placement.n_ranks, n_microbatches, r) for r in range(placement.n_ranks)]
    return [
        in_flight([a for a in lists[placement.rank_of(s)] if a.stage == s]) for s in range(n_stages)
    ]


def weight_copies(schedule: ScheduleLike) -> int:
    """Parameter copies a stage holds: 2 for PipeDream-2BW (double-buffered), else 1.

    A schedule function may say how many it needs in a `weight_copies` attribute.
    """
    if not isinstance(schedule, str):
        return int(getattr(schedule, "weight_copies", 1))
    if schedule.lower() in SCHEDULES:
        return int(getattr(SCHEDULES[schedule.lower()], "weight_copies", 1))
    return 2 if schedule.lower().replace("-", "").replace("_", "") in ("2bw", "pipedream2bw") else 1
