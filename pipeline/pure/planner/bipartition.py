"""`BiPartitionPlanner`: the time planner's plan, or a Bi-Partition cut where it is faster.

Bi-Partition (`pipeline.pure.bipartition`) hands the backward of a stage's last separable
layers to the next stage, so stage times even out where whole layers cannot. This planner
first asks `TimePlanner` for the best whole-layer plan under the memory budget; then it
searches partitions and handoffs jointly for the smallest bottleneck and takes that plan
only where the simulator predicts a shorter iteration and the memory budget still holds.
It keeps the whole-layer plan when that needed recompute or swap (the search models no
memory actions) and for stream schedules (2BW, PipeMare), whose weight versions the
runtime does not replicate.

A cut is not free: the boundary carries the handed layers' inputs besides the output, on
every micro-batch (for a Linear, its input beside its output). So both plans are simulated
with the link between stages (`link`; without one, `pipeline.pure.costs.HOST_LINK`, about
gloo between two processes on one host), and a cut whose saving the extra bytes eat is not
taken. The search itself balances compute only; the simulator has the last word.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pipeline.pure.bipartition import search
from pipeline.pure.costs import HOST_LINK, LayerCost, LinkCost
from pipeline.pure.planner.base import Plan, Planner, ScheduleLike, check_problem
from pipeline.pure.planner.time import TimePlanner
from pipeline.pure.schedule import is_stream

__all__ = ["BiPartitionPlanner"]


class BiPartitionPlanner(Planner):
    """Whole layers (`TimePlanner`), or a faster Bi-Partition cut (module doc)."""

    name = "bipartition"

    def __init__(self, max_handoff: int = 4) -> None:
        if isinstance(max_handoff, bool) or not isinstance(max_handoff, int) or max_handoff < 0:
            raise ValueError(f"max_handoff must be an int >= 0, got {max_handoff!r}")
        self.max_handoff = max_handoff

    def plan(
        self,
        costs: Sequence[LayerCost],
        n_stages: int,
        *,
        schedule: ScheduleLike = "1f1b",
        n_microbatches: int = 8,
        memory_budget: int | None = None,
        link: LinkCost | None = None,
    ) -> Plan:
        check_problem(costs, n_stages, n_microbatches)
        link = HOST_LINK if link is None else link
        whole = TimePlanner().plan(costs, n_stages, schedule=schedule,
                                   n_microbatches=n_microbatches, memory_budget=memory_budget,
                                   link=link)  # fmt: skip
        whole = dataclasses.replace(whole, planner=self.name)
        if is_stream(schedule) or any(a != "keep" for a in whole.actions):
            return whole
        _, sizes, handoff = search(costs, n_stages, self.max_handoff)
        if not any(handoff):
            return whole
        cut = self.evaluate(costs, sizes, schedule=schedule, n_microbatches=n_microbatches,
                            link=link, handoff=handoff)  # fmt: skip
        fits = memory_budget is None or max(cut.predicted_stage_bytes) <= memory_budget
        return cut if fits and cut.predicted_iteration_s < whole.predicted_iteration_s else whole
