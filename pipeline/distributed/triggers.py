"""When a running pipeline re-plans by itself: every N steps, on memory pressure, on drift.

Every rank must decide the same thing at the same step, or one rank would enter the
re-plan's collectives alone. So the decision is made from numbers every rank holds after
one all_reduce, on steps every rank agrees on:

    every N   step % N == 0; no message (every rank counts the same steps)
    correct   once per model planned with partition="auto" on several stages: on the first
              step that measures at least `correct_after` steps after it was built. The plan
              was made from costs measured alone (`pipeline.local.profiler.sandbox`); the
              stages now measure what each layer costs in the pipeline, beside its
              neighbours. The re-plan takes those costs (and teaches them to the cost cache);
              it migrates only when that pays back. No message: every rank counts the same.
    memory    on a step that measured memory: some stage's parameters, gradients,
              optimizer state and in-flight activation peak exceed the budget
    drift     on a step that measures (the per-layer meters are fresh: the others run
              each stage as one graph, `pipeline.local.fused`) at least `settle` steps
              after the plan was made:
              the stages' measured / predicted compute-time ratios r_s differ by more than
              the tolerance, max(r) / min(r) - 1 > drift, on two such steps in a row of
              the same plan. Costs have moved relative to each other since the plan was
              made (a layer got slower, a neighbour's process started competing for a
              core), so another split may now be faster. One step alone is not enough: a
              stage process preempted for a time slice (another process on its core)
              measures one step that is slow on that stage only, and the meters' moving
              average carries a third of it, so a plan would be migrated away from costs
              that did not move. A uniform slowdown keeps the best split where it is and
              triggers nothing. Without a plan for the current partition (explicit sizes)
              the first check asks for one.

The memory and drift checks share one all_reduce(MAX) of [over budget, max r, -min r].
`PlanAge` keeps when the plan in force began (drift waits `settle` steps after it), whether
the last check of the plan found drift, and has the first step of every plan measure memory.
The re-plan that follows is migration-aware: it moves layers only when that pays back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.distributed.comm import Comm
from pipeline.distributed.options import ElasticOptions
from pipeline.local.stage import Stage
from pipeline.pure.planner import Plan

__all__ = ["PlanAge", "ReplanTriggers"]


@dataclass(frozen=True)
class ReplanTriggers:
    """The re-plan policy: `ElasticOptions`' triggers and the plan's memory budget (bytes
    per rank). The default triggers nothing."""

    elastic: ElasticOptions = field(default_factory=ElasticOptions)
    memory_budget: int | None = None

    def reason(
        self,
        comm: Comm,
        step: int,
        stages: Sequence[Stage],
        plan: Plan | None,
        measured: bool,
        age: PlanAge,
    ) -> str | None:
        """Why this step ends with a re-plan (None: it does not); call on every rank with
        its `stages` (several under an interleaved or V placement: the budget is the rank's)
        and the plan's `age` (which learns whether this check found drift)."""
        every, drift = self.elastic.rebalance_every, self.elastic.rebalance_on_drift
        if every is not None and step % every == 0:
            return f"every {every} steps"
        if age.correction_due(step) and measured:
            return f"a correction from the costs measured over the first {step} steps"
        check_memory = measured and self.memory_budget is not None
        settled = age.steps_on_plan(step) >= self.elastic.rebalance_settle
        check_drift = drift is not None and measured and settled
        if not (check_memory or check_drift):
            return None
        over = 0.0
        if check_memory:
            assert self.memory_budget is not None
            held = sum(stage.state_bytes() + stage.saved.peak for stage in stages)
            over = float(held > self.memory_budget)
        ratios = [_time_ratio(stage, plan) for stage in stages] if check_drift else [1.0]
        flags = comm.all_reduce([over, max(ratios), -min(ratios)], op="max")  # one over: all
        if flags[0] > 0:
            return f"a stage exceeds the memory budget of {self.memory_budget:,} bytes"
        high, low = flags[1], -flags[2]
        if not check_drift:
            return None
        assert drift is not None
        if high == float("inf"):
            return "no plan for the current partition"
        drifting = low > 0 and high / low - 1 > drift
        if age.drift_confirmed(drifting):  # every rank holds the same numbers: agreed
            return f"stage times drifted from the plan: measured/predicted {low:.2f}..{high:.2f}"
        return None


class PlanAge:
    """The step the plan in force began at, whether the next step measures memory, whether
    the model still awaits its measured correction (`ElasticOptions.correct_after`), and
    whether the plan's last drift check found drift."""

    def __init__(self) -> None:
        self._since, self._measure_next = 0, False
        self._correct_at: int | None = None  # the step from which the correction is due
        self._drifting = False  # the plan's last drift check found drift

    def await_correction(self, step: int, after: int | None) -> None:
        """A model was planned from profiled costs at `step`: correct it `after` steps on
        (None: never)."""
        self._correct_at = None if after is None else step + after

    def correction_due(self, step: int) -> bool:
        return self._correct_at is not None and step >= self._correct_at

    def corrected(self) -> None:
        self._correct_at = None

    def restart(self, step: int, *, measure: bool = True) -> None:
        """A plan (or partition) takes effect at `step`; its first step measures memory."""
        self._since = step
        self._measure_next = self._measure_next or measure
        self._drifting = False

    def drift_confirmed(self, drifting: bool) -> bool:
        """Record one drift check of this plan: True when it and the one before both found
        drift (module doc, `drift`)."""
        confirmed = drifting and self._drifting
        self._drifting = drifting and not confirmed
        return confirmed

    def steps_on_plan(self, step: int) -> int:
        return step - self._since

    def measures(self, step: int, every: int, rebalance_every: int | None = None) -> bool:
        """Whether step `step` measures memory and per-layer times: the first of a plan,
        every `every`, and the step after which an every-N re-plan reads the meters."""
        before_replan = rebalance_every is not None and (step + 1) % rebalance_every == 0
        return self._measure_next or step % every == 0 or before_replan

    def measured(self) -> None:
        """A step ran (and measured, if `measures` said so)."""
        self._measure_next = False


def _time_ratio(stage: Stage, plan: Plan | None) -> float:
    """This stage's measured compute time per micro-batch over the plan's prediction."""
    if plan is None or plan.predicted_stage_s[stage.index] <= 0:
        return float("inf")
    measured = sum(layer.meter.forward_s + layer.meter.backward_s for layer in stage.layers)
    return measured / plan.predicted_stage_s[stage.index]
