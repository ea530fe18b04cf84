"""Trying, on the running pipeline, the plans its cost model cannot rank; keeping the fastest.

`pipeline.pure.planner.tryout` decides; this module runs it on every rank, numbered:

    1. begin   schedule="auto" plans every exact schedule on the first step
               (`pipeline.distributed.build.plan_first`); rank 0 ranks their plans by
               prediction corrected with the cost cache's `PredictionErrors` and keeps those
               within the model's error of the best (`ElasticOptions.try_plans` at most).
               One: it is the plan, untried. Several: a `PlanTryout` starts on the first
    2. time    after each step rank 0's wall time of it (from the batch to the agreed loss:
               the iteration) is shared with every rank (`Comm.agree`), so every rank's
               `Tryout` takes the same seconds and makes the same move. A step that
               measures memory and per-layer times (the first of each plan, every
               `measure_memory_every`) is slower by design: it does not count
    3. switch  to the next contender (`ElasticPipeline.switch_plan`): through a checkpoint,
               so the next step computes exactly what it would have under the plan before
    4. keep    after the last, the fastest measured is switched back to if another ran
               last; every contender's measurement teaches the cost cache's errors, a
               "tryout" event records them, and the plan kept awaits its correction from
               measured costs (`ElasticOptions.correct_after`), as any first plan does
    5. rivals  at that correction (`pipeline.distributed.elasticity.maybe_rebalance`), the
               plan in force re-planned from the costs its stages measured is weighed
               against every other exact schedule's plan from the same costs and against
               its own schedule on the cuts one layer from its own, each with its memory
               actions, where they fit the budget (`pipeline.pure.planner.tryout.rivals`);
               those the model cannot tell from it (within its error: `CHALLENGE_ERROR` at
               least, and at least how far the plan that ran measured from its prediction
               from these costs), or predicts faster, are tried against it as in 2.-4.
               (`challenge`). Their predictions come from measured costs, not the profile a
               next model starts from, so they teach no error, and the plan kept awaits no
               other correction

While a tryout runs, the re-plan triggers wait (a re-plan would change the plan being timed).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pipeline.distributed.comm import Comm
from pipeline.distributed.options import ElasticOptions
from pipeline.distributed.parts import ChallengedPipeline, TriedPipeline
from pipeline.pure.costs import LayerCost
from pipeline.pure.planner import Plan, choose_schedule
from pipeline.pure.planner.base import Problem
from pipeline.pure.planner.tryout import (
    Contender,
    Move,
    PredictionErrors,
    Tryout,
    challenge_error,
    contenders,
    neighbouring_cuts,
    rivals,
)

__all__ = ["PlanTryout", "begin", "challenge", "forget_switch", "switch_folder"]

WARMUP = 1  # steps of each contender not timed (its build, its first allocations)


class PlanTryout:
    """A `Tryout` on a running pipeline (module doc); the same on every rank. `teaches`:
    its plans' predictions came from the first step's profile, so what they measure teaches
    the cost cache's errors and the plan kept awaits its correction (not so for 5.)."""

    def __init__(self, tryout: Tryout, *, teaches: bool = True) -> None:
        self._tryout = tryout
        self._teaches = teaches

    @property
    def plan(self) -> Plan:
        """The plan the tryout runs now (once over: the one kept)."""
        return self._tryout.current.plan

    @property
    def done(self) -> bool:
        return self._tryout.done

    def after_step(self, pipe: TriedPipeline, seconds: float, measured: bool) -> None:
        """2.-4. after a step that took `seconds` here (rank 0's count); every rank."""
        agreed = pipe.comm.agree(lambda: seconds)
        if measured:  # slower by design (module doc, 2.)
            return
        move = self._tryout.stepped(agreed)
        if move is Move.SWITCH:
            pipe.switch_plan(self.plan)
        elif move is Move.KEEP:
            self._keep(pipe)

    def _keep(self, pipe: TriedPipeline) -> None:
        """4.: the fastest in force, the cost cache taught, the event recorded."""
        if self._tryout.ran_last is not self._tryout.current:
            pipe.switch_plan(self.plan)
        pipe.event_log.record("tryout", **self._tryout.to_dict())
        if not self._teaches:
            return
        errors = pipe.options.planning.cost_cache.errors
        for contender, measured in self._tryout.results():
            errors.learn(contender.plan, measured)
        if pipe.n_stages > 1:
            pipe.plan_age.await_correction(pipe.model.step, pipe.options.elastic.correct_after)


def begin(pipe: TriedPipeline, plans: Sequence[Plan]) -> tuple[Plan, PlanTryout | None]:
    """1.: the plan to build first, and the tryout that starts with it (None: no other
    plan is close enough to try, or `try_plans` is 1); every rank, agreed on rank 0."""
    elastic = pipe.options.elastic
    errors: PredictionErrors = pipe.options.planning.cost_cache.errors
    chosen = pipe.comm.agree(lambda: contenders(plans, errors, elastic.try_plans))
    if len(chosen) < 2:
        return chosen[0].plan, None
    tryout = _tryout(chosen, elastic)
    pipe.event_log.record("tryout", **tryout.to_dict())
    return chosen[0].plan, PlanTryout(tryout)


def challenge(
    pipe: ChallengedPipeline,
    costs: Sequence[LayerCost],
    memory_budget: int | None,
    in_force: Plan,
    ran: Plan,
    ran_steps: int,
) -> PlanTryout | None:
    """5.: the tryout of `in_force` (the correction's plan, from the measured `costs`)
    against the other schedules' plans from them that the model cannot rank below it; None
    when there is none. `ran`: the plan that ran the last `ran_steps` steps, predicted from
    `costs`; how far it ran from that prediction widens the error (`challenge_error`).
    Every rank, agreed on rank 0."""
    elastic = pipe.options.elastic
    learned = pipe.options.planning.cost_cache.errors.error
    error = challenge_error(learned, _iteration_s(pipe, ran_steps), ran.predicted_iteration_s)

    def decide() -> list[Contender]:
        try:
            _, tried = choose_schedule(
                pipe.planner,
                costs,
                pipe.comm.world_size,
                n_microbatches=pipe.options.n_microbatches,
                memory_budget=memory_budget,
            )
        except ValueError:  # no schedule fits: the plan in force is the only one
            tried = []
        others = [c.plan for c in tried if c.plan is not None]
        near = _neighbours(pipe, costs, memory_budget, in_force)
        return rivals(in_force, [*others, *near], error, elastic.try_plans)

    chosen = pipe.comm.agree(decide)
    if not chosen:
        return None
    tryout = _tryout(chosen, elastic)
    pipe.event_log.record("tryout", error=error, **tryout.to_dict())
    return PlanTryout(tryout, teaches=False)


def _iteration_s(pipe: ChallengedPipeline, steps: int) -> float:
    """The iteration the plan in force measured over the last `steps` steps: the slowest
    rank's median step, those that measured memory left out (slower by design) unless every
    one did (0.0: none ran); a collective."""
    records = pipe.model.history.recent(steps)
    plain = [r.times.total_s for r in records if not r.times.peak_activation_bytes]
    seconds = plain or [r.times.total_s for r in records]
    mine = statistics.median(seconds) if seconds else 0.0
    return float(pipe.comm.all_reduce([mine], op="max")[0])


def _neighbours(
    pipe: ChallengedPipeline,
    costs: Sequence[LayerCost],
    memory_budget: int | None,
    in_force: Plan,
) -> list[Plan]:
    """`in_force`'s schedule and memory actions on the cuts one layer from its own
    (`neighbouring_cuts`), predicted from `costs` as the correction planned it (the
    planner's link between stages), those that fit `memory_budget`; none under a
    Bi-Partition handoff (its cut is its own)."""
    if in_force.handoff:
        return []
    link = pipe.planner.default_link
    problem = Problem(
        costs,
        in_force.n_stages,
        in_force.schedule,
        in_force.n_microbatches,
        memory_budget,
        link,
    )
    near = [
        pipe.planner.evaluate(
            costs,
            sizes,
            in_force.actions,
            schedule=in_force.schedule,
            n_microbatches=in_force.n_microbatches,
            link=link,
        )
        for sizes in neighbouring_cuts(in_force.sizes)
    ]
    return [plan for plan in near if problem.fits(plan)]


def _tryout(chosen: Sequence[Contender], elastic: ElasticOptions) -> Tryout:
    return Tryout(
        chosen,
        warmup=WARMUP,
        steps=elastic.try_steps,
        rounds=elastic.try_rounds,
        most_rounds=elastic.try_rounds_max,
    )


def switch_folder(comm: Comm, directory: str | os.PathLike[str] | None, step: int) -> Path:
    """Where `switch_plan` saves the state it goes on from, the same on every rank:
    `<directory>/switch-<step>` beside the automatic checkpoints (a folder every rank
    sees), else in a new temporary folder of this machine."""

    def make() -> Path:
        if directory is None:
            return Path(tempfile.mkdtemp(prefix="pipeline-switch-")) / f"switch-{step:08d}"
        return Path(directory).absolute() / f"switch-{step:08d}"

    return comm.agree(make)


def forget_switch(comm: Comm, folder: Path, temporary: bool) -> None:
    """Once every rank loaded it, rank 0 deletes the switch's checkpoint (and its
    temporary parent)."""
    comm.barrier()
    if comm.rank == 0:
        shutil.rmtree(folder.parent if temporary else folder, ignore_errors=True)
