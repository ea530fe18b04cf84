"""Re-planning a running pipeline: move layers only when the move pays for itself (vPipe).

Measured costs drift from the estimates a plan was made with, and a better plan is then
one call away. But adopting it moves every layer whose stage changes (parameters,
gradients, optimizer state), and the pipeline pauses while the bytes travel. `replan`
takes the new plan only if the time it saves over the steps expected to remain exceeds
the time the move takes:

    (current iteration - new iteration) x remaining_steps  >  move time

where both iteration times are predicted from the *new* costs, and the move time is
`link.time(total bytes moved)`: a bound that assumes the moves share one link.
A current plan that no longer fits the memory budget is replaced whatever the cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.pure.costs import LayerCost, LinkCost
from pipeline.pure.planner.base import Plan, Planner, ScheduleLike

__all__ = ["Replan", "moved_layers", "replan"]


@dataclass(frozen=True)
class Replan:
    """The outcome of `replan`: the plan to run and what adopting it costs and saves."""

    plan: Plan  # the candidate if adopted, else the current layout with refreshed numbers
    changed: bool  # whether the candidate was adopted (and its layers are to move)
    candidate: Plan  # the planner's best plan for the new costs
    moved: tuple[str, ...]  # keys of the layers whose stage the candidate changes
    bytes_moved: int  # what moving them transfers
    move_s: float  # predicted time of that transfer
    saving_s: float  # predicted time the candidate saves over the remaining steps
    reason: str


def moved_layers(old: Plan, new: Plan) -> list[int]:
    """Indices of the layers whose owning stage differs between two plans."""
    if old.n_layers != new.n_layers:
        raise ValueError(f"plans for {old.n_layers} and {new.n_layers} layers cannot be compared")
    return [i for i, (a, b) in enumerate(zip(old.owners(), new.owners(), strict=True)) if a != b]


def replan(
    current: Plan,
    costs: Sequence[LayerCost],
    planner: Planner,
    *,
    remaining_steps: int,
    link: LinkCost,
    state_bytes: Sequence[int] | None = None,
    memory_budget: int | None = None,
    pipeline_link: LinkCost | None = None,
    schedule: ScheduleLike | None = None,
) -> Replan:
    """Plan afresh from `costs` and adopt the result only if it pays back its move.

    state_bytes    bytes that travel with each layer (default: its LayerCost.state_bytes)
    link           the link the migrated bytes cross
    pipeline_link  the link between stages during training (for iteration predictions)
    schedule       the schedule function when it is not a built-in one (default: by name)
    """
    sizes = _state_sizes(current, costs, remaining_steps, state_bytes)
    m = current.n_microbatches
    schedule = current.schedule if schedule is None else schedule
    now = planner.evaluate(
        costs,
        current.sizes,
        current.actions,
        schedule=schedule,
        n_microbatches=m,
        link=pipeline_link,
        handoff=current.handoff,
    )
    new = planner.plan(
        costs,
        current.n_stages,
        schedule=schedule,
        n_microbatches=m,
        memory_budget=memory_budget,
        link=pipeline_link,
    )
    moved = moved_layers(now, new)
    nbytes = sum(sizes[i] for i in moved)
    move_s = link.time(nbytes) if moved else 0.0
    saving = (now.predicted_iteration_s - new.predicted_iteration_s) * remaining_steps
    adopt, reason = _decide(now, new, memory_budget, saving, move_s, nbytes, remaining_steps)
    return Replan(
        plan=new if adopt else now,
        changed=adopt,
        candidate=new,
        moved=tuple(costs[i].key for i in moved),
        bytes_moved=nbytes,
        move_s=move_s,
        saving_s=saving,
        reason=reason,
    )


def _state_sizes(
    current: Plan,
    costs: Sequence[LayerCost],
    remaining_steps: int,
    state_bytes: Sequence[int] | None,
) -> list[int]:
    """The bytes that travel with each layer, the arguments of `replan` checked first."""
    if len(costs) != current.n_layers:
        raise ValueError(f"{len(costs)} layer costs for a plan of {current.n_layers} layers")
    if remaining_steps < 0:
        raise ValueError(f"remaining_steps must be >= 0, got {remaining_steps}")
    sizes = [c.state_bytes for c in costs] if state_bytes is None else list(state_bytes)
    if len(sizes) != len(costs):
        raise ValueError(f"{len(sizes)} state sizes for {len(costs)} layers")
    return sizes


def _decide(
    now: Plan,
    new: Plan,
    memory_budget: int | None,
    saving: float,
    move_s: float,
    nbytes: int,
    remaining_steps: int,
) -> tuple[bool, str]:
    """Whether to adopt `new` over `now` (the current layout), and why."""
    if memory_budget is not None and max(now.predicted_stage_bytes) > memory_budget:
        return True, "the current plan exceeds the memory budget"
    if (new.sizes, new.actions, new.handoff) == (now.sizes, now.actions, now.handoff):
        return False, "the best plan is the current one"
    reason = (
        f"saves {saving:.4g} s over {remaining_steps} steps; moving {nbytes:,} bytes "
        f"takes {move_s:.4g} s"
    )
    return saving > move_s, reason
