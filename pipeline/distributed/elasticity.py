"""Changing a running pipeline: `repartition`, `rebalance`, `reconfigure` (its elasticity).

Kept apart from `pipeline.distributed.elastic` so the facade stays short; its methods of the
same names delegate here and carry the documentation. Every function is a collective (all
ranks call it, in the same order), and the three below first drain a `train` stream in flight:

    repartition  moves layers live to new stage sizes (`pipeline.distributed.migration`);
                 on failure the old partition and Bi-Partition cut stay in force
    rebalance    re-plans from the measured costs (`pipeline.pure.planner.replan`, agreed
                 on rank 0) and repartitions when the new plan pays back its migration;
                 `maybe_rebalance` runs it after a step when a trigger fires
                 (`pipeline.distributed.triggers`); at a first plan's correction under
                 schedule="auto" it also weighs the other schedules' plans from the same
                 costs and returns the tryout of those it cannot rank
                 (`pipeline.distributed.tryout`, 5.)
    next_model   reconfigure's checks and the weights to inherit; the facade then swaps in
                 the next model (`pipeline.distributed.build`) and loads them
                 (`pipeline.distributed.weights`)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pipeline.distributed import build, weights
from pipeline.distributed import handoff as handoff_cut
from pipeline.distributed.inheritance import WeightSnapshot
from pipeline.distributed.migration import MigrationError, MigrationRecord, migrate
from pipeline.distributed.options import CheckpointOptions
from pipeline.distributed.parts import ElasticPipelineParts
from pipeline.distributed.tryout import PlanTryout, challenge
from pipeline.local.spec import LayerSpec, check_specs
from pipeline.pure.partition import bounds
from pipeline.pure.planner import InfeasibleBudgetError, Plan, Replan, evaluate, replan

__all__ = ["calibrated_budget", "maybe_rebalance", "next_model", "rebalance", "repartition"]


def repartition(
    pipe: ElasticPipelineParts,
    sizes: Sequence[int],
    actions: Sequence[str] | None,
    handoff: Sequence[int] | None,
) -> MigrationRecord:
    """Move layers live so that stage s holds `sizes[s]` layers (`ElasticPipeline.repartition`)."""
    pipe.drain()
    model = pipe.model
    stages = model.live_stages()
    new = build.checked_sizes(sizes, len(model.specs), pipe.n_stages)
    handoff_cut.check_handoff(handoff, new)
    old_cut = model.handoff
    model.set_handoff(())
    for stage in stages:
        stage.set_handoff(0, None)  # replicas go; the owners hold every handed layer's state
    try:
        record = migrate(
            pipe.comm,
            stages,
            model.specs,
            model.sizes,
            new,
            model.step,
            model.version + 1,
            pipe.placement.rank_of,
        )
    except MigrationError as exc:
        build.set_handoff(pipe, old_cut)
        pipe.event_log.record("rollback", sizes=model.sizes, requested=new, error=str(exc))
        raise
    if actions is not None:
        for stage in stages:
            a, b = bounds(new)[stage.index]
            stage.set_memory_actions(list(actions)[a:b])
    model.moved(record, new)
    build.set_handoff(pipe, handoff)
    pipe.plan_age.restart(model.step)  # the next step measures memory
    pipe.event_log.record("migration", **dataclasses.asdict(record))
    return record


def rebalance(
    pipe: ElasticPipelineParts, remaining_steps: int | None, *, rivals: bool = False
) -> tuple[MigrationRecord | None, PlanTryout | None]:
    """Re-plan from measured costs; migrate if it pays back (`ElasticPipeline.rebalance`).
    `rivals`: also the tryout of the other schedules' plans from these costs (None: none
    is close enough)."""
    pipe.drain()
    horizon = pipe.options.elastic.rebalance_horizon if remaining_steps is None else remaining_steps
    ran_steps = pipe.plan_age.steps_on_plan(pipe.model.step)  # of the plan in force
    costs, actions = pipe.layer_costs()
    if pipe.model.signatures:  # the next model with these layers plans from what they cost here
        pipe.options.planning.cost_cache.learn(pipe.model.signatures, costs)
    schedule = build.planned_schedule(pipe)
    current = evaluate(
        costs,
        pipe.model.sizes,
        actions,
        schedule=schedule,
        n_microbatches=pipe.options.n_microbatches,
        handoff=pipe.model.handoff,
    )
    budget = calibrated_budget(pipe, current)

    def decide() -> Replan:
        def held_to(limit: int | None) -> Replan:
            return replan(
                current,
                costs,
                pipe.planner,
                remaining_steps=horizon,
                link=pipe.link,
                memory_budget=limit,
                schedule=schedule,
            )

        try:
            return held_to(budget)
        except InfeasibleBudgetError:  # the margin is more than any split can give up
            return held_to(pipe.options.planning.memory_budget)

    decision = pipe.comm.agree(decide)
    pipe.event_log.record(
        "replan",
        changed=decision.changed,
        reason=decision.reason,
        candidate=decision.candidate.to_dict(),
    )
    pipe.model.replanned(decision.plan)
    pipe.plan_age.restart(pipe.model.step, measure=False)
    tryout = challenge(pipe, costs, budget, decision.plan, current, ran_steps) if rivals else None
    if not decision.changed:
        return None, tryout
    plan = decision.plan
    return pipe.repartition(plan.sizes, plan.actions, plan.handoff or None), tryout


def calibrated_budget(pipe: ElasticPipelineParts, current: Plan) -> int | None:
    """The budget a re-plan is held to: the user's, tightened by how far the stages' measured
    peaks exceed what the measured costs predict for the plan in force (a collective).

    The planner adds up per-layer costs; a stage also holds what no single layer owns (the
    buffers of a recompute, a kept input beside its replay), a few percent at most. Without
    the margin a re-plan could keep, or pick again, a plan that measures over the budget:
    the memory trigger would fire and the plan stay. Every stage's latest measurement is of
    the layers it holds now: each migration has the next step measure.
    """
    budget = pipe.options.planning.memory_budget
    if budget is None:
        return None
    ratios = [
        (stage.state_bytes() + stage.saved.peak) / current.predicted_stage_bytes[stage.index]
        for stage in pipe.model.live_stages()
        if current.predicted_stage_bytes[stage.index] > 0
    ]
    worst = pipe.comm.all_reduce([max(ratios, default=0.0)], op="max")[0]
    return budget if worst <= 1.0 else int(budget / worst)


def maybe_rebalance(pipe: ElasticPipelineParts, measured: bool) -> PlanTryout | None:
    """After a step: rebalance when a trigger fires (`pipeline.distributed.triggers`); at a
    first plan's correction under schedule="auto", the tryout of other schedules' plans to
    run next, if any."""
    model = pipe.model
    correcting = measured and pipe.plan_age.correction_due(model.step)
    reason = pipe.triggers.reason(
        pipe.comm,
        model.step,
        model.live_stages(),
        model.plan,
        measured,
        pipe.plan_age,
    )
    if reason is None:
        return None
    pipe.event_log.record("trigger", reason=reason)
    pipe.plan_age.corrected()  # any re-plan from measured costs is the correction
    return rebalance(pipe, None, rivals=correcting and pipe.auto_schedule)[1]


def next_model(
    pipe: ElasticPipelineParts,
    specs: Sequence[LayerSpec],
    inherit_weights: bool,
    inherit_from: WeightSnapshot | None,
    checkpoint: CheckpointOptions | None = None,
) -> tuple[list[LayerSpec], WeightSnapshot | None]:
    """`ElasticPipeline.reconfigure`'s checks, before the old model goes: the new specs
    (the same on every rank) and the weights the new model is to inherit, if any (none
    where it resumes a checkpoint)."""
    new_specs = check_specs(specs)
    resumes = checkpoint is not None and checkpoint.resume_from is not None
    if resumes and inherit_weights:
        raise ValueError(
            "inherit_weights=True and CheckpointOptions(resume_from=...) both give the "
            "starting weights; pass one of them"
        )
    pipe.drain()
    requests = pipe.comm.all_gather_object([s.key for s in new_specs])
    if any(r != requests[0] for r in requests):
        raise ValueError("ranks passed different models to reconfigure")
    if inherit_from is not None:
        weights.checked_source(inherit_from, resumes)
    if inherit_from is None and inherit_weights and pipe.model.built:
        # references: the old layers are freed before the new ones load them
        return new_specs, weights.snapshot(pipe.model, copy=False)
    return new_specs, inherit_from
