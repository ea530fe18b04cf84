"""What a plan is, what every planner promises, and how a layout is evaluated.

A `Plan` is the whole decision the runtime acts on: stage sizes (contiguous layer runs),
a memory action per layer, the schedule and micro-batch count, plus what the planner
predicts for it. It is plain data (`to_dict` / `from_dict`), so rank 0 can broadcast it.

Every planner is a small strategy class behind one lifecycle, the way Optuna's samplers
are: construct it with its options, then call `plan(costs, n_stages, ...)`, which every
planner runs the same way (`Planner`):

    1. `Problem`       validates what was asked and derives the in-flight counts
    2. `propose`       the strategy: the planner's layout (a `Layout`), then any challengers
    3. `evaluate`      puts the shared numbers on each layout (`stage_bytes` may refine them)
    4. choose          the first layout, unless a challenger fits the budget and is faster

`evaluate` is the shared way to put numbers on a layout, so plans from different planners
(or the equal split) are compared on the same model:

    stage time    per micro-batch: forward + backward of its layers + what recompute / swap
                  adds (independent of the micro-batch count M)
    stage memory  parameters (x weight copies) + gradients + optimizer state
                  + in_flight(schedule, S, M, s) x activation bytes kept per micro-batch
    iteration     `pipeline.pure.simulate` replaying the schedule on those stage costs

The partition search the strategies share lives in `pipeline.pure.planner.search`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, TypedDict, Unpack

from pipeline.pure.bipartition import handed_stage_costs
from pipeline.pure.costs import MEMORY_ACTIONS, LayerCost, LinkCost
from pipeline.pure.partition import bounds, check_sizes
from pipeline.pure.placement import Placement
from pipeline.pure.planner.schedule_facts import (
    ScheduleLike,
    in_flight_counts,
    schedule_name,
    weight_copies,
)
from pipeline.pure.schedule import is_stream, placement_for
from pipeline.pure.simulate import simulate, stage_costs

__all__ = [
    "DEFAULT_MICROBATCHES",
    "DEFAULT_SCHEDULE",
    "EvaluateOptions",
    "InfeasibleBudgetError",
    "Layout",
    "Plan",
    "Planner",
    "Problem",
    "ScheduleLike",
    "evaluate",
    "in_flight_counts",
    "placement_for",
    "schedule_name",
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
    # several stages per rank: each rank's peak, its stages' state plus the activations
    # they hold together at the worst moment (the simulator's, less than the sum of the
    # stages' peaks); () with one stage per rank, where it is `predicted_stage_bytes`
    predicted_rank_bytes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple(self.sizes))
        object.__setattr__(self, "actions", tuple(self.actions))
        object.__setattr__(self, "handoff", tuple(self.handoff))
        check_sizes(self.sizes, sum(self.sizes), len(self.sizes))
        if self.handoff and (
            len(self.handoff) != len(self.sizes) - 1
            or any(not 0 <= k < n for k, n in zip(self.handoff, self.sizes, strict=False))
        ):
            raise ValueError(
                f"handoff {self.handoff} does not fit stage sizes {self.sizes}: "
                "one count per boundary, fewer than the stage's layers"
            )
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
            "sizes": list(self.sizes),
            "actions": list(self.actions),
            "schedule": self.schedule,
            "n_microbatches": self.n_microbatches,
            "predicted_iteration_s": self.predicted_iteration_s,
            "predicted_stage_s": list(self.predicted_stage_s),
            "predicted_stage_bytes": list(self.predicted_stage_bytes),
            "planner": self.planner,
            "handoff": list(self.handoff),
            "predicted_rank_bytes": list(self.predicted_rank_bytes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        return cls(
            sizes=tuple(data["sizes"]),
            actions=tuple(data["actions"]),
            schedule=data["schedule"],
            n_microbatches=data["n_microbatches"],
            predicted_iteration_s=data["predicted_iteration_s"],
            predicted_stage_s=tuple(data["predicted_stage_s"]),
            predicted_stage_bytes=tuple(data["predicted_stage_bytes"]),
            planner=data.get("planner", ""),
            handoff=tuple(data.get("handoff", ())),
            predicted_rank_bytes=tuple(data.get("predicted_rank_bytes", ())),
        )


DEFAULT_SCHEDULE: ScheduleLike = "1f1b"  # what `plan` and `evaluate` assume unless told
DEFAULT_MICROBATCHES = 8
STREAM_STEPS = 5  # steps a stream schedule is simulated over to predict its time per step


def evaluate(
    costs: Sequence[LayerCost],
    sizes: Sequence[int],
    actions: Sequence[str] | None = None,
    *,
    schedule: ScheduleLike = DEFAULT_SCHEDULE,
    n_microbatches: int = DEFAULT_MICROBATCHES,
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
    placement = placement_for(schedule, len(stages))
    per_rank = (
        ()
        if placement.stages_per_rank == 1
        else tuple(
            sum(stages[s].state_bytes for s in placement.stages_of(r)) + held
            for r, held in enumerate(result.peak_rank_activation_bytes)
        )
    )
    return Plan(
        sizes=tuple(sizes),
        actions=actions,
        schedule=schedule_name(schedule),
        n_microbatches=n_microbatches,
        predicted_iteration_s=result.step_s,
        predicted_stage_s=tuple(st.forward_s + st.backward_s for st in stages),
        predicted_stage_bytes=tuple(
            st.state_bytes + k * st.activation_bytes for st, k in zip(stages, counts, strict=True)
        ),
        planner=planner,
        handoff=tuple(handoff) if any(handoff) else (),
        predicted_rank_bytes=per_rank,
    )


@dataclass(frozen=True, eq=False)
class Problem:
    """One planning question, validated: what `Planner.plan` was asked, and what follows.

    `link` is the link between stages the plan is predicted with (None: none modelled).
    """

    costs: Sequence[LayerCost]
    n_stages: int
    schedule: ScheduleLike
    n_microbatches: int
    memory_budget: int | None
    link: LinkCost | None

    def __post_init__(self) -> None:
        if self.n_stages < 1:
            raise ValueError(f"n_stages must be >= 1, got {self.n_stages}")
        if self.n_microbatches < 1:
            raise ValueError(f"n_microbatches must be >= 1, got {self.n_microbatches}")
        placement_for(self.schedule, self.n_stages)  # n_stages fits the schedule's placement
        if self.n_layers < self.n_stages:
            raise ValueError(
                f"cannot split {self.n_layers} layers over {self.n_stages} stages: every "
                f"stage needs at least one layer"
            )
        keys = [c.key for c in self.costs]
        if len(set(keys)) != len(keys):
            raise ValueError("layer keys must be unique")

    @property
    def n_layers(self) -> int:
        return len(self.costs)

    @cached_property
    def in_flight(self) -> list[int]:
        """Micro-batches each stage keeps in flight under the schedule (`in_flight_counts`)."""
        return in_flight_counts(self.schedule, self.n_stages, self.n_microbatches)

    @property
    def weight_copies(self) -> int:
        """Parameter copies each stage holds under the schedule (`weight_copies`)."""
        return weight_copies(self.schedule)

    @cached_property
    def placement(self) -> Placement:
        """Which rank holds which stage (`placement_for`)."""
        return placement_for(self.schedule, self.n_stages)

    @property
    def stage_budget(self) -> int | None:
        """The memory budget is a rank's: with v stages per rank, the planners' searches
        hold each stage to budget / v, so every rank fits (sound, if not always tight)."""
        if self.memory_budget is None:
            return None
        return self.memory_budget // self.placement.stages_per_rank

    def infeasible(self, least_stage_bytes: int, detail: str) -> InfeasibleBudgetError:
        """The error for a budget below what a stage needs at least (`stage_budget`),
        naming the budget as the user gave it (a rank's)."""
        assert self.memory_budget is not None
        v = self.placement.stages_per_rank
        return InfeasibleBudgetError(self.memory_budget, least_stage_bytes * v, detail)

    def fits(self, plan: Plan) -> bool:
        """Does every rank of `plan` fit the memory budget (always, without one)?"""
        held = plan.predicted_rank_bytes or plan.predicted_stage_bytes
        return self.memory_budget is None or max(held) <= self.memory_budget


@dataclass(frozen=True)
class Layout:
    """What a strategy decides, before `evaluate` puts numbers on it."""

    sizes: tuple[int, ...]  # layers per stage, in forward order
    actions: tuple[str, ...] | None = None  # per layer; None: every layer kept
    handoff: tuple[int, ...] = ()  # Bi-Partition's cut (`Plan.handoff`); (): none


class EvaluateOptions(TypedDict, total=False):
    """What `Planner.evaluate` passes on to `evaluate` besides the layout (same defaults)."""

    schedule: ScheduleLike
    n_microbatches: int
    link: LinkCost | None
    handoff: Sequence[int]


class Planner(abc.ABC):
    """Turns layer costs into a Plan: a strategy run by one lifecycle (module doc).

    A subclass takes its options in `__init__` and supplies the strategy, `propose`; it
    may refine the predicted memory with `stage_bytes`. `plan` is the same for all.
    """

    name: ClassVar[str] = ""
    host_link: LinkCost | None = None  # what a swap to host memory costs, where allowed
    default_link: ClassVar[LinkCost | None] = None  # the link `plan` assumes if given none

    def plan(
        self,
        costs: Sequence[LayerCost],
        n_stages: int,
        *,
        schedule: ScheduleLike = DEFAULT_SCHEDULE,
        n_microbatches: int = DEFAULT_MICROBATCHES,
        memory_budget: int | None = None,
        link: LinkCost | None = None,
    ) -> Plan:
        """The best plan under this planner's objective; InfeasibleBudgetError if none fits."""
        link = self.default_link if link is None else link
        problem = Problem(costs, n_stages, schedule, n_microbatches, memory_budget, link)
        layouts = self.propose(problem)
        if not layouts:
            raise RuntimeError(f"{type(self).__name__}.propose gave no layout")
        best = self._evaluate_layout(problem, layouts[0])
        for layout in layouts[1:]:
            challenger = self._evaluate_layout(problem, layout)
            if problem.fits(challenger) and (
                challenger.predicted_iteration_s < best.predicted_iteration_s
            ):
                best = challenger
        return best

    @abc.abstractmethod
    def propose(self, problem: Problem) -> list[Layout]:
        """The strategy: this planner's layout first, then any challengers to compare it
        with; InfeasibleBudgetError if no layout fits the memory budget."""

    def stage_bytes(
        self, costs: Sequence[LayerCost], plan: Plan, schedule: ScheduleLike
    ) -> tuple[int, ...]:
        """The peak memory per stage this planner predicts for an evaluated plan; by default
        the shared model's (`plan.predicted_stage_bytes`)."""
        return plan.predicted_stage_bytes

    def evaluate(
        self,
        costs: Sequence[LayerCost],
        sizes: Sequence[int],
        actions: Sequence[str] | None = None,
        **options: Unpack[EvaluateOptions],
    ) -> Plan:
        """Put this planner's numbers on a layout it did not choose (e.g. the current one);
        `options` as for the module's `evaluate`."""
        plan = evaluate(
            costs, sizes, actions, host_link=self.host_link, planner=self.name, **options
        )
        stage_bytes = self.stage_bytes(costs, plan, options.get("schedule", DEFAULT_SCHEDULE))
        return dataclasses.replace(plan, predicted_stage_bytes=stage_bytes)

    def _evaluate_layout(self, problem: Problem, layout: Layout) -> Plan:
        return self.evaluate(
            problem.costs,
            layout.sizes,
            layout.actions,
            schedule=problem.schedule,
            n_microbatches=problem.n_microbatches,
            link=problem.link,
            handoff=layout.handoff,
        )

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({options})"
