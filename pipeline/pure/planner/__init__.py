"""Planners: turn per-layer costs into a partition and a memory plan, by name.

    from pipeline.pure.planner import get_planner
    plan = get_planner("time").plan(costs, n_stages=4, schedule="1f1b",
                                    n_microbatches=8, memory_budget=8 << 30)

"time" (`TimePlanner`) minimises the bottleneck stage time under a memory budget, with
per-layer recompute (and swap); "memory" (`MemoryPlanner`, CAPSlog) minimises the largest
per-stage peak; "bipartition" (`BiPartitionPlanner`) challenges the time planner's layout
with a Bi-Partition cut. `replan` decides whether a new plan pays back the layers it moves.

    base.py         Plan, `evaluate` (the shared model), and `Planner`, the lifecycle every
                    planner runs: validate the `Problem`, `propose` layouts, evaluate, choose
    schedule_facts.py  what a schedule implies: placement, in-flight counts, weight copies
    search.py       the min-max partition search over cut points, given a range cost
    time.py, memory.py, bipartition.py   the strategies: a cost model and a `propose`
    payback.py      `replan`: adopt a new plan only if it pays for its move
    choose.py       `choose_schedule` (schedule="auto"): plan each exact schedule's
                    placement, keep the fastest predicted

With several stages per rank (interleaved 1F1B, ZB-V: `pipeline.pure.placement`) a planner
partitions n_stages = v * R stages with the same min-max objective; the memory budget is a
rank's, so its searches hold each stage to budget / v and a plan fits when every rank's sum
of stages does.
"""

from __future__ import annotations

from typing import Any

from pipeline.pure.planner.base import (
    InfeasibleBudgetError,
    Plan,
    Planner,
    evaluate,
    in_flight_counts,
)
from pipeline.pure.planner.bipartition import BiPartitionPlanner
from pipeline.pure.planner.choose import AUTO_CANDIDATES, Candidate, choose_schedule
from pipeline.pure.planner.memory import MemoryPlanner
from pipeline.pure.planner.payback import Replan, moved_layers, replan
from pipeline.pure.planner.time import TimePlanner
from pipeline.pure.registry import Registry, is_import_path

__all__ = [
    "AUTO_CANDIDATES",
    "PLANNERS",
    "BiPartitionPlanner",
    "Candidate",
    "InfeasibleBudgetError",
    "MemoryPlanner",
    "Plan",
    "Planner",
    "Replan",
    "TimePlanner",
    "choose_schedule",
    "evaluate",
    "get_planner",
    "in_flight_counts",
    "moved_layers",
    "replan",
]

# Every planner by name; a user's `Planner` subclass is found by import path as well.
PLANNERS: Registry[type[Planner]] = Registry(
    "planner",
    {"time": TimePlanner, "memory": MemoryPlanner, "bipartition": BiPartitionPlanner},
    base=Planner,
)


def get_planner(name: str, **options: Any) -> Planner:
    """A planner by name (any case) or a `Planner` subclass by import path
    ("package.module:ClassName"), built with `options` (e.g. allow_swap=True for "time")."""
    if not isinstance(name, str):
        raise TypeError(f"a planner is named by a string, got {name!r}")
    planner: Planner = PLANNERS.build(name if is_import_path(name) else name.lower(), **options)
    return planner
