"""The one search every planner runs: the min-max contiguous partition over cut points.

Each planner has its own cost model, but the same question to answer of it: split layers
[0, L) into S non-empty stages, stage s holding [cuts[s], cuts[s + 1]), so that the largest
cost(s, a, e) is smallest. A planner states its model as a range cost, a callback
(stage, start, stop) -> cost (`math.inf`: the range cannot be a stage), and this module
finds the cuts; keeping the search here lets a new planner be a cost model and nothing
more.

Costs depend on the stage (a stage keeps in_flight(s) micro-batches), so `solve` is a
binary search on the bottleneck (`minimize`) with a greedy check that is exact when the
cost is

* monotone in the range: a range inside another costs no more (true of time + recompute
  and of memory), and
* monotone in the stage: later stages never cost more (1F1B, GPipe), or never less.

If later stages cost no more, fill from the back (`fits_backward`): each stage, from the
last, takes the longest feasible range ending where the next one starts (leaving a layer
for each earlier stage). By exchange, the greedy start of stage s is never later than that
of any feasible partition, so the check succeeds whenever one exists; O(S log L)
evaluations per check. The mirror image (`fits_forward`) serves costs that grow with the
stage; anything else falls back to `dp_min_max`, the exact O(S L^2) dynamic program.
`stage_order` says which of the three a sequence of per-stage weights allows.
"""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Protocol

__all__ = [
    "ANY",
    "ORDERS",
    "Cuts",
    "MaxStop",
    "MinStart",
    "RangeCost",
    "bisect_max_stop",
    "bisect_min_start",
    "bottleneck",
    "dp_min_max",
    "first_true",
    "fits_backward",
    "fits_forward",
    "minimize",
    "sizes_from_cuts",
    "solve",
    "stage_order",
]

ANY = sys.float_info.max  # a limit every finite cost meets (math.inf marks infeasible)
ORDERS = ("backward", "forward", "dp")  # how `solve` searches (see `stage_order`)

RangeCost = Callable[[int, int, int], float]  # (stage, start, stop) -> cost; inf: infeasible
Cuts = list[int]  # stage s holds [cuts[s], cuts[s + 1]); cuts[0] = 0, cuts[-1] = L


class MinStart(Protocol):
    """The earliest start of a stage ending at `stop` whose cost is <= limit, or None."""

    def __call__(self, stage: int, stop: int, limit: float, lowest: int, /) -> int | None: ...


class MaxStop(Protocol):
    """The latest stop of a stage starting at `start` whose cost is <= limit, or None."""

    def __call__(self, stage: int, start: int, limit: float, highest: int, /) -> int | None: ...


def first_true(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """Smallest x in [lo, hi) with pred(x), for pred False...False True...True; hi if none."""
    return lo + bisect.bisect_left(range(lo, hi), True, key=pred)


def stage_order(values: Sequence[float]) -> str:
    """ "backward" if `values` never grow with the stage, "forward" if never shrink, else "dp"."""
    if all(x >= y for x, y in pairwise(values)):
        return "backward"
    if all(x <= y for x, y in pairwise(values)):
        return "forward"
    return "dp"


def bottleneck(cost: RangeCost, cuts: Sequence[int]) -> float:
    """The largest stage cost of a partition: what the search minimises."""
    return max(cost(s, a, e) for s, (a, e) in enumerate(pairwise(cuts)))


def sizes_from_cuts(cuts: Sequence[int]) -> list[int]:
    """Layers per stage of a partition given by its cut points."""
    return [e - a for a, e in pairwise(cuts)]


def bisect_min_start(cost: RangeCost) -> MinStart:
    """min_start by binary search on a cost that is monotone in the range."""

    def min_start(stage: int, stop: int, limit: float, lowest: int) -> int | None:
        if lowest >= stop or not cost(stage, stop - 1, stop) <= limit:
            return None
        return first_true(lowest, stop - 1, lambda a: cost(stage, a, stop) <= limit)

    return min_start


def bisect_max_stop(cost: RangeCost) -> MaxStop:
    """max_stop by binary search on a cost that is monotone in the range."""

    def max_stop(stage: int, start: int, limit: float, highest: int) -> int | None:
        if start >= highest or not cost(stage, start, start + 1) <= limit:
            return None
        return first_true(start + 2, highest + 1, lambda e: not cost(stage, start, e) <= limit) - 1

    return max_stop


def fits_backward(n_layers: int, n_stages: int, limit: float, min_start: MinStart) -> Cuts | None:
    """Fill from the last stage: a partition with every stage <= limit, or None."""
    cuts = [0] * n_stages + [n_layers]
    for s in range(n_stages - 1, -1, -1):
        start = min_start(s, cuts[s + 1], limit, s)  # stages 0..s-1 keep a layer each
        if start is None or (s == 0 and start != 0):
            return None
        cuts[s] = start
    return cuts


def fits_forward(n_layers: int, n_stages: int, limit: float, max_stop: MaxStop) -> Cuts | None:
    """Fill from the first stage (the mirror of `fits_backward`)."""
    cuts = [0] * (n_stages + 1)
    for s in range(n_stages):
        stop = max_stop(s, cuts[s], limit, n_layers - (n_stages - 1 - s))
        if stop is None or (s == n_stages - 1 and stop != n_layers):
            return None
        cuts[s + 1] = stop
    return cuts


def dp_min_max(cost: RangeCost, n_layers: int, n_stages: int) -> tuple[float, Cuts] | None:
    """Exact: best[s][e] = min over a of max(best[s-1][a], cost(s, a, e)); O(S L^2)."""
    inf = math.inf
    best = [[inf] * (n_layers + 1) for _ in range(n_stages)]
    came = [[0] * (n_layers + 1) for _ in range(n_stages)]
    for e in range(1, n_layers + 1):
        best[0][e] = cost(0, 0, e)
    for s in range(1, n_stages):
        for e in range(s + 1, n_layers + 1):
            for a in range(s, e):
                value = max(best[s - 1][a], cost(s, a, e))
                if value < best[s][e]:
                    best[s][e], came[s][e] = value, a
    if best[-1][n_layers] == inf:
        return None
    cuts = [0] * n_stages + [n_layers]
    for s in range(n_stages - 1, 0, -1):
        cuts[s] = came[s][cuts[s + 1]]
    return best[-1][n_layers], cuts


def minimize(
    fits: Callable[[float], Cuts | None],
    value: Callable[[Cuts], float],
    lower: float,
    *,
    integer: bool = False,
    rtol: float = 1e-10,
) -> tuple[float, Cuts] | None:
    """Binary search on the bottleneck: the smallest limit `fits` accepts, and its cuts.

    `fits(limit)` is a check: cuts whose every stage costs <= limit, or None. `value(cuts)`
    is the bottleneck a check really reached (<= the limit it was given), so each success
    tightens the upper end to a cost some partition achieves. `lower` must be a lower bound
    of the optimum. Integer costs are searched exactly; real ones to `rtol`.
    """
    best = fits(ANY)
    if best is None:
        return None
    hi = value(best)
    if not lower < hi:
        return hi, best
    at_lower = fits(lower)
    if at_lower is not None:
        return value(at_lower), at_lower
    lo = lower  # invariant: lo infeasible, hi reached
    while hi - lo > (1 if integer else rtol * hi):
        mid: float = (int(lo) + int(hi)) // 2 if integer else (lo + hi) / 2
        cuts = fits(mid)
        if cuts is None:
            lo = mid
        else:
            best, hi = cuts, value(cuts)
    return hi, best


def solve(
    cost: RangeCost,
    n_layers: int,
    n_stages: int,
    *,
    order: str,
    lower: float,
    integer: bool = False,
    rtol: float = 1e-10,
    min_start: MinStart | None = None,
    max_stop: MaxStop | None = None,
) -> tuple[float, Cuts] | None:
    """The optimal (bottleneck, cuts), or None if every partition has an infeasible stage.

    order: "backward" / "forward" (see `stage_order`) for the greedy binary search,
    "dp" for the dynamic program. `min_start` / `max_stop` may replace the generic binary
    searches of the greedy check with faster ones that know the cost's structure.
    """
    if order not in ORDERS:
        raise ValueError(f"unknown search order {order!r}; valid orders: {list(ORDERS)}")
    if not 1 <= n_stages <= n_layers:
        raise ValueError(f"cannot split {n_layers} layers into {n_stages} non-empty stages")
    if order == "dp":
        return dp_min_max(cost, n_layers, n_stages)
    if order == "backward":
        starts = min_start or bisect_min_start(cost)

        def fits(limit: float) -> Cuts | None:
            return fits_backward(n_layers, n_stages, limit, starts)
    else:
        stops = max_stop or bisect_max_stop(cost)

        def fits(limit: float) -> Cuts | None:
            return fits_forward(n_layers, n_stages, limit, stops)

    return minimize(fits, lambda cuts: bottleneck(cost, cuts), lower, integer=integer, rtol=rtol)
