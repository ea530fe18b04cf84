"""What a stage's layers keep for their backward: memory actions, and the bytes counted.

`MemoryPolicy` is the stage's part that owns the counting; the stage calls it as it
computes. Layers run one at a time, so each layer has its own memory action, chosen by the
planner (`pipeline.pure.costs`):

    keep       autograd keeps the layer's saved tensors until its backward (the default)
    recompute  forward under no_grad keeping only the input; re-run with grad at backward
               (`pipeline.local.stage_backward`), with the same RNG seed, so the result is
               bit-identical
    swap       saved tensors go to host memory and come back for backward (GPU only)

A step that measures memory counts what each micro-batch leaves behind for its backward
(`pipeline.local.meter.SavedBytes`, weights excluded): in a flushed step every micro-batch;
in a stream, whose steps interleave, the micro-batches below a window (`measure_stream`),
the segment's first steps, which reach its in-flight peak. A swapped layer's tensors are in
host memory and are not counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from pipeline.local.inflight import StepTimes
from pipeline.local.layer import StageLayer
from pipeline.local.meter import SavedBytes
from pipeline.pure.costs import MEMORY_ACTIONS

__all__ = ["MemoryPolicy", "set_memory_actions"]


def set_memory_actions(
    layers: Sequence[StageLayer], actions: Sequence[str], device: torch.device, holds_loss: bool
) -> None:
    """One memory action per layer; "swap" is "keep" off the GPU, the loss's layer keeps."""
    if len(actions) != len(layers):
        raise ValueError(f"{len(actions)} memory actions for {len(layers)} layers")
    for layer, action in zip(layers, actions, strict=True):
        if action not in MEMORY_ACTIONS:
            raise ValueError(f"memory action {action!r} is not one of {MEMORY_ACTIONS}")
        if action == "swap" and device.type != "cuda":
            action = "keep"  # host memory *is* the device memory: nothing to swap
        layer.action = action
    if holds_loss and layers:
        layers[-1].action = "keep"  # the loss is computed from it in the forward


class MemoryPolicy:
    """One stage's saved-bytes counter and when it counts (module doc): the stage calls
    `begin_step`, `measure_stream`, `mode` around each layer's forward, `release` after a
    micro-batch's backward, `end_step` and `forget`; others read `saved` and `measuring`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.saved = SavedBytes()
        self._measuring = False  # this step counts saved bytes ...
        self._below = 0  # ... of the micro-batches numbered below this (-1: every one)

    @property
    def measuring(self) -> bool:
        """Whether this step counts saved bytes (read-only)."""
        return self._measuring

    def counts(self, i: int) -> bool:
        """Whether micro-batch i's saved bytes are counted."""
        return self._measuring and (self._below < 0 or i < self._below)

    def begin_step(self, measure: bool, stream: bool, weights: list[torch.Tensor]) -> None:
        """A step; a flushed one that measures counts every micro-batch from zero, a stream
        goes on with the window `measure_stream` opened. `weights`: what saved bytes exclude."""
        self._measuring = measure
        if measure and not stream:
            self._below = -1
            self.saved.begin_step(weights)
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)

    def measure_stream(self, window: int, weights: list[torch.Tensor]) -> None:
        """A stream: count the micro-batches numbered below `window` from now on."""
        self._below = window
        self.saved.begin_step(weights)

    @contextlib.contextmanager
    def mode(self, action: str, i: int, added: list[int]) -> Iterator[None]:
        """Run a layer's forward under its memory action, counting what it saves into `added`."""
        with contextlib.ExitStack() as stack:
            if action == "recompute":
                stack.enter_context(torch.no_grad())
            elif action == "swap":
                stack.enter_context(torch.autograd.graph.save_on_cpu(pin_memory=True))
            if self.counts(i) and action != "swap":
                stack.enter_context(self.saved.saving(i, added))
            yield

    def release(self, i: int) -> None:
        """Micro-batch i's backward is over: what it saved is no longer held."""
        if self._measuring:
            self.saved.release(i)

    def end_step(self, times: StepTimes) -> None:
        """The step's measured peaks into its times (0 when it did not measure)."""
        times.peak_activation_bytes = self.saved.peak if self._measuring else 0
        if self._measuring and self.device.type == "cuda":
            times.allocator_peak_bytes = torch.cuda.max_memory_allocated(self.device)

    def forget(self) -> None:
        """A failed step: nothing it saved is held."""
        self.saved.begin_step([])
