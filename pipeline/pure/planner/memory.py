"""`MemoryPlanner`: the partition with the smallest largest per-stage peak (CAPSlog).

When memory, not time, is what limits a model (or a NAS candidate must simply fit), the
partition to pick is the one whose fullest stage is least full. CAPSlog predicts a
stage's peak from two cheap per-layer profiles (`LayerCost.isolated_peak`, the peak of a
stage holding the layer alone, and `LayerCost.added_peak`, what the layer adds behind
another one):

    peak(s, [a, e)) = isolated_peak(a) + sum of added_peak(a+1 .. e-1)
                      + (k_s - 1) x sum of activation_bytes(a .. e-1)     (in_flight=True)
                      + (copies - 1) x sum of param_bytes(a .. e-1)       (2BW's 2nd copy)

The profiles are taken with one micro-batch in flight; a stage that keeps k_s
(`in_flight(schedule, S, M, s)`) holds k_s - 1 more micro-batches of activations. With
`in_flight=False` the model is CAPSlog's as published.

Search: binary search on the threshold (integer bytes, so exact). The check is CAPSlog's
greedy front-fill (each stage takes the longest run under the threshold) when dropping a
stage's first layer never raises its peak, which makes greedy filling exact
(`pipeline.pure.planner.search`). A layer whose isolated peak exceeds its predecessor's
isolated + added peak breaks that; then the check tracks every reachable stage end
(a vectorised DP over positions), which is exact for any profile.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import numpy as np

from pipeline.pure.costs import LayerCost
from pipeline.pure.planner.base import (
    Layout,
    Plan,
    Planner,
    Problem,
    ScheduleLike,
    in_flight_counts,
    weight_copies,
)
from pipeline.pure.planner.search import (
    Cuts,
    bottleneck,
    minimize,
    sizes_from_cuts,
    solve,
    stage_order,
)

__all__ = ["MemoryPlanner"]


class _Peaks:
    """Stage peaks from prefix sums: peak = head[k][a] + body[k][e] - body[k][a + 1]."""

    def __init__(
        self, costs: Sequence[LayerCost], counts: Sequence[int], copies: int, in_flight: bool
    ) -> None:
        self.k = [k if in_flight else 1 for k in counts]
        self.iso = [c.isolated_peak for c in costs]
        self.extra = [c.activation_bytes for c in costs]  # per extra micro-batch in flight
        self.param = [(copies - 1) * c.param_bytes for c in costs]
        self.added = [0, *accumulate(c.added_peak for c in costs)]
        self.act = [0, *accumulate(self.extra)]
        self.params = [0, *accumulate(self.param)]
        self._arrays: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def head(self, k: int, a: int) -> int:
        return self.iso[a] + (k - 1) * self.extra[a] + self.param[a]

    def body(self, k: int, e: int) -> int:
        return self.added[e] + (k - 1) * self.act[e] + self.params[e]

    def peak_k(self, k: int, a: int, e: int) -> int:
        return self.head(k, a) + self.body(k, e) - self.body(k, a + 1)

    def peak(self, s: int, a: int, e: int) -> int:
        return self.peak_k(self.k[s], a, e)

    def start_monotone(self) -> bool:
        """Does dropping a stage's first layer never raise its peak (for every k used)?"""
        k = min(self.k)
        return all(
            self.peak_k(k, a, a + 2) >= self.peak_k(k, a + 1, a + 2)
            for a in range(len(self.iso) - 1)
        )

    def arrays(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """head(k, a) for every a and body(k, e) for every e, as int64 arrays."""
        if k not in self._arrays:
            iso, extra, param, added, act, params = (
                np.array(x, dtype=np.int64)
                for x in (self.iso, self.extra, self.param, self.added, self.act, self.params)
            )
            self._arrays[k] = iso + (k - 1) * extra + param, added + (k - 1) * act + params
        return self._arrays[k]

    def lower_bound(self) -> int:
        """Every layer adds at least min(as first layer, as a later one) to some stage."""
        k = min(self.k)
        return max(
            min(self.head(k, a), self.body(k, a + 1) - self.body(k, a))
            for a in range(len(self.iso))
        )


def _reachable(peaks: _Peaks, n_layers: int, n_stages: int, limit: float) -> Cuts | None:
    """Exact check for any profile: the set of ends stage s can reach, stage by stage.

    A stage starting at a (a reachable end of the stage before) can end anywhere in
    (a, hi(a)], hi(a) being the last end whose peak stays <= limit; the union over the
    reachable a's is marked with a difference array.
    """
    cap = int(min(limit, 2**62))
    reach = np.zeros(n_layers + 1, dtype=bool)
    reach[0] = True
    history, his = [], []
    for s in range(n_stages):
        head, body = peaks.arrays(peaks.k[s])
        starts = np.flatnonzero(reach[:n_layers])
        starts = starts[head[starts] <= cap]
        hi = np.searchsorted(body, cap - head[starts] + body[starts + 1], side="right") - 1
        marks = np.bincount(starts + 1, minlength=n_layers + 2)
        marks -= np.bincount(hi + 1, minlength=n_layers + 2)
        reach = np.cumsum(marks)[: n_layers + 1] > 0
        reach[n_layers - (n_stages - 1 - s) + 1 :] = False  # later stages need a layer each
        history.append(starts)
        his.append(hi)
    if not reach[n_layers]:
        return None
    cuts = [0] * n_stages + [n_layers]
    for s in range(n_stages - 1, 0, -1):
        starts, hi = history[s], his[s]
        ok = starts[(starts < cuts[s + 1]) & (hi >= cuts[s + 1])]
        cuts[s] = int(ok.max())  # any will do: it is reachable by the stages before
    return cuts


class MemoryPlanner(Planner):
    """Minimise the largest predicted per-stage peak (module doc); every layer is kept.

    in_flight  count the extra micro-batches each stage keeps under the schedule
    """

    name = "memory"

    def __init__(self, *, in_flight: bool = True) -> None:
        self.in_flight = in_flight

    def propose(self, problem: Problem) -> list[Layout]:
        peaks = _Peaks(problem.costs, problem.in_flight, problem.weight_copies, self.in_flight)
        n, n_stages = problem.n_layers, problem.n_stages
        if peaks.start_monotone():
            found = solve(
                peaks.peak,
                n,
                n_stages,
                order=stage_order(peaks.k),
                lower=peaks.lower_bound(),
                integer=True,
            )
        else:
            found = minimize(
                lambda limit: _reachable(peaks, n, n_stages, limit),
                lambda cuts: bottleneck(peaks.peak, cuts),
                peaks.lower_bound(),
                integer=True,
            )
        assert found is not None  # peaks are finite: some partition always exists
        worst, cuts = found
        if problem.stage_budget is not None and worst > problem.stage_budget:
            raise problem.infeasible(int(worst), " (all layers kept)")
        return [Layout(tuple(sizes_from_cuts(cuts)))]

    def stage_bytes(
        self, costs: Sequence[LayerCost], plan: Plan, schedule: ScheduleLike
    ) -> tuple[int, ...]:
        """CAPSlog's predicted peaks, which model whole layers: a plan with a handoff keeps
        the shared evaluation's memory."""
        if plan.handoff:
            return plan.predicted_stage_bytes
        peaks = self._peaks(costs, schedule, plan.n_stages, plan.n_microbatches)
        return tuple(peaks.peak(s, a, e) for s, (a, e) in enumerate(plan.bounds()))

    def _peaks(
        self, costs: Sequence[LayerCost], schedule: ScheduleLike, n_stages: int, n_microbatches: int
    ) -> _Peaks:
        counts = in_flight_counts(schedule, n_stages, n_microbatches)
        return _Peaks(costs, counts, weight_copies(schedule), self.in_flight)
