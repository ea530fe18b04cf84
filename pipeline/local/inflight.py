"""What one stage keeps while a step runs: its times, each micro-batch in flight, and errors.

`pipeline.local.stage` fills these as it computes; `pipeline.distributed.executor` and
`pipeline.distributed.stream` hold the `InFlight` of every micro-batch between its
forward and its backward, and turn a `ComputeError` into a `StageError` on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pipeline.local.backward import WeightGrad
from pipeline.local.carry import Carry

__all__ = ["ComputeError", "InFlight", "StepTimes"]


@dataclass
class StepTimes:
    """Where one stage's time went during one step (seconds)."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    wait_s: float = 0.0  # blocked on a receive or on the sends before the optimizer step
    optimizer_s: float = 0.0
    total_s: float = 0.0
    peak_activation_bytes: int = 0  # measured in-flight peak (steps that measure memory)
    allocator_peak_bytes: int = 0  # GPU only: torch.cuda.max_memory_allocated in the step
    forwards: int = 0  # micro-batch forwards in the step ...
    fused_forwards: int = 0  # ... of which ran the stage as one graph (`pipeline.local.fused`)


@dataclass
class InFlight:
    """What a micro-batch leaves on this stage between its forward and its backward."""

    inputs: list[Carry] = field(default_factory=list)  # per layer, detached leaves
    outputs: list[Carry] = field(default_factory=list)  # per layer; () when recomputed
    fused: bool = False  # one graph for the stage (`pipeline.local.fused`): one of each
    loss: torch.Tensor | None = None
    weight: dict[int, WeightGrad] = field(default_factory=dict)  # split: W's work, by layer
    # Bi-Partition (`pipeline.local.separable`): what goes to the next stage, when it is
    # more than the last output, and the inputs of the layers handed from the previous one
    wire: Carry | None = None
    handed: Carry = ()
    handed_weight: list[Callable[[], None]] = field(default_factory=list)  # split: W's


class ComputeError(Exception):
    """An exception in a layer, the loss or the optimizer step, and where it happened."""

    def __init__(
        self, phase: str, layer: str | None, microbatch: int | None, error: BaseException
    ) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.phase, self.layer, self.microbatch, self.error = phase, layer, microbatch, error
