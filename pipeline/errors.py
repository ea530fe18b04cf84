"""The errors a pipeline raises, in one place, so users know what to catch.

A NAS study runs hundreds of candidates on the same processes; a candidate that fails must
become an exception the study can record, on every rank at once, never a hang or a crash.
Every error here is picklable (it travels from the stage where it happened to every other
rank, and from a stage process to `launch`'s caller), so each defines `__reduce__`.

    PipelineError                  base of the runtime's errors
    ├── StageError                 a layer, the loss or the optimizer raised on one stage
    │   └── NonFiniteLossError     the step's loss is NaN or infinite (on_nonfinite="raise")
    ├── StageFailedError           a stage process raised out of `fn` or died (`launch`)
    └── MigrationError             a migration was rolled back; the old plan stays

`pipeline.pure.planner.InfeasibleBudgetError` (a `ValueError`: no plan fits the memory
budget) and the `ValueError`/`TypeError` of a bad argument or a bad layer factory are raised
as themselves, on every rank.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MigrationError",
    "NonFiniteLossError",
    "PipelineError",
    "StageError",
    "StageFailedError",
]


class PipelineError(RuntimeError):
    """Base class of the runtime's own errors."""


class StageError(PipelineError):
    """An exception inside one stage's work, raised on every rank as the same error.

    Attributes:
        stage: the stage (rank) where it happened.
        phase: "forward", "backward", "loss", "optimizer", "send" or "receive".
        step: the training step (steps count from 0 per model).
        layer: the key of the layer that raised, or None (loss, optimizer, messages).
        microbatch: the micro-batch, or None (optimizer).
        cause: "ExceptionType: message" of the original exception.
        traceback: its formatted traceback, from the stage where it was raised.
    """

    def __init__(
        self,
        stage: int,
        phase: str,
        step: int,
        cause: str,
        traceback: str = "",
        *,
        layer: str | None = None,
        microbatch: int | None = None,
    ) -> None:
        self.stage, self.phase, self.step, self.cause = stage, phase, step, cause
        self.traceback, self.layer, self.microbatch = traceback, layer, microbatch
        where = f"in the {phase}"
        if layer is not None:
            where += f" of layer {layer!r}"
        if microbatch is not None:
            where += f" (micro-batch {microbatch})"
        text = f"stage {stage} failed {where} at step {step}: {cause}"
        super().__init__(f"{text}\n\n{traceback}" if traceback else text)

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.stage, self.phase, self.step, self.cause, self.traceback)
        return _rebuild, (type(self), args, {"layer": self.layer, "microbatch": self.microbatch})


class NonFiniteLossError(StageError):
    """The loss of a step is NaN or infinite; the step was not applied on any stage."""


class StageFailedError(PipelineError):
    """A stage process raised out of the launched function, or died; `detail` says how."""

    def __init__(self, stage: int, detail: str) -> None:
        super().__init__(f"stage {stage} failed:\n{detail}")
        self.stage, self.detail = stage, detail

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.stage, self.detail)


class MigrationError(PipelineError):
    """A migration was rolled back; the pipeline still runs on the old plan, state intact."""


def _rebuild(cls: type[StageError], args: tuple[Any, ...], kwargs: dict[str, Any]) -> StageError:
    return cls(*args, **kwargs)
