"""`BiPartitionPlanner`: the time planner's plan, or a Bi-Partition cut where it is faster.

Bi-Partition (`pipeline.pure.bipartition`) hands the backward of a stage's last separable
layers to the next stage, so stage times even out where whole layers cannot. This planner
first asks `TimePlanner` for the best whole-layer layout under the memory budget; then it
searches partitions and handoffs jointly for the smallest bottleneck and proposes that cut
as the challenger, which the planners' lifecycle (`pipeline.pure.planner.base.Planner`)
takes only where the simulator predicts a shorter iteration and the memory budget holds.
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

from pipeline.pure.bipartition import search
from pipeline.pure.checks import is_int
from pipeline.pure.costs import HOST_LINK
from pipeline.pure.planner.base import Layout, Planner, Problem
from pipeline.pure.planner.time import TimePlanner
from pipeline.pure.schedule import is_stream

__all__ = ["BiPartitionPlanner"]


class BiPartitionPlanner(Planner):
    """Whole layers (`TimePlanner`), or a faster Bi-Partition cut (module doc)."""

    name = "bipartition"
    default_link = HOST_LINK

    def __init__(self, max_handoff: int = 4) -> None:
        if not is_int(max_handoff) or max_handoff < 0:
            raise ValueError(f"max_handoff must be an int >= 0, got {max_handoff!r}")
        self.max_handoff = max_handoff

    def propose(self, problem: Problem) -> list[Layout]:
        """The time planner's layout, then the best cut as its challenger (if it has one)."""
        [whole] = TimePlanner().propose(problem)
        several = problem.placement.stages_per_rank > 1  # the runtime hands off one per rank
        if several or is_stream(problem.schedule) or any(a != "keep" for a in whole.actions or ()):
            return [whole]
        _, sizes, handoff = search(problem.costs, problem.n_stages, self.max_handoff)
        if not any(handoff):
            return [whole]
        return [whole, Layout(sizes, handoff=handoff)]
