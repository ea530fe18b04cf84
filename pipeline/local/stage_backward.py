"""One stage's backward of one micro-batch: its layers in reverse, whole or split in two.

Kept apart from `pipeline.local.stage` so the stage stays short; `Stage.backward` and
`Stage.backward_weight` delegate here. The executor calls

    backward(i)       last stage: backward of loss_i / M; others: backward of the outputs
                      with the received gradients; returns the inputs' gradients
    backward(i, split=True), then backward_weight(i)
                      the same, in two parts: the inputs' gradients first, the weights'
                      later, each node run once (`pipeline.local.backward`); a recomputed
                      or swapped layer runs its whole backward in the first part

A micro-batch whose forward ran fused (one graph for the stage) runs its backward in one
call (`pipeline.local.fused`). Otherwise each layer's graph is its own (a step that
measures runs layers on detached leaf inputs), so the walk
hands each layer the gradient of its outputs and takes the gradient of its inputs. A
recomputed layer first re-runs its forward with grad, with the same RNG seed; its backward
time excludes that re-run. With Bi-Partition (`pipeline.distributed.handoff`) the stage's
own handed layers have no graph here (their backward runs on the next stage), and after its
own layers the stage runs the previous stage's handed layers' backward on their replicas
(`pipeline.local.separable.HandedLayers`), from the gradient of their output. PipeMare
(`pipeline.local.asynchronous`) computes the weight gradients at its current weights and
updates in place every N micro-batches, at the end of `backward`.

The loss of a step is the mean of the micro-batch losses and the gradients are those of
that mean, exactly as one process with gradient accumulation computes them. A carry tensor
carries a gradient exactly when it is floating point.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Protocol

import torch

from pipeline.local import fused
from pipeline.local.asynchronous import AsyncWeights
from pipeline.local.backward import backward_input, fused_backward
from pipeline.local.carry import Carry, floating
from pipeline.local.inflight import ComputeError, InFlight, StepTimes
from pipeline.local.layer import StageLayer
from pipeline.local.separable import HandedLayers
from pipeline.local.stage_memory import MemoryPolicy
from pipeline.local.versions import WeightVersions

__all__ = ["BackwardStage", "backward", "backward_weight"]


class BackwardStage(Protocol):
    """What the walk uses of a stage (`pipeline.local.stage.Stage` is one)."""

    index: int
    layers: list[StageLayer]
    handoff_out: int  # its last layers whose backward the next stage runs
    handed_in: HandedLayers | None  # the previous stage's, whose backward runs here
    versions: WeightVersions | AsyncWeights | None
    optimizer: torch.optim.Optimizer | None
    memory: MemoryPolicy
    times: StepTimes

    @property
    def n_microbatches(self) -> int: ...

    def now(self) -> float: ...

    def span(self, name: str, start: float, category: str = "compute") -> float: ...

    def call_layer(self, layer: StageLayer, i: int, carry: Carry) -> Carry: ...


def backward(
    stage: BackwardStage, state: InFlight, i: int, grads: Sequence[torch.Tensor], split: bool
) -> list[torch.Tensor]:
    """Back-propagate micro-batch i given its outputs' gradients; its inputs' gradients."""
    start = stage.now()
    asynchronous = stage.versions if isinstance(stage.versions, AsyncWeights) else None
    with asynchronous.backward_weights(i) if asynchronous else contextlib.nullcontext():
        if state.fused:
            grads = fused.backward(stage, state, i, grads, split)
        else:
            grads = _backward_layers(stage, state, i, grads, split)
    if stage.handed_in is not None:
        grads = [_handed_backward(stage, state, i, grads, split)]
    elapsed = stage.span(f"BI{i}" if split else f"B{i}", start, "backward")
    if state.fused:  # the walk times each layer; a fused backward is timed whole
        stage.times.backward_s += elapsed
    state.loss, state.inputs, state.outputs, state.handed = None, [], [], ()
    if not split:
        stage.memory.release(i)
    if asynchronous is not None and asynchronous.due(i):  # PipeMare: update in place
        t0 = stage.now()
        try:
            asynchronous.update(stage.optimizer)
        except Exception as error:
            raise ComputeError("optimizer", None, i, error) from error
        stage.times.optimizer_s += stage.span("optimizer step", t0, "optimizer")
    return list(grads)


def backward_weight(stage: BackwardStage, state: InFlight, i: int) -> None:
    """The weight gradients `backward(split=True)` left for micro-batch i; frees its graph."""
    start = stage.now()
    if state.fused:
        fused.backward_weight(stage, state, i)
        stage.times.backward_s += stage.span(f"W{i}", start, "weight")
        stage.memory.release(i)
        return
    for position in sorted(state.weight, reverse=True):
        layer, t0 = stage.layers[position], stage.now()
        try:
            state.weight.pop(position).run()
        except Exception as error:
            error.add_note(
                f"in the weight-gradient backward (W) of layer {layer.key!r} on stage {stage.index}"
            )
            raise ComputeError("backward", layer.key, i, error) from error
        elapsed = stage.now() - t0
        layer.backward_s += elapsed
        stage.times.backward_s += elapsed
    if state.handed_weight:
        _handed_weight(stage, state, i)
    stage.span(f"W{i}", start, "weight")
    stage.memory.release(i)


def _backward_layers(
    stage: BackwardStage, state: InFlight, i: int, grads: Sequence[torch.Tensor], split: bool
) -> Sequence[torch.Tensor]:
    for position in reversed(range(len(stage.layers) - stage.handoff_out)):
        layer = stage.layers[position]
        t0 = stage.now()
        try:
            grads, recomputed_at = _backward_layer(stage, state, position, i, grads, split)
        except ComputeError:
            raise
        except Exception as error:
            error.add_note(f"in the backward of layer {layer.key!r} on stage {stage.index}")
            raise ComputeError("backward", layer.key, i, error) from error
        elapsed = stage.now() - (t0 if recomputed_at is None else recomputed_at)
        layer.backward_s += elapsed
        layer.backward_n += 1
        stage.times.backward_s += elapsed
    return grads


def _backward_layer(
    stage: BackwardStage,
    state: InFlight,
    position: int,
    i: int,
    grads: Sequence[torch.Tensor],
    split: bool,
) -> tuple[Sequence[torch.Tensor], float | None]:
    """(the layer's inputs' gradients, when its recompute ended: backward time excludes it)."""
    layer, inputs = stage.layers[position], state.inputs[position]
    outputs: Carry
    recomputed_at = None
    if position == len(stage.layers) - 1 and state.loss is not None:
        loss = state.loss / stage.n_microbatches
        outputs, grads = (loss,), (torch.ones_like(loss),)
    else:
        outputs = state.outputs[position]
        if layer.action == "recompute":
            with torch.enable_grad():
                outputs = stage.call_layer(layer, i, inputs)
            recomputed_at = stage.now()
    state.outputs[position] = ()
    wanted = floating(inputs)
    if split and layer.action == "keep":
        input_grads, work = backward_input(floating(outputs), grads, wanted)
        if work:
            state.weight[position] = work
    else:
        input_grads = fused_backward(floating(outputs), grads, wanted)
    return (() if position == 0 and stage.index == 0 else input_grads), recomputed_at


def _handed_backward(
    stage: BackwardStage, state: InFlight, i: int, grads: Sequence[torch.Tensor], split: bool
) -> torch.Tensor:
    """The previous stage's handed layers' backward, from the gradient of their output
    (split: their weight gradients wait for `backward_weight`)."""
    assert stage.handed_in is not None and len(grads) == 1, "a handed layer has one output"
    t0 = stage.now()
    try:
        grad, state.handed_weight = stage.handed_in.backward(state.handed, grads[0], split)
    except Exception as error:
        keys = ", ".join(stage.handed_in.keys)
        error.add_note(f"in the backward of handed layers [{keys}] on stage {stage.index}")
        raise ComputeError("backward", stage.handed_in.keys[-1], i, error) from error
    stage.times.backward_s += stage.now() - t0
    return grad


def _handed_weight(stage: BackwardStage, state: InFlight, i: int) -> None:
    assert stage.handed_in is not None
    t0 = stage.now()
    try:
        for accumulate in state.handed_weight:
            accumulate()
    except Exception as error:
        error.add_note(
            f"in the weight-gradient backward (W) of handed layers on stage {stage.index}"
        )
        raise ComputeError("backward", stage.handed_in.keys[-1], i, error) from error
    state.handed_weight = []
    stage.times.backward_s += stage.now() - t0
