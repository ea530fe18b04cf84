"""What a stage's layers keep for their backward: memory actions, and the bytes counted.

Kept apart from `pipeline.local.stage` so the stage stays short; it calls these as it
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
from typing import TYPE_CHECKING

import torch

from pipeline.local.inflight import StepTimes
from pipeline.pure.costs import MEMORY_ACTIONS

if TYPE_CHECKING:
    from pipeline.local.stage import Stage, _Layer

__all__ = [
    "begin_step",
    "end_step",
    "measure_stream",
    "measuring",
    "memory_mode",
    "set_memory_actions",
]


def set_memory_actions(stage: Stage, actions: Sequence[str]) -> None:
    """One memory action per layer; "swap" is "keep" off the GPU, the loss's layer keeps."""
    if len(actions) != len(stage.layers):
        raise ValueError(f"{len(actions)} memory actions for {len(stage.layers)} layers")
    for layer, action in zip(stage.layers, actions, strict=True):
        if action not in MEMORY_ACTIONS:
            raise ValueError(f"memory action {action!r} is not one of {MEMORY_ACTIONS}")
        if action == "swap" and stage.device.type != "cuda":
            action = "keep"  # host memory *is* the device memory: nothing to swap
        layer.action = action
    if stage.index == stage.n_stages - 1:
        stage.layers[-1].action = "keep"  # the loss is computed from it in the forward


@contextlib.contextmanager
def memory_mode(stage: Stage, layer: _Layer, i: int, added: list[int]) -> Iterator[None]:
    """Run a layer's forward under its memory action, counting what it saves into `added`."""
    with contextlib.ExitStack() as stack:
        if layer.action == "recompute":
            stack.enter_context(torch.no_grad())
        elif layer.action == "swap":
            stack.enter_context(torch.autograd.graph.save_on_cpu(pin_memory=True))
        if measuring(stage, i) and layer.action != "swap":
            stack.enter_context(stage.saved.saving(i, added))
        yield


def measuring(stage: Stage, i: int) -> bool:
    """Whether micro-batch i's saved bytes are counted."""
    return stage._measure and (stage._measure_below < 0 or i < stage._measure_below)


def begin_step(stage: Stage) -> None:
    """A flushed step that measures memory: count every micro-batch from zero."""
    stage._measure_below = -1  # every micro-batch
    stage.saved.begin_step(_weight_tensors(stage))
    if stage.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(stage.device)


def measure_stream(stage: Stage, window: int) -> None:
    """A stream: count the micro-batches numbered below `window` from now on."""
    stage._measure_below = window
    stage.saved.begin_step(_weight_tensors(stage))


def end_step(stage: Stage, times: StepTimes) -> None:
    """The step's measured peaks into its times (0 when it did not measure)."""
    times.peak_activation_bytes = stage.saved.peak if stage._measure else 0
    if stage._measure and stage.device.type == "cuda":
        times.allocator_peak_bytes = torch.cuda.max_memory_allocated(stage.device)


def _weight_tensors(stage: Stage) -> list[torch.Tensor]:
    """Parameters and every weight version (2BW): what saved activations exclude."""
    extra = stage.versions.tensors() if stage.versions is not None else []
    return [*stage.parameters(), *extra]
