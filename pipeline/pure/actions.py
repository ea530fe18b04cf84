"""The vocabulary of schedules: actions, their kinds, and the error of a malformed list.

Kept apart from `pipeline.pure.schedule` (which builds, lowers and validates lists) so that
schedules living in their own modules (`pipeline.pure.zero_bubble`) can use it while the
registry in `pipeline.pure.schedule` imports them. See that module for what each op means.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["COMPUTE_OPS", "GRAD_OPS", "Action", "Op", "ScheduleError", "ScheduleFn", "check_shape"]


class ScheduleError(ValueError):
    """A schedule is malformed: it would compute wrong gradients or deadlock."""


class Op(enum.Enum):
    FORWARD = "F"
    BACKWARD = "B"
    BACKWARD_INPUT = "BI"
    BACKWARD_WEIGHT = "W"
    OPTIMIZER_STEP = "STEP"
    RECV_ACT = "RECV_ACT"
    SEND_ACT = "SEND_ACT"
    RECV_GRAD = "RECV_GRAD"
    SEND_GRAD = "SEND_GRAD"


COMPUTE_OPS = (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)
GRAD_OPS = (Op.BACKWARD, Op.BACKWARD_INPUT)  # receive the outputs' gradient, send the inputs'


@dataclass(frozen=True)
class Action:
    """One step of a stage's (or a rank's) list: `op` on micro-batch `microbatch` of `stage`.

    `stage` is -1 in the lists of schedules with one stage per rank: the action concerns the
    rank's only stage, and its repr is the op and micro-batch ("F3"). A schedule with several
    stages per rank (`pipeline.pure.placement`) names the global stage of every compute and
    message action ("F3@2": micro-batch 3's forward on stage 2); its OPTIMIZER_STEP stays -1
    (one per rank, for all its stages). `step` is the training step an OPTIMIZER_STEP
    closes in a stream's list, which spans several ("STEP3"); a flushed list has one step,
    and None there.
    """

    op: Op
    microbatch: int = -1  # -1 for actions that concern no micro-batch (OPTIMIZER_STEP)
    stage: int = -1  # -1: the rank's only stage (module doc)
    step: int | None = None  # OPTIMIZER_STEP in a stream: the step it closes

    def __post_init__(self) -> None:
        if self.step is not None and self.op is not Op.OPTIMIZER_STEP:
            raise ValueError(f"only an OPTIMIZER_STEP closes a step, not {self.op.name}")

    def __repr__(self) -> str:
        index = self.step if self.step is not None else self.microbatch
        text = self.op.value if index < 0 else f"{self.op.value}{index}"
        return text if self.stage < 0 else f"{text}@{self.stage}"


ScheduleFn = Callable[[int, int, int], list[Action]]


def check_shape(n_stages: int, n_microbatches: int, stage: int) -> None:
    if n_stages < 1:
        raise ValueError(f"n_stages must be >= 1, got {n_stages}")
    if n_microbatches < 1:
        raise ValueError(f"n_microbatches must be >= 1, got {n_microbatches}")
    if not 0 <= stage < n_stages:
        raise ValueError(f"stage must be in [0, {n_stages}), got {stage}")
