"""The per-stage checks of `pipeline.pure.schedule.validate`: what one stage's list must hold.

Kept apart from the registry and the lowering in `pipeline.pure.schedule` because these two
read a single stage's list on their own (every micro-batch computed exactly once, a stream's
optimizer steps where two weight versions suffice), while `validate` combines them with
the checks across stages (`pipeline.pure.wire_order`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.pure.actions import COMPUTE_OPS, GRAD_OPS, Action, Op, ScheduleError

__all__ = ["check_stage", "check_versions"]


def check_stage(actions: Sequence[Action], stage: int, n_microbatches: int) -> None:
    """Each micro-batch forwarded once, then back-propagated once (whole, or its input
    gradient before its weight gradient), and the optimizer step last."""
    forwarded: set[int] = set()
    backwarded: set[int] = set()  # input gradient done (BACKWARD or BACKWARD_INPUT)
    weights: set[int] = set()  # weight gradient done (BACKWARD or BACKWARD_WEIGHT)
    split: set[int] = set()
    for position, action in enumerate(actions):
        if action.op is Op.OPTIMIZER_STEP:
            if position != len(actions) - 1 and action.step is None:  # a stream's name theirs
                raise ScheduleError(f"stage {stage}: optimizer step must be the last action")
            continue
        i = action.microbatch_index
        if action.op in COMPUTE_OPS and not 0 <= i < n_microbatches:
            raise ScheduleError(f"stage {stage}: {action} names no micro-batch of {n_microbatches}")
        if action.op is Op.FORWARD:
            if i in forwarded:
                raise ScheduleError(f"stage {stage}: micro-batch {i} forwarded twice")
            forwarded.add(i)
        elif action.op in GRAD_OPS:
            if i not in forwarded:
                raise ScheduleError(f"stage {stage}: backward of {i} before its forward")
            if i in backwarded:
                raise ScheduleError(f"stage {stage}: micro-batch {i} back-propagated twice")
            backwarded.add(i)
            if action.op is Op.BACKWARD:
                weights.add(i)
            else:
                split.add(i)
        elif action.op is Op.BACKWARD_WEIGHT:
            if i not in split:
                raise ScheduleError(
                    f"stage {stage}: weight gradient of {i} without its BACKWARD_INPUT before it"
                )
            if i in weights:
                raise ScheduleError(f"stage {stage}: weight gradient of {i} computed twice")
            weights.add(i)
    missing = set(range(n_microbatches)) - (backwarded & weights)
    if missing or forwarded != backwarded or weights != backwarded:
        raise ScheduleError(f"stage {stage}: micro-batches {sorted(missing)} never finish")
    if not actions or actions[-1].op is not Op.OPTIMIZER_STEP:
        raise ScheduleError(f"stage {stage}: no optimizer step at the end")


def check_versions(actions: Sequence[Action], stage: int, m: int, n_steps: int) -> None:
    """A stream's OPTIMIZER_STEP(t): after step t's backwards, before step t + 2's forwards."""
    done = -1  # the last optimizer step taken
    for action in actions:
        if action.op is Op.OPTIMIZER_STEP:
            if action.step != done + 1:
                raise ScheduleError(f"stage {stage}: {action} after STEP{done}")
            done += 1
            continue
        step = action.microbatch_index // m
        if action.op in COMPUTE_OPS and step <= done:
            raise ScheduleError(f"stage {stage}: {action} of step {step} after its optimizer step")
        elif action.op is Op.FORWARD and step > done + 2:
            raise ScheduleError(
                f"stage {stage}: {action} of step {step} before STEP{step - 2}: its weight "
                "version does not exist yet (two versions: needs more micro-batches per step)"
            )
    if done != n_steps - 1:
        raise ScheduleError(f"stage {stage}: {done + 1} optimizer steps for {n_steps} steps")
