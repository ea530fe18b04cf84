"""Planning and building a model on the stages: what `ElasticPipeline` runs when a model starts.

Kept apart from `pipeline.distributed.elastic` so the facade stays short. A model starts at
construction and at every `reconfigure` (`pipeline.distributed.elasticity`): `setup` checks
its specs and partition and resets the step counters; with explicit sizes (or a `Plan`)
`build` makes this rank's `Stage` at once, with partition="auto" `plan_first` does on the
first step: it profiles one micro-batch's shapes (`pipeline.distributed.agreement`), plans on
rank 0 and builds. Every build puts Bi-Partition's cut in force (`set_handoff`, the protocol
is `pipeline.distributed.handoff`), and a model waiting for inherited weights takes them
(`pipeline.distributed.weights`). Everything here runs on every rank, in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pipeline.distributed import handoff as handoff_cut
from pipeline.distributed import weights
from pipeline.distributed.agreement import profile_costs
from pipeline.distributed.options import check_partition
from pipeline.distributed.parts import BuiltPipeline, TriedPipeline
from pipeline.distributed.tryout import PlanTryout
from pipeline.distributed.tryout import begin as begin_tryout
from pipeline.local.stage import Stage
from pipeline.pure.costs import LayerCost
from pipeline.pure.partition import bounds, check_sizes, equal_sizes
from pipeline.pure.planner import Plan, choose_schedule
from pipeline.pure.schedule import ScheduleSpec, is_stream

__all__ = ["build", "checked_sizes", "plan_first", "planned_schedule", "set_handoff", "setup"]


class TriedBuild(BuiltPipeline, TriedPipeline, Protocol):
    """What a first plan needs: a build, and a tryout of the plans it cannot rank."""


def setup(pipe: BuiltPipeline, partition: str | Sequence[int] | Plan) -> None:
    """Check the new model's partition; build now, or on the first step if "auto"."""
    n_layers = len(pipe.model.specs)
    partition = check_partition(partition)
    if isinstance(partition, str):
        equal_sizes(n_layers, pipe.n_stages)  # more stages than layers: fail now
        return
    if isinstance(partition, Plan):
        build(pipe, checked_sizes(partition.sizes, n_layers, pipe.n_stages), partition)
        return
    build(pipe, checked_sizes(partition, n_layers, pipe.n_stages))


def build(
    pipe: BuiltPipeline,
    sizes: list[int],
    plan: Plan | None = None,
    costs: list[LayerCost] | None = None,
) -> None:
    """Build this rank's stage of `sizes` (with `plan`'s memory actions, meters from `costs`)."""
    model, cuts = pipe.model, bounds(sizes)
    # Factories run here: a bad one raises on every rank, not only where it is built.
    stages = pipe.comm.together(
        lambda: [
            _stage(pipe, s, *cuts[s], plan) for s in pipe.runner.placement.stages_of(pipe.comm.rank)
        ]
    )
    if costs is not None:
        for stage in stages:
            start, stop = cuts[stage.index]
            stage.seed_meters(costs[start:stop])
    model.install(stages, sizes, plan)
    set_handoff(
        pipe, plan.handoff if plan is not None and plan.handoff else model.requested_handoff
    )
    pipe.plan_age.restart(model.step)  # measure memory on the first step of every plan
    pipe.event_log.record("build", sizes=list(sizes), plan=None if plan is None else plan.to_dict())


def _stage(pipe: BuiltPipeline, index: int, start: int, stop: int, plan: Plan | None) -> Stage:
    """Stage `index`, holding layers [start, stop) with the plan's memory actions."""
    actions = list(plan.actions[start:stop]) if plan is not None else None
    return Stage(
        index,
        pipe.n_stages,
        pipe.model.specs[start:stop],
        seed=pipe.recipe.seed,
        device=pipe.device,
        optimizer=pipe.recipe.optimizer,
        loss_fn=pipe.recipe.loss_fn,
        actions=actions,
    )


def set_handoff(pipe: BuiltPipeline, handoff: Sequence[int] | None) -> None:
    """Put Bi-Partition's cut in force (`pipeline.distributed.handoff`); every rank."""
    model = pipe.model
    cut = handoff_cut.check_handoff(handoff, model.sizes)
    if any(cut) or any(model.handoff):  # a cut to put in force or to take back
        stage = model.live_stage("Bi-Partition's handoff")
        if any(cut) and is_stream(pipe.schedule):
            raise ValueError(
                f"handoff {list(cut)} needs a flushed schedule (gpipe, 1f1b, "
                f"zbh1), not {pipe.schedule.name!r}"
            )
        pipe.comm.together(
            lambda: handoff_cut.configure(stage, model.specs, model.sizes, cut, pipe.recipe.seed)
        )
        pipe.event_log.record("handoff", handoff=list(cut))
    model.set_handoff(cut)


def plan_first(pipe: TriedBuild, example: Any) -> PlanTryout | None:
    """partition="auto": profile one micro-batch's shapes, plan on rank 0, build; a plan on
    several stages is corrected from measured costs later (`ElasticOptions.correct_after`).
    With schedule="auto", the plans the cost model cannot rank are tried on the next steps:
    the tryout to run (`pipeline.distributed.tryout`), None when there is none."""
    costs, signatures = profile_costs(
        pipe.comm,
        pipe.model.specs,
        example,
        device=pipe.device,
        opt_ratio=pipe.recipe.optimizer_state_ratio,
        cache=pipe.options.planning.cost_cache,
        source=pipe.options.planning.profile,
    )
    tried: PlanTryout | None = None
    if pipe.auto_schedule:
        plan, tried = _choose_schedule(pipe, costs)
    else:
        schedule = planned_schedule(pipe)
        plan = pipe.comm.agree(
            lambda: pipe.planner.plan(
                costs,
                pipe.n_stages,
                schedule=schedule,
                n_microbatches=pipe.options.n_microbatches,
                memory_budget=pipe.options.planning.memory_budget,
            )
        )
    build(pipe, list(plan.sizes), plan, costs)
    pipe.model.set_signatures(signatures)
    if pipe.n_stages > 1 and tried is None:  # a tryout's plan awaits it once kept
        pipe.plan_age.await_correction(pipe.model.step, pipe.options.elastic.correct_after)
    weights.take_inheritance(pipe.comm, pipe.model, pipe.event_log)
    return tried


def _choose_schedule(pipe: TriedBuild, costs: list[LayerCost]) -> tuple[Plan, PlanTryout | None]:
    """schedule="auto": every exact schedule planned on rank 0; the fastest predicted
    (corrected by what earlier plans measured) adopted, and the tryout of those the model
    cannot tell from it, if any."""
    _, tried = pipe.comm.agree(
        lambda: choose_schedule(
            pipe.planner,
            costs,
            pipe.comm.world_size,
            n_microbatches=pipe.options.n_microbatches,
            memory_budget=pipe.options.planning.memory_budget,
        )
    )
    plan, tryout = begin_tryout(pipe, [c.plan for c in tried if c.plan is not None])
    pipe.event_log.record("schedule", chosen=plan.schedule, candidates=[c.to_dict() for c in tried])
    pipe.adopt_schedule(plan.schedule)
    return plan, tryout


def planned_schedule(pipe: BuiltPipeline) -> ScheduleSpec:
    """The schedule as the planner takes it: the spec in force (its name is what a plan
    records; its stages per rank may differ from the registered one's)."""
    return pipe.schedule


def checked_sizes(sizes: Sequence[int], n_layers: int, n_stages: int) -> list[int]:
    """Stage sizes as a list, checked against the model's layers and the stages."""
    if n_stages > n_layers:
        equal_sizes(n_layers, n_stages)  # raises the clear "more stages than layers" error
    return check_sizes(list(sizes), n_layers, n_stages)
