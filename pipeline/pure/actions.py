"""The vocabulary of schedules: actions, their kinds, and the error of a malformed list.

Kept apart from `pipeline.pure.schedule` (which builds, lowers and validates lists) so that
schedules living in their own modules (`pipeline.pure.zero_bubble`) can use it while the
registry in `pipeline.pure.schedule` imports them. See that module for what each op means.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.pure.checks import is_int

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
    """One step of a rank's list: `op` on micro-batch `microbatch` of stage `stage`.

    Every compute and message action names its micro-batch and its global stage ("F3@2":
    micro-batch 3's forward on stage 2), as torch's `_Action` does; a rank that holds one
    stage names it in every action. An OPTIMIZER_STEP concerns no micro-batch and steps
    every stage the rank holds, so it names neither; in a stream's list, which spans several
    training steps, `step` is the one it closes ("STEP3"; a flushed list has one step, and
    None there).
    """

    op: Op
    microbatch: int | None = None  # None only for OPTIMIZER_STEP
    stage: int | None = None  # None only for OPTIMIZER_STEP (all the rank's stages)
    step: int | None = None  # OPTIMIZER_STEP in a stream: the step it closes

    def __post_init__(self) -> None:
        if self.op is Op.OPTIMIZER_STEP:
            if self.microbatch is not None or self.stage is not None:
                raise ValueError(
                    f"an OPTIMIZER_STEP names no micro-batch or stage, got microbatch="
                    f"{self.microbatch!r}, stage={self.stage!r}"
                )
            return
        if self.step is not None:
            raise ValueError(f"only an OPTIMIZER_STEP closes a step, not {self.op.name}")
        for name, value in (("microbatch", self.microbatch), ("stage", self.stage)):
            if not is_int(value) or value < 0:
                raise ValueError(f"{self.op.name} needs a {name} >= 0, got {value!r}")

    @property
    def microbatch_index(self) -> int:
        """The micro-batch of a compute or message action (an OPTIMIZER_STEP has none)."""
        assert self.microbatch is not None, f"{self} concerns no micro-batch"
        return self.microbatch

    @property
    def stage_index(self) -> int:
        """The stage of a compute or message action (an OPTIMIZER_STEP has none)."""
        assert self.stage is not None, f"{self} concerns no single stage"
        return self.stage

    @property
    def label(self) -> str:
        """The op and its micro-batch (or step), without the stage: "F3", "STEP", "STEP3"
        (a timeline row is the stage already)."""
        index = self.step if self.op is Op.OPTIMIZER_STEP else self.microbatch
        return self.op.value if index is None else f"{self.op.value}{index}"

    def __repr__(self) -> str:
        return self.label if self.stage is None else f"{self.label}@{self.stage}"


ScheduleFn = Callable[[int, int, int], list[Action]]


def check_shape(n_stages: int, n_microbatches: int, stage: int) -> None:
    if n_stages < 1:
        raise ValueError(f"n_stages must be >= 1, got {n_stages}")
    if n_microbatches < 1:
        raise ValueError(f"n_microbatches must be >= 1, got {n_microbatches}")
    if not 0 <= stage < n_stages:
        raise ValueError(f"stage must be in [0, {n_stages}), got {stage}")
