"""What a schedule implies for planning: its placement, in-flight counts and weight copies.

The planners (`pipeline.pure.planner.base` and the strategies) read these off the schedule
itself, by name, as a spec or as a plain builder (`pipeline.pure.schedule.spec_of`), so a new
schedule needs no planner change: its lists give the in-flight counts, its spec's
`placement` and `stages_per_rank` where its stages go (`pipeline.pure.schedule.placement_for`,
shared with the simulator), its `weight_copies` the parameter copies it keeps.
"""

from __future__ import annotations

from pipeline.pure.schedule import ScheduleLike, in_flight, placement_for, spec_of

__all__ = ["ScheduleLike", "in_flight_counts", "schedule_name", "weight_copies"]


def schedule_name(schedule: ScheduleLike) -> str:
    """What a plan records as its schedule: its spec's name (a builder's: its `__name__`)."""
    return spec_of(schedule).name


def in_flight_counts(schedule: ScheduleLike, n_stages: int, n_microbatches: int) -> list[int]:
    """Micro-batches each stage keeps in flight, read off the schedule itself (a schedule
    with several stages per rank: off each stage's actions in its rank's list)."""
    spec = spec_of(schedule)
    if not spec.multi_stage:
        return [in_flight(spec(n_stages, n_microbatches, s)) for s in range(n_stages)]
    placement = placement_for(spec, n_stages)
    lists = [spec(placement.n_ranks, n_microbatches, r) for r in range(placement.n_ranks)]
    return [
        in_flight([a for a in lists[placement.rank_of(s)] if a.stage == s]) for s in range(n_stages)
    ]


def weight_copies(schedule: ScheduleLike) -> int:
    """Parameter copies a stage holds: its spec's `weight_copies` (2 for PipeDream-2BW)."""
    return spec_of(schedule).weight_copies
