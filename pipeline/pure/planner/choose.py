"""`schedule="auto"`: plan every exact schedule's placement and keep the fastest predicted.

One stage per rank (1F1B, ZB-H1) and several (interleaved 1F1B, ZB-V) cut the model into a
different number of stages, so their plans are not comparable before each is planned: the
planner partitions S = v * R stages for each candidate, under the same rank memory budget,
and the simulator (`pipeline.pure.simulate`, through `evaluate`) predicts each plan's
iteration. The fastest plan that exists wins; every candidate's outcome is kept, with the
reason a candidate was left out (too few layers for its stages, no plan fits the budget),
so a user can see why a schedule was or was not picked.

Only the flushed schedules that train exactly like one process compete: GPipe holds every
micro-batch in flight for no gain over 1F1B, and the stream schedules (2BW, PipeMare) change
the optimisation itself, which is the user's call, not the planner's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.pure.costs import LayerCost, LinkCost
from pipeline.pure.planner.base import InfeasibleBudgetError, Plan, Planner
from pipeline.pure.schedule import get_schedule

__all__ = ["AUTO_CANDIDATES", "Candidate", "choose_schedule"]

AUTO_CANDIDATES = ("1f1b", "zbh1", "interleaved_1f1b", "zbv")


@dataclass(frozen=True)
class Candidate:
    """One schedule `choose_schedule` tried: its plan, or why it has none."""

    schedule: str
    n_stages: int
    plan: Plan | None
    reason: str  # "" for a candidate that was planned

    def to_dict(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule,
            "n_stages": self.n_stages,
            "reason": self.reason,
            "predicted_iteration_s": None if self.plan is None else self.plan.predicted_iteration_s,
        }


def choose_schedule(
    planner: Planner,
    costs: Sequence[LayerCost],
    n_ranks: int,
    *,
    n_microbatches: int,
    memory_budget: int | None = None,
    link: LinkCost | None = None,
    candidates: Sequence[str] = AUTO_CANDIDATES,
) -> tuple[Candidate, list[Candidate]]:
    """(the fastest candidate, every candidate tried); ValueError if none can be planned."""
    tried = [
        _plan(planner, costs, n_ranks, name, n_microbatches, memory_budget, link)
        for name in candidates
    ]
    planned = [c for c in tried if c.plan is not None]
    if not planned:
        reasons = "; ".join(f"{c.schedule}: {c.reason}" for c in tried)
        raise ValueError(
            f"no schedule can be planned for {len(costs)} layers on {n_ranks} ranks: {reasons}"
        )
    best = min(planned, key=lambda c: c.plan.predicted_iteration_s if c.plan else 0.0)
    return best, tried


def _plan(
    planner: Planner,
    costs: Sequence[LayerCost],
    n_ranks: int,
    name: str,
    m: int,
    memory_budget: int | None,
    link: LinkCost | None,
) -> Candidate:
    n_stages = get_schedule(name).stages_per_rank * n_ranks
    if len(costs) < n_stages:
        return Candidate(
            name,
            n_stages,
            None,
            f"needs at least {n_stages} layers for its "
            f"{n_stages} stages, the model has {len(costs)}",
        )
    try:
        plan = planner.plan(
            costs, n_stages, schedule=name, n_microbatches=m, memory_budget=memory_budget, link=link
        )
    except InfeasibleBudgetError as error:
        return Candidate(name, n_stages, None, str(error))
    return Candidate(name, n_stages, plan, "")
