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
    search.py       the min-max partition search over cut points, given a range cost
    time.py, memory.py, bipartition.py   the strategies: a cost model and a `propose`
    payback.py      `replan`: adopt a new plan only if it pays for its move
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
from pipeline.pure.planner.memory import MemoryPlanner
from pipeline.pure.planner.payback import Replan, moved_layers, replan
from pipeline.pure.planner.time import TimePlanner

__all__ = [
    "PLANNERS",
    "BiPartitionPlanner",
    "InfeasibleBudgetError",
    "MemoryPlanner",
    "Plan",
    "Planner",
    "Replan",
    "TimePlanner",
    "evaluate",
    "get_planner",
    "in_flight_counts",
    "moved_layers",
    "replan",
]

PLANNERS: dict[str, type[Planner]] = {
    "time": TimePlanner, "memory": MemoryPlanner, "bipartition": BiPartitionPlanner,
}  # fmt: skip


def get_planner(name: str, **options: Any) -> Planner:
    """A planner by name, constructed with `options` (e.g. allow_swap=True for "time")."""
    try:
        cls = PLANNERS[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown planner {name!r}; valid planners: {sorted(PLANNERS)}") from None
    return cls(**options)
