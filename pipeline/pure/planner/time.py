"""`TimePlanner`: the fastest pipeline that fits the memory budget (vPipe, PipeDream-2BW).

Objective: minimise the bottleneck, the largest stage time per micro-batch, over
contiguous partitions and per-layer memory actions, subject to every stage's memory
fitting `memory_budget`. With the flush schedules the iteration takes about
(M + S - 1) x bottleneck, so the bottleneck is what a partition controls.

The model (shared with `pipeline.pure.planner.base.evaluate`), for stage s holding [a, e):

    time(s)    = sum over its layers of forward_s + backward_s
                 + recompute_time of each recomputed layer (+ 2 host transfers if swapped)
    memory(s)  = sum of state bytes (parameters x weight copies, gradients, optimizer)
                 + k_s x sum of activation bytes kept per micro-batch
    k_s        = in_flight(schedule, S, M, s) micro-batches (1F1B and ZB-H1: min(S - s, M);
                 GPipe: M)

A recomputed (or swapped) layer keeps only its input per micro-batch,
`pipeline.pure.costs.kept_bytes`; every other layer keeps its activation_bytes. So a stage that
does not fit must save `ceil(excess / k_s)` bytes per micro-batch, each candidate layer
saving (activation - kept) bytes at an added time of recompute_time (or, with
`allow_swap=True`, the cheaper of recompute and a swap over `host_link`). Choosing which is
a covering knapsack per stage; the planner solves it

* exactly (Pareto frontier of subset sums) when the stage has <= `exact_limit` candidates,
* otherwise greedily: candidates in increasing order of added seconds per byte saved
  (ties: lower layer index first) until the stage fits.

Both choices get no cheaper when a range grows or k_s rises, which is what the search in
`pipeline.pure.planner.search` needs: binary search on the bottleneck with a greedy check.
The partition is exact under this model; the recompute choice is exact up to
`exact_limit` candidates per stage. An infeasible budget raises InfeasibleBudgetError with
the smallest per-stage budget under which some partition fits with everything reduced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate

import numpy as np

from pipeline.pure.costs import LayerCost, LinkCost, kept_bytes
from pipeline.pure.planner.base import Layout, Planner, Problem
from pipeline.pure.planner.search import Cuts, first_true, sizes_from_cuts, solve, stage_order

__all__ = ["DEFAULT_HOST_LINK", "TimePlanner"]

DEFAULT_HOST_LINK = LinkCost(bandwidth_bytes_per_s=12e9, latency_s=10e-6)  # PCIe 3.0 x16-ish

Choice = tuple[float, tuple[int, ...]]  # (seconds added, layers reduced)
Frontier = tuple[list[int], list[float], list[tuple[int, ...]]]  # saved, seconds, layers


class _Stages:
    """Prefix sums and the per-range memory plan of one planning problem."""

    def __init__(self, problem: Problem, reduce_s: Sequence[float], exact_limit: int) -> None:
        costs, copies, n = problem.costs, problem.weight_copies, problem.n_layers
        self.k, self.budget = list(problem.in_flight), problem.stage_budget
        self.exact_limit = exact_limit
        kept = [kept_bytes(costs, i) for i in range(n)]
        self.saving = [c.activation_bytes - kept[i] for i, c in enumerate(costs)]
        self.reduce_s = list(reduce_s)
        self.t = [0.0, *accumulate(c.compute_s for c in costs)]
        self.state = [
            0,
            *accumulate(copies * c.param_bytes + c.grad_bytes + c.optimizer_bytes for c in costs),
        ]
        self.act = [0, *accumulate(c.activation_bytes for c in costs)]
        self.floor = [0, *accumulate(kept)]  # every candidate reduced
        self.n_cand = [0, *accumulate(int(s > 0) for s in self.saving)]
        # greedy order: least added seconds per byte saved, then lower index
        order = sorted(
            (i for i in range(n) if self.saving[i] > 0),
            key=lambda i: (self.reduce_s[i] / self.saving[i], i),
        )
        self.layer_by_rank = np.array(order, dtype=np.int64)
        self.rank = np.full(n, len(order), dtype=np.int64)
        self.rank[self.layer_by_rank] = np.arange(len(order))
        self.saving_by_rank = np.array([self.saving[i] for i in order], dtype=np.int64)
        self.reduce_by_rank = np.array([self.reduce_s[i] for i in order], dtype=np.float64)
        self._frontiers: dict[tuple[int, int], Frontier] = {}

    # -- the model ------------------------------------------------------------------------
    def time(self, a: int, e: int) -> float:
        return self.t[e] - self.t[a]

    def memory(self, s: int, a: int, e: int) -> int:
        return self.state[e] - self.state[a] + self.k[s] * (self.act[e] - self.act[a])

    def least_memory(self, s: int, a: int, e: int) -> int:
        return self.state[e] - self.state[a] + self.k[s] * (self.floor[e] - self.floor[a])

    def reduce(self, s: int, a: int, e: int, *, layers: bool = True) -> Choice | None:
        """The cheapest set of layers in [a, e) to reduce so stage s fits; None if none.

        With layers=False the set is left empty (the search needs only the seconds).
        """
        if self.budget is None:
            return 0.0, ()
        excess = self.memory(s, a, e) - self.budget
        if excess <= 0:
            return 0.0, ()
        if self.least_memory(s, a, e) > self.budget:
            return None
        need = -(-excess // self.k[s])  # bytes to save per micro-batch
        if self.n_cand[e] - self.n_cand[a] <= self.exact_limit:
            return self._exact(a, e, need)
        return self._greedy(a, e, need, layers)

    def cost(self, s: int, a: int, e: int) -> float:
        choice = self.reduce(s, a, e, layers=False)
        return math.inf if choice is None else self.time(a, e) + choice[0]

    def _exact(self, a: int, e: int, need: int) -> Choice | None:
        saved, seconds, chosen = self._frontier(a, e)
        j = first_true(0, len(saved), lambda i: saved[i] >= need)
        return None if j == len(saved) else (seconds[j], chosen[j])

    def _frontier(self, a: int, e: int) -> Frontier:
        """Pareto-optimal (bytes saved, seconds added, layers) over subsets of [a, e)."""
        if (a, e) not in self._frontiers:
            front: list[tuple[int, float, tuple[int, ...]]] = [(0, 0.0, ())]
            for i in range(a, e):
                save, add = self.saving[i], self.reduce_s[i]
                if save > 0:
                    front = _pareto(front + [(b + save, t + add, (*c, i)) for b, t, c in front])
            self._frontiers[(a, e)] = (
                [f[0] for f in front],
                [f[1] for f in front],
                [f[2] for f in front],
            )
        return self._frontiers[(a, e)]

    def _greedy(self, a: int, e: int, need: int, layers: bool) -> Choice | None:
        ranks = np.sort(self.rank[a:e])[: self.n_cand[e] - self.n_cand[a]]
        j = int(np.searchsorted(np.cumsum(self.saving_by_rank[ranks]), need))
        if j >= len(ranks):
            return None
        chosen = ranks[: j + 1]
        seconds = float(self.reduce_by_rank[chosen].sum())
        if not layers:
            return seconds, ()
        return seconds, tuple(sorted(int(i) for i in self.layer_by_rank[chosen]))

    # -- the search -----------------------------------------------------------------------
    def min_start(self, s: int, stop: int, limit: float, lowest: int) -> int | None:
        """Smallest a >= lowest with cost(s, a, stop) <= limit (None if there is none)."""
        lo = first_true(lowest, stop, lambda a: self.time(a, stop) <= limit)
        if self.budget is None:
            return lo if lo < stop else None
        budget = self.budget
        lo = first_true(lo, stop, lambda a: self.least_memory(s, a, stop) <= budget)
        if lo >= stop:
            return None
        fits_as_is = first_true(lo, stop, lambda a: self.memory(s, a, stop) <= budget)
        if fits_as_is == lo:
            return lo
        start = first_true(lo, fits_as_is, lambda a: self.cost(s, a, stop) <= limit)
        return start if start < stop else None

    def lower_bound(self, n_stages: int) -> float:
        n = len(self.t) - 1
        return max(self.t[-1] / n_stages, max(self.time(i, i + 1) for i in range(n)))


def _pareto(
    points: list[tuple[int, float, tuple[int, ...]]],
) -> list[tuple[int, float, tuple[int, ...]]]:
    """Keep the points no other point beats: as many bytes saved for less time."""
    points.sort(key=lambda p: (-p[0], p[1]))
    kept, cheapest = [], math.inf
    for p in points:
        if p[1] < cheapest:
            kept.append(p)
            cheapest = p[1]
    return kept[::-1]  # bytes saved ascending, seconds ascending


class TimePlanner(Planner):
    """Minimise the bottleneck stage time under a per-stage memory budget (module doc).

    allow_swap   also consider swapping saved activations to host memory (GPU only)
    host_link    the device-host link a swap crosses (both ways, not overlapped)
    exact_limit  solve a stage's recompute choice exactly up to this many candidate layers
    rtol         relative precision of the binary search on the bottleneck
    """

    name = "time"

    def __init__(
        self,
        *,
        allow_swap: bool = False,
        host_link: LinkCost | None = None,
        exact_limit: int = 12,
        rtol: float = 1e-10,
    ) -> None:
        self.allow_swap = allow_swap
        self.host_link: LinkCost = host_link or DEFAULT_HOST_LINK
        self.exact_limit = exact_limit
        self.rtol = rtol

    def propose(self, problem: Problem) -> list[Layout]:
        reduce_s, labels = self._reduce_options(problem.costs)
        stages = _Stages(problem, reduce_s, self.exact_limit)
        budget, n_layers, n_stages = problem.stage_budget, problem.n_layers, problem.n_stages
        if budget is not None:
            least = self._least_budget(stages, n_layers, n_stages)
            if budget < least:
                how = "recomputed or swapped" if self.allow_swap else "recomputed"
                raise problem.infeasible(least, f" (with every layer that can be {how})")
        _, cuts = self._search(stages, n_layers, n_stages)
        actions = ["keep"] * n_layers
        for s in range(n_stages):
            choice = stages.reduce(s, cuts[s], cuts[s + 1])
            assert choice is not None
            for i in choice[1]:
                actions[i] = labels[i]
        return [Layout(tuple(sizes_from_cuts(cuts)), tuple(actions))]

    def _reduce_options(self, costs: Sequence[LayerCost]) -> tuple[list[float], list[str]]:
        """Per layer: the cheapest way to drop its saved activations, and its label."""
        seconds, labels = [], []
        for i, c in enumerate(costs):
            swap_s = 2 * self.host_link.time(c.activation_bytes - kept_bytes(costs, i))
            if self.allow_swap and swap_s < c.recompute_time:
                seconds.append(swap_s)
                labels.append("swap")
            else:
                seconds.append(c.recompute_time)
                labels.append("recompute")
        return seconds, labels

    def _search(self, stages: _Stages, n_layers: int, n_stages: int) -> tuple[float, Cuts]:
        order = "backward" if stages.budget is None else stage_order(stages.k)
        found = solve(
            stages.cost,
            n_layers,
            n_stages,
            order=order,
            lower=stages.lower_bound(n_stages),
            rtol=self.rtol,
            min_start=stages.min_start,
        )
        assert found is not None  # the caller checked the budget admits a partition
        return found

    @staticmethod
    def _least_budget(stages: _Stages, n_layers: int, n_stages: int) -> int:
        """The smallest per-stage budget some partition fits with every candidate reduced."""
        k_min = min(stages.k)
        lower = max(stages.least_memory(stages.k.index(k_min), i, i + 1) for i in range(n_layers))
        found = solve(
            stages.least_memory,
            n_layers,
            n_stages,
            order=stage_order(stages.k),
            lower=lower,
            integer=True,
        )
        assert found is not None  # memory is always finite
        return int(found[0])
