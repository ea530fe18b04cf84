"""What a plan is, what every planner promises, how a layout is evaluated and searched.

A `Plan` is the whole decision the runtime acts on: stage sizes (contiguous layer runs),
a memory action per layer, the schedule and micro-batch count, plus what the planner
predicts for it. It is plain data (`to_dict` / `from_dict`), so rank 0 can broadcast it.

Every planner is a small class behind one interface, the way Optuna's samplers are:
construct it with its options, then call `plan(costs, n_stages, ...)`. `evaluate` is the
shared way to put numbers on a layout, so plans from different planners (or the equal
split) are compared on the same model:

    stage time    per micro-batch: forward + backward of its layers + what recompute / swap
                  adds (independent of the micro-batch count M)
    stage memory  parameters (x weight copies) + gradients + optimizer state
                  + in_flight(schedule, S, M, s) x activation bytes kept per micro-batch
    iteration     `pipeline.pure.simulate` replaying the schedule on those stage costs

The search both planners share (bottom of this file) solves the min-max contiguous
partition: split layers [0, L) into S non-empty stages, stage s holding [a, e), so that
the largest cost(s, a, e) is smallest. Costs depend on the stage (a stage keeps
in_flight(s) micro-batches), so it is a binary search on the bottleneck with a greedy
check that is exact when the cost is

* monotone in the range: a range inside another costs no more (true of time + recompute
  and of memory), and
* monotone in the stage: later stages never cost more (1F1B, GPipe), or never less.

If later stages cost no more, fill from the back: each stage, from the last, takes the
longest feasible range ending where the next one starts (leaving a layer for each earlier
stage). By exchange, the greedy start of stage s is never later than that of any feasible
partition, so the check succeeds whenever one exists; O(S log L) evaluations per check.
The mirror image (fill from the front) serves costs that grow with the stage; anything
else falls back to `dp_min_max`, the exact O(S L^2) dynamic program.
"""

from __future__ import annotations

import abc
import bisect
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, ClassVar, Protocol

from pipeline.pure.bipartition import handed_stage_costs
from pipeline.pure.costs import MEMORY_ACTIONS, LayerCost, LinkCost
from pipeline.pure.partition import bounds, check_sizes
from pipeline.pure.schedule import SCHEDULES, ScheduleFn, get_schedule, in_flight, is_stream
from pipeline.pure.simulate import simulate, stage_costs

__all__ = [
    "InfeasibleBudgetError",
    "Plan",
    "Planner",
    "evaluate",
    "in_flight_counts",
    "solve",
    "stage_order",
    "weight_copies",
]


class InfeasibleBudgetError(ValueError):
    """No partition fits the per-stage memory budget; says the smallest budget that would."""

    def __init__(self, budget: int, min_budget: int, detail: str = "") -> None:
        self.budget = budget
        self.min_budget = min_budget
        self.detail = detail
        super().__init__(
            f"no plan fits a memory budget of {budget:,} bytes per stage; the smallest "
            f"per-stage budget that fits is {min_budget:,} bytes{detail}"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # picklable, so rank 0 can hand it to every rank
        return (type(self), (self.budget, self.min_budget, self.detail))


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...]  # layers per stage, in forward order
    actions: tuple[str, ...]  # per layer: "keep" | "recompute" | "swap"
    schedule: str
    n_microbatches: int
    predicted_iteration_s: float
    predicted_stage_s: tuple[float, ...]  # per micro-batch, forward + backward + added
    predicted_stage_bytes: tuple[int, ...]  # peak memory per stage
    planner: str = ""
    # Bi-Partition (`pipeline.pure.bipartition`): per boundary s | s+1, the last layers of
    # stage s whose backward runs on s + 1; () for none
    handoff: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple(self.sizes))
        object.__setattr__(self, "actions", tuple(self.actions))
        object.__setattr__(self, "handoff", tuple(self.handoff))
        check_sizes(self.sizes, sum(self.sizes), len(self.sizes))
        if self.handoff and (len(self.handoff) != len(self.sizes) - 1 or any(
                not 0 <= k < n for k, n in zip(self.handoff, self.sizes, strict=False))):
            raise ValueError(f"handoff {self.handoff} does not fit stage sizes {self.sizes}: "
                             "one count per boundary, fewer than the stage's layers")
        if len(self.actions) != sum(self.sizes):
            raise ValueError(f"{len(self.actions)} memory actions for {sum(self.sizes)} layers")
        unknown = set(self.actions) - set(MEMORY_ACTIONS)
        if unknown:
            raise ValueError(f"unknown memory actions {sorted(unknown)}; valid: {MEMORY_ACTIONS}")

    @property
    def n_stages(self) -> int:
        return len(self.sizes)

    @property
    def n_layers(self) -> int:
        return len(self.actions)

    @property
    def bottleneck_s(self) -> float:
        """The slowest stage's time per micro-batch: what sets the pipeline's pace."""
        return max(self.predicted_stage_s)

    def bounds(self) -> list[tuple[int, int]]:
        """[(start, stop)] of each stage's layers."""
        return bounds(self.sizes)

    def owners(self) -> list[int]:
        """The stage that holds each layer."""
        return [s for s, n in enumerate(self.sizes) for _ in range(n)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "sizes": list(self.sizes), "actions": list(self.actions),
            "schedule": self.schedule, "n_microbatches": self.n_microbatches,
            "predicted_iteration_s": self.predicted_iteration_s,
            "predicted_stage_s": list(self.predicted_stage_s),
            "predicted_stage_bytes": list(self.predicted_stage_bytes),
            "planner": self.planner, "handoff": list(self.handoff),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        return cls(
            sizes=tuple(data["sizes"]), actions=tuple(data["actions"]),
            schedule=data["schedule"], n_microbatches=data["n_microbatches"],
            predicted_iteration_s=data["predicted_iteration_s"],
            predicted_stage_s=tuple(data["predicted_stage_s"]),
            predicted_stage_bytes=tuple(data["predicted_stage_bytes"]),
            planner=data.get("planner", ""), handoff=tuple(data.get("handoff", ())),
        )  # fmt: skip


ScheduleLike = str | ScheduleFn  # a schedule's name, or a schedule function


def schedule_name(schedule: ScheduleLike) -> str:
    """What a plan records as its schedule: the name, or the function's `__name__`."""
    return schedule if isinstance(schedule, str) else getattr(schedule, "__name__", "custom")


def in_flight_counts(schedule: ScheduleLike, n_stages: int, n_microbatches: int) -> list[int]:
    """Micro-batches each stage keeps in flight, read off the schedule itself."""
    fn = get_schedule(schedule) if isinstance(schedule, str) else schedule
    return [in_flight(fn(n_stages, n_microbatches, s)) for s in range(n_stages)]


STREAM_STEPS = 5  # steps a stream schedule is simulated over to predict its time per step


def weight_copies(schedule: ScheduleLike) -> int:
    """Parameter copies a stage holds: 2 for PipeDream-2BW (double-buffered), else 1.

    A schedule function may say how many it needs in a `weight_copies` attribute.
    """
    if not isinstance(schedule, str):
        return int(getattr(schedule, "weight_copies", 1))
    if schedule.lower() in SCHEDULES:
        return int(getattr(SCHEDULES[schedule.lower()], "weight_copies", 1))
    return 2 if schedule.lower().replace("-", "").replace("_", "") in ("2bw", "pipedream2bw") else 1


def evaluate(
    costs: Sequence[LayerCost],
    sizes: Sequence[int],
    actions: Sequence[str] | None = None,
    *,
    schedule: ScheduleLike = "1f1b",
    n_microbatches: int = 8,
    link: LinkCost | None = None,
    host_link: LinkCost | None = None,
    planner: str = "",
    handoff: Sequence[int] = (),
) -> Plan:
    """A Plan for a given layout, with its predicted times and memory (module doc);
    `handoff`: Bi-Partition's cut (`pipeline.pure.bipartition`), none by default."""
    actions = tuple(actions) if actions is not None else ("keep",) * len(costs)
    copies = weight_copies(schedule)
    stages = stage_costs(costs, sizes, actions, host_link=host_link, weight_copies=copies)
    if any(handoff):
        stages = handed_stage_costs(stages, costs, sizes, handoff)
    counts = in_flight_counts(schedule, len(stages), n_microbatches)
    # a stream (2BW): the steady-state time per step of a stream long enough to show it
    n_steps = STREAM_STEPS if is_stream(schedule) else 1
    result = simulate(schedule, stages, n_microbatches, link, n_steps=n_steps)
    return Plan(
        sizes=tuple(sizes), actions=actions, schedule=schedule_name(schedule),
        n_microbatches=n_microbatches,
        predicted_iteration_s=result.step_s,
        predicted_stage_s=tuple(st.forward_s + st.backward_s for st in stages),
        predicted_stage_bytes=tuple(st.state_bytes + k * st.activation_bytes
                                    for st, k in zip(stages, counts, strict=True)),
        planner=planner, handoff=tuple(handoff) if any(handoff) else (),
    )  # fmt: skip


def check_problem(costs: Sequence[LayerCost], n_stages: int, n_microbatches: int) -> None:
    if n_stages < 1:
        raise ValueError(f"n_stages must be >= 1, got {n_stages}")
    if n_microbatches < 1:
        raise ValueError(f"n_microbatches must be >= 1, got {n_microbatches}")
    if len(costs) < n_stages:
        raise ValueError(
            f"cannot split {len(costs)} layers over {n_stages} stages: every stage needs at "
            f"least one layer"
        )
    keys = [c.key for c in costs]
    if len(set(keys)) != len(keys):
        raise ValueError("layer keys must be unique")


class Planner(abc.ABC):
    """Turns layer costs into a Plan. Subclasses take their options in `__init__`."""

    name: ClassVar[str] = ""
    host_link: LinkCost | None = None  # what a swap to host memory costs, where allowed

    @abc.abstractmethod
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
        """The best plan under this planner's objective; InfeasibleBudgetError if none fits."""

    def evaluate(
        self,
        costs: Sequence[LayerCost],
        sizes: Sequence[int],
        actions: Sequence[str] | None = None,
        *,
        schedule: ScheduleLike = "1f1b",
        n_microbatches: int = 8,
        link: LinkCost | None = None,
        handoff: Sequence[int] = (),
    ) -> Plan:
        """Put this planner's numbers on a layout it did not choose (e.g. the current one)."""
        return evaluate(costs, sizes, actions, schedule=schedule, n_microbatches=n_microbatches,
                        link=link, host_link=self.host_link, planner=self.name,
                        handoff=handoff)  # fmt: skip

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({options})"


# -- the search both planners share (module doc) --------------------------------------
ANY = sys.float_info.max  # a limit every finite cost meets (math.inf marks infeasible)

RangeCost = Callable[[int, int, int], float]  # (stage, start, stop) -> cost; inf: infeasible
Cuts = list[int]  # stage s holds [cuts[s], cuts[s + 1]); cuts[0] = 0, cuts[-1] = L


class MinStart(Protocol):
    def __call__(self, stage: int, stop: int, limit: float, lowest: int, /) -> int | None: ...


class MaxStop(Protocol):
    def __call__(self, stage: int, start: int, limit: float, highest: int, /) -> int | None: ...


def first_true(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """Smallest x in [lo, hi) with pred(x), for pred False...False True...True; hi if none."""
    return lo + bisect.bisect_left(range(lo, hi), True, key=pred)


def stage_order(values: Sequence[float]) -> str:
    """"backward" if `values` never grow with the stage, "forward" if never shrink, else "dp"."""
    if all(x >= y for x, y in pairwise(values)):
        return "backward"
    if all(x <= y for x, y in pairwise(values)):
        return "forward"
    return "dp"


def bisect_min_start(cost: RangeCost) -> MinStart:
    """min_start by binary search on a cost that is monotone in the range."""

    def min_start(stage: int, stop: int, limit: float, lowest: int) -> int | None:
        if lowest >= stop or not cost(stage, stop - 1, stop) <= limit:
            return None
        return first_true(lowest, stop - 1, lambda a: cost(stage, a, stop) <= limit)

    return min_start


def bisect_max_stop(cost: RangeCost) -> MaxStop:
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

    `value(cuts)` is the bottleneck a check really reached (<= the limit it was given), so
    each success tightens the upper end to a cost some partition achieves. `lower` must be
    a lower bound of the optimum. Integer costs are searched exactly; real ones to `rtol`.
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

    def value(cuts: Cuts) -> float:
        return max(cost(s, cuts[s], cuts[s + 1]) for s in range(n_stages))

    return minimize(fits, value, lower, integer=integer, rtol=rtol)
